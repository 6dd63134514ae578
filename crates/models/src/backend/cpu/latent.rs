//! Multi-head Latent Attention on the CPU, per head across the pool, in
//! whichever of its two equivalent forms costs fewer multiply-adds
//! (`crate::mla`, `docs/mla.md` §1).

use rayon::prelude::*;
use strata_kernels::simd::Isa;
use strata_kernels::{Matrix, Threads, ops};

use crate::backend::{LatentJob, LatentShape};

/// Largest expansion (keys × heads × (nope + v) f32, 48 MiB) the prefill
/// may build instead of attending over the latents: the engine's cap on
/// one pass's activations (`strata_engine::ACTIVATION_BYTES_MAX`), which
/// live in the memory budget's slack.
const MAX_EXPANDED_FLOATS: usize = 12 << 20;

/// The attention of `job`'s queries over its latents, `[n, heads *
/// v_head_dim]`; `kv_b` is `shape.kv_b`'s matrix. Each head is computed by
/// the same code on any thread.
pub fn attend(threads: &Threads, isa: Isa, shape: &LatentShape, kv_b: &Matrix<'_>, job: &LatentJob<'_>) -> Vec<f32> {
    let d = &shape.dims;
    let n = job.q.len() / (shape.heads * d.qk_head_dim());
    let keys = job.latents.len() / d.latent_dim();
    let ctx = Ctx { shape, isa, job, n };
    // Multiply-adds per head: expanding costs one up-projection per key
    // plus plain attention; absorbing costs two projections per query
    // plus attention over the wider latent. Expanding also holds every
    // key's heads at once, so it is only chosen while that stays small.
    let (r, dn, dv, dq) = (d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim, d.qk_head_dim());
    let expanded_cost = keys * (dn + dv) * r + n * keys * (dq + dv);
    let absorbed_cost = n * (dn + dv) * r + n * keys * (2 * r + d.qk_rope_head_dim);
    let expanded_floats = keys * kv_b.rows;
    let per_head: Vec<Vec<f32>> = if absorbed_cost <= expanded_cost || expanded_floats > MAX_EXPANDED_FLOATS {
        threads.pool().install(|| (0..shape.heads).into_par_iter().map(|h| ctx.absorbed_head(kv_b, h)).collect())
    } else {
        let mut latent = vec![0.0f32; keys * r];
        for (dst, row) in latent.chunks_exact_mut(r).zip(job.latents.chunks_exact(d.latent_dim())) {
            dst.copy_from_slice(&row[..r]);
        }
        let mut kv = vec![0.0f32; keys * kv_b.rows];
        threads.matmul(kv_b, &latent, keys, &mut kv);
        threads.pool().install(|| (0..shape.heads).into_par_iter().map(|h| ctx.expanded_head(&kv, h)).collect())
    };
    let mut out = vec![0.0f32; n * shape.heads * dv];
    for (h, head) in per_head.iter().enumerate() {
        for (i, o) in head.chunks_exact(dv).enumerate() {
            out[(i * shape.heads + h) * dv..][..dv].copy_from_slice(o);
        }
    }
    out
}

/// The positions one query attends to.
#[derive(Clone, Copy)]
enum Visible<'a> {
    /// Every position up to and including this one.
    UpTo(usize),
    /// Exactly these (DSA's choice).
    Only(&'a [usize]),
}

impl Visible<'_> {
    fn positions(self) -> impl Iterator<Item = usize> + Clone {
        let (up_to, only) = match self {
            Visible::UpTo(last) => (0..last + 1, &[][..]),
            Visible::Only(positions) => (0..0, positions),
        };
        up_to.chain(only.iter().copied())
    }
}

/// What one head's attention reads.
struct Ctx<'a> {
    shape: &'a LatentShape,
    isa: Isa,
    job: &'a LatentJob<'a>,
    n: usize,
}

impl Ctx<'_> {
    /// Positions query `i` attends to.
    fn visible(&self, i: usize) -> Visible<'_> {
        match self.job.selection {
            Some(selected) => Visible::Only(&selected[i]),
            None => Visible::UpTo(self.job.start + i),
        }
    }

    /// Head `h`'s query `i`: its no-position and rotated parts.
    fn query(&self, i: usize, h: usize) -> (&[f32], &[f32]) {
        let d = &self.shape.dims;
        let dq = d.qk_head_dim();
        let head = &self.job.q[(i * self.shape.heads + h) * dq..][..dq];
        head.split_at(d.qk_nope_head_dim)
    }

    /// The latent `c_t` and rotated key `k_pe_t` of cached position `t`.
    fn latent(&self, t: usize) -> (&[f32], &[f32]) {
        let d = &self.shape.dims;
        self.job.latents[t * d.latent_dim()..][..d.latent_dim()].split_at(d.kv_lora_rank)
    }

    /// Head `h` attending over the cached latents directly, `[n, v_head_dim]`.
    fn absorbed_head(&self, kv_b: &Matrix<'_>, h: usize) -> Vec<f32> {
        let d = &self.shape.dims;
        let (r, dn, dv) = (d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim);
        let isa = self.isa;
        let first_row = h * (dn + dv);
        // W_uk_h: dn rows of r, dequantized once for the batch.
        let mut w_uk = vec![0.0f32; dn * r];
        for (j, row) in w_uk.chunks_exact_mut(r).enumerate() {
            kv_b.row_to_f32(first_row + j, row);
        }
        let w_uv = kv_b.row_range(first_row + dn, dv).expect("kv_b_proj holds every head (checked at load)");
        let mut out = vec![0.0f32; self.n * dv];
        let mut q_lat = vec![0.0f32; r];
        let mut o_lat = vec![0.0f32; r];
        let mut scores = Vec::new();
        for (i, o) in out.chunks_exact_mut(dv).enumerate() {
            let (q_nope, q_pe) = self.query(i, h);
            q_lat.fill(0.0);
            for (&qj, row) in q_nope.iter().zip(w_uk.chunks_exact(r)) {
                isa.axpy(qj, row, &mut q_lat);
            }
            let visible = self.visible(i).positions();
            scores.clear();
            scores.extend(visible.clone().map(|t| {
                let (c_t, k_pe) = self.latent(t);
                (isa.dot_f32(&q_lat, c_t) + isa.dot_f32(q_pe, k_pe)) * self.shape.scale
            }));
            ops::softmax_inplace(&mut scores);
            o_lat.fill(0.0);
            for (t, &p) in visible.zip(&scores) {
                isa.axpy(p, self.latent(t).0, &mut o_lat);
            }
            w_uv.matvec(&o_lat, o);
        }
        out
    }

    /// Head `h` over keys and values expanded from every latent (`kv`,
    /// `[keys, heads * (nope + v)]`), `[n, v_head_dim]`.
    fn expanded_head(&self, kv: &[f32], h: usize) -> Vec<f32> {
        let d = &self.shape.dims;
        let (dn, dv) = (d.qk_nope_head_dim, d.v_head_dim);
        let isa = self.isa;
        let stride = self.shape.heads * (dn + dv);
        let mut out = vec![0.0f32; self.n * dv];
        let mut scores = Vec::new();
        for (i, o) in out.chunks_exact_mut(dv).enumerate() {
            let (q_nope, q_pe) = self.query(i, h);
            let visible = self.visible(i).positions();
            scores.clear();
            scores.extend(visible.clone().map(|t| {
                let k_nope = &kv[t * stride + h * (dn + dv)..][..dn];
                (isa.dot_f32(q_nope, k_nope) + isa.dot_f32(q_pe, self.latent(t).1)) * self.shape.scale
            }));
            ops::softmax_inplace(&mut scores);
            for (t, &p) in visible.zip(&scores) {
                isa.axpy(p, &kv[t * stride + h * (dn + dv) + dn..][..dv], o);
            }
        }
        out
    }
}
