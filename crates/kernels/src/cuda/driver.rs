//! The device through cudarc's driver API, the driver loaded at run time.

use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError};

use super::DRIVER_LIBRARY;
use crate::error::{Error, Result};

/// An NVIDIA GPU: its context, name and memory.
pub struct CudaDevice {
    /// Held for the kernels to come: the context lives as long as the device.
    _context: Arc<CudaContext>,
    /// The device's name and ordinal, as a start-up line shows it.
    name: String,
    total_bytes: u64,
    /// Free at opening (cuMemGetInfo), what `--vram-budget auto` shares.
    free_bytes: u64,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("name", &self.name).finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// The GPU of ordinal `ordinal`, or why there is none: no driver
    /// library (checked first, as cudarc panics where it cannot load it),
    /// no such device, or the driver's refusal.
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
        Ok(Self { _context: context, name, total_bytes, free_bytes })
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the driver is absent (CI, this machine) the refusal names its
    /// library; where a GPU is present, the device opens. Skips, saying why,
    /// where a driver is present without a device.
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
