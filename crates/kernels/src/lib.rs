//! Pure math for Strata: quantized block layouts, matrix-vector and small-batch
//! matrix products, and the element-wise operators of a transformer layer.
//!
//! **Architecture invariant:** this crate knows no files and no models. It sees
//! slices of numbers and shapes, nothing else.
//!
//! Every operator has a scalar reference implementation in [`scalar`]; faster
//! paths (AVX2/FMA, AVX-512) are chosen at run time and are tested against the
//! reference with proptest.

pub mod accel;
mod act;
pub mod cuda;
mod error;
pub mod gdn;
pub mod gpu;
mod int;
pub mod matrix;
pub mod mxfp4;
pub mod ops;
pub mod quant;
pub mod scalar;
pub mod simd;
pub mod threads;

pub use accel::{Accelerator, AcceleratorMatrix};
pub use act::ActivationPrecision;
pub use error::{Error, Result};
pub use matrix::{MatData, Matrix};
pub use quant::QuantFormat;
pub use threads::{GatedAct, Threads};

#[cfg(test)]
mod tests;
