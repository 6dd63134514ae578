//! The stand-in of a build without the feature `gpu`: the same names, no
//! value of them can exist, and [`Device::new`] says what is missing.

use std::convert::Infallible;

use crate::act::ActivationPrecision;
use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::threads::GatedAct;

/// A GPU; this build has none (see [`Device::new`]).
#[derive(Debug)]
pub struct Device {
    never: Infallible,
}

/// A matrix on a GPU; this build has none.
#[derive(Debug)]
pub struct DeviceMatrix {
    never: Infallible,
}

impl Device {
    /// Fails: this build has no GPU support.
    pub fn new() -> Result<Self> {
        Err(Error::GpuNotBuilt)
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn upload(&self, _m: &Matrix<'_>) -> Result<DeviceMatrix> {
        match self.never {}
    }

    pub fn matmul(&self, _m: &DeviceMatrix, _precision: ActivationPrecision, _xs: &[f32], _n: usize, _ys: &mut [f32]) {
        match self.never {}
    }

    pub fn gated_ffn(
        &self,
        _matrices: [&DeviceMatrix; 3],
        _act: GatedAct<'_>,
        _precision: ActivationPrecision,
        _xs: &[f32],
        _n: usize,
        _ys: &mut [f32],
    ) {
        match self.never {}
    }
}

impl DeviceMatrix {
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
