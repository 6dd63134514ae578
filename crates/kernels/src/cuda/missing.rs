//! The stand-in of a build without the feature `cuda`: the same name, no
//! value of it can exist, and [`CudaDevice::new`] says what is missing.

use std::convert::Infallible;

use crate::error::{Error, Result};

/// An NVIDIA GPU; this build has none (see [`CudaDevice::new`]).
#[derive(Debug)]
pub struct CudaDevice {
    never: Infallible,
}

impl CudaDevice {
    /// Fails: this build has no CUDA support.
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::CudaNotBuilt)
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn total_bytes(&self) -> u64 {
        match self.never {}
    }

    pub fn free_bytes(&self) -> u64 {
        match self.never {}
    }
}
