//! CUDA, behind the feature `cuda`: an NVIDIA GPU through the driver API
//! (cudarc), the driver's library loaded at run time, so that building
//! needs no CUDA toolkit and no GPU, and a machine without the driver is
//! refused `--device cuda` with the library's name.
//!
//! # The kernels: the integer path, bit for bit
//!
//! The q8/q4 products and the gated FFN around them are `crate::gpu`'s:
//! activations quantized on the host by the CPU's quantizer, and a kernel
//! (`products.cu`, embedded in the binary and compiled by NVRTC when the
//! device opens, `nvrtc`) that computes `products.wgsl`'s operations in
//! the same order, so that its products equal the CPU's integer path bit
//! for bit; the host side is written once for both backends
//! (`crate::accel::products`). CUDA's `__fmaf_rn` is IEEE's fused
//! multiply-add, and NVRTC is told not to contract or flush (`--fmad=false`,
//! `--ftz=false`), which is all the definition asks of a device. Matrices
//! go up once, in the container's own layout, through pinned buffers on a
//! copy stream ordered before the products by an event (`driver`'s docs).
//!
//! NVRTC is loaded at run time like the driver: `STRATA_NVRTC_LIBRARY`
//! names it, else CUDA 13's or 12's library is looked for by name.
//!
//! Without the feature, [`CudaDevice`] and [`CudaMatrix`] keep their names
//! and [`CudaDevice::new`] fails with [`crate::Error::CudaNotBuilt`].

#[cfg(feature = "cuda")]
mod driver;
#[cfg(not(feature = "cuda"))]
mod missing;
#[cfg(feature = "cuda")]
pub mod nvrtc;

#[cfg(feature = "cuda")]
pub use driver::{CudaDevice, CudaMatrix};
#[cfg(all(feature = "cuda", test))]
pub(crate) use driver::{SOURCE, SOURCE_NAME};
#[cfg(not(feature = "cuda"))]
pub use missing::{CudaDevice, CudaMatrix};

/// The driver's library, as a refusal names it.
pub const DRIVER_LIBRARY: &str = if cfg!(windows) { "nvcuda.dll" } else { "libcuda.so (the NVIDIA driver)" };

/// The VRAM `--vram-budget auto` gives the model on a CUDA device with
/// `free_bytes` free of `total_bytes` (cuMemGetInfo): the free bytes less a
/// reserve for the driver, the kernels' scratch and the activations, the
/// larger of 1 GiB and 5% of the device (a floor for small cards, a share
/// for large ones); zero where less than that is free.
pub fn auto_vram_budget_bytes(free_bytes: u64, total_bytes: u64) -> u64 {
    const RESERVE_FLOOR_BYTES: u64 = 1 << 30;
    let reserve_bytes = RESERVE_FLOOR_BYTES.max(total_bytes / 20);
    free_bytes.saturating_sub(reserve_bytes)
}

#[cfg(test)]
mod auto_budget_tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn auto_vram_budget_keeps_a_gib_on_small_cards_and_five_percent_on_large() {
        // 8 GiB card, 7 GiB free: 5% is 0.4 GiB, so the 1 GiB floor applies.
        assert_eq!(auto_vram_budget_bytes(7 * GIB, 8 * GIB), 6 * GIB);
        // 140 GiB card (H200-like), all free: 5% is 7 GiB.
        assert_eq!(auto_vram_budget_bytes(140 * GIB, 140 * GIB), 133 * GIB);
        // 20 GiB is exactly where the share meets the floor.
        assert_eq!(auto_vram_budget_bytes(20 * GIB, 20 * GIB), 19 * GIB);
    }

    #[test]
    fn auto_vram_budget_is_zero_when_less_than_the_reserve_is_free() {
        assert_eq!(auto_vram_budget_bytes(GIB / 2, 8 * GIB), 0);
        assert_eq!(auto_vram_budget_bytes(0, 0), 0);
        assert_eq!(auto_vram_budget_bytes(u64::MAX, u64::MAX), u64::MAX - u64::MAX / 20);
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_cuda_says_how_to_build_it() {
        let refused = CudaDevice::new(0).expect_err("no CUDA in this build");
        assert!(refused.to_string().contains("--features cuda"), "{refused}");
    }
}
