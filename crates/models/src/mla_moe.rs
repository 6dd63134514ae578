//! The forward graph of the MLA families: DeepSeek-V3 (and Kimi K2.5's text
//! model, the same network under other tensor names) and GLM-5.
//!
//! Pre-norm decoder layers of Multi-head Latent Attention ([`crate::mla`],
//! with GLM-5's DSA indexer, [`crate::dsa`]) and either a dense SwiGLU MLP
//! (the first `first_k_dense_replace` layers) or a MoE block: a sigmoid,
//! group-limited router, routed experts streamed through the shared expert
//! pipeline, and always-resident shared experts. `docs/mla.md` has
//! the exact math.

use std::sync::Arc;

use strata_format::{Container, IndexerKind, LayerKind, ModelSpec, names};
use strata_kv::{INDEX_KEYS, KvCache, LATENT};
use strata_sched::swiglu;

use crate::common::{batch_logits, batch_rows, decoder_stack, embed, output_logits, run_routed_experts};
use crate::dsa::Indexer;
use crate::mla::Mla;
use crate::rope::{Angles, Rope};
use crate::router::{GroupedSigmoid, grouped_sigmoid_top_k};
use crate::weights::{matrix, vector};
use crate::{CausalLm, Error, Logits, Result, Runtime, SeqBatch};

/// A loaded DeepSeek-V3, Kimi K2.5 or GLM-5 model.
pub struct MlaMoe {
    container: Arc<Container>,
    spec: ModelSpec,
    rope: Rope,
    layers: Vec<Layer>,
    embed: String,
    final_norm: String,
    lm_head: String,
}

/// One decoder layer.
struct Layer {
    input_norm: String,
    post_attn_norm: String,
    attn: Mla,
    indexer: IndexerSlot,
    ffn: Ffn,
}

/// The DSA indexer of a layer.
enum IndexerSlot {
    /// No sparse attention: every earlier token is visible.
    Absent,
    /// The layer selects with its own indexer.
    Own(Indexer),
    /// The layer reuses the previous full layer's selection.
    Shared,
}

/// The feed-forward half of a layer.
enum Ffn {
    Dense([String; 3]),
    Moe { router: String, correction_bias: String, shared: Option<[String; 3]> },
}

impl MlaMoe {
    /// Checks every tensor the graph will read.
    pub fn load(container: Arc<Container>) -> Result<Self> {
        let spec = container.spec().clone();
        let (Some(mla), true) = (spec.mla, spec.family.is_mla()) else {
            return Err(Error::UnsupportedFamily { family: spec.family.to_string() });
        };
        let c = &*container;
        let h = spec.hidden_size;
        let rope = Rope::new(&spec.rope, mla.qk_rope_head_dim)?;
        let mut layers = Vec::with_capacity(spec.num_layers);
        for l in 0..spec.num_layers {
            let input_norm = names::layer_tensor(&spec, l, "input_layernorm.weight");
            let post_attn_norm = names::layer_tensor(&spec, l, "post_attention_layernorm.weight");
            vector(c, &input_norm, h)?;
            vector(c, &post_attn_norm, h)?;
            let indexer = match (&spec.dsa, mla.q_lora_rank) {
                (None, _) => IndexerSlot::Absent,
                (Some(dsa), Some(rank)) if dsa.indexer_types.get(l) == Some(&IndexerKind::Full) => {
                    IndexerSlot::Own(Indexer::load(c, &spec, dsa, rank, l)?)
                }
                (Some(dsa), Some(_)) if l > 0 && dsa.indexer_types.get(l) == Some(&IndexerKind::Shared) => {
                    IndexerSlot::Shared
                }
                _ => return Err(Error::Unsupported(format!("layer {l}: DSA indexer layout is inconsistent"))),
            };
            let ffn = match spec.layers[l] {
                LayerKind::Dense => {
                    let [g, u, d] = names::dense_mlp_names(&spec, l);
                    let i = spec.dense_intermediate_size;
                    matrix(c, &g, i, h)?;
                    matrix(c, &u, i, h)?;
                    matrix(c, &d, h, i)?;
                    Ffn::Dense([g, u, d])
                }
                LayerKind::Moe => {
                    let router = names::router_name(&spec, l);
                    let correction_bias = names::correction_bias_name(&spec, l);
                    matrix(c, &router, spec.moe.num_experts, h)?;
                    vector(c, &correction_bias, spec.moe.num_experts)?;
                    c.expert_layout(l)?;
                    let shared = match spec.shared_intermediate_size {
                        Some(i) => {
                            let [g, u, d] = names::shared_expert_names(&spec, l);
                            matrix(c, &g, i, h)?;
                            matrix(c, &u, i, h)?;
                            matrix(c, &d, h, i)?;
                            Some([g, u, d])
                        }
                        None => None,
                    };
                    Ffn::Moe { router, correction_bias, shared }
                }
            };
            let attn = Mla::load(c, &spec, mla, l)?;
            layers.push(Layer { input_norm, post_attn_norm, attn, indexer, ffn });
        }
        let (embed, final_norm, lm_head) =
            (names::embedding_name(&spec), names::final_norm_name(&spec), names::lm_head_name(&spec));
        matrix(c, &embed, spec.vocab_size, h)?;
        matrix(c, &lm_head, spec.vocab_size, h)?;
        vector(c, &final_norm, h)?;
        Ok(Self { container, spec, rope, layers, embed, final_norm, lm_head })
    }

    /// Runs layer `l`'s attention for `xs`, the normalised hidden states of
    /// every new row of the batch (`angles` at their positions), writing
    /// each sequence's cache rows. The projections run once over all rows;
    /// the attention itself per sequence, over its own cache.
    /// `selections[k]` carries sequence `k`'s DSA choice from layer to layer.
    fn attention(
        &self,
        rt: &Runtime<'_>,
        l: usize,
        xs: &[f32],
        angles: &Angles,
        seqs: &mut [SeqBatch<'_>],
        selections: &mut [Option<Vec<Vec<usize>>>],
    ) -> Result<Vec<f32>> {
        let c = &*self.container;
        let layer = &self.layers[l];
        let h = self.spec.hidden_size;
        let queries = layer.attn.queries(rt, c, xs, angles)?;
        let latents = layer.attn.latents(rt, c, xs, angles)?;
        let index_keys = match &layer.indexer {
            IndexerSlot::Own(indexer) => Some(indexer.keys(rt, c, xs, angles)?),
            IndexerSlot::Absent | IndexerSlot::Shared => None,
        };
        let n = xs.len() / h;
        let (q_width, latent_width) = (queries.q.len() / n, latents.len() / n);
        let mut out = Vec::with_capacity(n * layer.attn.output_width());
        let mut row = 0;
        for (seq, selection) in seqs.iter_mut().zip(selections.iter_mut()) {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let rows = row..row + m;
            seq.cache.write(l, LATENT, &latents[rows.start * latent_width..rows.end * latent_width]);
            match (&layer.indexer, &index_keys) {
                (IndexerSlot::Own(indexer), Some(keys)) => {
                    let width = keys.len() / n;
                    seq.cache.write(l, INDEX_KEYS, &keys[rows.start * width..rows.end * width]);
                    let compressed = queries.compressed.as_deref().ok_or_else(|| {
                        Error::Unsupported(format!("layer {l}: the DSA indexer needs a compressed query"))
                    })?;
                    let cw = compressed.len() / n;
                    *selection = Some(indexer.select(
                        rt,
                        c,
                        &xs[rows.start * h..rows.end * h],
                        &compressed[rows.start * cw..rows.end * cw],
                        seq.cache.rows(l, INDEX_KEYS, start + m),
                        start,
                        &angles.rows(rows.clone()),
                    )?);
                }
                (IndexerSlot::Shared, _) => {
                    // The stream has a row for every layer; a sharing layer
                    // has no key of its own, so its row stays zero.
                    let width = seq.cache.row_dims()[INDEX_KEYS];
                    seq.cache.write(l, INDEX_KEYS, &vec![0.0; m * width]);
                }
                _ => *selection = None,
            }
            let q = &queries.q[rows.start * q_width..rows.end * q_width];
            let cached = seq.cache.rows(l, LATENT, start + m);
            out.extend(layer.attn.attend(rt, c, q, cached, start, selection.as_deref())?);
            row += m;
        }
        layer.attn.output(rt, c, &out)
    }

    /// The final hidden states (before the last norm) of every new row of
    /// every sequence, extending each sequence's cache.
    fn hidden_states(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<f32>> {
        let s = &self.spec;
        let c = &*self.container;
        let (tokens, positions) = batch_rows(seqs)?;
        let angles = Angles::new(&self.rope, &positions);
        let x = embed(c, s, &self.embed, &tokens)?;
        let mut selections = vec![None; seqs.len()];
        let names = |l: usize| (self.layers[l].input_norm.as_str(), self.layers[l].post_attn_norm.as_str());
        decoder_stack(
            c,
            s,
            seqs,
            x,
            names,
            |l, xs, seqs| self.attention(rt, l, xs, &angles, seqs, &mut selections),
            |l, xs, out| self.ffn(rt, l, &positions, xs, out),
        )
    }

    /// Adds layer `l`'s feed-forward output for `xs` to `out`.
    fn ffn(&self, rt: &Runtime<'_>, l: usize, positions: &[usize], xs: &[f32], out: &mut [f32]) -> Result<()> {
        let s = &self.spec;
        let c = &*self.container;
        let n = xs.len() / s.hidden_size;
        let mut ys = vec![0.0f32; n * s.hidden_size];
        match &self.layers[l].ffn {
            Ffn::Dense([g, u, d]) => swiglu(rt.threads, &[c.dense(g)?, c.dense(u)?, c.dense(d)?], xs, &mut ys),
            Ffn::Moe { router, correction_bias, shared } => {
                let mut logits = vec![0.0f32; n * s.moe.num_experts];
                rt.threads.matmul(&c.dense(router)?, xs, n, &mut logits);
                let routing = GroupedSigmoid {
                    n_group: s.router.n_group,
                    topk_group: s.router.topk_group,
                    top_k: s.moe.top_k,
                    normalize: s.moe.norm_topk_prob,
                    scaling: s.router.routed_scaling_factor as f32,
                    bias: c.dense_vec(correction_bias)?,
                };
                let routes = grouped_sigmoid_top_k(&logits, s.moe.num_experts, &routing);
                let layout = c.expert_layout(l)?;
                run_routed_experts(rt, layout, l, positions, xs, s.hidden_size, &routes, s.moe.top_k, &mut ys)?;
                // transformers adds the shared experts to the routed sum
                // before the residual; keep that order.
                if let Some([g, u, d]) = shared {
                    let mut shared_out = vec![0.0f32; ys.len()];
                    swiglu(rt.threads, &[c.dense(g)?, c.dense(u)?, c.dense(d)?], xs, &mut shared_out);
                    ys.iter_mut().zip(&shared_out).for_each(|(y, v)| *y += v);
                }
            }
        }
        out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
        Ok(())
    }
}

impl CausalLm for MlaMoe {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn new_cache(&self, capacity_tokens: usize) -> KvCache {
        let latent = self.spec.mla.map_or(1, |m| m.latent_dim());
        let index = self.spec.dsa.as_ref().map(|d| d.index_head_dim);
        KvCache::mla(self.spec.num_layers, latent, index, capacity_tokens)
    }

    fn forward(&self, rt: &Runtime<'_>, tokens: &[u32], cache: &mut KvCache, logits: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let x = self.hidden_states(rt, &mut [SeqBatch { tokens, cache }])?;
        output_logits(rt, &self.container, &self.spec, &x, logits, &self.final_norm, &self.lm_head)
    }

    fn forward_batch(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<Vec<f32>>> {
        if seqs.iter().any(|seq| seq.tokens.is_empty()) {
            return Err(Error::Unsupported("a sequence of a batch has no tokens".into()));
        }
        let x = self.hidden_states(rt, seqs)?;
        batch_logits(rt, &self.container, &self.spec, &x, seqs, &self.final_norm, &self.lm_head)
    }
}
