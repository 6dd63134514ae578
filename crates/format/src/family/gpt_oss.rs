//! gpt-oss (`gpt_oss`, `GptOssConfig`): grouped-query attention with
//! q/k/v/o biases and a learned sink per head, sliding-window and full
//! layers as `layer_types` says (from a sliding layer, alternating, when
//! absent), YaRN; every layer MoE: a router with a bias that takes the
//! top-k of its logits, then a softmax over them, and experts with biases
//! and the clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`). Its experts
//! are published fused with gate and up interleaved, dequantized or as the
//! hub's MXFP4 blocks and scales (`checkpoint::InterleavedExperts`).

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, Naming, gqa};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{ExpertKind, FfnKind, FfnSpec, MixerSpec, ModelArch, RopeScaling, RopeSpec, RouterKind, parse_rope};

pub(super) struct GptOss;

/// What a gpt_oss checkpoint may hold (`GptOssConfig`; the Hub's
/// `experts_per_token` and `initial_context_length` come from OpenAI's
/// own code and are not read by transformers).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            gqa::READ,
            &["num_local_experts", "num_experts", "attention_bias", "swiglu_alpha", "swiglu_limit"],
            &["sliding_window", "layer_types", "original_max_position_embeddings"],
        ],
        inert: &[HF_INERT, &["experts_per_token", "initial_context_length"]],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: false,
};

const DEFAULTS: gqa::Defaults = gqa::Defaults {
    num_kv_heads: Some(8),
    rms_norm_eps: 1e-5,
    max_position_embeddings: 131_072,
    rope_theta: 150_000.0,
    bos_token_id: None,
    eos_token_ids: &[],
    expert_width: "intermediate_size",
    expert_count: ("num_local_experts", "num_experts"),
};

/// `GptOssConfig`'s defaults for the fields only gpt-oss reads.
const SWIGLU_ALPHA: f64 = 1.702;
const SWIGLU_LIMIT: f64 = 7.0;
const SLIDING_WINDOW: usize = 128;

const NAMING: Naming = Naming {
    model_prefix: "model.",
    lm_head: "lm_head.weight",
    moe_module: "mlp",
    expert_projections: ["gate_proj", "up_proj", "down_proj"],
    aliases: &[],
    saved_as: &[(".mlp.gate.", ".mlp.router.")],
};

/// `layer_types`, else `GptOssConfig`'s default: sliding on even layers.
fn sliding_layers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let Some(types) = cfg.raw("layer_types").filter(|v| !v.is_null()) else {
        return Ok((0..num_layers).map(|l| l % 2 == 0).collect());
    };
    let items = types.as_array().ok_or_else(|| Error::invalid("layer_types", "must be a list of strings"))?;
    if items.len() != num_layers {
        return Err(Error::invalid("layer_types", format!("{} entries for {num_layers} layers", items.len())));
    }
    items
        .iter()
        .map(|item| match item.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => {
                Err(Error::invalid("layer_types", format!("{item} is not \"sliding_attention\" or \"full_attention\"")))
            }
        })
        .collect()
}

/// The rope: the config's (YaRN accepted), else `GptOssConfig`'s default
/// YaRN (factor 32 over 4096 positions, not truncated).
fn rope(cfg: &Fields<'_>, head_dim: usize, max_positions: usize) -> Result<RopeSpec> {
    if cfg.object("rope_scaling")?.is_some() || cfg.object("rope_parameters")?.is_some() {
        return parse_rope(cfg, DEFAULTS.rope_theta, true, head_dim, max_positions);
    }
    let scaling = RopeScaling::Yarn {
        factor: 32.0,
        original_max_position_embeddings: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale: 0.0,
        mscale_all_dim: 0.0,
        attention_factor: None,
        truncate: false,
    };
    Ok(RopeSpec { theta: cfg.f64("rope_theta")?.unwrap_or(DEFAULTS.rope_theta), scaling, rotary_dim: head_dim })
}

impl FamilyDef for GptOss {
    fn model_type(&self) -> &'static str {
        "gpt_oss"
    }

    fn architecture(&self) -> &'static str {
        "GptOssForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        // The shared GQA reader refuses YaRN; gpt-oss's rope is read here.
        let mut plain = root.clone();
        plain.remove("rope_scaling");
        plain.remove("rope_parameters");
        let cfg = Fields { map: root, prefix: "" };
        let mut parsed = gqa::parse(&plain, Family::GptOss, &DEFAULTS)?;
        let head_dim = parsed.attention.head_dim;
        parsed.attention.rope = Some(rope(&cfg, head_dim, parsed.core.max_position_embeddings)?);
        parsed.attention.bias = cfg.bool("attention_bias")?.unwrap_or(true);
        parsed.attention.sinks = true;
        parsed.ffns.moe.router = RouterKind::TopKThenSoftmax;
        parsed.ffns.moe.experts = ExpertKind::ClampedSwiGlu {
            alpha: cfg.f64("swiglu_alpha")?.unwrap_or(SWIGLU_ALPHA) as f32,
            limit: cfg.f64("swiglu_limit")?.unwrap_or(SWIGLU_LIMIT) as f32,
        };
        let window = match cfg.raw("sliding_window") {
            None => Some(SLIDING_WINDOW),
            Some(_) => cfg.usize("sliding_window")?,
        };
        let sliding = sliding_layers(&cfg, parsed.num_layers)?;
        let full = parsed.attention;
        let kinds = vec![FfnKind::Moe; parsed.num_layers];
        parsed.build(&kinds, |l| {
            let mut gqa = full;
            gqa.sliding_window = if sliding[l] { window } else { None };
            MixerSpec::Gqa(gqa)
        })
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        let ours = arch.layers.iter().all(|l| {
            let attention = matches!(&l.mixer, MixerSpec::Gqa(g) if g.sinks);
            let ffn = matches!(&l.ffn, FfnSpec::Moe(m) if m.router == RouterKind::TopKThenSoftmax
                && matches!(m.experts, ExpertKind::ClampedSwiGlu { limit, .. } if limit >= 0.0));
            attention && ffn
        });
        if !ours {
            return Err(Error::invalid(
                "model_type",
                "gpt_oss is sinks attention and biased clamped experts throughout",
            ));
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let (attention, moe) = gqa::blocks(arch);
        let mut c = gqa::config_json(arch, &attention, &moe);
        let window = arch.layers.iter().find_map(|l| match &l.mixer {
            MixerSpec::Gqa(g) => g.sliding_window,
            _ => None,
        });
        let types: Vec<&str> = arch
            .layers
            .iter()
            .map(|l| match &l.mixer {
                MixerSpec::Gqa(g) if g.sliding_window.is_some() => "sliding_attention",
                _ => "full_attention",
            })
            .collect();
        let ExpertKind::ClampedSwiGlu { alpha, limit } = moe.experts else { unreachable!("validated") };
        c.insert("intermediate_size".into(), json!(moe.intermediate_size));
        c.insert("num_local_experts".into(), json!(moe.num_experts));
        c.insert("attention_bias".into(), json!(attention.bias));
        c.insert("sliding_window".into(), json!(window));
        c.insert("layer_types".into(), json!(types));
        c.insert("swiglu_alpha".into(), json!(alpha));
        c.insert("swiglu_limit".into(), json!(limit));
        Value::Object(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{GqaSpec, LayerSpec, MoeBlock};

    fn testdata(path: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(path);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn gqa(layer: &LayerSpec) -> &GqaSpec {
        match &layer.mixer {
            MixerSpec::Gqa(gqa) => gqa,
            other => panic!("{other:?}"),
        }
    }

    fn moe(layer: &LayerSpec) -> &MoeBlock {
        match &layer.ffn {
            FfnSpec::Moe(moe) => moe,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_fixture_reads_as_transformers_builds_it_in_every_spelling() {
        let arch = ModelArch::from_config_json(&testdata("gpt_oss/hf/config.json")).unwrap();
        let [sliding, full] = &arch.layers[..] else { panic!("two layers") };
        assert_eq!((gqa(sliding).sliding_window, gqa(full).sliding_window), (Some(6), None));
        for layer in [sliding, full] {
            let g = gqa(layer);
            assert!(g.sinks && g.bias && g.qk_norm == crate::spec::QkNorm::None);
            let rope = g.rope.unwrap();
            assert!(matches!(rope.scaling, RopeScaling::Yarn { factor: 4.0, truncate: false, .. }), "{rope:?}");
            assert_eq!((rope.theta, rope.rotary_dim), (150_000.0, 16));
            let m = moe(layer);
            assert_eq!(m.router, RouterKind::TopKThenSoftmax);
            assert_eq!(m.experts, ExpertKind::ClampedSwiGlu { alpha: 1.702, limit: 0.5 });
            assert_eq!((m.num_experts, m.top_k, m.intermediate_size), (4, 2, 32));
        }
        // The hub's 4.x spelling (rope_scaling with rope_type, torch_dtype), with and without MXFP4.
        for other in ["gpt_oss/hf_bf16/config.json", "gpt_oss/hf_mxfp4/config.json"] {
            assert_eq!(ModelArch::from_config_json(&testdata(other)).unwrap(), arch, "{other}");
        }
        let exported = serde_json::to_string(&arch.to_config_json()).unwrap();
        assert_eq!(ModelArch::from_config_json(&exported).unwrap(), arch, "{exported}");
    }

    #[test]
    fn absent_keys_take_gpt_oss_config_defaults() {
        let mut config: Value = serde_json::from_str(&testdata("gpt_oss/hf/config.json")).unwrap();
        let map = config.as_object_mut().unwrap();
        for key in
            ["layer_types", "sliding_window", "rope_parameters", "swiglu_limit", "swiglu_alpha", "attention_bias"]
        {
            map.remove(key);
        }
        map.insert("num_hidden_layers".into(), json!(3));
        let arch = ModelArch::from_config_value(&config).unwrap();
        let windows: Vec<Option<usize>> = arch.layers.iter().map(|l| gqa(l).sliding_window).collect();
        assert_eq!(windows, [Some(128), None, Some(128)], "sliding on even layers, window 128");
        let g = gqa(&arch.layers[1]);
        assert!(g.bias);
        let rope = g.rope.unwrap();
        assert!(matches!(
            rope.scaling,
            RopeScaling::Yarn { factor: 32.0, original_max_position_embeddings: 4096, truncate: false, .. }
        ));
        assert_eq!(rope.theta, 150_000.0);
        assert_eq!(moe(&arch.layers[0]).experts, ExpertKind::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
    }

    #[test]
    fn a_layer_type_that_is_neither_is_refused_naming_the_field() {
        let mut config: Value = serde_json::from_str(&testdata("gpt_oss/hf/config.json")).unwrap();
        config["layer_types"] = json!(["sliding_attention", "linear_attention"]);
        let err = ModelArch::from_config_value(&config).unwrap_err().to_string();
        assert!(err.contains("layer_types"), "{err}");
        config["layer_types"] = json!(["sliding_attention"]);
        let err = ModelArch::from_config_value(&config).unwrap_err().to_string();
        assert!(err.contains("1 entries for 2 layers"), "{err}");
    }

    /// The published gpt-oss-20b and -120b: a ring of 128 positions of 8 kv
    /// heads x 64 (keys and values) on every other layer.
    #[test]
    fn the_published_models_keep_a_ring_of_128_positions_on_half_their_layers() {
        for (name, layers, experts) in [("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)] {
            let arch = ModelArch::from_config_json(&testdata(&format!("gpt_oss_hub/{name}/config.json"))).unwrap();
            assert_eq!((arch.layers.len(), moe(&arch.layers[0]).num_experts), (layers, experts), "{name}");
            let ring_bytes = layers / 2 * 2 * 8 * 64 * 128 * size_of::<f32>();
            assert_eq!(arch.state_bytes_per_sequence(), ring_bytes, "{name}");
            assert_eq!(
                arch.kv_bytes_per_token(),
                layers / 2 * 2 * 8 * 64 * size_of::<f32>(),
                "{name}: full layers' rows"
            );
        }
    }
}
