//! The invariants every model keeps, checked on the architecture: its
//! common part, then each layer's blocks (in this one place, whatever
//! family built them), then the family's own (its file's `validate`).
//! Errors name the config.json field at fault.

use super::{
    CoreSpec, ExpertKind, FfnSpec, GateRank, GdnProjections, GdnSpec, GqaSpec, LayerSpec, MixerSpec, MlaAttention,
    ModelArch, MoeBlock, NormKind, QsaSpec, ResidualKind, RopeScaling, RopeSpec, RouterKind, SharedExperts, SwiGlu,
    limits,
};
use crate::error::{Error, Result};

impl ModelArch {
    /// Checks every invariant the rest of the engine relies on: sizes
    /// within this build's limits (which also keep every product of two
    /// sizes within 64 bits), then the common part, every layer, and
    /// the family's own invariants.
    pub fn validate(&self) -> Result<()> {
        limits::check(self)?;
        self.core.validate()?;
        if self.layers.is_empty() {
            return Err(Error::invalid("num_hidden_layers", "must be > 0"));
        }
        for layer in self.layers.iter().chain(&self.mtp) {
            layer.validate()?;
        }
        // The streams are the stack's: every layer mixes and combines the
        // same ones, and the head collapses them once.
        if self.layers.iter().any(|layer| layer.residual != self.layers[0].residual) {
            return Err(Error::invalid("hc_mult", "every layer needs the same residual streams"));
        }
        self.core.family.def().validate(self)
    }
}

impl CoreSpec {
    fn validate(&self) -> Result<()> {
        positive(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ])?;
        if let Some(unpadded) = self.unpadded_vocab_size
            && !(1..=self.vocab_size).contains(&unpadded)
        {
            return Err(Error::invalid("unpadded_vocab_size", format!("{unpadded} is not in 1..={}", self.vocab_size)));
        }
        if let Some(divisor) = self.logits_mup_divisor
            && !(divisor.is_finite() && divisor > 0.0)
        {
            return Err(Error::invalid("logits_mup_width_multiplier", "must be finite and > 0"));
        }
        if let Some(norm) = &self.embed_norm {
            norm.validate()?;
        }
        self.final_norm.validate()
    }
}

impl LayerSpec {
    /// The invariants of one layer's blocks, whatever its family.
    pub(crate) fn validate(&self) -> Result<()> {
        self.norm.validate()?;
        self.residual.validate()?;
        match &self.mixer {
            MixerSpec::Gqa(gqa) => gqa.validate()?,
            MixerSpec::Mla(mla) => mla.validate()?,
            MixerSpec::GatedDeltaNet(gdn) => gdn.validate()?,
            MixerSpec::Inkling(ink) => ink.validate()?,
            MixerSpec::SharedKv(sk) => {
                sk.rope.validate(sk.head_dim, "partial_rotary_factor")?;
                sk.validate()?
            }
        }
        if let Some(conv) = &self.ffn_output_conv {
            conv.validate()?;
        }
        if let Some(ple) = &self.ple {
            ple.validate()?;
        }
        self.ffn.validate()
    }
}

impl NormKind {
    fn validate(&self) -> Result<()> {
        let eps = self.eps();
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid("rms_norm_eps", "must be finite and > 0"));
        }
        Ok(())
    }
}

impl ResidualKind {
    fn validate(&self) -> Result<()> {
        let (streams, eps) = match *self {
            ResidualKind::Plain => return Ok(()),
            ResidualKind::AttentionResiduals { block_size } => return positive(&[("attn_res_block_size", block_size)]),
            ResidualKind::GatedStreams { streams, lowrank } => {
                return positive(&[("hc_count", streams), ("hc_lowrank", lowrank)]);
            }
            ResidualKind::HyperConnections { streams, eps, .. } => (streams, eps),
        };
        positive(&[("hc_mult", streams)])?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid("hc_eps", "must be finite and >= 0"));
        }
        Ok(())
    }
}

impl SwiGlu {
    fn validate(&self) -> Result<()> {
        match *self {
            SwiGlu::Limited { limit } if !(limit.is_finite() && limit >= 0.0) => {
                Err(Error::invalid("swiglu_limit", "must be finite and >= 0"))
            }
            SwiGlu::Situ { beta, linear_beta } if !(beta.is_finite() && beta > 0.0) => Err(Error::invalid(
                "activation_situ_beta",
                format!("{beta} is not finite and > 0 (with linear beta {linear_beta})"),
            )),
            SwiGlu::Situ { linear_beta, .. } if !(linear_beta.is_finite() && linear_beta > 0.0) => {
                Err(Error::invalid("activation_situ_linear_beta", "must be finite and > 0"))
            }
            SwiGlu::Plain | SwiGlu::Limited { .. } | SwiGlu::Situ { .. } => Ok(()),
        }
    }
}

impl GqaSpec {
    fn validate(&self) -> Result<()> {
        positive(&[
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ])?;
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::invalid(
                "num_key_value_heads",
                format!("{} does not divide num_attention_heads {}", self.num_kv_heads, self.num_heads),
            ));
        }
        if let Some(rope) = &self.rope {
            rope.validate(self.head_dim, "partial_rotary_factor")?;
        }
        if let Some(clip) = self.clip_qkv
            && !(clip.is_finite() && clip > 0.0)
        {
            return Err(Error::invalid("clip_qkv", "must be finite and > 0"));
        }
        if self.sliding_window == Some(0) {
            return Err(Error::invalid("sliding_window", "must be > 0"));
        }
        if let Some(qsa) = &self.qsa {
            let Some(rope) = &self.rope else {
                return Err(Error::invalid(
                    "indexer_n_heads",
                    "QSA rotates its queries and keys with the layer's RoPE",
                ));
            };
            qsa.validate(rope.rotary_dim)?;
        }
        Ok(())
    }
}

impl QsaSpec {
    /// A selection whose blocks are whole and whose query and key heads
    /// hold the attention's rotary part (`rotary_dim`), which rotates them.
    fn validate(&self, rotary_dim: usize) -> Result<()> {
        positive(&[
            ("indexer_n_heads", self.n_heads),
            ("indexer_head_dim", self.head_dim),
            ("indexer_budget", self.budget_tokens),
            ("indexer_compress_ratio", self.block_tokens),
        ])?;
        if !self.budget_tokens.is_multiple_of(self.block_tokens) {
            return Err(Error::invalid(
                "indexer_budget",
                format!("{} is not a multiple of indexer_compress_ratio {}", self.budget_tokens, self.block_tokens),
            ));
        }
        if rotary_dim > self.head_dim {
            return Err(Error::invalid(
                "indexer_head_dim",
                format!("{} is narrower than the attention's rotary part {rotary_dim}", self.head_dim),
            ));
        }
        Ok(())
    }
}

impl MlaAttention {
    fn validate(&self) -> Result<()> {
        let dims = &self.dims;
        positive(&[
            ("num_attention_heads", self.num_heads),
            ("kv_lora_rank", dims.kv_lora_rank),
            ("qk_nope_head_dim", dims.qk_nope_head_dim),
            ("v_head_dim", dims.v_head_dim),
            ("q_lora_rank", dims.q_lora_rank.unwrap_or(1)),
        ])?;
        if !(self.latent_norm_eps.is_finite() && self.latent_norm_eps > 0.0) {
            return Err(Error::invalid("rms_norm_eps", "the latent norms' eps must be finite and > 0"));
        }
        // RoPE rotates exactly the qk_rope_head_dim part of each head; without
        // RoPE that part (possibly empty) is attended as it is.
        if let Some(rope) = &self.rope {
            let rope_dims = dims.qk_rope_head_dim;
            if rope.rotary_dim != rope_dims || rope_dims == 0 || !rope_dims.is_multiple_of(2) {
                return Err(Error::invalid(
                    "qk_rope_head_dim",
                    format!(
                        "RoPE must rotate all {rope_dims} rope dimensions (an even number > 0), not {}",
                        rope.rotary_dim
                    ),
                ));
            }
            rope.validate(dims.qk_head_dim(), "qk_rope_head_dim")?;
        }
        if let Some(indexer) = &self.indexer {
            positive(&[("index_topk", indexer.topk), ("index_n_heads", indexer.n_heads)])?;
            if indexer.head_dim < dims.qk_rope_head_dim {
                return Err(Error::invalid(
                    "index_head_dim",
                    format!("{} is narrower than qk_rope_head_dim {}", indexer.head_dim, dims.qk_rope_head_dim),
                ));
            }
            if let Some(pool) = indexer.pool {
                // A whole number of pools (transformers checks it too), at
                // least one: a query that closes a pool has no tail, so it
                // must see a pool.
                if pool == 0 || !indexer.topk.is_multiple_of(pool) {
                    return Err(Error::invalid(
                        "index_kpool",
                        format!("{pool} must be > 0 and divide index_topk {}", indexer.topk),
                    ));
                }
                if self.rope.is_some() {
                    return Err(Error::invalid(
                        "qk_rope_head_dim",
                        "a pooled DSA indexer pools unrotated keys: no RoPE",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl GdnSpec {
    fn validate(&self) -> Result<()> {
        let dims = &self.dims;
        positive(&[
            ("linear_num_key_heads", dims.num_k_heads),
            ("linear_num_value_heads", dims.num_v_heads),
            ("linear_key_head_dim", dims.head_k_dim),
            ("linear_value_head_dim", dims.head_v_dim),
        ])?;
        if dims.conv_kernel < 2 {
            return Err(Error::invalid("linear_conv_kernel_dim", format!("{} must be >= 2", dims.conv_kernel)));
        }
        if !dims.num_v_heads.is_multiple_of(dims.num_k_heads) {
            return Err(Error::invalid(
                "linear_num_value_heads",
                format!("{} is not a multiple of linear_num_key_heads {}", dims.num_v_heads, dims.num_k_heads),
            ));
        }
        let kimi_only =
            [("g_proj", self.output_gate_rank == GateRank::Full), ("A_log", self.a_log_padded_to.is_some())];
        if let Some((part, _)) = kimi_only.iter().find(|(_, set)| *set)
            && dims.projections != GdnProjections::Kimi
        {
            return Err(Error::invalid(*part, "only Kimi Delta Attention has a full-rank gate or a padded A_log"));
        }
        if let Some(padded) = self.a_log_padded_to
            && padded < dims.num_v_heads
        {
            return Err(Error::invalid(
                "A_log",
                format!("padded to {padded} values, fewer than the {} heads", dims.num_v_heads),
            ));
        }
        if let Some(bound) = self.gate_lower_bound {
            if dims.projections != GdnProjections::Kimi {
                return Err(Error::invalid(
                    "linear_lower_bound",
                    "only Kimi Delta Attention has a bounded forget gate",
                ));
            }
            // Positive, the "bound" would let the state grow without limit.
            if !(bound.is_finite() && bound < 0.0) {
                return Err(Error::invalid("linear_lower_bound", format!("{bound} must be finite and < 0")));
            }
        }
        NormKind::Weight { eps: self.eps }.validate()
    }
}

impl RopeSpec {
    /// A rotation of the leading `rotary_dim` of `head_dim` values; a bad
    /// rotary width is charged to `width_field`.
    fn validate(&self, head_dim: usize, width_field: &str) -> Result<()> {
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return Err(Error::invalid("rope_theta", "must be finite and > 0"));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > head_dim {
            return Err(Error::invalid(
                width_field,
                format!("rotary dimension {} must be even, > 0 and <= head_dim {head_dim}", self.rotary_dim),
            ));
        }
        match self.scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } if factor.is_finite() && factor > 0.0 => {
                Ok(())
            }
            RopeScaling::Linear { .. } | RopeScaling::Yarn { .. } => {
                Err(Error::invalid("rope_parameters.factor", "must be finite and > 0"))
            }
        }
    }
}

impl FfnSpec {
    /// The invariants of a feed-forward block (also of the MoE block a
    /// config gives when no layer uses it: transformers builds it anyway).
    pub(crate) fn validate(&self) -> Result<()> {
        match self {
            FfnSpec::Dense { intermediate_size, swiglu, .. } => {
                positive(&[("intermediate_size", *intermediate_size)])?;
                swiglu.validate()
            }
            FfnSpec::Moe(moe) => moe.validate(),
        }
    }
}

impl MoeBlock {
    fn validate(&self) -> Result<()> {
        positive(&[
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.top_k),
            ("expert intermediate_size", self.intermediate_size),
        ])?;
        if self.top_k > self.num_experts {
            return Err(Error::invalid(
                "num_experts_per_tok",
                format!("{} exceeds the number of experts {}", self.top_k, self.num_experts),
            ));
        }
        match self.shared {
            SharedExperts::Plain { intermediate_size: 0 }
            | SharedExperts::Gated { intermediate_size: 0 }
            | SharedExperts::Sink { intermediate_size: 0, .. } => {
                return Err(Error::invalid("shared_expert_intermediate_size", "must be > 0"));
            }
            _ => {}
        }
        self.swiglu.validate()?;
        if let Some(latent) = self.latent {
            positive(&[("routed_expert_hidden_size", latent.width)])?;
            if !(latent.norm_eps.is_finite() && latent.norm_eps > 0.0) {
                return Err(Error::invalid("rms_norm_eps", "the latent norm's eps must be finite and > 0"));
            }
            // The latent block runs the experts as SwiGLUs of `z` only: a
            // biased expert's rows would be sized by the full width.
            if self.experts != ExpertKind::SwiGlu {
                return Err(Error::invalid("routed_expert_hidden_size", "a latent MoE's experts carry no biases"));
            }
        }
        self.validate_router()
    }

    fn validate_router(&self) -> Result<()> {
        if let RouterKind::SqrtSoftplus { scaling } | RouterKind::Hash { scaling } = self.router
            && !scaling.is_finite()
        {
            return Err(Error::invalid("routed_scaling_factor", "must be finite"));
        }
        // The sink router's gate rows past the routed experts are the
        // shared experts', and only it weighs them.
        match (self.router, self.shared) {
            (RouterKind::SharedExpertSink { route_scale }, SharedExperts::Sink { count, .. }) => {
                if count == 0 {
                    return Err(Error::invalid("n_shared_experts", "the shared-expert sink needs at least one"));
                }
                if !route_scale.is_finite() {
                    return Err(Error::invalid("route_scale", "must be finite"));
                }
                return Ok(());
            }
            (RouterKind::SharedExpertSink { .. }, _) | (_, SharedExperts::Sink { .. }) => {
                return Err(Error::invalid("n_shared_experts", "sink shared experts need the sink router and back"));
            }
            _ => {}
        }
        let RouterKind::GroupedSigmoid { n_group, topk_group, scaling, .. } = self.router else {
            return Ok(());
        };
        let experts = self.num_experts;
        if n_group == 0 || !experts.is_multiple_of(n_group) {
            return Err(Error::invalid("n_group", format!("{n_group} does not divide n_routed_experts {experts}")));
        }
        // Groups are ranked by the sum of their two best scores.
        let per_group = experts / n_group;
        if per_group < 2 {
            return Err(Error::invalid("n_group", "every group needs at least two experts"));
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(Error::invalid("topk_group", format!("{topk_group} is not in 1..={n_group}")));
        }
        if self.top_k > topk_group * per_group {
            return Err(Error::invalid(
                "num_experts_per_tok",
                format!("{} exceeds the {} experts of the chosen groups", self.top_k, topk_group * per_group),
            ));
        }
        if !scaling.is_finite() {
            return Err(Error::invalid("routed_scaling_factor", "must be finite"));
        }
        Ok(())
    }
}

/// Refuses the first `(field, value)` that is zero.
fn positive(values: &[(&str, usize)]) -> Result<()> {
    match values.iter().find(|(_, value)| *value == 0) {
        Some((field, _)) => Err(Error::invalid(*field, "must be > 0")),
        None => Ok(()),
    }
}
