//! The legacy conversions between the flat [`ModelSpec`] manifests of
//! earlier versions store (frozen: no new fields, ever) and the in-memory
//! [`ModelArch`]. [`ModelSpec::arch`] is the one place a layer's spec is
//! derived from model-wide fields; nothing else reads a layer's dimensions
//! from the flat spec.

use super::{
    CoreSpec, ExpertKind, FfnKind, FfnSpec, GateActivation, GateRank, GdnSpec, GqaSpec, IndexerSpec, LayerSpec,
    LayerType, MixerSpec, MlaAttention, ModelArch, ModelSpec, MoeBlock, MoeSpec, NormKind, NormStyle, QkNorm,
    ResidualKind, RopeScaling, RopeSpec, RouterKind, RouterSpec, ScoringFunc, SharedExperts, SwiGlu,
};
use super::{DsaSpec, GdnDims, LATENT_NORM_EPS, MlaSpec, MtpForm};
use crate::error::{Error, Result};

impl ModelSpec {
    /// The architecture this spec describes: its common part and every
    /// layer's blocks. Total on any spec, validated or not (a manifest's is
    /// read from outside): a list shorter than the layers reads as absent.
    pub fn arch(&self) -> ModelArch {
        let core = CoreSpec {
            family: self.family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            final_norm: self.norm_kind(),
            embed_norm: None,
            logits_mup_divisor: None,
            unpadded_vocab_size: None,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_ids.clone(),
        };
        let layers = self.layers.iter().enumerate().map(|(l, kind)| self.layer_spec(l, *kind)).collect();
        ModelArch { core, layers, mtp: Vec::new(), mtp_form: MtpForm::DEEPSEEK_V3 }
    }

    /// Checks a stored spec: its layer list matches its layer count, and the
    /// architecture it describes keeps every invariant.
    pub fn validate(&self) -> Result<()> {
        if self.layers.len() != self.num_layers {
            return Err(Error::invalid(
                "num_hidden_layers",
                format!("{} layers declared but {} layer kinds given", self.num_layers, self.layers.len()),
            ));
        }
        self.arch().validate()
    }

    /// The flat spec of `arch`: what manifests of earlier versions store.
    /// Refused for an architecture the flat form cannot express (layers
    /// with their own heads, windows or positions).
    pub fn frozen(arch: &ModelArch) -> Result<ModelSpec> {
        let core = &arch.core;
        let gqa = arch.first_gqa();
        let mla = arch.first_mla();
        let moe = arch.first_moe();
        let rope =
            arch.first_rope().copied().unwrap_or(RopeSpec { theta: 1.0, scaling: RopeScaling::None, rotary_dim: 0 });
        let (num_heads, num_kv_heads, head_dim) = match (mla, gqa) {
            (Some(mla), _) => (mla.num_heads, mla.num_heads, mla.dims.qk_head_dim()),
            (None, Some(gqa)) => (gqa.num_heads, gqa.num_kv_heads, gqa.head_dim),
            (None, None) => (0, 0, 0),
        };
        let (router, norm_topk_prob) = match moe.map(|m| m.router) {
            Some(RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, scaling }) => (
                RouterSpec {
                    scoring: ScoringFunc::Sigmoid,
                    n_group,
                    topk_group,
                    routed_scaling_factor: scaling,
                    score_correction_bias: true,
                },
                renormalize,
            ),
            Some(RouterKind::SoftmaxTopK { renormalize }) => (RouterSpec::default(), renormalize),
            // Not expressible flat: the check below refuses the spec.
            Some(
                RouterKind::TopKThenSoftmax
                | RouterKind::SharedExpertSink { .. }
                | RouterKind::SqrtSoftplus { .. }
                | RouterKind::Hash { .. },
            )
            | None => (RouterSpec::default(), false),
        };
        let shared = moe.map_or(SharedExperts::None, |m| m.shared);
        let linear_attention = arch.first_gdn().map(|gdn| gdn.dims);
        let indexed = arch.layers.iter().filter_map(|l| match &l.mixer {
            MixerSpec::Mla(mla) => mla.indexer,
            _ => None,
        });
        let indexers: Vec<IndexerSpec> = indexed.collect();
        let spec = ModelSpec {
            family: core.family,
            vocab_size: core.vocab_size,
            hidden_size: core.hidden_size,
            num_layers: arch.layers.len(),
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: core.final_norm.eps(),
            rope,
            max_position_embeddings: core.max_position_embeddings,
            tie_word_embeddings: core.tie_word_embeddings,
            attention_bias: gqa.map(|g| g.bias).or(mla.map(|m| m.bias)).unwrap_or(false),
            qk_norm: gqa.map_or(QkNorm::None, |g| g.qk_norm),
            clip_qkv: gqa.and_then(|g| g.clip_qkv),
            sliding_window: gqa.and_then(|g| g.sliding_window),
            moe: moe.map_or(MoeSpec { num_experts: 0, top_k: 0, intermediate_size: 0, norm_topk_prob }, |m| MoeSpec {
                num_experts: m.num_experts,
                top_k: m.top_k,
                intermediate_size: m.intermediate_size,
                norm_topk_prob,
            }),
            router,
            shared_intermediate_size: match shared {
                // Not expressible flat (no sink router): refused below.
                SharedExperts::None | SharedExperts::Sink { .. } => None,
                SharedExperts::Plain { intermediate_size } | SharedExperts::Gated { intermediate_size } => {
                    Some(intermediate_size)
                }
            },
            mla: mla.map(|m| m.dims),
            dsa: indexers.first().map(|first| DsaSpec {
                index_topk: first.topk,
                index_head_dim: first.head_dim,
                index_n_heads: first.n_heads,
                indexer_types: indexers.iter().map(|i| i.kind).collect(),
            }),
            dense_intermediate_size: arch.dense_intermediate_size().unwrap_or(0),
            layers: arch.layer_kinds(),
            mixers: match linear_attention {
                Some(_) => arch
                    .layers
                    .iter()
                    .map(|l| match l.mixer {
                        MixerSpec::GatedDeltaNet(_) => LayerType::Linear,
                        _ => LayerType::Full,
                    })
                    .collect(),
                None => Vec::new(),
            },
            linear_attention,
            norm_style: match core.final_norm {
                NormKind::Weight { .. } => NormStyle::Weight,
                NormKind::OnePlusWeight { .. } => NormStyle::OnePlusWeight,
            },
            attn_output_gate: gqa.is_some_and(|g| g.output_gate),
            shared_expert_gate: matches!(shared, SharedExperts::Gated { .. }),
            bos_token_id: core.bos_token_id,
            eos_token_ids: core.eos_token_ids.clone(),
        };
        // The flat form gives every layer the model's blocks: it expresses
        // `arch` exactly when it derives it back (MTP layers aside: the
        // stored config declares them, not the spec).
        if spec.arch() != arch.clone().without_mtp() {
            return Err(Error::SpecDisagrees {
                what: "the layers differ from one another beyond the flat spec".into(),
            });
        }
        Ok(spec)
    }

    /// The blocks of decoder layer `layer`, of feed-forward kind `kind`.
    fn layer_spec(&self, layer: usize, kind: FfnKind) -> LayerSpec {
        let ffn = match kind {
            FfnKind::Dense => FfnSpec::Dense {
                intermediate_size: self.dense_intermediate_size,
                swiglu: SwiGlu::Plain,
                global_scale: false,
            },
            FfnKind::Moe => FfnSpec::Moe(self.moe_block()),
        };
        LayerSpec {
            mixer: self.attention(layer),
            ffn,
            norm: self.norm_kind(),
            residual: ResidualKind::Plain,
            ffn_output_conv: None,
            ple: None,
        }
    }

    /// Layer `layer`'s mixer: latent attention (with its DSA indexer) where
    /// the spec has MLA dimensions, Gated DeltaNet where the layer's mixer
    /// is linear, else grouped-query attention with the model's heads.
    fn attention(&self, layer: usize) -> MixerSpec {
        if let Some(dims) = self.mla {
            return MixerSpec::Mla(self.mla_attention(dims, layer));
        }
        match (self.mixers.get(layer), self.linear_attention) {
            (Some(LayerType::Linear), Some(dims)) => self.gdn(dims),
            _ => MixerSpec::Gqa(GqaSpec {
                num_heads: self.num_heads,
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
                qk_norm: self.qk_norm,
                clip_qkv: self.clip_qkv,
                bias: self.attention_bias,
                sliding_window: self.sliding_window,
                rope: Some(self.rope),
                sinks: false,
                output_gate: self.attn_output_gate,
                qsa: None,
            }),
        }
    }

    fn mla_attention(&self, dims: MlaSpec, layer: usize) -> MlaAttention {
        let indexer = self.dsa.as_ref().and_then(|dsa| {
            Some(IndexerSpec {
                kind: *dsa.indexer_types.get(layer)?,
                topk: dsa.index_topk,
                head_dim: dsa.index_head_dim,
                n_heads: dsa.index_n_heads,
                pool: None,
            })
        });
        MlaAttention {
            num_heads: self.num_heads,
            dims,
            rope: Some(self.rope),
            latent_norm_eps: LATENT_NORM_EPS,
            bias: self.attention_bias,
            indexer,
            output_gate: false,
        }
    }

    fn gdn(&self, dims: GdnDims) -> MixerSpec {
        MixerSpec::GatedDeltaNet(GdnSpec {
            dims,
            eps: self.rms_norm_eps,
            gate_lower_bound: None,
            output_gate: GateActivation::Silu,
            a_log_padded_to: None,
            output_gate_rank: GateRank::Low,
        })
    }

    fn moe_block(&self) -> MoeBlock {
        MoeBlock {
            num_experts: self.moe.num_experts,
            top_k: self.moe.top_k,
            intermediate_size: self.moe.intermediate_size,
            router: match self.router.scoring {
                ScoringFunc::Softmax => RouterKind::SoftmaxTopK { renormalize: self.moe.norm_topk_prob },
                ScoringFunc::Sigmoid => RouterKind::GroupedSigmoid {
                    n_group: self.router.n_group,
                    topk_group: self.router.topk_group,
                    renormalize: self.moe.norm_topk_prob,
                    scaling: self.router.routed_scaling_factor,
                },
            },
            shared: match self.shared_intermediate_size {
                Some(intermediate_size) if self.shared_expert_gate => SharedExperts::Gated { intermediate_size },
                Some(intermediate_size) => SharedExperts::Plain { intermediate_size },
                None => SharedExperts::None,
            },
            experts: ExpertKind::SwiGlu,
            swiglu: SwiGlu::Plain,
            latent: None,
        }
    }

    /// The kind of every RMSNorm of the decoder stack, the final one included.
    fn norm_kind(&self) -> NormKind {
        let eps = self.rms_norm_eps;
        match self.norm_style {
            NormStyle::Weight => NormKind::Weight { eps },
            NormStyle::OnePlusWeight => NormKind::OnePlusWeight { eps },
        }
    }

    /// The blocks of every decoder layer, in order.
    pub fn layer_specs(&self) -> Vec<LayerSpec> {
        self.arch().layers
    }

    /// Bytes (f32) one token adds to a sequence's cache, over all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.arch().kv_bytes_per_token()
    }

    /// Bytes (f32) of fixed state one sequence keeps, over all layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.arch().state_bytes_per_sequence()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::IndexerKind;
    use crate::synth::{LIKE, like_config};

    /// The committed GLM-5 checkpoint's config: MLA with a DSA indexer.
    const GLM: &str = include_str!("../../../../testdata/glm_moe_dsa/hf/config.json");

    #[test]
    fn the_flat_spec_of_every_family_derives_its_architecture_back() {
        // DeepSeek V4's layers differ in kind (sliding, CSA, HCA), Inkling's
        // in heads and windows, and Qwen3.8-Flash-Next's in streams, QSA and
        // PLE, which no flat spec says.
        let unflat = ["deepseek-v4-flash", "inkling", "qwen3.8-flash-next"];
        let flat = LIKE.iter().filter(|(like, _)| !unflat.contains(like));
        let likes = flat.map(|(like, _)| like_config(like, Some(4)).unwrap());
        for config in likes.chain([GLM.to_owned()]) {
            let arch = ModelArch::from_config_json(&config).unwrap();
            assert_eq!(ModelSpec::frozen(&arch).unwrap().arch(), arch, "{config}");
        }
    }

    #[test]
    fn layers_with_their_own_windows_have_no_flat_spec() {
        let mut arch = ModelArch::from_config_json(&like_config("mixtral-8x7b", Some(2)).unwrap()).unwrap();
        let MixerSpec::Gqa(gqa) = &mut arch.layers[1].mixer else { panic!("mixtral is gqa") };
        gqa.sliding_window = Some(128);
        assert!(matches!(ModelSpec::frozen(&arch), Err(Error::SpecDisagrees { .. })));
    }

    #[test]
    fn a_stored_spec_with_fewer_indexer_types_than_layers_converts_without_panicking() {
        let arch = ModelArch::from_config_json(GLM).unwrap();
        let mut spec = ModelSpec::frozen(&arch).unwrap();
        spec.dsa.as_mut().unwrap().indexer_types.truncate(1);
        assert!(matches!(spec.arch().layers[1].mixer, MixerSpec::Mla(MlaAttention { indexer: None, .. })));
        assert_eq!(IndexerKind::Full, spec.dsa.unwrap().indexer_types[0]);
    }
}
