//! Qwen3.8-Flash-Next's n-gram Per-Layer Embedding (transformers'
//! `Qwen4ExpTextPLELayer`, models/qwen4_exp/modeling_qwen4_exp.py:1179),
//! added to the residual streams before its layer's blocks.
//!
//! Each token's hashed n-gram ids ([`crate::ngram`]) pick one row of the
//! layer's table per head; the rows, concatenated, go through `key_proj`
//! (a key per stream) and `value_proj` (one value), and the backend gates
//! the value per stream and adds it with its dilated convolution
//! ([`Backend::ple_inject`]). The table is read by row (on disk under
//! `strata_format::Embedding::ReadByRow`, 51 B parameters in the released
//! model). A sequence keeps its last `ngram_size - 1` token ids and the
//! convolution's inputs, as the layer's last two cache parts.

use strata_format::names;
use strata_format::{CoreSpec, NormKind, PleSpec};
use strata_kv::StatePart;

use crate::backend::{Backend, MatrixHandle, PleGate, Runtime, TableHandle};
use crate::error::{Error, Result};
use crate::lm::SeqBatch;
use crate::ngram::{NgramConfig, NgramHash};
use crate::norm::Norm;

/// One layer's PLE: its hashing, table, projections and gate.
pub struct Ple {
    hash: NgramHash,
    table: TableHandle,
    key_proj: MatrixHandle,
    value_proj: MatrixHandle,
    gate: PleGate,
    /// The layer's cache parts of the token ids and the convolution's
    /// inputs.
    parts: [usize; 2],
    spec: PleSpec,
}

impl Ple {
    /// Layer `layer`'s PLE, its state in parts `first_part` and the next of
    /// the layer's cache.
    /// `eps` is the norms' (`rms_norm_eps`).
    pub fn load(
        b: &mut Backend,
        core: &CoreSpec,
        (spec, eps): (&PleSpec, f32),
        layer: usize,
        first_part: usize,
    ) -> Result<Self> {
        let hash = NgramHash::new(&NgramConfig {
            vocab_size: core.vocab_size as u64,
            ngram_size: spec.ngram_size,
            heads_per_ngram: spec.heads_per_ngram,
            ple_layer_index: spec.layer_index,
            seed: spec.seed,
            ngram_vocab_size_base: spec.vocab_base,
            eos: spec.eos,
        })?;
        let [table, key, value, norm_key, norm_query, norm_conv, conv] = names::ple_names(core, layer);
        let rows = spec.table_rows()?;
        let table = b.table(&table, rows, spec.head_dim())?;
        let key_proj = b.matrix(&key, spec.channels, spec.embed_dim)?;
        let value_proj = b.matrix(&value, core.hidden_size, spec.embed_dim)?;
        let norm = |b: &mut Backend, name: &str| -> Result<_> {
            Ok(Norm::load(b, name, NormKind::OnePlusWeight { eps }, spec.channels)?.into_weight())
        };
        let gate = PleGate {
            hidden: core.hidden_size,
            norm_key: norm(b, &norm_key)?,
            norm_query: norm(b, &norm_query)?,
            norm_conv: norm(b, &norm_conv)?,
            conv: b.vector(&conv, spec.channels * spec.conv_kernel)?,
            kernel: spec.conv_kernel,
            dilation: spec.ngram_size,
            eps,
        };
        Ok(Self { hash, table, key_proj, value_proj, gate, parts: [first_part, first_part + 1], spec: *spec })
    }

    /// What a sequence keeps of it: its last token ids, its convolution's
    /// inputs.
    pub fn cache_parts(&self) -> [StatePart; 2] {
        [
            StatePart::Tokens { n: self.spec.context_tokens() },
            StatePart::Fixed { floats: self.spec.conv_state_floats() },
        ]
    }

    /// Adds the PLE of the batch's tokens to `streams` (`[tokens, streams ·
    /// hidden]`, the sequences' rows in order); `layer` is its layer in the
    /// caches, whose token ids it writes and whose convolution state it
    /// stages.
    pub fn add_to(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        streams: &mut [f32],
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<()> {
        let [ids_part, conv_part] = self.parts;
        let mut rows = Vec::new();
        for seq in seqs.iter_mut() {
            let kept = seq.cache.tokens(layer, ids_part, seq.cache.len());
            // Before a sequence's first token its history is EOS.
            let mut context = self.hash.fresh_context();
            let first_kept = context.len() - kept.len();
            context[first_kept..].copy_from_slice(kept);
            for row in self.hash.rows(&context, seq.tokens) {
                // Each id is below its head's offset plus its prime, inside
                // the table (whose rows the spec padded up from their sum).
                rows.push(usize::try_from(row).map_err(|_| Error::Unsupported(format!("n-gram row {row}")))?);
            }
            seq.cache.write_tokens(layer, ids_part, seq.tokens);
        }
        let n = rows.len() / self.hash.heads();
        let mut embedded = vec![0.0f32; rows.len() * self.table.cols];
        b.table_rows(self.table, &rows, &mut embedded)?;
        let (channels, hidden) = (self.spec.channels, self.gate.hidden);
        let mut keys = vec![0.0f32; n * channels];
        let mut values = vec![0.0f32; n * hidden];
        b.matmul(rt, self.key_proj, &embedded, &mut keys);
        b.matmul(rt, self.value_proj, &embedded, &mut values);
        let (mut keys, mut values, mut streams) = (&mut keys[..], &values[..], streams);
        for seq in seqs.iter_mut() {
            let len = seq.tokens.len();
            let (own_keys, rest_keys) = keys.split_at_mut(len * channels);
            let (own_values, rest_values) = values.split_at(len * hidden);
            let (own_streams, rest_streams) = streams.split_at_mut(len * channels);
            let state = seq.cache.stage_state(layer, conv_part);
            b.ple_inject(&self.gate, own_keys, own_values, own_streams, state);
            (keys, values, streams) = (rest_keys, rest_values, rest_streams);
        }
        assert!(streams.is_empty(), "a row of streams per token of the batch");
        Ok(())
    }
}
