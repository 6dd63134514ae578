//! CUDA, behind the feature `cuda`: an NVIDIA GPU through the driver API
//! (cudarc), the driver's library loaded at run time, so that building
//! needs no CUDA toolkit and no GPU, and a machine without the driver is
//! refused `--device cuda` with the library's name.
//!
//! No kernel runs on it yet: a later port brings the q8/q4 products and
//! the expert FFN (the integer path, as `crate::gpu` computes it, compiled
//! by NVRTC at run time or embedded as PTX).
//!
//! Without the feature, [`CudaDevice`] keeps its name and
//! [`CudaDevice::new`] fails with [`crate::Error::CudaNotBuilt`].

#[cfg(feature = "cuda")]
mod driver;
#[cfg(not(feature = "cuda"))]
mod missing;

#[cfg(feature = "cuda")]
pub use driver::CudaDevice;
#[cfg(not(feature = "cuda"))]
pub use missing::CudaDevice;

/// The driver's library, as a refusal names it.
pub const DRIVER_LIBRARY: &str = if cfg!(windows) { "nvcuda.dll" } else { "libcuda.so (the NVIDIA driver)" };

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_cuda_says_how_to_build_it() {
        let refused = CudaDevice::new(0).expect_err("no CUDA in this build");
        assert!(refused.to_string().contains("--features cuda"), "{refused}");
    }
}
