//! Quantization presets: which [`QuantFormat`] each kind of tensor gets.
//!
//! | preset | routed experts | dense 2-D matrices (incl. embeddings, lm_head) | norms, biases, routers |
//! |--------|----------------|-----------------------------------------------|------------------------|
//! | f32    | f32            | f32                                           | f32                    |
//! | bf16   | bf16           | bf16                                          | f32                    |
//! | q8     | q8 (group 32)  | q8 (group 32)                                 | f32                    |
//! | q4     | q4 (group 64)  | q8 (group 32)                                 | f32                    |
//!
//! Rationale (also in docs/FORMAT.md): experts are >90% of the bytes of a MoE
//! model and are what streams from disk, so they take the most compression;
//! attention, embeddings and lm_head are touched by every token and are small
//! in total, so they stay at q8 where error hardly shows; 1-D tensors and
//! routers are tiny and numerically sensitive (a router error changes which
//! experts run), so they are never quantized.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use strata_kernels::QuantFormat;

use crate::error::{Error, Result};
use crate::names::TensorKind;

/// Group size of every q8 tensor.
pub const Q8_GROUP: usize = 32;
/// Default group size of q4 experts.
pub const Q4_DEFAULT_GROUP: usize = 64;

/// A named quantization policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantPreset {
    F32,
    Bf16,
    Q8,
    Q4,
}

impl QuantPreset {
    pub const ALL: [QuantPreset; 4] = [QuantPreset::F32, QuantPreset::Bf16, QuantPreset::Q8, QuantPreset::Q4];

    pub fn name(self) -> &'static str {
        match self {
            QuantPreset::F32 => "f32",
            QuantPreset::Bf16 => "bf16",
            QuantPreset::Q8 => "q8",
            QuantPreset::Q4 => "q4",
        }
    }

    /// Format of routed-expert matrices.
    pub fn expert_format(self) -> QuantFormat {
        match self {
            QuantPreset::F32 => QuantFormat::F32,
            QuantPreset::Bf16 => QuantFormat::Bf16,
            QuantPreset::Q8 => QuantFormat::Q8,
            QuantPreset::Q4 => QuantFormat::Q4,
        }
    }

    /// Format of non-expert 2-D weight matrices.
    pub fn dense_matrix_format(self) -> QuantFormat {
        match self {
            QuantPreset::F32 => QuantFormat::F32,
            QuantPreset::Bf16 => QuantFormat::Bf16,
            QuantPreset::Q8 | QuantPreset::Q4 => QuantFormat::Q8,
        }
    }

    /// Format of a non-expert tensor of `kind`.
    pub fn dense_format(self, kind: TensorKind) -> QuantFormat {
        if kind.is_matrix() { self.dense_matrix_format() } else { QuantFormat::F32 }
    }
}

impl fmt::Display for QuantPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantPreset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        QuantPreset::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| Error::InvalidOption {
            option: "preset".into(),
            reason: format!("unknown quant preset {s:?} (known: f32, bf16, q8, q4)"),
        })
    }
}

/// Group size for `format`: q8 is fixed at [`Q8_GROUP`], q4 uses `q4_group`,
/// unscaled formats and mxfp4 (whose blocks are fixed) have none (0 on disk).
pub(crate) fn group_for(format: QuantFormat, q4_group: usize) -> usize {
    match format {
        QuantFormat::Q8 => Q8_GROUP,
        QuantFormat::Q4 => q4_group,
        QuantFormat::F32 | QuantFormat::Bf16 | QuantFormat::Mxfp4 => 0,
    }
}
