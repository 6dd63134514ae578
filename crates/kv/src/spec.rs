//! The one derivation of what a layer keeps per sequence from its spec: the
//! engine budgets with it without building the model, and the model's
//! blocks are checked against it when they load.

use strata_format::{IndexerKind, IndexerSpec, LayerSpec, MixerSpec, ShortConv};

use crate::{LayerLayout, StatePart};

/// What a layer of `spec` keeps per sequence, in the order its block
/// indexes the parts: keys then values (grouped-query attention; a ring of
/// the last `window` under a sliding window); the
/// latent with its rotary key, then the indexer's parts with DSA
/// (Multi-head Latent Attention); the delta-rule and convolution state
/// (Gated DeltaNet); keys and values as GQA's, then the k, v and output
/// convolutions' inputs (Inkling). Then the FFN's: its output convolution's
/// inputs. Then the PLE's: its last token ids and its convolution's inputs.
pub fn layout_of(spec: &LayerSpec) -> LayerLayout {
    let mut parts = match &spec.mixer {
        MixerSpec::Gqa(gqa) => {
            let dim = gqa.kv_dim();
            // A sliding window needs only its last `window` keys and values.
            let part = gqa.sliding_window.map_or(StatePart::Rows { dim }, |window| StatePart::Ring { dim, window });
            // QSA scores blocks of every key a query sees: each token's raw
            // indexer key, kept whole.
            let qsa = gqa.qsa.map(|qsa| StatePart::Rows { dim: qsa.head_dim });
            [part, part].into_iter().chain(qsa).collect()
        }
        MixerSpec::Mla(mla) => {
            let latent = StatePart::Rows { dim: mla.dims.latent_dim() };
            std::iter::once(latent).chain(mla.indexer.iter().flat_map(indexer_parts)).collect()
        }
        MixerSpec::GatedDeltaNet(gdn) => vec![StatePart::Fixed { floats: gdn.dims.state_floats() }],
        MixerSpec::Inkling(ink) => {
            let dim = ink.kv_dim();
            let rows = ink.sliding_window.map_or(StatePart::Rows { dim }, |window| StatePart::Ring { dim, window });
            let conv = |conv: ShortConv| StatePart::Fixed { floats: conv.state_floats() };
            vec![rows, rows, conv(ink.kv_conv()), conv(ink.kv_conv()), conv(ink.output_conv())]
        }
        // The window's ring, then per compressor its entries (the open
        // window's kv pending) and the rest of its last tokens' projections.
        MixerSpec::SharedKv(sk) => std::iter::once(StatePart::Ring { dim: sk.head_dim, window: sk.window })
            .chain(sk.compressors().iter().flat_map(|c| {
                [
                    StatePart::Strided { dim: c.width, every: c.ratio },
                    StatePart::Ring { dim: c.rest_width(), window: c.span() },
                ]
            }))
            .collect(),
    };
    parts.extend(spec.ffn_output_conv.map(|conv| StatePart::Fixed { floats: conv.state_floats() }));
    // The PLE's: the ids its n-grams reach back to, its convolution's inputs.
    if let Some(ple) = &spec.ple {
        parts.push(StatePart::Tokens { n: ple.context_tokens() });
        parts.push(StatePart::Fixed { floats: ple.conv_state_floats() });
    }
    LayerLayout::new(parts)
}

/// A DSA indexer's parts: a key per token (GLM-5; a sharing layer's row
/// stays zero), or when pooled the keys as a strided part (a key per pool,
/// the open pool's keys pending) and the open pool's gate logits as a ring
/// (none for pools of one token); a pooled sharing layer keeps nothing.
fn indexer_parts(indexer: &IndexerSpec) -> Vec<StatePart> {
    let dim = indexer.head_dim;
    match (indexer.pool, indexer.kind) {
        (None, _) => vec![StatePart::Rows { dim }],
        (Some(_), IndexerKind::Shared) => Vec::new(),
        (Some(1), IndexerKind::Full) => vec![StatePart::Strided { dim, every: 1 }],
        (Some(pool), IndexerKind::Full) => {
            vec![StatePart::Strided { dim, every: pool }, StatePart::Ring { dim, window: pool - 1 }]
        }
    }
}

/// [`layout_of`] every layer of a model.
pub fn layouts_of(layers: &[LayerSpec]) -> Vec<LayerLayout> {
    layers.iter().map(layout_of).collect()
}

#[cfg(test)]
mod tests {
    use strata_format::{
        CompressedIndexer, Compression, FfnSpec, IndexerKind, IndexerSpec, LIKE, MixerSpec, ModelArch, NormKind,
        ResidualKind, RopeScaling, RopeSpec, SharedKvAttention, SwiGlu, like_config,
    };

    use super::*;

    #[test]
    fn layouts_of_every_known_config_cost_what_the_spec_says() {
        for (like, _) in LIKE {
            let arch = ModelArch::from_config_json(&like_config(like, None).unwrap()).unwrap();
            let layouts = layouts_of(&arch.layers);
            assert_eq!(layouts.len(), arch.layers.len(), "{like}");
            let bytes_per_token: usize = layouts.iter().map(LayerLayout::bytes_per_token).sum();
            let bytes_per_sequence: usize = layouts.iter().map(LayerLayout::bytes_per_sequence).sum();
            assert_eq!(bytes_per_token, arch.kv_bytes_per_token(), "{like}");
            assert_eq!(bytes_per_sequence, arch.state_bytes_per_sequence(), "{like}");
        }
    }

    #[test]
    fn a_shared_kv_layer_costs_what_its_spec_says() {
        let rope = RopeSpec { theta: 1e4, scaling: RopeScaling::None, rotary_dim: 8 };
        let indexer = CompressedIndexer { n_heads: 4, head_dim: 16, topk: 2 };
        for compression in
            [None, Some(Compression::Heavy { ratio: 8 }), Some(Compression::Sparse { ratio: 4, indexer })]
        {
            let attention = SharedKvAttention {
                num_heads: 4,
                head_dim: 32,
                q_lora_rank: 24,
                rope,
                window: 6,
                o_groups: 2,
                o_lora_rank: 12,
                eps: 1e-6,
                compression,
            };
            let layer = LayerSpec {
                mixer: MixerSpec::SharedKv(attention),
                ffn: FfnSpec::Dense { intermediate_size: 16, swiglu: SwiGlu::Plain, global_scale: false },
                norm: NormKind::Weight { eps: 1e-6 },
                residual: ResidualKind::Plain,
                ffn_output_conv: None,
                ple: None,
            };
            let layout = layout_of(&layer);
            assert_eq!(layout.bytes_per_token(), layer.cache_floats_per_token() * size_of::<f32>(), "{compression:?}");
            assert_eq!(layout.bytes_per_sequence(), layer.state_floats() * size_of::<f32>(), "{compression:?}");
        }
    }
    #[test]
    fn a_hybrid_model_keeps_rows_on_attention_layers_and_a_state_on_the_others() {
        let arch = ModelArch::from_config_json(&like_config("qwen3-next-80b-a3b", Some(4)).unwrap()).unwrap();
        let parts: Vec<Vec<StatePart>> = layouts_of(&arch.layers).into_iter().map(|l| l.parts).collect();
        let MixerSpec::Gqa(full) = &arch.layers[3].mixer else { panic!("layer 3 is full attention") };
        let kv_dim = full.kv_dim();
        let state = StatePart::Fixed { floats: arch.first_gdn().unwrap().dims.state_floats() };
        let rows = vec![StatePart::Rows { dim: kv_dim }; 2];
        assert_eq!(parts, [vec![state], vec![state], vec![state], rows]);
    }

    #[test]
    fn an_inkling_layer_keeps_keys_values_and_four_convolutions_the_ffns_last() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/inkling_hub/inkling/config.json");
        let arch = ModelArch::from_config_json(&std::fs::read_to_string(path).unwrap()).unwrap();
        let layouts = layouts_of(&arch.layers);
        let (kv, hidden) = (16 * 128, 6144);
        let conv = |channels| StatePart::Fixed { floats: 3 * channels };
        let ring = StatePart::Ring { dim: kv, window: 512 };
        assert_eq!(layouts[0].parts, [ring, ring, conv(kv), conv(kv), conv(hidden), conv(hidden)]);
        let rows = StatePart::Rows { dim: 8 * 128 };
        assert_eq!(layouts[5].parts, [rows, rows, conv(8 * 128), conv(8 * 128), conv(hidden), conv(hidden)]);
        let bytes_per_sequence: usize = layouts.iter().map(LayerLayout::bytes_per_sequence).sum();
        assert_eq!(bytes_per_sequence, arch.state_bytes_per_sequence());
        assert_eq!(layouts.iter().map(LayerLayout::bytes_per_token).sum::<usize>(), arch.kv_bytes_per_token());
    }

    #[test]
    fn a_pooled_indexer_keeps_its_pools_and_open_pool_and_a_sharing_layer_nothing() {
        let mut arch = ModelArch::from_config_json(
            r#"{"model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 12, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8, "v_head_dim": 8, "index_head_dim": 16, "index_n_heads": 2}"#,
        )
        .unwrap();
        for (layer, kind) in arch.layers.iter_mut().zip([IndexerKind::Full, IndexerKind::Shared]) {
            let MixerSpec::Mla(mla) = &mut layer.mixer else { panic!("{layer:?}") };
            mla.indexer = mla.indexer.map(|ix| IndexerSpec { kind, pool: Some(4), ..ix });
        }
        let layouts = layouts_of(&arch.layers);
        let latent = StatePart::Rows { dim: 16 + 8 };
        let pools = StatePart::Strided { dim: 16, every: 4 };
        assert_eq!(layouts[0].parts, [latent, pools, StatePart::Ring { dim: 16, window: 3 }]);
        assert_eq!(layouts[1].parts, [latent]);
        for (layout, layer) in layouts.iter().zip(&arch.layers) {
            assert_eq!(layout.bytes_per_token(), layer.cache_floats_per_token() * size_of::<f32>());
            assert_eq!(layout.bytes_per_sequence(), layer.state_floats() * size_of::<f32>());
        }
    }
}
