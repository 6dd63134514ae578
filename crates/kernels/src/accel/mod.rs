//! The GPU a run offloads to, whichever backend opened it: wgpu
//! ([`crate::gpu`], `--device gpu`) or CUDA ([`crate::cuda`], `--device
//! cuda`). Both run the same integer-path products and gated FFN
//! (`products`: everything but moving buffers and launching the kernel
//! is written once there), so the models and the VRAM tier of routed
//! experts hold one [`Accelerator`] and never ask which.
//!
//! An enum, not a trait object: the backends are a closed set, and a
//! matrix must go back to the device that holds it, which a match on the
//! pair checks. Without a backend's feature its variant holds the
//! stand-in, which has no value, so the match stays exhaustive.

#[cfg(any(feature = "gpu", feature = "cuda"))]
pub(crate) mod products;

use crate::act::ActivationPrecision;
use crate::cuda::{CudaDevice, CudaMatrix};
use crate::error::Result;
use crate::gpu::{Device as WgpuDevice, DeviceMatrix as WgpuMatrix};
use crate::matrix::Matrix;
use crate::threads::GatedAct;

/// A GPU and its kernels.
#[derive(Debug)]
pub enum Accelerator {
    /// Through wgpu (Vulkan, Metal, DX12).
    Wgpu(WgpuDevice),
    /// An NVIDIA GPU through the CUDA driver.
    Cuda(CudaDevice),
}

/// A q8 or q4 matrix on an [`Accelerator`], in the container's own layout.
#[derive(Debug)]
pub enum AcceleratorMatrix {
    Wgpu(WgpuMatrix),
    Cuda(CudaMatrix),
}

/// The panic of a matrix handed to a device that does not hold it: a bug
/// of the caller, which keeps one accelerator per run.
const OTHER_DEVICE: &str = "a matrix goes back to the device it was uploaded to";

impl Accelerator {
    /// The device's name, as a start-up line shows it.
    pub fn name(&self) -> &str {
        match self {
            Accelerator::Wgpu(device) => device.name(),
            Accelerator::Cuda(device) => device.name(),
        }
    }

    /// Free and total bytes of device memory where the backend says
    /// (CUDA); wgpu gives no such number.
    pub fn memory_bytes(&self) -> Option<(u64, u64)> {
        match self {
            Accelerator::Wgpu(_) => None,
            Accelerator::Cuda(device) => Some((device.free_bytes(), device.total_bytes())),
        }
    }

    /// Uploads a q8 or q4 matrix whose group the integer path takes, as it
    /// is stored; anything else stays on the host
    /// ([`crate::Error::GpuUnsupported`]), as does a matrix the device has
    /// no memory for ([`crate::Error::GpuOutOfMemory`]).
    pub fn upload(&self, m: &Matrix<'_>) -> Result<AcceleratorMatrix> {
        match self {
            Accelerator::Wgpu(device) => device.upload(m).map(AcceleratorMatrix::Wgpu),
            Accelerator::Cuda(device) => device.upload(m).map(AcceleratorMatrix::Cuda),
        }
    }

    /// `ys[t] = W xs[t]` for the `n` inputs `xs` (`[n, cols]`), their codes
    /// quantized at `precision`: bit for bit the CPU's integer path.
    ///
    /// # Panics
    /// If the shapes disagree, `m` is another device's, or the device fails.
    pub fn matmul(&self, m: &AcceleratorMatrix, precision: ActivationPrecision, xs: &[f32], n: usize, ys: &mut [f32]) {
        match (self, m) {
            (Accelerator::Wgpu(device), AcceleratorMatrix::Wgpu(m)) => device.matmul(m, precision, xs, n, ys),
            (Accelerator::Cuda(device), AcceleratorMatrix::Cuda(m)) => device.matmul(m, precision, xs, n, ys),
            _ => panic!("{OTHER_DEVICE}"),
        }
    }

    /// The gated feed-forward block on `[gate, up, down]`: bit for bit
    /// [`crate::Threads::gated_ffn`] where the CPU takes the integer path.
    ///
    /// # Panics
    /// As [`crate::Threads::gated_ffn`], if a matrix is another device's, or
    /// if the device fails.
    pub fn gated_ffn(
        &self,
        matrices: [&AcceleratorMatrix; 3],
        act: GatedAct<'_>,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        match (self, matrices) {
            (
                Accelerator::Wgpu(device),
                [AcceleratorMatrix::Wgpu(g), AcceleratorMatrix::Wgpu(u), AcceleratorMatrix::Wgpu(d)],
            ) => device.gated_ffn([g, u, d], act, precision, xs, n, ys),
            (
                Accelerator::Cuda(device),
                [AcceleratorMatrix::Cuda(g), AcceleratorMatrix::Cuda(u), AcceleratorMatrix::Cuda(d)],
            ) => device.gated_ffn([g, u, d], act, precision, xs, n, ys),
            _ => panic!("{OTHER_DEVICE}"),
        }
    }
}

impl AcceleratorMatrix {
    pub fn rows(&self) -> usize {
        match self {
            AcceleratorMatrix::Wgpu(m) => m.rows(),
            AcceleratorMatrix::Cuda(m) => m.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            AcceleratorMatrix::Wgpu(m) => m.cols(),
            AcceleratorMatrix::Cuda(m) => m.cols(),
        }
    }

    /// Bytes this matrix holds on the device.
    pub fn bytes(&self) -> u64 {
        match self {
            AcceleratorMatrix::Wgpu(m) => m.bytes(),
            AcceleratorMatrix::Cuda(m) => m.bytes(),
        }
    }
}
