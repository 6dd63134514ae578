//! The legacy conversion: the flat [`ModelSpec`] every manifest stores
//! (frozen: no new fields, ever) → the in-memory [`ModelArch`]. It is the
//! one place a layer's spec is derived from model-wide fields, each layer's
//! mixer as its family file says (`FamilyDef::attention`); nothing else
//! reads a layer's dimensions from the flat spec.

use super::{
    CoreSpec, ExpertKind, FfnKind, LayerKind, LayerSpec, ModelArch, ModelSpec, MoeBlock, NormKind, NormStyle,
    ResidualKind, RouterKind, ScoringFunc, SharedExperts,
};

impl ModelSpec {
    /// The architecture this spec describes: its common part and every
    /// layer's blocks.
    pub fn arch(&self) -> ModelArch {
        let core = CoreSpec {
            family: self.family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            final_norm: self.norm_kind(),
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_ids.clone(),
        };
        ModelArch { core, layers: (0..self.num_layers).map(|l| self.layer_spec(l)).collect() }
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

    /// The blocks of decoder layer `layer` (`layer < num_layers`).
    fn layer_spec(&self, layer: usize) -> LayerSpec {
        let attention = self.family.def().attention(self, layer);
        let ffn = match self.layers[layer] {
            LayerKind::Dense => FfnKind::Dense { intermediate_size: self.dense_intermediate_size },
            LayerKind::Moe => FfnKind::Moe(MoeBlock {
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
            }),
        };
        LayerSpec { attention, ffn, norm: self.norm_kind(), residual: ResidualKind::Plain }
    }

    /// The kind of every RMSNorm of the decoder stack, the final one included.
    fn norm_kind(&self) -> NormKind {
        let eps = self.rms_norm_eps;
        match self.norm_style {
            NormStyle::Weight => NormKind::Weight { eps },
            NormStyle::OnePlusWeight => NormKind::OnePlusWeight { eps },
        }
    }
}
