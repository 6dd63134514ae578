//! Routed experts in VRAM: a [`DeviceTier`] of experts' matrices on a GPU
//! (wgpu's or CUDA's, one [`Accelerator`]), filled from the RAM cache or the
//! disk, its experts computed there.
//!
//! The device's gated FFN is the CPU's integer path bit for bit
//! (`strata_kernels::accel`), so an expert gives the same output whichever
//! tier it came from: the VRAM budget changes speed, never results. An
//! expert whose matrices have no device kernel (f32, bf16, mxfp4 or other
//! groups) or that the tier cannot hold runs on the CPU from its record.

use std::sync::Arc;
use std::time::Instant;

use strata_format::ExpertLayout;
use strata_kernels::{Accelerator, AcceleratorMatrix, GatedAct, Threads};
use strata_tier::{DeviceTier, ExpertKey, Record};

use crate::{Error, Result};

/// An expert's gate, up and down matrices on the device.
pub type ExpertOnDevice = [AcceleratorMatrix; 3];

/// A GPU and the experts it holds.
#[derive(Clone, Copy)]
pub struct VramExperts<'a> {
    pub device: &'a Accelerator,
    pub tier: &'a DeviceTier<ExpertOnDevice>,
}

impl VramExperts<'_> {
    /// A lease on `key`'s copy on the device if the tier holds it.
    pub(crate) fn lookup(&self, key: ExpertKey) -> Option<Arc<ExpertOnDevice>> {
        self.tier.lookup(key)
    }

    /// `key`'s matrices from `record` uploaded (and held if the tier makes
    /// room), or `None` where they stay on the CPU: the tier could never
    /// hold the record, a matrix has no device kernel, or the device is out
    /// of memory (counted, and said once). Charged the
    /// record's length, an upper bound of its buffers on the device.
    pub(crate) fn upload(
        &self,
        key: ExpertKey,
        layout: &ExpertLayout,
        record: &Record,
    ) -> Result<Option<Arc<ExpertOnDevice>>> {
        if !self.tier.could_hold(record.len()) {
            return Ok(None);
        }
        let started = Instant::now();
        let matrices = layout.matrices(record.as_slice()).map_err(|source| Error::Record {
            layer: key.layer,
            expert: key.expert,
            source: Box::new(source),
        })?;
        let [gate, up, down] = &matrices;
        let uploaded = (|| {
            Ok::<_, strata_kernels::Error>([
                self.device.upload(gate)?,
                self.device.upload(up)?,
                self.device.upload(down)?,
            ])
        })();
        let on_device = match uploaded {
            Ok(on_device) => on_device,
            Err(e @ strata_kernels::Error::GpuOutOfMemory { .. }) => {
                if self.tier.refuse() {
                    tracing::warn!("{e}: routed experts the device refuses run on the CPU (counted in the run stats)");
                }
                return Ok(None);
            }
            Err(_) => return Ok(None),
        };
        Ok(Some(self.tier.admit(key, on_device, record.len(), started.elapsed())))
    }

    /// The expert on `xs` (`[tokens, hidden]`) on the device.
    pub(crate) fn compute(
        &self,
        threads: &Threads,
        [gate, up, down]: &ExpertOnDevice,
        act: GatedAct<'_>,
        xs: &[f32],
    ) -> Vec<f32> {
        let mut ys = vec![0.0f32; xs.len()];
        let n = xs.len() / gate.cols();
        self.device.gated_ffn([gate, up, down], act, threads.activations(), xs, n, &mut ys);
        ys
    }
}
