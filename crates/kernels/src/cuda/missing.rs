//! The stand-in of a build without the feature `cuda`: the same names, no
//! value of them can exist, and [`CudaDevice::new`] says what is missing.

use std::convert::Infallible;

use crate::act::ActivationPrecision;
use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::threads::GatedAct;

/// An NVIDIA GPU; this build has none (see [`CudaDevice::new`]).
#[derive(Debug)]
pub struct CudaDevice {
    never: Infallible,
}

/// A matrix on an NVIDIA GPU; this build has none.
#[derive(Debug)]
pub struct CudaMatrix {
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

    pub fn upload(&self, _m: &Matrix<'_>) -> Result<CudaMatrix> {
        match self.never {}
    }

    pub fn matmul(&self, _m: &CudaMatrix, _precision: ActivationPrecision, _xs: &[f32], _n: usize, _ys: &mut [f32]) {
        match self.never {}
    }

    pub fn gated_ffn(
        &self,
        _matrices: [&CudaMatrix; 3],
        _act: GatedAct<'_>,
        _precision: ActivationPrecision,
        _xs: &[f32],
        _n: usize,
        _ys: &mut [f32],
    ) {
        match self.never {}
    }
}

impl CudaMatrix {
    pub fn rows(&self) -> usize {
        match self.never {}
    }

    pub fn cols(&self) -> usize {
        match self.never {}
    }

    pub fn bytes(&self) -> u64 {
        match self.never {}
    }
}
