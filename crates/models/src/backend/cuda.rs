//! The CUDA backend (`--device cuda[:N]`): the NVIDIA GPU opened through
//! the driver loaded at run time (`strata_kernels::cuda`). No kernel is
//! ported to it yet, so the CPU backend runs everything, and the start-up
//! line says so; what it establishes is the name, the refusal where the
//! driver is absent, and the device's memory for a later port.

use std::sync::Arc;

use strata_format::Container;
use strata_kernels::cuda::CudaDevice;

use super::cpu::Cpu;
use crate::error::Result;

/// The device, and the host that runs the model meanwhile.
pub struct Cuda {
    host: Cpu,
    device: CudaDevice,
}

impl Cuda {
    /// The GPU of ordinal `ordinal`, for `container`'s weights.
    pub fn new(container: Arc<Container>, ordinal: usize) -> Result<Self> {
        Ok(Self { host: Cpu::new(container), device: CudaDevice::new(ordinal)? })
    }

    pub fn host(&self) -> &Cpu {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut Cpu {
        &mut self.host
    }

    /// What runs where, said once at start.
    pub fn summary(&self) -> String {
        format!(
            "CUDA {} ({:.1} GiB): no kernel is ported to CUDA yet; on the CPU: everything (--device gpu runs the \
             q8/q4 products through Vulkan)",
            self.device.name(),
            self.device.total_bytes() as f64 / (1u64 << 30) as f64
        )
    }
}
