//! The multi-token-prediction layer, as transformers' `MtpModel` computes
//! it: from the stack's hidden state at position p (after the final norm)
//! and the embedding of token p + 1 (the table's row as stored: `MtpModel`
//! drops Inkling's embedding norm), each RMS-normed (`hnorm`, `enorm`) and
//! joined as the form says (`MtpForm::hidden_first`: DeepSeek-V3's
//! `[embedding, hidden]`, Inkling's `[hidden, embedding]`), `eh_proj` gives
//! the input of a decoder layer of its own, whose output after the form's
//! norm (DeepSeek-V3's `shared_head.norm`, Inkling's shared chain norm, or
//! none) goes through the model's lm head as the stack's does (Inkling's μP
//! divisor and unpadded vocabulary included): logits for token p + 2.
//!
//! Qwen3-Next's and Qwen3.5/3.6's MTP module is the same computation
//! (vLLM's `Qwen3NextMultiTokenPredictor`: `pre_fc_norm_embedding` and
//! `pre_fc_norm_hidden` over the same inputs, joined embedding first, `fc`,
//! a full-attention layer of the stack's kind, `norm`; strata-format's
//! `family/hybrid.rs` cites it line by line), which convert stores in this
//! form: it drafts here as it is.
//!
//! Its attention keeps its own cache (a `SequenceState` of one layer, the
//! draft cache), whose first row is the second token's: row r is position
//! r + 1 (the pass says so to blocks that read positions without rotary
//! angles: Inkling's log scaling, as `MtpCache`'s query offset), or
//! `first_row + r + 1` where a drafter restarted it at the stack's row
//! `first_row` (it then attends over the rows since: other drafts, the
//! same tokens). Its
//! experts are the container's layer `num_hidden_layers`, read through the
//! same store and budget as the stack's.
//!
//! A layer with a fixed state (Inkling's short convolutions, a sliding
//! window's ring) drafts too: the engine's drafter snapshots the draft
//! cache at its committed rows before drafting past them and restores that
//! snapshot after, since cutting rows back does not undo a state. Only one
//! layer over a plain residual drafts; other MTP layers (several chained,
//! residual streams) are left unloaded, and the model says why
//! ([`refusal`]) instead of drafting wrongly.

use strata_format::names;
use strata_format::{CoreSpec, LayerSpec, ModelArch, MtpForm, MtpOutputNorm, ResidualKind, RopeSpec};
use strata_kv::{LayerLayout, SequenceState};

use super::{Decoder, Layer};
use crate::attention::Pass;
use crate::backend::{Backend, MatrixHandle, Runtime};
use crate::error::{Error, Result};
use crate::lm::{Draft, Logits, SeqBatch};
use crate::norm::Norm;
use crate::residual::Streams;
use crate::rope::{Angles, Rope};

/// One MTP layer's blocks.
pub(super) struct Mtp {
    enorm: Norm,
    hnorm: Norm,
    eh_proj: MatrixHandle,
    /// `eh_proj` takes `[hidden, embedding]` ([`MtpForm::hidden_first`]).
    hidden_first: bool,
    layer: Layer,
    /// The norm of its output before the lm head ([`MtpForm::output_norm`]);
    /// `None`: the output as it is.
    output_norm: Option<Norm>,
    /// The layer's index in the container: its tensors and expert file.
    index: usize,
    pub(super) cache_layout: LayerLayout,
}

/// Why `arch`'s MTP layers cannot draft here (`None`: they can, or there
/// are none), over a stack carrying `streams` residual streams.
pub(super) fn refusal(arch: &ModelArch, streams: usize) -> Option<String> {
    let layer = match arch.mtp.as_slice() {
        [] => return None,
        [layer] => layer,
        more => return Some(format!("{} MTP layers: Strata drafts with one", more.len())),
    };
    if streams != 1 || layer.residual != ResidualKind::Plain {
        return Some(format!("an MTP layer over {streams} residual streams: Strata drafts over a plain residual"));
    }
    None
}

impl Mtp {
    /// MTP layer `index` (numbered after the stack's layers) as `layer`
    /// and the model's MTP `form` say; adds its rotary embedding to
    /// `ropes` if new.
    pub(super) fn load(
        b: &mut Backend,
        spec: &CoreSpec,
        (layer, form): (&LayerSpec, MtpForm),
        index: usize,
        ropes: &mut Vec<(RopeSpec, Rope)>,
    ) -> Result<Self> {
        // `refusal` keeps any other layer from loading.
        assert_eq!(layer.residual, ResidualKind::Plain, "MTP layer {index}: a plain residual");
        let h = spec.hidden_size;
        let t = |suffix: &str| names::layer_tensor(spec, index, suffix);
        let enorm = Norm::load(b, &t("enorm.weight"), layer.norm, h)?;
        let hnorm = Norm::load(b, &t("hnorm.weight"), layer.norm, h)?;
        let eh_proj = b.matrix(&t("eh_proj.weight"), h, 2 * h)?;
        let (layer_blocks, cache_layout) = Layer::load(b, spec, layer, index, ropes)?;
        let output_norm = match form.output_norm {
            MtpOutputNorm::PerLayer => Some(t(names::MTP_HEAD_NORM)),
            MtpOutputNorm::Chain => Some(names::mtp_chain_norm_name(spec)),
            MtpOutputNorm::Unnormed => None,
        };
        let output_norm = output_norm.map(|name| Norm::load(b, &name, layer.norm, h)).transpose()?;
        let hidden_first = form.hidden_first;
        Ok(Self { enorm, hnorm, eh_proj, hidden_first, layer: layer_blocks, output_norm, index, cache_layout })
    }
}

impl Decoder {
    /// An empty draft cache holding at most `capacity_tokens`.
    pub(super) fn draft_cache(&self, capacity_tokens: usize) -> SequenceState {
        let layouts = self.mtp.iter().map(|mtp| mtp.cache_layout.clone()).collect();
        SequenceState::with_layers(layouts, capacity_tokens)
    }

    /// The MTP layer's logits for tokens p + 2 from `hidden` (the stack's
    /// final-normed rows at positions p, `[n, hidden]`) and `next` (tokens
    /// p + 1), extending the draft cache `cache`, whose row 0 took the
    /// stack's row `first_row`: the first p is `first_row + cache.len()`.
    pub(super) fn draft_rows(
        &self,
        rt: &Runtime<'_>,
        hidden: &[f32],
        next: &[u32],
        (cache, first_row): (&mut SequenceState, usize),
        which: Logits,
    ) -> Result<Draft> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            Error::Unsupported(self.mtp_refused.clone().unwrap_or_else(|| "the model has no MTP layer".into()))
        })?;
        let (b, h, n) = (&self.backend, self.spec.hidden_size, next.len());
        assert_eq!(hidden.len(), n * h, "a hidden row per next token");
        cache.reserve(n)?;
        // Row r of the draft cache is position first_row + r + 1 (the
        // first token has no MTP row: nothing precedes it).
        let first_position = first_row.checked_add(1).expect("a row of the stack is a position");
        let positions: Vec<usize> = (first_position + cache.len()..first_position + cache.len() + n).collect();
        let angles = self.ropes.iter().map(|(spec, rope)| (*spec, Angles::new(rope, &positions))).collect();
        let mut pass = Pass::new(angles, 1).with_first_position(first_position);
        let mut embedded = self.embedding_rows(next)?;
        mtp.enorm.apply_rows(b, &mut embedded);
        let mut previous = hidden.to_vec();
        mtp.hnorm.apply_rows(b, &mut previous);
        let (first, second) = if mtp.hidden_first { (&previous, &embedded) } else { (&embedded, &previous) };
        let joined: Vec<f32> =
            first.chunks_exact(h).zip(second.chunks_exact(h)).flat_map(|(a, z)| a.iter().chain(z)).copied().collect();
        let mut x = vec![0.0f32; n * h];
        b.matmul(rt, mtp.eh_proj, &joined, &mut x);
        let mut streams = Streams::expand(1, x, h);
        let mut normed = vec![0.0f32; n * h];
        let mut seqs = [SeqBatch { tokens: next, cache }];
        // The draft cache's one layer is layer 0; the store's is `index`.
        mtp.layer.attend(rt, b, 0, &mut streams, &mut normed, &mut pass, &mut seqs)?;
        mtp.layer.ffn_input(rt, b, &mut streams, &mut normed);
        mtp.layer.add_ffn(rt, b, (mtp.index, 0), (&positions, next), &normed, &mut streams, None, &mut seqs)?;
        seqs[0].cache.advance(n);
        let mut out = streams.collapse(rt, b, &self.head);
        if let Some(norm) = &mtp.output_norm {
            norm.apply_rows(b, &mut out);
        }
        let head_rows = match which {
            Logits::All => out.clone(),
            Logits::Last => out[(n - 1) * h..].to_vec(),
        };
        Ok(Draft { logits: self.head_logits(rt, head_rows), hidden: out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_arch(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> ModelArch {
        let path = format!("{}/../../testdata/{family}/config.json", env!("CARGO_MANIFEST_DIR"));
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut config);
        ModelArch::from_config_value(&config).unwrap()
    }

    /// One MTP layer over a plain residual drafts, in DeepSeek-V3's form
    /// or Inkling's (its hidden-first join and convolution state); two, or
    /// a stack of residual streams, are refused, saying what is missing,
    /// rather than drafted wrongly.
    #[test]
    fn one_mtp_layer_over_a_plain_residual_drafts_in_either_form() {
        assert_eq!(refusal(&fixture_arch("deepseek_v3/hf", |_| {}), 1), None);
        let two = fixture_arch("deepseek_v3/hf", |c| c["num_nextn_predict_layers"] = 2.into());
        assert_eq!(refusal(&two, 1).unwrap(), "2 MTP layers: Strata drafts with one");
        assert!(refusal(&fixture_arch("deepseek_v3/hf", |_| {}), 2).unwrap().contains("residual streams"));
        let inkling = fixture_arch("inkling/hf", |c| c["num_mtp_layers"] = 1.into());
        assert!(inkling.mtp[0].state_floats() > 0, "Inkling's MTP layer keeps convolution states");
        assert_eq!(refusal(&inkling, 1), None);
        let chained = fixture_arch("inkling/hf", |c| c["num_mtp_layers"] = 2.into());
        assert_eq!(refusal(&chained, 1).unwrap(), "2 MTP layers: Strata drafts with one");
    }
}
