//! DeepSeek V4's attention block (`DeepseekV4Attention`): a q-LoRA query
//! (`q_a_norm` weighted, each head then RMS-normalised without a weight),
//! one key-value head shared by every query head and read as both key and
//! value (`kv_norm`), RoPE on the trailing `rotary_dim` values of each head
//! (interleaved pairs), a sink logit per head, keys from a sliding window
//! and on CSA and HCA layers the compressed entries each query sees
//! ([`super::compressed`]), the output's rope part rotated back (so each
//! value's contribution depends only on its distance), and a grouped
//! low-rank output projection: `o_groups` blocks of heads each projected
//! by its own rows of `o_a_proj`, then `o_b_proj`.

use strata_format::{CoreSpec, SharedKvAttention, names};
use strata_kv::StatePart;

use super::compressed::{Compressor, EntryIndexer, IndexerPass, trailing_rotary};
use crate::backend::{Backend, MatrixHandle, Rotary, Runtime, SharedKvJob, SharedKvShape, VectorHandle};
use crate::common::Linear;
use crate::error::Result;
use crate::lm::SeqBatch;
use crate::rope::{Angles, Rope};

/// The cache part of the window's rows.
const WINDOW: usize = 0;
/// The first part of the attention's compressor (its entries, then its ring).
const COMPRESSOR: usize = 1;
/// The first part of the indexer's compressor.
const INDEXER: usize = 3;

/// One layer's tensors and shape.
pub struct SharedKv {
    spec: SharedKvAttention,
    /// The block's rotation, for the positions of compressed windows.
    rope: Rope,
    q_a: Linear,
    q_a_norm: VectorHandle,
    q_b: Linear,
    /// Ones: the per-head query norm has no weight.
    q_norm: VectorHandle,
    kv: Linear,
    kv_norm: VectorHandle,
    o_a: MatrixHandle,
    o_b: Linear,
    sinks: VectorHandle,
    compressor: Option<Compressor>,
    indexer: Option<EntryIndexer>,
}

impl SharedKv {
    /// Layer `layer`'s tensors, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, sk: &SharedKvAttention, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.{suffix}"));
        let (h, d, rank, q_dim) = (spec.hidden_size, sk.head_dim, sk.q_lora_rank, sk.q_dim());
        let o_width = sk.o_groups * sk.o_lora_rank;
        let rotary_dim = sk.rope.rotary_dim;
        let states = sk.compressors();
        let compressor = match states.first() {
            Some(&state) => {
                let tensor = |suffix: &str| t(&format!("compressor.{suffix}"));
                Some(Compressor::load(b, &tensor, state, h, sk.eps, rotary_dim, COMPRESSOR)?)
            }
            None => None,
        };
        let indexer = match (states.get(1), sk.compression) {
            (Some(&state), Some(strata_format::Compression::Sparse { indexer, .. })) => {
                let tensor = |suffix: &str| t(&format!("compressor.indexer.{suffix}"));
                Some(EntryIndexer::load(b, &tensor, indexer, state, h, rank, sk.eps, rotary_dim, INDEXER)?)
            }
            _ => None,
        };
        Ok(Self {
            spec: *sk,
            rope: Rope::new(&sk.rope, rotary_dim)?,
            q_a: Linear::load(b, &t("q_a_proj.weight"), None, rank, h)?,
            q_a_norm: b.vector(&t("q_a_norm.weight"), rank)?,
            q_b: Linear::load(b, &t("q_b_proj.weight"), None, q_dim, rank)?,
            q_norm: b.upload_vector(vec![1.0; d]),
            kv: Linear::load(b, &t("kv_proj.weight"), None, d, h)?,
            kv_norm: b.vector(&t("kv_norm.weight"), d)?,
            o_a: b.matrix(&t("o_a_proj.weight"), o_width, q_dim / sk.o_groups)?,
            o_b: Linear::load(b, &t("o_b_proj.weight"), None, h, o_width)?,
            sinks: b.vector(&names::sinks_name(spec, layer), sk.num_heads)?,
            compressor,
            indexer,
        })
    }

    /// What a sequence keeps: the window's ring ([`WINDOW`]), then each
    /// compressor's entries and ring ([`COMPRESSOR`], [`INDEXER`]).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        let window = StatePart::Ring { dim: self.spec.head_dim, window: self.spec.window };
        let compressors = self.compressor.iter().flat_map(Compressor::cache_parts);
        std::iter::once(window)
            .chain(compressors)
            .chain(self.indexer.iter().flat_map(EntryIndexer::cache_parts))
            .collect()
    }

    /// The rotation of queries and keys.
    pub fn rope(&self) -> &strata_format::RopeSpec {
        &self.spec.rope
    }

    fn rotary(&self) -> Rotary {
        trailing_rotary(self.spec.head_dim, self.spec.rope.rotary_dim)
    }

    /// See [`super::Attention::forward`]; `angles` are the rows' angles of
    /// the block's rotation.
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        xs: &[f32],
        angles: &Angles,
        seqs: &mut [SeqBatch<'_>],
    ) -> Vec<f32> {
        let (d, eps) = (self.spec.head_dim, self.spec.eps);
        let q_dim = self.spec.q_dim();
        let mut residual = self.q_a.apply(rt, b, xs);
        b.rmsnorm_rows(self.q_a_norm, eps, &mut residual);
        let mut q = self.q_b.apply(rt, b, &residual);
        b.rmsnorm_rows(self.q_norm, eps, &mut q);
        b.rotate(&mut q, angles, self.rotary());
        let mut kv = self.kv.apply(rt, b, xs);
        b.rmsnorm_rows(self.kv_norm, eps, &mut kv);
        b.rotate(&mut kv, angles, self.rotary());
        let positions: Vec<usize> =
            seqs.iter().flat_map(|seq| seq.cache.len()..seq.cache.len() + seq.tokens.len()).collect();
        let projected = self.compressor.as_ref().map(|c| c.project(rt, b, xs, &positions));
        let index_pass = self.indexer.as_ref().map(|ix| ix.project(rt, b, xs, &residual, angles, &positions));
        // Each sequence's rows and entries into its cache first, with the
        // entries each query sees; then every sequence's attention at once.
        let mut visible = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let (start, rows) = (seq.cache.len(), row..row + seq.tokens.len());
            seq.cache.write(layer, WINDOW, &kv[rows.start * d..rows.end * d]);
            if let (Some(c), Some(projected)) = (&self.compressor, &projected) {
                c.advance(b, &self.rope, seq.cache, layer, start, projected, rows.clone());
            }
            visible.push(self.visible(rt, b, layer, seq, start, index_pass.as_ref(), rows.clone()));
            row = rows.end;
        }
        let mut attn = vec![0.0f32; q.len()];
        let mut jobs = Vec::with_capacity(seqs.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut attn[..]);
        for (seq, visible) in seqs.iter().zip(&visible) {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let (q_seq, q_tail) = q_rest.split_at(m * q_dim);
            let (out_seq, out_tail) = out_rest.split_at_mut(m * q_dim);
            (q_rest, out_rest) = (q_tail, out_tail);
            let first_key = (start + 1).saturating_sub(self.spec.window);
            let entries = self.compressor.as_ref().map_or(&[][..], |c| c.entries(&*seq.cache, layer, start + m));
            jobs.push(SharedKvJob {
                q: q_seq,
                rows: seq.cache.rows_between(layer, WINDOW, first_key, start + m),
                first_key,
                start,
                entries,
                visible,
                out: out_seq,
            });
        }
        let shape =
            SharedKvShape { n_heads: self.spec.num_heads, head_dim: d, window: self.spec.window, sinks: self.sinks };
        b.attend_shared_kv(rt, shape, jobs);
        // Every value carries its own rotation: undo the query's.
        b.rotate(&mut attn, &angles.inverse(), self.rotary());
        self.output(rt, b, &attn)
    }

    /// The entries each of one sequence's queries sees, ascending: none
    /// (sliding only), every closed window's (HCA), or the indexer's choice
    /// (CSA), whose keys it writes first.
    fn visible(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        seq: &mut SeqBatch<'_>,
        start: usize,
        index_pass: Option<&IndexerPass>,
        rows: std::ops::Range<usize>,
    ) -> Vec<Vec<usize>> {
        match (&self.indexer, index_pass, &self.compressor) {
            (Some(ix), Some(pass), _) => ix.select(rt, b, &self.rope, seq.cache, layer, start, pass, rows),
            (None, _, Some(c)) => (start..start + rows.len()).map(|pos| (0..(pos + 1) / c.ratio()).collect()).collect(),
            _ => vec![Vec::new(); rows.len()],
        }
    }

    /// The grouped low-rank output projection of the attention output
    /// `[n, heads * head_dim]`: group `g`'s heads through rows
    /// `g * o_lora_rank..` of `o_a_proj`, the groups side by side, then
    /// `o_b_proj`.
    fn output(&self, rt: &Runtime<'_>, b: &Backend, attn: &[f32]) -> Vec<f32> {
        let (groups, rank) = (self.spec.o_groups, self.spec.o_lora_rank);
        let group_width = self.spec.q_dim() / groups;
        let n = attn.len() / self.spec.q_dim();
        let mut grouped = vec![0.0f32; n * groups * rank];
        let (mut xs, mut ys) = (vec![0.0f32; n * group_width], vec![0.0f32; n * rank]);
        for g in 0..groups {
            for (x, row) in xs.chunks_exact_mut(group_width).zip(attn.chunks_exact(self.spec.q_dim())) {
                x.copy_from_slice(&row[g * group_width..(g + 1) * group_width]);
            }
            b.matmul_rows(rt, self.o_a, g * rank..(g + 1) * rank, &xs, &mut ys);
            for (out, y) in grouped.chunks_exact_mut(groups * rank).zip(ys.chunks_exact(rank)) {
                out[g * rank..(g + 1) * rank].copy_from_slice(y);
            }
        }
        self.o_b.apply(rt, b, &grouped)
    }
}
