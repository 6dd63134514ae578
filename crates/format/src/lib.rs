//! strata-format: model specs, Hugging Face checkpoints and the Strata
//! container.
//!
//! * [`spec`]: config.json (transformers 4.x and 5.x spellings) parsed into a
//!   validated [`ModelSpec`], and the blocks of each layer ([`LayerSpec`]).
//! * `family`: the registry of model families, one file each (olmoe,
//!   qwen3_moe, mixtral, deepseek_v3, glm_moe_dsa, kimi_k25): config fields
//!   and defaults, invariants, tensor naming.
//! * [`names`]: tensor names and shapes per block role, as each family
//!   spells them.
//! * [`checkpoint`]: memory-mapped safetensors checkpoints (single file or
//!   sharded, f32/bf16/f16 or block-scaled FP8, per-expert or fused 3-D
//!   expert tensors).
//! * [`container`]: the on-disk Strata container (docs/FORMAT.md): a
//!   manifest, an mmapped `dense.bin`, and per-layer expert files of
//!   fixed-size, 4 KiB-aligned records for O_DIRECT streaming.
//! * [`convert()`] / [`export()`]: checkpoint -> container (streaming,
//!   atomic) and container -> f32 checkpoint loadable by transformers.
//! * [`npy`]: tiny .npy reader/writer for logits and token ids.
//!
//! **Architecture invariant:** this crate reads and writes files; it runs no
//! model and does no I/O scheduling. Expert files are described here and
//! streamed by another crate.

// The container stores little-endian numbers and views them in place.
#[cfg(not(target_endian = "little"))]
compile_error!("strata-format supports little-endian targets only");

pub mod checkpoint;
mod checksum;
pub mod container;
mod convert;
mod error;
mod export;
mod family;
mod fp8;
pub mod names;
pub mod npy;
mod preset;
pub mod spec;
mod synth;
pub mod temporaries;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;

pub use checkpoint::Checkpoint;
pub use container::{ComponentLayout, Container, DenseId, Embedding, ExpertLayout, Manifest, RowReads};
pub use convert::{CHUNK_ELEMS, ConvertOptions, ConvertReport, convert};
pub use error::{Error, Result};
pub use export::export;
pub use family::check_config_keys;
pub use names::{ExpertProj, TensorDesc, TensorKind};
pub use preset::{Q4_DEFAULT_GROUP, Q8_GROUP, QuantPreset};
pub use spec::{
    CompressedIndexer, Compression, CompressorState, CoreSpec, DsaSpec, ExpertKind, Family, FfnKind, FfnSpec,
    GateActivation, GateRank, GdnDims, GdnProjections, GdnSpec, GqaSpec, HyperHead, IndexerKind, IndexerSpec,
    InklingAttention, LatentMoe, LayerSpec, LayerType, LogScaling, MixerSpec, MlaAttention, MlaSpec, ModelArch,
    ModelSpec, MoeBlock, MoeSpec, MtpForm, MtpOutputNorm, NormKind, NormStyle, PleSpec, QkNorm, QsaSpec, ResidualKind,
    RopeScaling, RopeSpec, RouterKind, RouterSpec, ScoringFunc, SharedExperts, SharedKvAttention, ShortConv, SwiGlu,
};
pub use synth::{LIKE, SynthOptions, like_config, synth, synth_config, with_ngram_vocab_size_base};
