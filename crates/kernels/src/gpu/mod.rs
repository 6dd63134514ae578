//! The GPU, behind the feature `gpu`: one device through wgpu (Vulkan,
//! Metal or DX12), q8 and q4 matrices uploaded once in the container's own
//! layout (no re-quantization), and their products and the expert FFN on
//! it.
//!
//! # Bit for bit the CPU's integer path
//!
//! The device computes the integer path's definition ([`crate::int`]):
//! activations are quantized on the host by the CPU's own quantizer
//! ([`crate::act`]), and the WGSL kernel (`products.wgsl`) sums each lane's
//! integer products exactly, accumulates the lanes over the blocks with one
//! fused multiply-add each, and adds the 16 lane sums in the same tree. So a
//! q8/q4 product on the device equals the CPU's bit for bit, which is the
//! route by which the output never depends on where an expert is computed.
//! What that needs of a device, and its tests check: a fused `fma` and
//! correctly rounded `f32` multiplication and addition (Vulkan requires the
//! latter two; lavapipe and the GPUs' native `fma` give the first), and no
//! flush of subnormal values, which only products of tiny scales meet.
//!
//! Everything around the kernel (its parameters, the activations' order,
//! the dispatch, the gated FFN's host side) is shared with the CUDA backend,
//! whose kernel computes the same (`crate::accel`).
//!
//! The gated FFN's activation (SwiGLU, or gpt-oss's clamped form) runs on
//! the host between the gate/up products and the down product: a device's
//! `exp` and division are not correctly rounded (Vulkan allows `3 + 2|x|`
//! ulp for `exp`), so a device SwiGLU could not equal the CPU's.
//!
//! Without the feature, [`Device`] and [`DeviceMatrix`] keep their names
//! and [`Device::new`] fails with [`crate::Error::GpuNotBuilt`], so callers
//! build the same either way.

#[cfg(feature = "gpu")]
mod device;
#[cfg(not(feature = "gpu"))]
mod missing;

#[cfg(feature = "gpu")]
pub use device::{Device, DeviceMatrix};
#[cfg(not(feature = "gpu"))]
pub use missing::{Device, DeviceMatrix};
