//! The device through cudarc's driver API, the driver loaded at run time:
//! its context, two streams, the products kernel (compiled by NVRTC when
//! the device opens) and the matrices uploaded to it.
//!
//! # What overlaps what
//!
//! Uploads (a matrix at load, a routed expert the VRAM tier admits) go
//! through pinned host buffers on the **copy stream**; products run on the
//! **compute stream**. An upload ends by recording an event on the copy
//! stream that the compute stream waits for, so a product never reads a
//! matrix before its bytes are in, while the copy itself runs beside the
//! products already queued: an expert uploaded by one of the MoE layer's
//! threads crosses the bus while another thread's expert computes.
//! (cudarc's own event tracking orders each buffer's uses across streams
//! too; the explicit event says the order here, where it is decided.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, cudaError_enum};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::DRIVER_LIBRARY;
use super::nvrtc::Nvrtc;
use crate::accel::products::{
    self, LANES_PER_ROW, Params, ProductsDevice, ProductsMatrix, ROWS_PER_GROUP, Uploadable, column_acts, dispatch,
};
use crate::act::{ActivationPrecision, Layout};
use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::threads::GatedAct;

/// The products kernel's source, compiled by NVRTC when a device opens.
pub(crate) const SOURCE: &str = include_str!("products.cu");
/// Its file name, as NVRTC's messages and the kernel's entry point name it.
pub(crate) const SOURCE_NAME: &str = "products.cu";
const ENTRY_POINT: &str = "products";

/// The most bytes of pinned staging buffers kept for reuse: enough for the
/// records of a layer's experts in flight at once, while the dense part's
/// one-off uploads of every size are freed after their copy.
const STAGING_KEPT_BYTES_MAX: usize = 256 << 20;

// SAFETY: `Params` is `#[repr(C)]` plain `u32`s, the kernel's `Params`
// field for field, passed by value.
unsafe impl DeviceRepr for Params {}

/// An NVIDIA GPU: its context, streams, kernel, name and memory.
pub struct CudaDevice {
    context: Arc<CudaContext>,
    /// Products run here, one call after another per thread.
    compute: Arc<CudaStream>,
    /// Uploads run here, beside the compute stream (module docs).
    copy: Arc<CudaStream>,
    products: CudaFunction,
    /// Pinned buffers the copy stream reads uploads from, by length: a
    /// layer's experts are all one size, so a record's buffers are reused
    /// (waiting, when taken, for the copy that last read them).
    staging: Mutex<Staging>,
    /// The device's name and ordinal, as a start-up line shows it.
    name: String,
    total_bytes: u64,
    /// Free at opening (cuMemGetInfo), what `--vram-budget auto` shares.
    free_bytes: u64,
}

#[derive(Default)]
struct Staging {
    by_len: HashMap<usize, Vec<PinnedHostSlice<u8>>>,
    kept_bytes: usize,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A q8 or q4 matrix on the device, its bytes the container's own.
#[derive(Debug)]
pub struct CudaMatrix {
    rows: usize,
    cols: usize,
    layout: Layout,
    params: Params,
    /// The weight bytes, rows back to back.
    qs: CudaSlice<u8>,
    /// The scales' bytes (f32, as the kernel reads them).
    scales: CudaSlice<u8>,
}

impl CudaDevice {
    /// The GPU of ordinal `ordinal`, its kernel compiled by the first NVRTC
    /// found ([`super::nvrtc`]), or why there is none: no driver library
    /// (checked first, as cudarc panics where it cannot load it), no such
    /// device, no NVRTC, or the driver's refusal.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: loading the driver's library runs its initializers, which
        // is what any use of CUDA does; nothing of it is held here.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoCudaDriver { library: DRIVER_LIBRARY });
        }
        let refused = |e: DriverError| Error::Cuda { reason: format!("device {ordinal}: {e}") };
        let count = CudaContext::device_count().map_err(refused)?;
        if usize::try_from(count).is_ok_and(|count| ordinal >= count) {
            return Err(Error::Cuda { reason: format!("no device {ordinal}: the driver sees {count}") });
        }
        let context = CudaContext::new(ordinal).map_err(refused)?;
        let name = format!("{} (cuda:{ordinal})", context.name().map_err(refused)?);
        let (free_bytes, total_bytes) = context.mem_get_info().map_err(refused)?;
        let (free_bytes, total_bytes) = (free_bytes as u64, total_bytes as u64);
        let products = Self::load_kernel(&context).map_err(|e| match e {
            Error::Cuda { reason } => Error::Cuda { reason: format!("{name}: {reason}") },
            e => e,
        })?;
        let compute = context.new_stream().map_err(refused)?;
        let copy = context.new_stream().map_err(refused)?;
        Ok(Self { context, compute, copy, products, staging: Mutex::default(), name, total_bytes, free_bytes })
    }

    /// The products kernel, compiled for the device's architecture.
    fn load_kernel(context: &Arc<CudaContext>) -> Result<CudaFunction> {
        let attribute = |a| context.attribute(a).map_err(|e| Error::Cuda { reason: e.to_string() });
        let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let device_arch = u32::try_from(major * 10 + minor).unwrap_or(0);
        let nvrtc = Nvrtc::find(&[])?;
        let ptx = nvrtc.compile_ptx(SOURCE, SOURCE_NAME, nvrtc.arch_for(device_arch)?)?;
        let module = context.load_module(Ptx::from_src(ptx)).map_err(|e| {
            let (major, minor) = nvrtc.version();
            Error::Cuda {
                reason: format!(
                    "loading the kernels NVRTC {major}.{minor} ({}) compiled: {e} (an NVRTC newer than the driver \
                     writes PTX it cannot read: use one no newer than the driver's CUDA)",
                    nvrtc.found()
                ),
            }
        })?;
        module.load_function(ENTRY_POINT).map_err(|e| Error::Cuda { reason: format!("{ENTRY_POINT}: {e}") })
    }

    /// The device's name and ordinal.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's memory in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The bytes free when the device was opened (what `--vram-budget auto`
    /// shares, [`super::auto_vram_budget_bytes`]).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Uploads a q8 or q4 matrix whose group the integer path takes, as it
    /// is stored, through the copy stream (module docs); anything else stays
    /// on the host ([`Error::GpuUnsupported`]), as does a matrix the device
    /// has no memory for ([`Error::GpuOutOfMemory`]).
    pub fn upload(&self, m: &Matrix<'_>) -> Result<CudaMatrix> {
        let Uploadable { layout, params, qs, scales } = Uploadable::of(m)?;
        let qs = self.stage("weights", qs)?;
        let scales = self.stage("scales", bytemuck::cast_slice(scales))?;
        let failed = |e: DriverError| Error::Cuda { reason: format!("{}: ordering an upload: {e}", self.name) };
        let uploaded = self.copy.record_event(None).map_err(failed)?;
        self.compute.wait(&uploaded).map_err(failed)?;
        Ok(CudaMatrix { rows: m.rows, cols: m.cols, layout, params, qs, scales })
    }

    /// `bytes` (at least one) copied to a new device buffer on the copy
    /// stream, through a pinned staging buffer.
    fn stage(&self, what: &'static str, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        let len = bytes.len().max(1);
        let out_of_memory = |e: DriverError| {
            if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                Error::GpuOutOfMemory { what, bytes: len as u64 }
            } else {
                Error::Cuda { reason: format!("{}: uploading {what}: {e}", self.name) }
            }
        };
        let reused = self.staging.lock().expect("staging lock").take(len);
        let mut pinned = match reused {
            Some(pinned) => pinned,
            // SAFETY: the buffer is written below before the copy reads it.
            None => unsafe { self.context.alloc_pinned::<u8>(len) }.map_err(out_of_memory)?,
        };
        // Waits for the copy that last read this buffer, if any.
        let host = pinned.as_mut_slice().map_err(out_of_memory)?;
        host[..bytes.len()].copy_from_slice(bytes);
        let on_device = self.copy.clone_htod(&pinned).map_err(out_of_memory)?;
        let unkept = self.staging.lock().expect("staging lock").put(pinned);
        // Dropped with the lock released: dropping waits for its copy.
        drop(unkept);
        Ok(on_device)
    }

    /// `ys[t] = W xs[t]` for the `n` inputs `xs` (`[n, cols]`), their
    /// codes quantized at `precision`: bit for bit the CPU's integer path.
    ///
    /// # Panics
    /// If `xs` is not `[n, cols]` or `ys` not `[n, rows]`, or the device
    /// fails (it is lost, or out of memory).
    pub fn matmul(&self, m: &CudaMatrix, precision: ActivationPrecision, xs: &[f32], n: usize, ys: &mut [f32]) {
        products::matmul(self, m, precision, xs, n, ys)
    }

    /// The gated feed-forward block of one expert (or a dense MLP) on
    /// `[gate, up, down]` ([`products::gated_ffn`]): bit for bit
    /// [`crate::Threads::gated_ffn`] where the CPU takes the integer path.
    ///
    /// # Panics
    /// As [`crate::Threads::gated_ffn`], and if the device fails.
    pub fn gated_ffn(
        &self,
        matrices: [&CudaMatrix; 3],
        act: GatedAct<'_>,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        products::gated_ffn(self, matrices, act, precision, xs, n, ys)
    }

    /// `result`'s value, or the panic of a failed device (lost, or out of
    /// memory mid-product), which no caller can recover from.
    fn ok<T>(&self, result: std::result::Result<T, DriverError>) -> T {
        result.unwrap_or_else(|e| panic!("{}: the device failed: {e}", self.name))
    }
}

impl Staging {
    /// A kept buffer of exactly `len` bytes, if any.
    fn take(&mut self, len: usize) -> Option<PinnedHostSlice<u8>> {
        let pinned = self.by_len.get_mut(&len)?.pop()?;
        self.kept_bytes -= len;
        Some(pinned)
    }

    /// Keeps `pinned` for the next upload of its length, unless that
    /// exceeds [`STAGING_KEPT_BYTES_MAX`]: then it is handed back, for the
    /// caller to drop (which waits for its copy, and frees it).
    fn put(&mut self, pinned: PinnedHostSlice<u8>) -> Option<PinnedHostSlice<u8>> {
        let len = pinned.len();
        if self.kept_bytes + len > STAGING_KEPT_BYTES_MAX {
            return Some(pinned);
        }
        self.kept_bytes += len;
        self.by_len.entry(len).or_default().push(pinned);
        None
    }
}

impl CudaMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes this matrix holds on the device.
    pub fn bytes(&self) -> u64 {
        (self.qs.len() + self.scales.len()) as u64
    }
}

impl ProductsMatrix for CudaMatrix {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }
}

impl ProductsDevice for CudaDevice {
    type Matrix = CudaMatrix;

    fn products(
        &self,
        matrices: &[&CudaMatrix],
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        outs: &mut [&mut [f32]],
    ) {
        assert_eq!(matrices.len(), outs.len(), "one output per matrix");
        // Quantized once per layout: gate and up share theirs.
        let mut acts: Vec<(Layout, CudaSlice<i32>, CudaSlice<f32>)> = Vec::new();
        let mut results = Vec::with_capacity(matrices.len());
        for m in matrices {
            if !acts.iter().any(|(layout, ..)| *layout == m.layout) {
                let (codes, lane_scales) = column_acts(m.layout, precision, xs, n, m.cols);
                let codes = self.ok(self.compute.clone_htod(&codes));
                let lane_scales = self.ok(self.compute.clone_htod(&lane_scales));
                acts.push((m.layout, codes, lane_scales));
            }
            let (_, codes, lane_scales) = acts.iter().find(|(layout, ..)| *layout == m.layout).expect("pushed above");
            let mut out = self.ok(self.compute.alloc_zeros::<f32>((n * m.rows).max(1)));
            if let Some([x, y, z]) = dispatch(m.rows, n) {
                let config = LaunchConfig {
                    grid_dim: (x, y, z),
                    block_dim: (LANES_PER_ROW as u32, ROWS_PER_GROUP as u32, 1),
                    shared_mem_bytes: 0,
                };
                let mut launch = self.compute.launch_builder(&self.products);
                launch.arg(&m.qs).arg(&m.scales).arg(codes).arg(lane_scales).arg(&mut out).arg(&m.params);
                // SAFETY: the kernel's arguments are these six, in this
                // order and of these types (`products.cu`); every index it
                // forms lies within the buffers `params` was checked
                // against at upload and the activations hold `n` vectors
                // of the matrix's blocks.
                self.ok(unsafe { launch.launch(config) });
            }
            results.push(out);
        }
        for (out, ys) in results.iter().zip(outs.iter_mut()) {
            if !ys.is_empty() {
                self.ok(self.compute.memcpy_dtoh(&out.slice(..ys.len()), &mut **ys));
            }
        }
        self.ok(self.compute.synchronize());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the driver is absent (CI, this machine) the refusal names its
    /// library; where a GPU is present, the device opens. Skips, saying why,
    /// where a driver is present without a device or NVRTC.
    #[test]
    fn cuda_without_a_driver_is_refused_naming_the_library() {
        match CudaDevice::new(0) {
            Err(Error::NoCudaDriver { library }) => {
                let said = Error::NoCudaDriver { library }.to_string();
                assert!(said.contains("libcuda") || said.contains("nvcuda"), "{said}");
            }
            Ok(device) => {
                assert!(device.free_bytes() <= device.total_bytes() && device.name().contains("cuda:0"), "{device:?}")
            }
            Err(e) => eprintln!("CUDA test skipped: {e}"),
        }
    }
}
