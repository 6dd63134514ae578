//! The largest sizes a config.json (or a manifest's spec) may declare.
//!
//! Each is far above any published model (for scale: DeepSeek-V3 has 61
//! layers, 256 routed experts, a 129,280-token vocabulary, hidden size 7,168,
//! 128 heads; Llama 3.1 405B 126 layers, hidden size 16,384, intermediate
//! size 53,248; Gemma 3 a 262,144-token vocabulary; Llama 4 Scout a
//! 10-million-token context), and low enough that a hostile or mistyped file
//! cannot make parsing, conversion or loading allocate without bound, and
//! that every product of two of them (an embedding's elements, an expert's
//! bytes) fits in 64 bits. docs/FORMAT.md lists them. Files read whole
//! (manifest.json, tokenizer.json) have a size limit for the same reason.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::{
    Compression, FfnSpec, LayerSpec, MixerSpec, ModelArch, MoeBlock, ResidualKind, RouterKind, SharedExperts,
    SharedKvAttention,
};
use crate::error::{Error, Result};

/// Decoder layers (`num_hidden_layers`).
pub const MAX_LAYERS: usize = 1024;
/// Multi-token-prediction layers (`num_nextn_predict_layers`; published
/// models have 1).
pub const MAX_MTP_LAYERS: usize = 16;
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
/// Positions (`max_position_embeddings`, `sliding_window`, `index_topk`,
/// `rel_extent`).
pub const MAX_POSITIONS: usize = 1 << 24;
/// Taps of a short convolution (`conv_kernel_size`; published models have 4).
pub const MAX_CONV_KERNEL: usize = 64;
/// Residual streams of hyper-connections (`hc_mult`; published models have
/// 4).
pub const MAX_STREAMS: usize = 64;
/// Sinkhorn rounds of a hyper-connection's `comb` (`hc_sinkhorn_iters`;
/// published models run 20), each run per token and block.
pub const MAX_SINKHORN_ITERS: usize = 1024;

/// End-of-sequence token ids (`eos_token_id` as a list; published models
/// list at most a handful).
pub const MAX_EOS_TOKENS: usize = 64;

/// Bytes of a container's manifest.json. Its bulk is the expert records'
/// CRC32Cs: `MAX_LAYERS * MAX_EXPERTS` records of at most 11 bytes each
/// (`4294967295,`) are 46 MB; published models need a few MB.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// Bytes of a tokenizer.json, and of each of a model's smaller text files
/// that convert copies beside it. The largest published ones are about
/// 33 MB (Gemma 3's 262,144 tokens); loading one takes a few times its
/// size in memory.
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// Reads the file at `path` whole, refusing one of more than `max_bytes`
/// (the error names the file and the limit) without reading past the limit:
/// the size is checked first and the read is bounded, so neither a huge
/// file nor one that grows (a link to `/dev/zero`) is held in memory.
pub fn read_at_most(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let too_large = || Error::FileTooLarge { path: path.to_owned(), max_bytes };
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let size_bytes = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if size_bytes > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size_bytes).map_err(|_| too_large())?);
    // One byte past the limit tells a file at the limit from a longer one.
    file.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Refuses `value` of `field` above `max`, naming both.
pub(crate) fn at_most(field: &str, value: usize, max: usize) -> Result<usize> {
    if value > max {
        return Err(Error::invalid(field, format!("{value} is more than this build accepts (at most {max})")));
    }
    Ok(value)
}

/// Checks every size of `arch` against its maximum: the common part's,
/// then each layer's.
pub(super) fn check(arch: &ModelArch) -> Result<()> {
    let core = &arch.core;
    let mut sizes = vec![
        ("num_hidden_layers", arch.layers.len(), MAX_LAYERS),
        ("num_nextn_predict_layers", arch.mtp.len(), MAX_MTP_LAYERS),
        ("vocab_size", core.vocab_size, MAX_VOCAB),
        ("hidden_size", core.hidden_size, MAX_HIDDEN),
        ("max_position_embeddings", core.max_position_embeddings, MAX_POSITIONS),
        ("unpadded_vocab_size", core.unpadded_vocab_size.unwrap_or(0), MAX_VOCAB),
    ];
    for layer in arch.layers.iter().chain(&arch.mtp) {
        sizes.extend(layer_sizes(layer));
    }
    for (field, value, max) in sizes {
        at_most(field, value, max)?;
    }
    at_most("eos_token_id (number of ids)", core.eos_token_ids.len(), MAX_EOS_TOKENS)?;
    // Ids at or above vocab_size are accepted as transformers accepts them
    // (class defaults such as OLMoE's eos 50279 outlive a smaller vocabulary
    // in saved configs): such an id is never sampled, and the engine does not
    // insert bos itself. Only ids no vocabulary can have are refused.
    for &id in core.bos_token_id.iter().chain(&core.eos_token_ids) {
        at_most("bos_token_id / eos_token_id", id as usize, MAX_VOCAB - 1)?;
    }
    Ok(())
}

/// Every size of one layer, with the config field that gives it and its
/// maximum.
fn layer_sizes(layer: &LayerSpec) -> Vec<(&'static str, usize, usize)> {
    let mut sizes = match &layer.mixer {
        MixerSpec::Gqa(gqa) => {
            let qsa = gqa.qsa.map_or([0; 4], |q| [q.n_heads, q.head_dim, q.budget_tokens, q.block_tokens]);
            vec![
                ("num_attention_heads", gqa.num_heads, MAX_HEADS),
                ("num_key_value_heads", gqa.num_kv_heads, MAX_HEADS),
                ("head_dim", gqa.head_dim, MAX_HEAD_DIM),
                ("sliding_window", gqa.sliding_window.unwrap_or(0), MAX_POSITIONS),
                ("indexer_n_heads", qsa[0], MAX_HEADS),
                ("indexer_head_dim", qsa[1], MAX_HEAD_DIM),
                ("indexer_budget", qsa[2], MAX_POSITIONS),
                ("indexer_compress_ratio", qsa[3], MAX_POSITIONS),
            ]
        }
        MixerSpec::Mla(mla) => {
            let (topk, head_dim, n_heads, pool) =
                mla.indexer.map_or((0, 0, 0, None), |i| (i.topk, i.head_dim, i.n_heads, i.pool));
            vec![
                ("num_attention_heads", mla.num_heads, MAX_HEADS),
                ("q_lora_rank", mla.dims.q_lora_rank.unwrap_or(0), MAX_HIDDEN),
                ("kv_lora_rank", mla.dims.kv_lora_rank, MAX_HIDDEN),
                ("qk_nope_head_dim", mla.dims.qk_nope_head_dim, MAX_HEAD_DIM),
                ("qk_rope_head_dim", mla.dims.qk_rope_head_dim, MAX_HEAD_DIM),
                ("v_head_dim", mla.dims.v_head_dim, MAX_HEAD_DIM),
                ("index_topk", topk, MAX_POSITIONS),
                ("index_head_dim", head_dim, MAX_HEAD_DIM),
                ("index_n_heads", n_heads, MAX_HEADS),
                ("index_kpool", pool.unwrap_or(0), MAX_POSITIONS),
            ]
        }
        MixerSpec::GatedDeltaNet(gdn) => vec![
            ("linear_num_key_heads", gdn.dims.num_k_heads, MAX_HEADS),
            ("linear_num_value_heads", gdn.dims.num_v_heads, MAX_HEADS),
            ("linear_key_head_dim", gdn.dims.head_k_dim, MAX_HEAD_DIM),
            ("linear_value_head_dim", gdn.dims.head_v_dim, MAX_HEAD_DIM),
        ],
        MixerSpec::Inkling(ink) => ink.sizes().to_vec(),
        MixerSpec::SharedKv(sk) => shared_kv_sizes(sk),
    };
    sizes.extend(layer.ffn_output_conv.map(|conv| ("conv_kernel_size", conv.kernel, MAX_CONV_KERNEL)));
    match &layer.ffn {
        FfnSpec::Dense { intermediate_size, .. } => {
            sizes.push(("intermediate_size", *intermediate_size, MAX_INTERMEDIATE))
        }
        FfnSpec::Moe(moe) => sizes.extend(moe_sizes(moe)),
    }
    match layer.residual {
        ResidualKind::Plain => {}
        ResidualKind::AttentionResiduals { block_size } => sizes.push(("attn_res_block_size", block_size, MAX_LAYERS)),
        ResidualKind::HyperConnections { streams, sinkhorn_iters, .. } => {
            sizes.extend([("hc_mult", streams, MAX_STREAMS), ("hc_sinkhorn_iters", sinkhorn_iters, MAX_SINKHORN_ITERS)])
        }
        ResidualKind::GatedStreams { streams, lowrank } => {
            sizes.extend([("hc_count", streams, MAX_STREAMS), ("hc_lowrank", lowrank, MAX_INTERMEDIATE)])
        }
    }
    sizes
}

/// A shared key-value attention block's sizes (every compress ratio is a
/// number of positions).
fn shared_kv_sizes(sk: &SharedKvAttention) -> Vec<(&'static str, usize, usize)> {
    let (ratio, indexer) = match sk.compression {
        None => (0, None),
        Some(Compression::Heavy { ratio }) => (ratio, None),
        Some(Compression::Sparse { ratio, indexer }) => (ratio, Some(indexer)),
    };
    let (n_heads, head_dim, topk) = indexer.map_or((0, 0, 0), |i| (i.n_heads, i.head_dim, i.topk));
    vec![
        ("num_attention_heads", sk.num_heads, MAX_HEADS),
        ("head_dim", sk.head_dim, MAX_HEAD_DIM),
        ("q_lora_rank", sk.q_lora_rank, MAX_HIDDEN),
        ("sliding_window", sk.window, MAX_POSITIONS),
        ("o_groups", sk.o_groups, MAX_HEADS),
        ("o_lora_rank", sk.o_lora_rank, MAX_HIDDEN),
        ("compress_rates", ratio, MAX_POSITIONS),
        ("index_n_heads", n_heads, MAX_HEADS),
        ("index_head_dim", head_dim, MAX_HEAD_DIM),
        ("index_topk", topk, MAX_POSITIONS),
    ]
}

/// The sizes of a mixture-of-experts block.
fn moe_sizes(moe: &MoeBlock) -> [(&'static str, usize, usize); 5] {
    let (shared, shared_count) = match moe.shared {
        SharedExperts::None => (0, 0),
        SharedExperts::Plain { intermediate_size } | SharedExperts::Gated { intermediate_size } => {
            (intermediate_size, 0)
        }
        SharedExperts::Sink { count, intermediate_size } => (intermediate_size, count),
    };
    let n_group = match moe.router {
        RouterKind::SoftmaxTopK { .. }
        | RouterKind::TopKThenSoftmax
        | RouterKind::SharedExpertSink { .. }
        | RouterKind::SqrtSoftplus { .. }
        | RouterKind::Hash { .. } => 1,
        RouterKind::GroupedSigmoid { n_group, .. } => n_group,
    };
    [
        ("num_experts", moe.num_experts, MAX_EXPERTS),
        ("expert intermediate_size", moe.intermediate_size, MAX_INTERMEDIATE),
        ("n_shared_experts * moe_intermediate_size", shared, MAX_INTERMEDIATE),
        ("n_group", n_group, MAX_EXPERTS),
        ("n_shared_experts", shared_count, MAX_EXPERTS),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_whole_is_refused_past_its_limit_even_when_it_never_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        std::fs::write(&path, [b' '; 10]).unwrap();
        assert_eq!(read_at_most(&path, 10).unwrap(), [b' '; 10]);
        let err = read_at_most(&path, 9).unwrap_err();
        assert!(matches!(&err, Error::FileTooLarge { path: p, max_bytes: 9 } if *p == path), "{err}");
        // A character device reports 0 bytes and never ends.
        let err = read_at_most(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(matches!(err, Error::FileTooLarge { .. }), "{err}");
    }
}
