//! What a version-2 manifest records of the model besides the config it is
//! derived from: the family and one small record per layer. It is the
//! on-disk counterpart of [`ModelArch`], not its serialization: frozen, so
//! the in-memory model can change freely, and compared with what a
//! reader's own derivation from `hf_config` gives, so a build that would
//! read the config otherwise refuses the container rather than misread it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::{Family, FfnSpec, LayerSpec, MixerSpec, ModelArch};

/// The model a version-2 manifest records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub family: Family,
    /// One per decoder layer, in order.
    pub layers: Vec<LayerRecord>,
}

/// One decoder layer as a version-2 manifest records it: what its blocks
/// are and what a sequence keeps in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub mixer: MixerRecord,
    pub ffn: FfnRecord,
    /// f32 values one token adds to the layer's cache.
    pub cache_floats_per_token: usize,
    /// f32 values of fixed state one sequence keeps in the layer.
    pub state_floats: usize,
}

/// A layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixerRecord {
    Gqa,
    Mla,
    GatedDeltanet,
    Inkling,
    SharedKv,
}

/// A layer's feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnRecord {
    Dense,
    Moe,
}

impl ModelRecord {
    /// The record of `arch`.
    pub fn of(arch: &ModelArch) -> ModelRecord {
        ModelRecord { family: arch.core.family, layers: arch.layers.iter().map(LayerRecord::of).collect() }
    }

    /// Refuses `derived` (the layers a reader derives from the manifest's
    /// config) unless it is the model this record describes, naming the
    /// first layer that differs.
    pub fn check(&self, derived: &ModelArch) -> Result<()> {
        let disagrees = |what: String| Err(Error::SpecDisagrees { what });
        if self.family != derived.core.family {
            return disagrees(format!("family {} recorded, the config is {}", self.family, derived.core.family));
        }
        if self.layers.len() != derived.layers.len() {
            return disagrees(format!(
                "{} layers recorded, the config derives {}",
                self.layers.len(),
                derived.layers.len()
            ));
        }
        let derived_records = derived.layers.iter().map(LayerRecord::of);
        match self.layers.iter().zip(derived_records).enumerate().find(|(_, (stored, own))| *stored != own) {
            Some((layer, (stored, own))) => {
                disagrees(format!("layer {layer}: recorded {}, the config derives {}", stored.line(), own.line()))
            }
            None => Ok(()),
        }
    }
}

impl LayerRecord {
    fn of(layer: &LayerSpec) -> LayerRecord {
        LayerRecord {
            mixer: match layer.mixer {
                MixerSpec::Gqa(_) => MixerRecord::Gqa,
                MixerSpec::Mla(_) => MixerRecord::Mla,
                MixerSpec::GatedDeltaNet(_) => MixerRecord::GatedDeltanet,
                MixerSpec::Inkling(_) => MixerRecord::Inkling,
                MixerSpec::SharedKv(_) => MixerRecord::SharedKv,
            },
            ffn: match layer.ffn {
                FfnSpec::Dense { .. } => FfnRecord::Dense,
                FfnSpec::Moe(_) => FfnRecord::Moe,
            },
            cache_floats_per_token: layer.cache_floats_per_token(),
            state_floats: layer.state_floats(),
        }
    }

    /// The record in words, for errors.
    fn line(&self) -> String {
        format!(
            "{:?} / {:?}, {} f32/token, {} f32 state",
            self.mixer, self.ffn, self.cache_floats_per_token, self.state_floats
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::like_config;

    #[test]
    fn a_record_whose_layer_differs_from_its_config_is_refused_naming_the_layer() {
        let arch = ModelArch::from_config_json(&like_config("qwen3-next-80b-a3b", Some(4)).unwrap()).unwrap();
        let mut record = ModelRecord::of(&arch);
        record.check(&arch).unwrap();
        record.layers[2].cache_floats_per_token += 1;
        let err = record.check(&arch).unwrap_err().to_string();
        assert!(err.contains("layer 2: recorded GatedDeltanet / Moe, 1 f32/token"), "{err}");
    }
}
