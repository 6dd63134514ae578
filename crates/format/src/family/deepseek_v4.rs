//! DeepSeek V4 (`deepseek_v4`, `DeepseekV4Config`): shared key-value
//! attention with sinks over a sliding window, on most layers beside a
//! compressor's entries (CSA with its lightning indexer, or HCA), as
//! `layer_types` (or the hub's `compress_ratios`) says; every layer MoE,
//! the first ones hash-routed (`mlp_layer_types`, or `num_hash_layers`),
//! the rest sqrt-softplus routed, every SwiGLU limited; hyper-connections
//! around every block. Two ropes: plain `rope_theta` on sliding layers,
//! `compress_rope_theta` (YaRN) on compressed ones.
//!
//! Tensors are read under transformers' in-memory names, the names its
//! `save_pretrained` writes (`model.layers.{i}.attn.wq_a`, `head.weight`:
//! several parts of one name renamed) and the hub's (the same without the
//! `model.` prefix, `embed`, `norm`, `hc_head_*`); export writes
//! `save_pretrained`'s.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, QUANTIZATION, ROPE};
use super::mla::string_list;
use super::{CORE_READ, CoreDims, Family, FamilyDef, HF_NAMING, Naming};
use crate::error::{Error, Result};
use crate::spec::MtpForm;
use crate::spec::fields::Fields;
use crate::spec::{
    CompressedIndexer, Compression, CoreSpec, ExpertKind, FfnSpec, HyperHead, LayerSpec, MixerSpec, ModelArch,
    MoeBlock, NormKind, ResidualKind, RopeSpec, RouterKind, SharedExperts, SharedKvAttention, SwiGlu, common_config,
    parse_rope, special_tokens,
};

pub(super) struct DeepseekV4;

/// `rope_parameters` as 5.x writes it: one rope per rotation (`main` for
/// sliding layers, `compress` for compressed ones); as the hub writes it,
/// the compressed layers' YaRN alone.
const V4_ROPE: ConfigKeys = ConfigKeys { read: ROPE.read, inert: &[], nested: &[("main", &ROPE), ("compress", &ROPE)] };

/// What a deepseek_v4 checkpoint may hold (`DeepseekV4Config`; the hub's
/// legacy spellings are folded in as its `__post_init__` folds them; the
/// multi-token-prediction module `mtp.*` is not loaded by transformers).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            &["head_dim", "num_key_value_heads", "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window"],
            &["moe_intermediate_size", "num_experts_per_tok", "n_routed_experts", "n_shared_experts"],
            &["scoring_func", "norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "attention_bias"],
            &["layer_types", "compress_ratios", "compress_rates", "compress_rate_csa", "compress_rate_hca"],
            &["mlp_layer_types", "num_hash_layers", "compress_rope_theta", "qk_rope_head_dim"],
            &["original_max_position_embeddings"],
            &["index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters", "hc_eps"],
        ],
        inert: &[HF_INERT, &["num_nextn_predict_layers", "router_jitter_noise", "mlp_bias", "expert_dtype"]],
        nested: &[("rope_parameters", &V4_ROPE), ("rope_scaling", &ROPE), ("quantization_config", &V4_QUANTIZATION)],
    },
    unused_tensors: &["mtp.*"],
    extra_layers_unused: false,
};

/// transformers' conversion mapping for `deepseek_v4` (conversion_mapping.py)
/// run backwards: the in-memory names Strata reads, spelled as
/// `save_pretrained` writes them. The order matters: the indexer's own
/// projections and the compressors' gates are renamed before the general
/// `.self_attn.` and `.gate_proj.` renames would take them.
const SAVED_AS: &[(&str, &str)] = &[
    (".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
    (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
    (".compressor.indexer.", ".indexer.compressor."),
    (".compressor.gate_proj.", ".compressor.wgate."),
    (".self_attn.", ".attn."),
    (".mlp.", ".ffn."),
    (".kv_norm.", ".norm."),
    (".position_bias", ".ape"),
    (".q_a_proj.", ".wq_a."),
    (".q_b_proj.", ".wq_b."),
    (".kv_proj.", ".wkv."),
    (".o_a_proj.", ".wo_a."),
    (".o_b_proj.", ".wo_b."),
    (".q_a_norm.", ".q_norm."),
    (".gate.e_score_correction_bias", ".gate.bias"),
    (".gate_proj.", ".w1."),
    (".down_proj.", ".w2."),
    (".up_proj.", ".w3."),
    (".sinks", ".attn_sink"),
    (".input_layernorm.", ".attn_norm."),
    (".post_attention_layernorm.", ".ffn_norm."),
    ("lm_head.", "head."),
    ("model.hc_head_", "model.hc_head.hc_"),
];

/// The hub's checkpoints: the saved names with the top-level ones renamed
/// and no `model.` prefix.
const HUB_ALIASES: &[(&str, &str)] = &[
    ("model.embed_tokens.", "embed."),
    ("model.hc_head.hc_", "hc_head_"),
    ("model.layers.", "layers."),
    ("model.norm.", "norm."),
];

/// The hub's `quantization_config`: V3's, plus `scale_fmt` (the scale
/// tensors' dtype says it) and `expert_dtype` (here and at the top: it lets
/// the checkpoint decode I8 experts as FP4, which are refused without it,
/// so it never changes what a model computes).
const V4_QUANTIZATION: ConfigKeys = ConfigKeys {
    read: QUANTIZATION.read,
    inert: &[QUANTIZATION.inert[0], &["scale_fmt", "expert_dtype"]],
    nested: &[],
};

const NAMING: Naming = Naming { aliases: HUB_ALIASES, saved_as: SAVED_AS, ..HF_NAMING };

/// Prefixes of DeepSeek V4.1's config keys (`engram_layer_ids`,
/// `kv_source_layers`, `index_source_layers`, `candidate_topk_blocks`, as
/// public ports spell them; transformers 5.23 has no V4.1): any one of them
/// refuses the checkpoint in one line naming everything V4.1 adds, rather
/// than running it as V4 without those parts.
const V4_1_KEY_PREFIXES: &[&str] = &["engram", "kv_source_layers", "index_source_layers", "candidate_"];

/// What DeepSeek V4.1 adds to V4, as the refusal names it.
const V4_1_ADDS: &str = "the engram n-gram memory, compressed-KV (and indexer) sources shared across layers \
                         and the two-level (candidate block) indexer";

/// `DeepseekV4Config`'s class defaults that are not in [`CoreDims`].
const HEAD_DIM: usize = 512;
const ROTARY_DIM: usize = 64;
const Q_LORA_RANK: usize = 1024;
const SLIDING_WINDOW: usize = 128;
const O_GROUPS: usize = 8;
const O_LORA_RANK: usize = 1024;
const EXPERT_WIDTH: usize = 2048;
const NUM_EXPERTS: usize = 256;
const TOP_K: usize = 6;
const ROUTED_SCALING: f64 = 1.5;
const SWIGLU_LIMIT: f64 = 10.0;
const CSA_RATIO: usize = 4;
const HCA_RATIO: usize = 128;
const HASH_LAYERS: usize = 3;
const INDEX_N_HEADS: usize = 64;
const INDEX_HEAD_DIM: usize = 128;
const INDEX_TOPK: usize = 512;
const HC_MULT: usize = 4;
const HC_SINKHORN_ITERS: usize = 20;
const HC_EPS: f64 = 1e-6;
const RMS_NORM_EPS: f64 = 1e-6;
const MAX_POSITIONS: usize = 1_048_576;
const ROPE_THETA: f64 = 10_000.0;
const COMPRESS_ROPE_THETA: f64 = 160_000.0;

/// The attention of a layer, as `layer_types` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttentionType {
    Sliding,
    Sparse,
    Heavy,
}

impl AttentionType {
    fn name(self) -> &'static str {
        match self {
            AttentionType::Sliding => "sliding_attention",
            AttentionType::Sparse => "compressed_sparse_attention",
            AttentionType::Heavy => "heavily_compressed_attention",
        }
    }

    fn parse(name: &str) -> Result<Self> {
        [AttentionType::Sliding, AttentionType::Sparse, AttentionType::Heavy]
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| Error::invalid("layer_types", format!("unknown layer type {name:?}")))
    }
}

/// A list given per layer keeps its first `num_layers` entries (the hub's
/// lists also cover the MTP layer); a shorter one is refused.
fn first_layers<T>(mut items: Vec<T>, field: &str, num_layers: usize) -> Result<Vec<T>> {
    if items.len() < num_layers {
        return Err(Error::invalid(field, format!("{} entries for {num_layers} layers", items.len())));
    }
    items.truncate(num_layers);
    Ok(items)
}

/// `layer_types`, else the hub's `compress_ratios` (0, 4 or 128 per
/// layer), else the class default: two HCA layers, then HCA and CSA
/// alternating.
fn attention_types(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<AttentionType>> {
    if let Some(names) = string_list(cfg, "layer_types")? {
        let types = names.iter().map(|n| AttentionType::parse(n)).collect::<Result<Vec<_>>>()?;
        return first_layers(types, "layer_types", num_layers);
    }
    if let Some(ratios) = cfg.usize_list("compress_ratios")? {
        let types = ratios
            .iter()
            .map(|r| match r {
                0 => Ok(AttentionType::Sliding),
                4 => Ok(AttentionType::Sparse),
                128 => Ok(AttentionType::Heavy),
                other => Err(Error::invalid("compress_ratios", format!("{other} is not 0, 4 or 128"))),
            })
            .collect::<Result<Vec<_>>>()?;
        return first_layers(types, "compress_ratios", num_layers);
    }
    let alternating = |l: usize| if l % 2 == 1 { AttentionType::Sparse } else { AttentionType::Heavy };
    Ok((0..num_layers).map(|l| if l < 2 { AttentionType::Heavy } else { alternating(l - 2) }).collect())
}

/// Whether each layer is hash-routed: `mlp_layer_types`, else the first
/// `num_hash_layers`.
fn hash_layers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let Some(names) = string_list(cfg, "mlp_layer_types")? else {
        let hashed = cfg.usize("num_hash_layers")?.unwrap_or(HASH_LAYERS);
        return Ok((0..num_layers).map(|l| l < hashed).collect());
    };
    let kinds = names
        .iter()
        .map(|n| match n.as_str() {
            "hash_moe" => Ok(true),
            "moe" => Ok(false),
            other => Err(Error::invalid("mlp_layer_types", format!("unknown layer type {other:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    first_layers(kinds, "mlp_layer_types", num_layers)
}

/// `(CSA, HCA)` tokens per entry: `compress_rates` by type name, the
/// legacy scalars winning.
fn compress_rates(cfg: &Fields<'_>) -> Result<(usize, usize)> {
    let rates = cfg.object("compress_rates")?;
    let rate = |scalar: &str, name: &str, default: usize| -> Result<usize> {
        if let Some(n) = cfg.usize(scalar)? {
            return Ok(n);
        }
        match rates.and_then(|r| r.get(name)) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| Error::invalid("compress_rates", format!("{name}: {v} is not a count"))),
        }
    };
    Ok((
        rate("compress_rate_csa", AttentionType::Sparse.name(), CSA_RATIO)?,
        rate("compress_rate_hca", AttentionType::Heavy.name(), HCA_RATIO)?,
    ))
}

/// The two ropes `(main, compress)`, resolved as `__post_init__` does:
/// nested `main` / `compress` objects as given; else a plain `rope_theta`
/// rope and the compressed layers' `compress_rope_theta` with the config's
/// rope (YaRN's attention factor 1 unless given).
fn ropes(cfg: &Fields<'_>, head_dim: usize, max_positions: usize) -> Result<(RopeSpec, RopeSpec)> {
    let partial = match (cfg.f64("partial_rotary_factor")?, cfg.usize("qk_rope_head_dim")?) {
        (Some(f), _) => f,
        (None, Some(rope_dim)) => rope_dim as f64 / head_dim as f64,
        (None, None) => ROTARY_DIM as f64 / HEAD_DIM as f64,
    };
    let nested = cfg.object("rope_parameters")?.and_then(|p| match (p.get("main"), p.get("compress")) {
        (Some(Value::Object(main)), Some(Value::Object(compress))) => Some((main.clone(), compress.clone())),
        _ => None,
    });
    let (main, compress) = match nested {
        Some(both) => both,
        None => {
            let given = match cfg.object("rope_scaling")? {
                Some(p) => Some(p),
                None => cfg.object("rope_parameters")?,
            };
            let mut compress = given.cloned().unwrap_or_default();
            compress.remove("main");
            compress.remove("compress");
            let theta = cfg.f64("rope_theta")?.unwrap_or(ROPE_THETA);
            let compress_theta = cfg.f64("compress_rope_theta")?.unwrap_or(COMPRESS_ROPE_THETA);
            compress.insert("rope_theta".into(), json!(compress_theta));
            let rope_type = compress.get("rope_type").or_else(|| compress.get("type")).and_then(Value::as_str);
            if rope_type == Some("yarn") && !compress.contains_key("attention_factor") {
                compress.insert("attention_factor".into(), json!(1.0));
            }
            let main =
                Map::from_iter([("rope_type".to_owned(), json!("default")), ("rope_theta".into(), json!(theta))]);
            (main, compress)
        }
    };
    let read = |params: Map<String, Value>| {
        let mut root = Map::from_iter([
            ("rope_parameters".to_owned(), Value::Object(params)),
            ("partial_rotary_factor".into(), json!(partial)),
        ]);
        if let Some(n) = cfg.raw("original_max_position_embeddings") {
            root.insert("original_max_position_embeddings".into(), n.clone());
        }
        parse_rope(&Fields { map: &root, prefix: "" }, ROPE_THETA, true, head_dim, max_positions)
    };
    Ok((read(main)?, read(compress)?))
}

/// Refuses what V4's config class would take but its model cannot run, and
/// a V4.1 config, naming the key.
fn refuse_unsupported(root: &Map<String, Value>, cfg: &Fields<'_>) -> Result<()> {
    if let Some(key) = root.keys().find(|k| V4_1_KEY_PREFIXES.iter().any(|p| k.starts_with(p))) {
        return Err(Error::invalid(
            key.as_str(),
            format!(
                "a DeepSeek V4.1 checkpoint: V4.1 adds {V4_1_ADDS}, which transformers has no reference for and Strata does not run"
            ),
        ));
    }
    if let Some(func) = cfg.str("scoring_func")?
        && func != "sqrtsoftplus"
    {
        return Err(Error::invalid("scoring_func", format!("{func:?} is not supported (only \"sqrtsoftplus\")")));
    }
    if cfg.bool("norm_topk_prob")? == Some(false) {
        return Err(Error::invalid("norm_topk_prob", "DeepSeek V4's router always renormalises"));
    }
    if cfg.bool("attention_bias")? == Some(true) {
        return Err(Error::invalid("attention_bias", "DeepSeek V4's attention has no biases"));
    }
    if let Some(shared) = cfg.usize("n_shared_experts")?
        && shared != 1
    {
        // DeepseekV4MLP is one expert `moe_intermediate_size` wide (its
        // config maps `intermediate_size` there), whatever the count says.
        return Err(Error::invalid("n_shared_experts", format!("{shared}: DeepSeek V4 has one shared expert")));
    }
    if let Some(kv_heads) = cfg.usize("num_key_value_heads")?
        && kv_heads != 1
    {
        return Err(Error::invalid("num_key_value_heads", format!("{kv_heads}: DeepSeek V4 shares one kv head")));
    }
    Ok(())
}

impl FamilyDef for DeepseekV4 {
    fn model_type(&self) -> &'static str {
        "deepseek_v4"
    }

    fn architecture(&self) -> &'static str {
        "DeepseekV4ForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let cfg = Fields { map: root, prefix: "" };
        refuse_unsupported(root, &cfg)?;
        let dims = CoreDims::read(&cfg)?;
        let eps = cfg.f64("rms_norm_eps")?.unwrap_or(RMS_NORM_EPS) as f32;
        let max_positions = cfg.usize("max_position_embeddings")?.unwrap_or(MAX_POSITIONS);
        let head_dim = cfg.usize("head_dim")?.unwrap_or(HEAD_DIM);
        let (bos_token_id, eos_token_ids) = special_tokens(&cfg, (Some(0), vec![1]))?;
        let core = CoreSpec {
            family: Family::DeepseekV4,
            vocab_size: dims.vocab_size,
            hidden_size: dims.hidden_size,
            max_position_embeddings: max_positions,
            tie_word_embeddings: cfg.bool("tie_word_embeddings")?.unwrap_or(false),
            final_norm: NormKind::Weight { eps },
            bos_token_id,
            eos_token_ids,
            embed_norm: None,
            logits_mup_divisor: None,
            unpadded_vocab_size: None,
        };
        let (main_rope, compress_rope) = ropes(&cfg, head_dim, max_positions)?;
        let (csa_ratio, hca_ratio) = compress_rates(&cfg)?;
        let indexer = CompressedIndexer {
            n_heads: cfg.usize("index_n_heads")?.unwrap_or(INDEX_N_HEADS),
            head_dim: cfg.usize("index_head_dim")?.unwrap_or(INDEX_HEAD_DIM),
            topk: cfg.usize("index_topk")?.unwrap_or(INDEX_TOPK),
        };
        let attention = SharedKvAttention {
            num_heads: dims.num_heads,
            head_dim,
            q_lora_rank: cfg.usize("q_lora_rank")?.unwrap_or(Q_LORA_RANK),
            rope: main_rope,
            window: cfg.usize("sliding_window")?.unwrap_or(SLIDING_WINDOW),
            o_groups: cfg.usize("o_groups")?.unwrap_or(O_GROUPS),
            o_lora_rank: cfg.usize("o_lora_rank")?.unwrap_or(O_LORA_RANK),
            eps,
            compression: None,
        };
        let expert_width = cfg.usize("moe_intermediate_size")?.unwrap_or(EXPERT_WIDTH);
        let scaling = cfg.f64("routed_scaling_factor")?.unwrap_or(ROUTED_SCALING);
        let moe = MoeBlock {
            num_experts: cfg.usize("n_routed_experts")?.unwrap_or(NUM_EXPERTS),
            top_k: cfg.usize("num_experts_per_tok")?.unwrap_or(TOP_K),
            intermediate_size: expert_width,
            router: RouterKind::SqrtSoftplus { scaling },
            shared: SharedExperts::Plain { intermediate_size: expert_width },
            experts: ExpertKind::SwiGlu,
            swiglu: SwiGlu::Limited { limit: cfg.f64("swiglu_limit")?.unwrap_or(SWIGLU_LIMIT) as f32 },
            latent: None,
        };
        let residual = ResidualKind::HyperConnections {
            streams: cfg.usize("hc_mult")?.unwrap_or(HC_MULT),
            sinkhorn_iters: cfg.usize("hc_sinkhorn_iters")?.unwrap_or(HC_SINKHORN_ITERS),
            eps: cfg.f64("hc_eps")?.unwrap_or(HC_EPS) as f32,
            head: HyperHead::Sigmoid,
        };
        let types = attention_types(&cfg, dims.num_layers)?;
        let hashed = hash_layers(&cfg, dims.num_layers)?;
        let layer = |(kind, hash): (&AttentionType, &bool)| {
            let (rope, compression) = match kind {
                AttentionType::Sliding => (main_rope, None),
                AttentionType::Sparse => (compress_rope, Some(Compression::Sparse { ratio: csa_ratio, indexer })),
                AttentionType::Heavy => (compress_rope, Some(Compression::Heavy { ratio: hca_ratio })),
            };
            let router = if *hash { RouterKind::Hash { scaling } } else { RouterKind::SqrtSoftplus { scaling } };
            LayerSpec {
                mixer: MixerSpec::SharedKv(SharedKvAttention { rope, compression, ..attention }),
                ffn: FfnSpec::Moe(MoeBlock { router, ..moe }),
                norm: NormKind::Weight { eps },
                residual,
                ffn_output_conv: None,
                ple: None,
            }
        };
        // `mtp.*` is known and left unread (the draft layers run for DeepSeek-V3's layout only).
        Ok(ModelArch {
            core,
            layers: types.iter().zip(&hashed).map(layer).collect(),
            mtp: Vec::new(),
            mtp_form: MtpForm::DEEPSEEK_V3,
        })
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        let ours = arch.layers.iter().all(|l| {
            let attention = matches!(l.mixer, MixerSpec::SharedKv(_));
            let ffn = matches!(&l.ffn, FfnSpec::Moe(m)
                if matches!(m.router, RouterKind::SqrtSoftplus { .. } | RouterKind::Hash { .. }));
            let limited = matches!(&l.ffn, FfnSpec::Moe(m) if matches!(m.swiglu, SwiGlu::Limited { .. }));
            let residual = matches!(l.residual, ResidualKind::HyperConnections { head: HyperHead::Sigmoid, .. });
            attention && ffn && limited && residual
        });
        if !ours {
            return Err(Error::invalid(
                "model_type",
                "deepseek_v4 is shared-kv attention, limited SwiGLU experts routed by sqrt-softplus or hash, \
                 and hyper-connections throughout",
            ));
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let shared_kv = |l: &LayerSpec| match l.mixer {
            MixerSpec::SharedKv(sk) => Some(sk),
            _ => None,
        };
        let blocks = arch.layers.first().and_then(|l| Some((shared_kv(l)?, l.ffn, l.residual)));
        let Some((attention, FfnSpec::Moe(moe), ResidualKind::HyperConnections { streams, sinkhorn_iters, eps, .. })) =
            blocks
        else {
            // validate() guarantees these blocks on every layer.
            return Value::Null;
        };
        let attentions: Vec<SharedKvAttention> = arch.layers.iter().filter_map(shared_kv).collect();
        let rope_of = |compressed: bool| {
            attentions.iter().find(|a| a.compression.is_some() == compressed).map_or(attention.rope, |a| a.rope)
        };
        let rope_json = |rope: &RopeSpec| {
            common_config(&arch.core, arch.layers.len(), (attention.num_heads, 1), rope, attention.head_dim)
                .remove("rope_parameters")
                .unwrap_or(Value::Null)
        };
        let (main, compress) = (rope_of(false), rope_of(true));
        let mut c = common_config(&arch.core, arch.layers.len(), (attention.num_heads, 1), &main, attention.head_dim);
        c.insert("rope_parameters".into(), json!({"main": rope_json(&main), "compress": rope_json(&compress)}));
        let (mut csa_ratio, mut hca_ratio, mut indexer) = (CSA_RATIO, HCA_RATIO, None);
        let types: Vec<&str> = attentions
            .iter()
            .map(|a| match a.compression {
                None => AttentionType::Sliding.name(),
                Some(Compression::Sparse { ratio, indexer: i }) => {
                    (csa_ratio, indexer) = (ratio, Some(i));
                    AttentionType::Sparse.name()
                }
                Some(Compression::Heavy { ratio }) => {
                    hca_ratio = ratio;
                    AttentionType::Heavy.name()
                }
            })
            .collect();
        let mlp_types: Vec<&str> = arch
            .layers
            .iter()
            .map(|l| match l.ffn {
                FfnSpec::Moe(MoeBlock { router: RouterKind::Hash { .. }, .. }) => "hash_moe",
                _ => "moe",
            })
            .collect();
        let scaling = match moe.router {
            RouterKind::SqrtSoftplus { scaling } | RouterKind::Hash { scaling } => scaling,
            _ => ROUTED_SCALING,
        };
        let SwiGlu::Limited { limit: swiglu_limit } = moe.swiglu else { return Value::Null };
        let indexer =
            indexer.unwrap_or(CompressedIndexer { n_heads: INDEX_N_HEADS, head_dim: INDEX_HEAD_DIM, topk: INDEX_TOPK });
        let fields = [
            ("num_key_value_heads", json!(1)),
            ("head_dim", json!(attention.head_dim)),
            ("q_lora_rank", json!(attention.q_lora_rank)),
            ("sliding_window", json!(attention.window)),
            ("o_groups", json!(attention.o_groups)),
            ("o_lora_rank", json!(attention.o_lora_rank)),
            ("layer_types", json!(types)),
            (
                "compress_rates",
                json!({AttentionType::Sparse.name(): csa_ratio, AttentionType::Heavy.name(): hca_ratio}),
            ),
            ("index_n_heads", json!(indexer.n_heads)),
            ("index_head_dim", json!(indexer.head_dim)),
            ("index_topk", json!(indexer.topk)),
            ("mlp_layer_types", json!(mlp_types)),
            ("moe_intermediate_size", json!(moe.intermediate_size)),
            ("n_routed_experts", json!(moe.num_experts)),
            ("num_experts_per_tok", json!(moe.top_k)),
            ("n_shared_experts", json!(1)),
            ("scoring_func", json!("sqrtsoftplus")),
            ("routed_scaling_factor", json!(scaling)),
            ("swiglu_limit", json!(crate::spec::f32_to_json(swiglu_limit))),
            ("hc_mult", json!(streams)),
            ("hc_sinkhorn_iters", json!(sinkhorn_iters)),
            ("hc_eps", json!(crate::spec::f32_to_json(eps))),
        ];
        c.extend(fields.into_iter().map(|(k, v)| (k.to_owned(), v)));
        Value::Object(c)
    }
}

#[cfg(test)]
mod tests;
