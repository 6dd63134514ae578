//! gpt-oss's routed experts as its checkpoints store them, read one expert
//! at a time into the record's gate, up and down (`[inter, hidden]`,
//! `[inter, hidden]`, `[hidden, inter]`).
//!
//! Two layouts exist under a layer's `mlp.experts.`:
//!
//! * what transformers' `save_pretrained` writes: `gate_up_proj`
//!   `[E, hidden, 2·inter]` (the transpose of a linear weight) whose even
//!   columns are the gate's and odd ones the up's, and `down_proj`
//!   `[E, inter, hidden]`;
//! * the hub's MXFP4 checkpoints: `gate_up_proj_blocks` `[E, 2·inter,
//!   hidden/32, 16]` with `gate_up_proj_scales` `[E, 2·inter, hidden/32]`
//!   (rows in linear-weight order, row `2r` the gate's row `r`, `2r + 1` the
//!   up's), and `down_proj_blocks`/`_scales` over `[E, hidden, inter]`
//!   (see [`strata_kernels::mxfp4`]).
//!
//! Both carry `gate_up_proj_bias` `[E, 2·inter]` (interleaved alike) and
//! `down_proj_bias` `[E, hidden]`.

use safetensors::tensor::Dtype;
use strata_kernels::mxfp4::{BLOCK_BYTES, BLOCK_VALUES};

use super::{Checkpoint, Mxfp4Bytes};
use crate::error::{Error, Result};

/// The widths of one layer's interleaved experts.
#[derive(Debug, Clone, Copy)]
pub struct InterleavedExperts<'a> {
    /// Where the layer's expert tensors live, e.g. `model.layers.3.mlp.experts.`.
    pub prefix: &'a str,
    pub num_experts: usize,
    pub hidden: usize,
    pub inter: usize,
}

impl InterleavedExperts<'_> {
    fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// The first element and the count of expert `expert`'s slab of
    /// `rows · cols` elements, checked.
    fn slab(&self, expert: usize, rows: usize, cols: usize) -> Result<(usize, usize)> {
        if expert >= self.num_experts {
            return Err(Error::Checkpoint {
                path: self.prefix.into(),
                reason: format!("expert {expert} of {}", self.num_experts),
            });
        }
        let slab = rows.checked_mul(cols).ok_or_else(|| overflow(self.prefix))?;
        let first = expert.checked_mul(slab).ok_or_else(|| overflow(self.prefix))?;
        Ok((first, slab))
    }
}

fn overflow(prefix: &str) -> Error {
    Error::Checkpoint { path: prefix.into(), reason: "expert tensor sizes overflow".into() }
}

/// Splits `[2·inter, width]` rows (`width` elements each: values, or an
/// MXFP4 row's code or scale bytes, a row being whole blocks) whose even
/// rows are the gate's and odd rows the up's into gate and up, `[inter,
/// width]` each.
pub(super) fn split_rows<T: Copy>(rows: &[T], width: usize) -> (Vec<T>, Vec<T>) {
    let (mut gate, mut up) = (Vec::with_capacity(rows.len() / 2), Vec::with_capacity(rows.len() / 2));
    for pair in rows.chunks_exact(2 * width) {
        gate.extend_from_slice(&pair[..width]);
        up.extend_from_slice(&pair[width..]);
    }
    (gate, up)
}

/// The inverse of [`split_rows`]: gate and up (`[n, run]` each) as
/// alternating runs of `run` values, the gate's first. Runs of one make
/// `gate_up_proj_bias` of the split biases.
pub(crate) fn interleave(gate: &[f32], up: &[f32], run: usize) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "gate and up pair up");
    assert!(run > 0 && gate.len().is_multiple_of(run), "whole runs of {run}");
    gate.chunks_exact(run).zip(up.chunks_exact(run)).flat_map(|(g, u)| g.iter().chain(u)).copied().collect()
}

/// One expert's slab of `gate_up_proj`, `[hidden, 2·inter]`, from its gate
/// and up (`[inter, hidden]` each): what the reader takes apart.
pub(crate) fn fused_gate_up(gate: &[f32], up: &[f32], hidden: usize) -> Vec<f32> {
    let rows = interleave(gate, up, hidden);
    transpose(&rows, rows.len() / hidden, hidden)
}

/// One expert's slab of `down_proj`, `[inter, hidden]`, from its down
/// (`[hidden, inter]`).
pub(crate) fn fused_down(down: &[f32], hidden: usize) -> Vec<f32> {
    transpose(down, hidden, down.len() / hidden)
}

/// The transpose of a row-major `[rows, cols]` matrix.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(m.len(), rows * cols, "a [rows, cols] matrix");
    (0..cols).flat_map(|c| (0..rows).map(move |r| m[r * cols + c])).collect()
}

/// The stored tensor a split expert bias is read from (see
/// [`crate::names::expert_bias_names`]), and which of its interleaved
/// columns it takes (0: the gate's, 1: the up's).
pub(super) fn split_bias_source(name: &str) -> Option<(String, usize)> {
    [("experts.gate_proj_bias", 0), ("experts.up_proj_bias", 1)].into_iter().find_map(|(suffix, parity)| {
        name.strip_suffix(suffix).map(|base| (format!("{base}experts.gate_up_proj_bias"), parity))
    })
}

/// Every other column, from `parity`, of `[rows, 2·cols]` rows.
fn take_columns(interleaved: &[f32], parity: usize) -> Vec<f32> {
    interleaved.iter().skip(parity).step_by(2).copied().collect()
}

/// Whether the fused experts under `prefix` are gpt-oss's: only those carry
/// biases (and interleave gate and up).
pub(super) fn is_interleaved(ckpt: &Checkpoint, prefix: &str) -> bool {
    ckpt.has(&format!("{prefix}gate_up_proj_bias"))
}

/// The tensors holding the interleaved experts under `prefix` in whichever
/// layout is stored, their biases included; none unless they are
/// interleaved.
pub(crate) fn interleaved_sources(ckpt: &Checkpoint, prefix: &str) -> Vec<String> {
    if !is_interleaved(ckpt, prefix) {
        return Vec::new();
    }
    let packed = ["gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"];
    let dequantized = ["gate_up_proj", "down_proj"];
    let biases = ["gate_up_proj_bias", "down_proj_bias"];
    let stored = |suffixes: &[&str]| suffixes.iter().map(|s| format!("{prefix}{s}")).filter(|n| ckpt.has(n)).collect();
    let mut found: Vec<String> = stored(&packed);
    if found.is_empty() {
        found = stored(&dequantized);
    }
    found.extend(stored(&biases));
    found
}

impl Checkpoint {
    /// A split expert bias ([`split_bias_source`]) whose source is stored:
    /// its source and parity.
    pub(super) fn split_bias(&self, name: &str) -> Option<(String, usize)> {
        split_bias_source(name).filter(|(source, _)| !self.has(name) && self.has(source))
    }

    /// Rows of a split expert bias: those rows of its source, every other
    /// column.
    pub(super) fn split_bias_rows(&self, source: &str, parity: usize, first: usize, count: usize) -> Result<Vec<f32>> {
        Ok(take_columns(&self.rows_f32(source, first, count)?, parity))
    }

    /// Whether `experts` are stored MXFP4-packed (the hub's layout).
    pub fn has_mxfp4_experts(&self, experts: &InterleavedExperts<'_>) -> bool {
        self.has(&experts.name("gate_up_proj_blocks"))
    }

    /// Gate, up and down of expert `expert` of an interleaved layer, from
    /// whichever layout the checkpoint holds.
    pub fn interleaved_expert_f32(&self, experts: &InterleavedExperts<'_>, expert: usize) -> Result<[Vec<f32>; 3]> {
        let InterleavedExperts { num_experts: e, hidden: h, inter: i, .. } = *experts;
        let two_i = i.checked_mul(2).ok_or_else(|| overflow(experts.prefix))?;
        if self.has_mxfp4_experts(experts) {
            return Ok(self.interleaved_expert_mxfp4(experts, expert)?.map(|m| m.to_f32()));
        }
        let (gate_up_name, down_name) = (experts.name("gate_up_proj"), experts.name("down_proj"));
        self.check_shape(&gate_up_name, &[e, h, two_i])?;
        self.check_shape(&down_name, &[e, i, h])?;
        let (first, count) = experts.slab(expert, h, two_i)?;
        let gate_up = transpose(&self.elements_f32(&gate_up_name, first, count)?, h, two_i);
        let (gate, up) = split_rows(&gate_up, h);
        let (first, count) = experts.slab(expert, i, h)?;
        let down = transpose(&self.elements_f32(&down_name, first, count)?, i, h);
        Ok([gate, up, down])
    }

    /// The biases of every expert of an interleaved layer: gate and up
    /// (`[E, inter]` each, split from `gate_up_proj_bias`) and down
    /// (`[E, hidden]`).
    pub fn interleaved_biases_f32(&self, experts: &InterleavedExperts<'_>) -> Result<[Vec<f32>; 3]> {
        let InterleavedExperts { num_experts: e, hidden: h, inter: i, .. } = *experts;
        let two_i = i.checked_mul(2).ok_or_else(|| overflow(experts.prefix))?;
        let (gate_up_name, down_name) = (experts.name("gate_up_proj_bias"), experts.name("down_proj_bias"));
        self.check_shape(&gate_up_name, &[e, two_i])?;
        self.check_shape(&down_name, &[e, h])?;
        let (gate_up, down) = (self.tensor_f32(&gate_up_name)?.1, self.tensor_f32(&down_name)?.1);
        Ok([take_columns(&gate_up, 0), take_columns(&gate_up, 1), down])
    }

    /// Gate, up and down of expert `expert` of an interleaved layer stored
    /// MXFP4-packed ([`Checkpoint::has_mxfp4_experts`]), as its codes and
    /// scales: `gate_up_proj`'s even rows the gate's and odd rows the up's,
    /// each row whole blocks, so the rows are taken apart as bytes.
    /// Dequantized, they are what transformers' `convert_moe_packed_tensors`
    /// computes.
    pub fn interleaved_expert_mxfp4(&self, experts: &InterleavedExperts<'_>, expert: usize) -> Result<[Mxfp4Bytes; 3]> {
        let InterleavedExperts { hidden: h, inter: i, .. } = *experts;
        let two_i = i.checked_mul(2).ok_or_else(|| overflow(experts.prefix))?;
        let (codes, scales) = self.mxfp4_slab(experts, "gate_up_proj", expert, two_i, h)?;
        let ((gate_codes, up_codes), (gate_scales, up_scales)) =
            (split_rows(codes, h / 2), split_rows(scales, h / BLOCK_VALUES));
        let (codes, scales) = self.mxfp4_slab(experts, "down_proj", expert, h, i)?;
        Ok([
            Mxfp4Bytes { codes: gate_codes, scales: gate_scales },
            Mxfp4Bytes { codes: up_codes, scales: up_scales },
            Mxfp4Bytes { codes: codes.to_vec(), scales: scales.to_vec() },
        ])
    }

    /// One expert's `[rows, cols]` matrix `{proj}` as its MXFP4 blocks' and
    /// scales' bytes, shapes checked.
    fn mxfp4_slab(
        &self,
        experts: &InterleavedExperts<'_>,
        proj: &str,
        expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(&[u8], &[u8])> {
        let (blocks_name, scales_name) =
            (experts.name(&format!("{proj}_blocks")), experts.name(&format!("{proj}_scales")));
        if !cols.is_multiple_of(BLOCK_VALUES) {
            return Err(Error::TensorShape {
                name: blocks_name,
                expected: vec![cols.next_multiple_of(BLOCK_VALUES)],
                found: vec![cols],
            });
        }
        let groups = cols / BLOCK_VALUES;
        self.check_shape(&blocks_name, &[experts.num_experts, rows, groups, BLOCK_BYTES])?;
        self.check_shape(&scales_name, &[experts.num_experts, rows, groups])?;
        let (first, count) = experts.slab(expert, rows, groups)?;
        let scales = self.u8_elements(&scales_name, first, count)?;
        // In range of usize: the blocks tensor holds BLOCK_BYTES per scale.
        let blocks = self.u8_elements(&blocks_name, first * BLOCK_BYTES, count * BLOCK_BYTES)?;
        Ok((blocks, scales))
    }

    /// Bytes `[first, first + count)` of a `U8` tensor.
    pub(super) fn u8_elements(&self, name: &str, first: usize, count: usize) -> Result<&[u8]> {
        let loc = self.loc(name)?;
        if loc.dtype != Dtype::U8 {
            return Err(Error::UnsupportedDtype {
                name: name.to_owned(),
                dtype: format!("{:?} (MXFP4 needs U8)", loc.dtype),
            });
        }
        let shard = &self.shards[loc.shard];
        let start = loc.start_bytes.checked_add(first);
        let end = start.and_then(|s| s.checked_add(count));
        match (start, end) {
            (Some(s), Some(e)) if e <= loc.end_bytes && e <= shard.map.len() => Ok(&shard.map[s..e]),
            _ => Err(Error::Checkpoint {
                path: shard.path.clone(),
                reason: format!("tensor {name:?}: bytes {first}+{count} out of range"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn fixture(dir: &str) -> Checkpoint {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gpt_oss").join(dir);
        Checkpoint::open(path).expect("the gpt_oss fixture opens")
    }

    /// The tiny gpt_oss fixture's shape (xtask/fixtures/gen_fixtures.py).
    fn layer(prefix: &str) -> InterleavedExperts<'_> {
        InterleavedExperts { prefix, num_experts: 4, hidden: 64, inter: 32 }
    }

    #[test]
    fn the_hub_s_mxfp4_experts_decode_to_the_saved_f32_experts_bit_for_bit() {
        let (saved, hub) = (fixture("hf"), fixture("hf_mxfp4"));
        for l in 0..2 {
            let prefix = format!("model.layers.{l}.mlp.experts.");
            assert!(hub.has_mxfp4_experts(&layer(&prefix)) && !saved.has_mxfp4_experts(&layer(&prefix)));
            for e in 0..4 {
                let want = saved.interleaved_expert_f32(&layer(&prefix), e).unwrap();
                let got = hub.interleaved_expert_f32(&layer(&prefix), e).unwrap();
                for (w, g) in want.iter().zip(&got) {
                    assert_eq!(
                        w.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        g.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "layer {l} expert {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn split_expert_biases_read_as_tensors_of_their_own() {
        let saved = fixture("hf");
        let prefix = "model.layers.0.mlp.experts.";
        let [gate_bias, up_bias, _] = saved.interleaved_biases_f32(&layer(prefix)).unwrap();
        for (name, want) in [("gate_proj_bias", gate_bias), ("up_proj_bias", up_bias)] {
            let name = format!("{prefix}{name}");
            assert_eq!(saved.resolve(std::slice::from_ref(&name)), Some(name.as_str()));
            saved.check_shape(&name, &[4, 32]).unwrap();
            assert!(saved.check_shape(&name, &[4, 64]).is_err());
            assert_eq!(saved.rows_f32(&name, 1, 2).unwrap(), want[32..96]);
        }
        assert_eq!(saved.resolve(&["model.layers.0.mlp.experts.nothing_bias".to_owned()]), None);
    }

    /// What export writes reads back as what it was written from.
    #[test]
    fn fused_slabs_split_back_into_gate_up_and_down() {
        let (h, i) = (3, 2);
        let gate: Vec<f32> = (0..i * h).map(|x| x as f32).collect();
        let up: Vec<f32> = (0..i * h).map(|x| 100.0 + x as f32).collect();
        let down: Vec<f32> = (0..h * i).map(|x| 200.0 + x as f32).collect();
        let gate_up = fused_gate_up(&gate, &up, h);
        // gate_up[c][2r] is gate row r, column c; [c][2r + 1] up's.
        assert_eq!((gate_up[2 * 2 * i + 2], gate_up[2 * 2 * i + 3]), (gate[h + 2], up[h + 2]));
        assert_eq!(split_rows(&transpose(&gate_up, h, 2 * i), h), (gate.clone(), up.clone()));
        assert_eq!(transpose(&fused_down(&down, h), i, h), down);
        let biases = interleave(&gate[..i], &up[..i], 1);
        assert_eq!((take_columns(&biases, 0), take_columns(&biases, 1)), (gate[..i].to_vec(), up[..i].to_vec()));
    }

    #[test]
    fn gate_takes_the_even_columns_and_up_the_odd_ones() {
        let saved = fixture("hf");
        let prefix = "model.layers.1.mlp.experts.";
        let (h, i) = (64, 32);
        let [gate, up, down] = saved.interleaved_expert_f32(&layer(prefix), 2).unwrap();
        let gate_up = saved.tensor_f32(&format!("{prefix}gate_up_proj")).unwrap().1;
        let down_proj = saved.tensor_f32(&format!("{prefix}down_proj")).unwrap().1;
        // gate_up_proj[2][c][2r] is gate row r, column c; [2][c][2r + 1] up's.
        let (r, c) = (5, 7);
        assert_eq!(gate[r * h + c], gate_up[(2 * h + c) * 2 * i + 2 * r]);
        assert_eq!(up[r * h + c], gate_up[(2 * h + c) * 2 * i + 2 * r + 1]);
        // down_proj[2][r][c] is down row c, column r.
        assert_eq!(down[c * i + r], down_proj[(2 * i + r) * h + c]);
        let [gate_bias, up_bias, down_bias] = saved.interleaved_biases_f32(&layer(prefix)).unwrap();
        let fused = saved.tensor_f32(&format!("{prefix}gate_up_proj_bias")).unwrap().1;
        assert_eq!(
            (gate_bias[2 * i + r], up_bias[2 * i + r]),
            (fused[2 * 2 * i + 2 * r], fused[2 * 2 * i + 2 * r + 1])
        );
        assert_eq!(down_bias.len(), 4 * h);
    }
}
