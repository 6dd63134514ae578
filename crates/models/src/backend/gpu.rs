//! The GPU backend (`--device gpu` through wgpu, `--device cuda` through
//! the CUDA driver: one [`Accelerator`], the same kernels' arithmetic): the
//! CPU backend, with every q8/q4 matrix the device's kernels take uploaded
//! once as the container stores it, within the VRAM budget; the products with those matrices and the dense SwiGLU MLPs
//! whose three matrices are all there run on the device, the rest on the
//! CPU (`Gpu::summary` says which, at start). What the dense matrices
//! leave of the budget is a tier of routed experts in VRAM
//! (`strata_sched::VramExperts`), under the RAM cache's policy and leases,
//! filled from the RAM cache or the disk. The device's products are the
//! CPU's bit for bit (`strata_kernels::accel`), so what runs where, which
//! backend, and the VRAM budget never change the output.
//!
//! Without the kernels' `gpu` (or `cuda`) feature the device cannot be
//! made and `Backend::gpu` (`Backend::cuda`) fails, saying how to build it.

use std::sync::{Arc, OnceLock};

use strata_format::{Container, SwiGlu};
use strata_kernels::{Accelerator, AcceleratorMatrix, Error as KernelError, QuantFormat, Threads};
use strata_sched::{ExpertOnDevice, VramExperts};
use strata_tier::{DeviceTier, DeviceTierStats, ExpertStore};

use super::cpu::{Cpu, swiglu_act};
use super::{Device, MatrixHandle};
use crate::error::Result;

/// What a GPU holds, for the run stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VramStats {
    /// Bytes of the dense part's matrices on the device.
    pub dense_bytes: u64,
    /// The tier of routed experts.
    pub experts: DeviceTierStats,
}

/// The device, and which matrices it holds.
pub struct Gpu {
    host: Cpu,
    device: Accelerator,
    /// The most bytes of matrices to upload (`None`: all the device takes).
    vram_budget_bytes: Option<u64>,
    /// By the host's matrix slot: the matrix on the device, if it went there.
    on_device: Vec<Option<AcceleratorMatrix>>,
    bytes_on_device: u64,
    /// Matrices kept on the host: no kernel for their format, over the
    /// budget, larger than one of the device's buffers, or refused by a
    /// device out of memory.
    no_kernel: usize,
    over_budget: usize,
    too_large: usize,
    out_of_memory: usize,
    /// The routed experts in VRAM, made at the first MoE layer (once every
    /// dense matrix has taken its share of the budget).
    experts: OnceLock<DeviceTier<ExpertOnDevice>>,
}

impl Gpu {
    /// `device`, for `container`'s weights, holding at most
    /// `vram_budget_bytes` of matrices (`None`: all it takes).
    pub fn new(container: Arc<Container>, device: Accelerator, vram_budget_bytes: Option<u64>) -> Self {
        Self {
            host: Cpu::new(container),
            device,
            vram_budget_bytes,
            on_device: Vec::new(),
            bytes_on_device: 0,
            no_kernel: 0,
            over_budget: 0,
            too_large: 0,
            out_of_memory: 0,
            experts: OnceLock::new(),
        }
    }

    /// The CPU backend over the same container, which runs what the device
    /// does not.
    pub fn host(&self) -> &Cpu {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut Cpu {
        &mut self.host
    }

    /// Registers the matrix `name` on the host, and uploads it if the
    /// device has its kernel and the budget room; the slot of its handle
    /// and where its products run.
    pub fn register_matrix(&mut self, name: &str) -> Result<(usize, Device)> {
        let slot = self.host.register_matrix(name)?;
        assert_eq!(slot, self.on_device.len(), "one device entry per host slot");
        let matrix = self.host.container().dense(name)?;
        let uploaded = match self.device.upload(&matrix) {
            Ok(on_device) if self.fits(on_device.bytes()) => {
                self.bytes_on_device += on_device.bytes();
                Some(on_device)
            }
            Ok(_) => {
                self.over_budget += 1;
                None
            }
            Err(KernelError::GpuUnsupported { .. }) => {
                self.no_kernel += 1;
                None
            }
            Err(KernelError::GpuOutOfMemory { .. }) => {
                self.out_of_memory += 1;
                None
            }
            Err(_) => {
                self.too_large += 1;
                None
            }
        };
        let device = if uploaded.is_some() { Device::Gpu } else { Device::Cpu };
        self.on_device.push(uploaded);
        Ok((slot, device))
    }

    /// Registers the table `name` on the host (rows are read there); the
    /// slot of its handle, which it shares with the matrices.
    pub fn register_table(&mut self, name: &str) -> Result<usize> {
        let slot = self.host.register_table(name)?;
        assert_eq!(slot, self.on_device.len(), "one device entry per host slot");
        self.on_device.push(None);
        Ok(slot)
    }

    /// The bytes of VRAM left to routed experts: the budget less the dense
    /// matrices (`auto`: as many as the device takes).
    fn expert_vram_bytes(&self) -> usize {
        match self.vram_budget_bytes {
            Some(budget) => usize::try_from(budget.saturating_sub(self.bytes_on_device)).unwrap_or(usize::MAX),
            None => usize::MAX,
        }
    }

    /// The device and its tier of routed experts, under `store`'s policy.
    pub fn vram_experts(&self, store: &ExpertStore) -> VramExperts<'_> {
        let tier = self.experts.get_or_init(|| store.device_tier(self.expert_vram_bytes()));
        VramExperts { device: &self.device, tier }
    }

    /// What VRAM holds, and what the tier of routed experts did (zeros
    /// before the first MoE layer ran).
    pub fn vram_stats(&self) -> VramStats {
        VramStats {
            dense_bytes: self.bytes_on_device,
            experts: self.experts.get().map(DeviceTier::stats).unwrap_or_default(),
        }
    }

    /// Whether `bytes` more stay within the budget.
    fn fits(&self, bytes: u64) -> bool {
        self.vram_budget_bytes.is_none_or(|budget| self.bytes_on_device.saturating_add(bytes) <= budget)
    }

    fn on_device(&self, m: MatrixHandle) -> &AcceleratorMatrix {
        assert_eq!(m.device, Device::Gpu, "a device operation reads device tensors");
        let matrix = self.on_device[m.slot].as_ref().expect("a handle on the device names an uploaded matrix");
        assert_eq!((matrix.rows(), matrix.cols()), (m.rows, m.cols), "the handle's shape is its matrix's");
        matrix
    }

    /// `out = W xs`, on the device where `w` is, else on the host.
    pub fn matmul(&self, threads: &Threads, w: MatrixHandle, xs: &[f32], out: &mut [f32]) {
        match w.device {
            Device::Gpu => self.device.matmul(self.on_device(w), threads.activations(), xs, xs.len() / w.cols, out),
            Device::Cpu => self.host.matmul(threads, w, xs, out),
        }
    }

    /// A dense SwiGLU MLP, on the device where all three matrices are.
    pub fn swiglu(&self, threads: &Threads, weights: &[MatrixHandle; 3], swiglu: SwiGlu, xs: &[f32], ys: &mut [f32]) {
        if weights.iter().all(|m| m.device == Device::Gpu) {
            let [gate, up, down] = weights.map(|m| self.on_device(m));
            let n = xs.len() / gate.cols();
            self.device.gated_ffn([gate, up, down], swiglu_act(swiglu), threads.activations(), xs, n, ys);
        } else {
            self.host.swiglu(threads, &weights.map(MatrixHandle::on_host), swiglu, xs, ys);
        }
    }

    /// The routed experts stored in a format the device has no kernel for
    /// (its kernels are the integer path's, q8 and q4: MXFP4 experts kept
    /// from their checkpoint stay on the CPU), by format, if any.
    fn experts_without_kernel(&self) -> Option<String> {
        let container = self.host.container();
        let mut layers_by_format: std::collections::BTreeMap<&str, usize> = Default::default();
        for layer in container.arch().expert_layers() {
            let Ok(layout) = container.expert_layout(layer) else { continue };
            let formats = layout.components.iter().map(|c| c.format);
            let without: std::collections::BTreeSet<&str> =
                formats.filter(|f| !matches!(f, QuantFormat::Q8 | QuantFormat::Q4)).map(QuantFormat::name).collect();
            for format in without {
                *layers_by_format.entry(format).or_default() += 1;
            }
        }
        let said: Vec<String> = layers_by_format
            .into_iter()
            .map(|(format, layers)| format!("the routed experts of {layers} layers ({format}: no device kernel)"))
            .collect();
        (!said.is_empty()).then(|| said.join("; "))
    }

    /// What runs where, said once at start.
    pub fn summary(&self) -> String {
        let uploaded = self.on_device.iter().flatten().count();
        let mut kept = Vec::new();
        if self.no_kernel > 0 {
            kept.push(format!("{} matrices with no device kernel (f32, bf16 or other groups)", self.no_kernel));
        }
        if self.over_budget > 0 {
            kept.push(format!("{} matrices over the VRAM budget", self.over_budget));
        }
        if self.too_large > 0 {
            kept.push(format!("{} matrices larger than the device's buffers", self.too_large));
        }
        if self.out_of_memory > 0 {
            kept.push(format!("{} matrices the device had no memory for", self.out_of_memory));
        }
        if let Some(experts) = self.experts_without_kernel() {
            kept.push(experts);
        }
        kept.push(
            "attention, norms, routing, residual-stream mixes, row-block products, and the routed experts the VRAM \
             tier does not hold or has no kernel for"
                .into(),
        );
        let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        let experts = match self.expert_vram_bytes() {
            usize::MAX => "routed experts in VRAM as the device takes them".to_owned(),
            bytes => format!("routed experts in {:.1} MiB of VRAM", mib(bytes as u64)),
        };
        let memory = match self.device.memory_bytes() {
            Some((free_bytes, total_bytes)) => {
                format!(" ({:.1} GiB, {:.1} GiB free)", gib(total_bytes), gib(free_bytes))
            }
            None => String::new(),
        };
        format!(
            "GPU {}{memory}: {uploaded} matrices ({:.1} MiB) and their products on the device, {experts}; on the \
             CPU: {}",
            self.device.name(),
            mib(self.bytes_on_device),
            kept.join("; ")
        )
    }
}
