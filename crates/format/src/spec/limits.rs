//! The largest sizes a config.json (or a manifest's spec) may declare.
//!
//! Each is far above any published model (for scale: DeepSeek-V3 has 61
//! layers, 256 routed experts, a 129,280-token vocabulary, hidden size 7,168,
//! 128 heads; Llama 3.1 405B 126 layers, hidden size 16,384, intermediate
//! size 53,248; Gemma 3 a 262,144-token vocabulary; Llama 4 Scout a
//! 10-million-token context), and low enough that a hostile or mistyped file
//! cannot make parsing, conversion or loading allocate without bound, and
//! that every product of two of them (an embedding's elements, an expert's
//! bytes) fits in 64 bits. docs/FORMAT.md lists them.

use super::ModelSpec;
use crate::error::{Error, Result};

/// Decoder layers (`num_hidden_layers`).
pub const MAX_LAYERS: usize = 1024;
/// Routed experts per MoE layer.
pub const MAX_EXPERTS: usize = 4096;
/// Tokens in the vocabulary (`vocab_size`).
pub const MAX_VOCAB: usize = 1 << 22;
/// Width of the residual stream (`hidden_size`), and of MLA's low-rank
/// projections (`q_lora_rank`, `kv_lora_rank`).
pub const MAX_HIDDEN: usize = 1 << 16;
/// Width of a feed-forward block: dense, expert or shared.
pub const MAX_INTERMEDIATE: usize = 1 << 18;
/// Attention heads (query, key/value, indexer).
pub const MAX_HEADS: usize = 1024;
/// Width of one attention head (and MLA's per-head dimensions).
pub const MAX_HEAD_DIM: usize = 4096;
/// Positions (`max_position_embeddings`, `sliding_window`, `index_topk`).
pub const MAX_POSITIONS: usize = 1 << 24;

/// End-of-sequence token ids (`eos_token_id` as a list; published models
/// list at most a handful).
pub const MAX_EOS_TOKENS: usize = 64;

/// Refuses `value` of `field` above `max`, naming both.
pub(crate) fn at_most(field: &str, value: usize, max: usize) -> Result<usize> {
    if value > max {
        return Err(Error::invalid(field, format!("{value} is more than this build accepts (at most {max})")));
    }
    Ok(value)
}

/// Checks every size of `spec` against its maximum.
pub(super) fn check(spec: &ModelSpec) -> Result<()> {
    let mut sizes = vec![
        ("num_hidden_layers", spec.num_layers, MAX_LAYERS),
        ("num_experts", spec.moe.num_experts, MAX_EXPERTS),
        ("vocab_size", spec.vocab_size, MAX_VOCAB),
        ("hidden_size", spec.hidden_size, MAX_HIDDEN),
        ("num_attention_heads", spec.num_heads, MAX_HEADS),
        ("num_key_value_heads", spec.num_kv_heads, MAX_HEADS),
        ("head_dim", spec.head_dim, MAX_HEAD_DIM),
        ("expert intermediate_size", spec.moe.intermediate_size, MAX_INTERMEDIATE),
        ("intermediate_size", spec.dense_intermediate_size, MAX_INTERMEDIATE),
        ("n_shared_experts * moe_intermediate_size", spec.shared_intermediate_size.unwrap_or(0), MAX_INTERMEDIATE),
        ("max_position_embeddings", spec.max_position_embeddings, MAX_POSITIONS),
        ("sliding_window", spec.sliding_window.unwrap_or(0), MAX_POSITIONS),
        ("n_group", spec.router.n_group, MAX_EXPERTS),
    ];
    if let Some(mla) = &spec.mla {
        sizes.extend([
            ("q_lora_rank", mla.q_lora_rank.unwrap_or(0), MAX_HIDDEN),
            ("kv_lora_rank", mla.kv_lora_rank, MAX_HIDDEN),
            ("qk_nope_head_dim", mla.qk_nope_head_dim, MAX_HEAD_DIM),
            ("qk_rope_head_dim", mla.qk_rope_head_dim, MAX_HEAD_DIM),
            ("v_head_dim", mla.v_head_dim, MAX_HEAD_DIM),
        ]);
    }
    if let Some(dsa) = &spec.dsa {
        sizes.extend([
            ("index_topk", dsa.index_topk, MAX_POSITIONS),
            ("index_head_dim", dsa.index_head_dim, MAX_HEAD_DIM),
            ("index_n_heads", dsa.index_n_heads, MAX_HEADS),
        ]);
    }
    for (field, value, max) in sizes {
        at_most(field, value, max)?;
    }
    at_most("eos_token_id (number of ids)", spec.eos_token_ids.len(), MAX_EOS_TOKENS)?;
    // Ids at or above vocab_size are accepted as transformers accepts them
    // (class defaults such as OLMoE's eos 50279 outlive a smaller vocabulary
    // in saved configs): such an id is never sampled, and the engine does not
    // insert bos itself. Only ids no vocabulary can have are refused.
    for &id in spec.bos_token_id.iter().chain(&spec.eos_token_ids) {
        at_most("bos_token_id / eos_token_id", id as usize, MAX_VOCAB - 1)?;
    }
    Ok(())
}
