//! The CUDA backend (`--device cuda[:N]`): the NVIDIA GPU opened through
//! the driver loaded at run time (`strata_kernels::cuda`). No kernel is
//! ported to it yet, so the CPU backend runs everything, and the start-up
//! line says so; what it establishes is the name, the refusal where the
//! driver is absent, and the device's memory for a later port.

use std::sync::Arc;

use strata_format::Container;
use strata_kernels::cuda::{CudaDevice, auto_vram_budget_bytes};

use super::cpu::Cpu;
use crate::error::Result;

/// The device, and the host that runs the model meanwhile.
pub struct Cuda {
    host: Cpu,
    device: CudaDevice,
    /// The VRAM the model may take (`--vram-budget`, or `auto`'s share of
    /// the free memory): said at start, for the kernels a port brings.
    vram_budget_bytes: u64,
}

impl Cuda {
    /// The GPU of ordinal `ordinal`, for `container`'s weights.
    /// `vram_budget_bytes`: `None` is `auto`.
    pub fn new(container: Arc<Container>, ordinal: usize, vram_budget_bytes: Option<u64>) -> Result<Self> {
        let device = CudaDevice::new(ordinal)?;
        let vram_budget_bytes =
            vram_budget_bytes.unwrap_or_else(|| auto_vram_budget_bytes(device.free_bytes(), device.total_bytes()));
        Ok(Self { host: Cpu::new(container), device, vram_budget_bytes })
    }

    pub fn host(&self) -> &Cpu {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut Cpu {
        &mut self.host
    }

    /// What runs where, said once at start.
    pub fn summary(&self) -> String {
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        format!(
            "CUDA {} ({:.1} GiB, {:.1} GiB free, VRAM budget {:.1} GiB): no kernel is ported to CUDA yet; on the \
             CPU: everything (--device gpu runs the q8/q4 products through Vulkan)",
            self.device.name(),
            gib(self.device.total_bytes()),
            gib(self.device.free_bytes()),
            gib(self.vram_budget_bytes)
        )
    }
}
