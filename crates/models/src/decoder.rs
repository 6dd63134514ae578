//! The one decoder stack every family runs: token embedding, then per layer
//! the attention block and the FFN the layer's [`strata_format::LayerSpec`]
//! names, each wrapped by the layer's residual (mix → norm → block →
//! combine, [`crate::residual`]), then the final norm and the lm head.
//! Under gated residual streams the mix norms the streams itself: the
//! layers have no norms and the stack no final norm.
//!
//! Everything runs on a batch: `forward` is a batch of one sequence,
//! `forward_batch` several (continuous batching). Every projection and each
//! MoE layer's expert union runs once for all rows; attention per sequence,
//! over its own cache; each sequence's logits are bit-identical to running
//! it alone.

use std::sync::Arc;

use strata_format::names::{self, HyperSite};
use strata_format::{Container, CoreSpec, LayerSpec, RopeSpec};
use strata_kv::{LayerLayout, SequenceState};
use strata_sched::Guess;

use crate::attention::{Attention, Pass};
use crate::backend::Runtime;
use crate::backend::{Backend, DeviceRequest, MatrixHandle, StreamHead, TableHandle};
use crate::conv::ShortConvolution;
use crate::error::{Error, Result};
use crate::ffn::Ffn;
use crate::lm::CausalLm;
use crate::lm::SeqBatch;
use crate::lm::{Draft, Logits, Rows};
use crate::norm::Norm;
use crate::ple::Ple;
use crate::residual::{self, Residual, Streams};
use crate::rope::{Angles, Rope};

mod mtp;

/// A loaded model: its layers' blocks over the backend's tensors.
pub struct Decoder {
    backend: Backend,
    spec: CoreSpec,
    layers: Vec<Layer>,
    /// One RoPE table per rotary embedding the layers use.
    ropes: Vec<(RopeSpec, Rope)>,
    /// What each layer keeps per sequence in its cache.
    cache_layouts: Vec<LayerLayout>,
    embed: TableHandle,
    /// The RMSNorm of the embedding rows, if the model has one (Inkling).
    embed_norm: Option<Norm>,
    /// Collapses the streams the layers carry before the final norm.
    head: StreamHead,
    /// `None` where the head is the last step before the lm head.
    final_norm: Option<Norm>,
    lm_head: MatrixHandle,
    /// The multi-token-prediction layer that drafts, where the container
    /// keeps one the decoder can run.
    mtp: Option<mtp::Mtp>,
    /// Why the container's MTP layers do not draft, where it keeps some
    /// the decoder cannot run (`mtp::refusal`).
    mtp_refused: Option<String>,
}

/// One decoder layer.
struct Layer {
    attn_residual: Residual,
    /// `None` where the residual's mix norms the block's input.
    input_norm: Option<Norm>,
    attention: Attention,
    ffn_residual: Residual,
    post_attn_norm: Option<Norm>,
    ffn: Ffn,
    /// The short convolution of the FFN's output, if any (Inkling's
    /// `mlp_sconv`): its state follows the attention's in the layer's cache.
    ffn_conv: Option<ShortConvolution>,
    /// The n-gram Per-Layer Embedding added to the streams before the
    /// blocks, if any (Qwen3.8-Flash-Next): its state comes last.
    ple: Option<Ple>,
}

impl Layer {
    /// Layer `l`'s blocks as `layer` says, and what it keeps per sequence;
    /// adds its rotary embedding to `ropes` if new.
    fn load(
        b: &mut Backend,
        spec: &CoreSpec,
        layer: &LayerSpec,
        l: usize,
        ropes: &mut Vec<(RopeSpec, Rope)>,
    ) -> Result<(Self, LayerLayout)> {
        let h = spec.hidden_size;
        let mut norm = |suffix: &str| match layer.residual.has_layer_norms() {
            true => Norm::load(b, &names::layer_tensor(spec, l, suffix), layer.norm, h).map(Some),
            false => Ok(None),
        };
        let (input_norm, post_attn_norm) = (norm("input_layernorm.weight")?, norm("post_attention_layernorm.weight")?);
        let attention = Attention::load(b, spec, &layer.mixer, layer.norm, l)?;
        if let Some(rope) = layer.mixer.rope()
            && !ropes.iter().any(|(known, _)| known == rope)
        {
            ropes.push((*rope, Rope::new(rope, rope.rotary_dim)?));
        }
        // The engine budgets with the spec's derivation, never building
        // the model: the blocks must keep exactly that.
        let mut parts = attention.cache_parts();
        let ffn_conv = match layer.ffn_output_conv {
            Some(conv) => {
                let name = names::layer_tensor(spec, l, "mlp_sconv.conv1d.weight");
                Some(ShortConvolution::load(b, &name, conv, parts.len())?)
            }
            None => None,
        };
        parts.extend(ffn_conv.as_ref().map(ShortConvolution::cache_part));
        let ple = match &layer.ple {
            Some(ple) => Some(Ple::load(b, spec, (ple, layer.norm.eps()), l, parts.len())?),
            None => None,
        };
        parts.extend(ple.iter().flat_map(Ple::cache_parts));
        let layout = LayerLayout::new(parts);
        assert_eq!(layout, strata_kv::layout_of(layer), "layer {l}: the blocks keep what the spec says");
        let residual = |b: &mut Backend, site| Residual::load(b, spec, layer.residual, layer.norm.eps(), l, site);
        let (attn_residual, ffn_residual) = (residual(b, HyperSite::Attention)?, residual(b, HyperSite::Ffn)?);
        let ffn = Ffn::load(b, spec, &layer.ffn, l)?;
        Ok((Self { attn_residual, input_norm, attention, ffn_residual, post_attn_norm, ffn, ffn_conv, ple }, layout))
    }

    /// The attention block over `streams`, added back into them; `cache_layer`
    /// is its layer in the sequences' caches.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        cache_layer: usize,
        streams: &mut Streams,
        normed: &mut [f32],
        pass: &mut Pass,
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<()> {
        let residual = self.attn_residual;
        norm_into(b, self.input_norm.as_ref(), &residual.mix(rt, b, streams), normed);
        let attn = self.attention.forward(rt, b, cache_layer, normed, pass, seqs)?;
        residual.slot(streams).iter_mut().zip(&attn).for_each(|(x, y)| *x += y);
        residual.combine(b, streams);
        Ok(())
    }

    /// The FFN's input from `streams`, into `normed`.
    fn ffn_input(&self, rt: &Runtime<'_>, b: &Backend, streams: &mut Streams, normed: &mut [f32]) {
        norm_into(b, self.post_attn_norm.as_ref(), &self.ffn_residual.mix(rt, b, streams), normed);
    }

    /// The FFN over `normed` (from [`Layer::ffn_input`]), added back into
    /// `streams`; `(store_layer, cache_layer)` are its layer in the expert
    /// store and in the sequences' caches.
    #[allow(clippy::too_many_arguments)]
    fn add_ffn(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        (store_layer, cache_layer): (usize, usize),
        (positions, tokens): (&[usize], &[u32]),
        normed: &[f32],
        streams: &mut Streams,
        guess: Option<Guess<'_>>,
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<()> {
        let residual = self.ffn_residual;
        match &self.ffn_conv {
            None => self.ffn.add_to(rt, b, store_layer, positions, tokens, normed, residual.slot(streams), guess)?,
            Some(conv) => {
                // The whole output passes the convolution before the
                // residual add.
                let mut ys = vec![0.0f32; normed.len()];
                self.ffn.add_to(rt, b, store_layer, positions, tokens, normed, &mut ys, guess)?;
                conv.apply(b, cache_layer, &mut ys, seqs);
                residual.slot(streams).iter_mut().zip(&ys).for_each(|(x, y)| *x += y);
            }
        }
        residual.combine(b, streams);
        Ok(())
    }
}

impl Decoder {
    /// Builds every layer's blocks from the spec and checks every tensor the
    /// forward pass will read, so that it never meets a missing or
    /// misshapen one.
    pub fn load(container: Arc<Container>) -> Result<Self> {
        Self::load_on(container, DeviceRequest::Cpu)
    }

    /// [`Decoder::load`] on the device `request` names.
    pub fn load_on(container: Arc<Container>, request: DeviceRequest) -> Result<Self> {
        let spec = container.arch().core.clone();
        let arch = container.arch();
        let mut backend = match request {
            DeviceRequest::Cpu => Backend::cpu(Arc::clone(&container)),
            DeviceRequest::Gpu { vram_budget_bytes } => Backend::gpu(Arc::clone(&container), vram_budget_bytes)?,
            DeviceRequest::Cuda { ordinal, vram_budget_bytes } => {
                Backend::cuda(Arc::clone(&container), ordinal, vram_budget_bytes)?
            }
        };
        let b = &mut backend;
        let h = arch.core.hidden_size;
        let mut layers = Vec::with_capacity(arch.layers.len());
        let mut ropes: Vec<(RopeSpec, Rope)> = Vec::new();
        let mut cache_layouts = Vec::with_capacity(arch.layers.len());
        for (l, layer) in arch.layers.iter().enumerate() {
            let (loaded, layout) = Layer::load(b, &spec, layer, l, &mut ropes)?;
            layers.push(loaded);
            cache_layouts.push(layout);
        }
        if layers.is_empty() {
            return Err(Error::Unsupported("a model needs at least one layer".into()));
        }
        // The streams are the stack's, not a layer's: every layer mixes and
        // combines the ones the head collapses.
        let head = residual::load_head(b, &spec, arch.residual(), arch.core.final_norm.eps())?;
        let carries = |layer: &Layer| [layer.attn_residual, layer.ffn_residual].map(Residual::streams);
        if let Some(l) = layers.iter().position(|layer| carries(layer) != [head.streams(); 2]) {
            return Err(Error::Unsupported(format!("layer {l} carries a different number of residual streams")));
        }
        let embed = b.table(&names::embedding_name(&spec), spec.vocab_size, h)?;
        let lm_head = b.matrix(&names::lm_head_name(&spec), spec.vocab_size, h)?;
        let final_norm = match arch.residual().has_layer_norms() {
            true => Some(Norm::load(b, &names::final_norm_name(&spec), arch.core.final_norm, h)?),
            false => None,
        };
        let mtp_refused = mtp::refusal(arch, head.streams());
        let mtp = match (arch.mtp.as_slice(), &mtp_refused) {
            ([layer], None) => Some(mtp::Mtp::load(b, &spec, (layer, arch.mtp_form), arch.layers.len(), &mut ropes)?),
            _ => None,
        };
        let embed_norm = match spec.embed_norm {
            Some(kind) => Some(Norm::load(b, &names::embed_norm_name(&spec), kind, h)?),
            None => None,
        };
        Ok(Self {
            backend,
            spec,
            layers,
            ropes,
            cache_layouts,
            embed,
            embed_norm,
            head,
            final_norm,
            lm_head,
            mtp,
            mtp_refused,
        })
    }

    /// The final hidden states (before the last norm) of every new row of
    /// every sequence, extending each sequence's cache.
    fn hidden_states(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<f32>> {
        let b = &self.backend;
        let (tokens, positions) = batch_rows(seqs)?;
        let angles = self.ropes.iter().map(|(spec, rope)| (*spec, Angles::new(rope, &positions))).collect();
        let mut pass = Pass::new(angles, seqs.len());
        let mut streams = Streams::expand(self.head.streams(), self.embed(&tokens)?, self.spec.hidden_size);
        let mut normed = vec![0.0f32; tokens.len() * self.spec.hidden_size];
        self.guess_first_layer(rt, &mut streams, &mut normed, &tokens)?;
        for (l, layer) in self.layers.iter().enumerate() {
            if let Some(ple) = &layer.ple {
                ple.add_to(rt, b, l, streams.rows_mut(), seqs)?;
            }
            layer.attend(rt, b, l, &mut streams, &mut normed, &mut pass, seqs)?;
            layer.ffn_input(rt, b, &mut streams, &mut normed);
            // Look-ahead: the next layer's router on this layer's FFN input
            // guesses what it will read; the store starts those reads while
            // this layer computes. Only bytes move on a guess, never results.
            let predicted = match self.layers.get(l + 1) {
                Some(next) if rt.store.prefetching() => next.ffn.predict(rt, b, &normed, &tokens),
                _ => None,
            };
            let guess = predicted.as_deref().map(|experts| Guess { layer: l + 1, experts });
            layer.add_ffn(rt, b, (l, l), (&positions, &tokens), &normed, &mut streams, guess, seqs)?;
        }
        for seq in seqs.iter_mut() {
            seq.cache.advance(seq.tokens.len());
        }
        debug_assert_eq!(streams.tokens(), tokens.len(), "a row per token");
        Ok(streams.collapse(rt, b, &self.head))
    }

    /// Look-ahead for layer 0, which no layer runs before: its router on its
    /// FFN norm of the embeddings alone (the attention output not yet added)
    /// guesses its experts, read while its attention runs. Only bytes move
    /// on a guess. `scratch` is `[n, hidden]` of any contents.
    fn guess_first_layer(
        &self,
        rt: &Runtime<'_>,
        streams: &mut Streams,
        scratch: &mut [f32],
        tokens: &[u32],
    ) -> Result<()> {
        let first = &self.layers[0];
        if !rt.store.prefetching() {
            return Ok(());
        }
        let b = &self.backend;
        norm_into(b, first.post_attn_norm.as_ref(), &first.ffn_residual.mix(rt, b, streams), scratch);
        if let Some(experts) = first.ffn.predict(rt, b, scratch, tokens) {
            rt.store.prefetch(0, &experts)?;
        }
        Ok(())
    }

    /// The stack's input rows for `tokens`, `[n, hidden]`: the embedding
    /// table's, RMS-normed where the model norms them (Inkling).
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut x = self.embedding_rows(tokens)?;
        if let Some(norm) = &self.embed_norm {
            norm.apply_rows(&self.backend, &mut x);
        }
        Ok(x)
    }

    /// Rows of the embedding table for `tokens` as stored, `[n, hidden]`.
    /// (The table may be on disk: `strata_format::Embedding::ReadByRow`.)
    fn embedding_rows(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (h, vocab_size) = (self.spec.hidden_size, self.spec.vocab_size);
        let rows = tokens
            .iter()
            .map(|&token| match token as usize {
                row if row < vocab_size => Ok(row),
                _ => Err(Error::TokenOutOfRange { token, vocab_size }),
            })
            .collect::<Result<Vec<usize>>>()?;
        let mut x = vec![0.0f32; tokens.len() * h];
        self.backend.table_rows(self.embed, &rows, &mut x)?;
        Ok(x)
    }

    /// The final norm and lm head over the rows of `x` that `which` asks
    /// for: `[rows, logits_width]`, the hidden states divided by the μP
    /// multiplier first and the padded vocabulary's logits cut, where the
    /// model has them (Inkling).
    fn logits(&self, rt: &Runtime<'_>, x: &[f32], which: Logits) -> Result<Vec<f32>> {
        let h = self.spec.hidden_size;
        let n = x.len() / h;
        let rows = match which {
            Logits::All => x,
            Logits::Last => &x[(n - 1) * h..],
        };
        let mut normed = vec![0.0f32; rows.len()];
        norm_into(&self.backend, self.final_norm.as_ref(), rows, &mut normed);
        Ok(self.head_logits(rt, normed))
    }

    /// The lm head over final-normed rows `[m, hidden]`: `[m, logits_width]`,
    /// the rows divided by the μP multiplier first and the padded
    /// vocabulary's logits cut, where the model has them (Inkling).
    fn head_logits(&self, rt: &Runtime<'_>, mut normed: Vec<f32>) -> Vec<f32> {
        if let Some(divisor) = self.spec.logits_mup_divisor {
            normed.iter_mut().for_each(|x| *x /= divisor);
        }
        let vocab_size = self.spec.vocab_size;
        let mut out = vec![0.0f32; normed.len() / self.spec.hidden_size * vocab_size];
        self.backend.matmul(rt, self.lm_head, &normed, &mut out);
        let width = self.spec.logits_width();
        if width < vocab_size {
            out = out.chunks_exact(vocab_size).flat_map(|row| &row[..width]).copied().collect();
        }
        out
    }
}

/// `xs` through `norm` into `out`, or as it is where there is none.
fn norm_into(b: &Backend, norm: Option<&Norm>, xs: &[f32], out: &mut [f32]) {
    match norm {
        Some(norm) => norm.apply(b, xs, out),
        None => out.copy_from_slice(xs),
    }
}

/// A batch's new tokens, concatenated, and each one's position in its own
/// sequence; reserves every sequence's cache room for them first.
fn batch_rows(seqs: &mut [SeqBatch<'_>]) -> Result<(Vec<u32>, Vec<usize>)> {
    for seq in seqs.iter_mut() {
        seq.cache.reserve(seq.tokens.len())?;
    }
    let tokens = seqs.iter().flat_map(|seq| seq.tokens.iter().copied()).collect();
    let positions = seqs.iter().flat_map(|seq| seq.cache.len()..seq.cache.len() + seq.tokens.len()).collect();
    Ok((tokens, positions))
}

impl CausalLm for Decoder {
    fn core(&self) -> &CoreSpec {
        &self.spec
    }

    fn device_summary(&self) -> Option<String> {
        self.backend.summary()
    }

    fn vram_stats(&self) -> Option<crate::VramStats> {
        self.backend.vram_stats()
    }

    fn new_cache(&self, capacity_tokens: usize) -> SequenceState {
        SequenceState::with_layers(self.cache_layouts.clone(), capacity_tokens)
    }

    fn forward(&self, rt: &Runtime<'_>, tokens: &[u32], cache: &mut SequenceState, logits: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let x = self.hidden_states(rt, &mut [SeqBatch { tokens, cache }])?;
        self.logits(rt, &x, logits)
    }

    fn forward_hidden(
        &self,
        rt: &Runtime<'_>,
        tokens: &[u32],
        cache: &mut SequenceState,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        if tokens.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let x = self.hidden_states(rt, &mut [SeqBatch { tokens, cache }])?;
        let mut normed = vec![0.0f32; x.len()];
        norm_into(&self.backend, self.final_norm.as_ref(), &x, &mut normed);
        Ok((self.head_logits(rt, normed.clone()), normed))
    }

    fn forward_batch_rows(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>], which: &[Logits]) -> Result<Vec<Rows>> {
        assert_eq!(seqs.len(), which.len(), "one choice of logits per sequence");
        if seqs.iter().any(|seq| seq.tokens.is_empty()) {
            return Err(Error::Unsupported("a sequence of a batch has no tokens".into()));
        }
        let lengths: Vec<usize> = seqs.iter().map(|seq| seq.tokens.len()).collect();
        let x = self.hidden_states(rt, seqs)?;
        let h = self.spec.hidden_size;
        let mut normed = vec![0.0f32; x.len()];
        norm_into(&self.backend, self.final_norm.as_ref(), &x, &mut normed);
        // The rows asked for, of every sequence; the lm head runs once over all.
        let mut head_rows = Vec::new();
        let mut start = 0;
        for (&n, &which) in lengths.iter().zip(which) {
            let first = if which == Logits::All { start } else { start + n - 1 };
            head_rows.extend_from_slice(&normed[first * h..(start + n) * h]);
            start += n;
        }
        let logits = self.head_logits(rt, head_rows);
        let width = self.spec.logits_width();
        let (mut row, mut start) = (0, 0);
        let mut out = Vec::with_capacity(seqs.len());
        for (&n, &which) in lengths.iter().zip(which) {
            let rows = if which == Logits::All { n } else { 1 };
            out.push(Rows {
                logits: logits[row * width..(row + rows) * width].to_vec(),
                hidden: normed[start * h..(start + n) * h].to_vec(),
            });
            row += rows;
            start += n;
        }
        Ok(out)
    }

    fn mtp_layers(&self) -> usize {
        self.mtp.iter().count()
    }

    fn mtp_refused(&self) -> Option<&str> {
        self.mtp_refused.as_deref()
    }

    fn new_draft_cache(&self, capacity_tokens: usize) -> SequenceState {
        self.draft_cache(capacity_tokens)
    }

    fn draft(
        &self,
        rt: &Runtime<'_>,
        hidden: &[f32],
        next: &[u32],
        cache: &mut SequenceState,
        first_row: usize,
        which: Logits,
    ) -> Result<Draft> {
        self.draft_rows(rt, hidden, next, (cache, first_row), which)
    }

    fn forward_batch(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<Vec<f32>>> {
        if seqs.iter().any(|seq| seq.tokens.is_empty()) {
            return Err(Error::Unsupported("a sequence of a batch has no tokens".into()));
        }
        let x = self.hidden_states(rt, seqs)?;
        // Each sequence's last row; the lm head runs once over all.
        let h = self.spec.hidden_size;
        let mut last_rows = Vec::with_capacity(seqs.len() * h);
        let mut end = 0;
        for seq in seqs.iter() {
            end += seq.tokens.len();
            last_rows.extend_from_slice(&x[(end - 1) * h..end * h]);
        }
        let logits = self.logits(rt, &last_rows, Logits::All)?;
        Ok(logits.chunks_exact(self.spec.logits_width()).map(<[f32]>::to_vec).collect())
    }
}
