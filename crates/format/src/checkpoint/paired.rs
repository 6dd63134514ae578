//! Gate and up projections stored as one tensor with their rows paired:
//! row `2r` the gate's row `r`, row `2r + 1` the up's (what transformers'
//! `Interleave` undoes on loading Inkling's hub checkpoints,
//! `conversion_mapping.py`'s `inkling_mm_model`):
//!
//! * the dense MLP's `mlp.w13_dn.weight` `[2·inter, hidden]` and the shared
//!   experts' `mlp.shared_experts.shared_w13_weight` `[S, 2·inter, hidden]`,
//!   read as their gate and up halves under the names the family's hub
//!   spelling gives them (`…mlp.gate_proj.weight` of a `model.llm.` layer);
//! * the routed experts' `mlp.experts.w13_weight` `[E, 2·inter, hidden]`
//!   beside `w2_weight` `[E, hidden, inter]`, read one expert at a time.
//!
//! Pairs of rows stay pairs across a stack's matrices (each has an even
//! number of rows), so stored row `2r + parity` is the half's row `r`
//! whether the tensor is one matrix or a stack.

use safetensors::tensor::Dtype;

use super::Checkpoint;
use super::interleaved::split_rows;
use crate::error::{Error, Result};
use crate::names;
use crate::spec::ModelArch;

/// `(half, stored, parity)`: the end of a half's name, the end of the
/// tensor pairing it with the other half, and which rows are its own
/// (0: the gate's, even rows; 1: the up's, odd rows).
const PAIRED: &[(&str, &str, usize)] = &[
    (".mlp.gate_proj.weight", ".mlp.w13_dn.weight", 0),
    (".mlp.up_proj.weight", ".mlp.w13_dn.weight", 1),
    (".mlp.shared_experts.gate_proj", ".mlp.shared_experts.shared_w13_weight", 0),
    (".mlp.shared_experts.up_proj", ".mlp.shared_experts.shared_w13_weight", 1),
];

/// The stored tensor half `name` would be read from, and its parity.
fn paired_source(name: &str) -> Option<(String, usize)> {
    PAIRED
        .iter()
        .find_map(|(half, stored, parity)| name.strip_suffix(half).map(|base| (format!("{base}{stored}"), *parity)))
}

impl Checkpoint {
    /// A half ([`PAIRED`]) not stored by itself but in a stored pair: the
    /// pair's name and the half's parity.
    pub(super) fn paired_half(&self, name: &str) -> Option<(String, usize)> {
        paired_source(name).filter(|(source, _)| !self.has(name) && self.has(source))
    }

    /// Rows `first..first + count` of a half: rows `2·first..2·(first +
    /// count)` of its pair, every other one.
    pub(super) fn paired_rows(&self, source: &str, parity: usize, first: usize, count: usize) -> Result<Vec<f32>> {
        let two = |n: usize| n.checked_mul(2).ok_or_else(|| overflow(source));
        let cols = self.shape(source)?.last().copied().unwrap_or(1);
        let rows = self.rows_f32(source, two(first)?, two(count)?)?;
        let (gate, up) = split_rows(&rows, cols);
        Ok(if parity == 0 { gate } else { up })
    }

    /// A half's shape: its pair's with the rows (the second-to-last
    /// dimension) halved, checked against `expected`.
    pub(super) fn check_paired_shape(&self, name: &str, source: &str, expected: &[usize]) -> Result<()> {
        let mut doubled = expected.to_vec();
        let rows = doubled.len().checked_sub(2).map(|at| &mut doubled[at]);
        match rows.and_then(|rows| rows.checked_mul(2).map(|two| *rows = two)) {
            Some(()) => self.check_shape(source, &doubled),
            None => Err(Error::TensorShape { name: name.to_owned(), expected: expected.to_vec(), found: vec![] }),
        }
    }

    /// Whether `layer`'s routed experts are the hub's paired `w13_weight`.
    pub(super) fn has_paired_experts(&self, arch: &ModelArch, layer: usize) -> bool {
        names::paired_expert_names(&arch.core, layer).is_some_and(|[w13, _]| self.has(&w13))
    }

    /// Gate, up and down of expert `expert` from the paired `w13_weight`
    /// and `w2_weight`. The published checkpoint's NVFP4 experts (bytes with
    /// scale sidecars) are refused by name: Strata does not read them.
    pub(super) fn paired_expert_f32(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let Some([w13, w2]) = names::paired_expert_names(&arch.core, layer) else {
            return Err(Error::MissingTensor { name: format!("layer {layer}'s paired experts"), hint: String::new() });
        };
        let (e, i, h) = (arch.num_experts(), arch.expert_intermediate_size(), arch.core.hidden_size);
        let dtype = self.loc(&w13)?.dtype;
        if !matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(Error::UnsupportedDtype {
                name: w13,
                dtype: format!("{dtype:?} (NVFP4 experts are not read: convert a bf16 copy)"),
            });
        }
        let two_i = i.checked_mul(2).ok_or_else(|| overflow(&w13))?;
        self.check_shape(&w13, &[e, two_i, h])?;
        self.check_shape(&w2, &[e, h, i])?;
        let rows = self.rows_f32(&w13, expert.checked_mul(two_i).ok_or_else(|| overflow(&w13))?, two_i)?;
        let (gate, up) = split_rows(&rows, h);
        let down = self.rows_f32(&w2, expert.checked_mul(h).ok_or_else(|| overflow(&w2))?, h)?;
        Ok([gate, up, down])
    }
}

fn overflow(name: &str) -> Error {
    Error::Checkpoint { path: name.into(), reason: "paired tensor sizes overflow".into() }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::container::matrix_dims;

    fn fixture(dir: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling").join(dir)
    }

    fn arch_of(ckpt: &Checkpoint) -> ModelArch {
        ModelArch::from_config_value(&serde_json::from_str(ckpt.config_json()).unwrap()).unwrap()
    }

    fn to_bf16(values: Vec<f32>) -> Vec<f32> {
        values.into_iter().map(|v| half::bf16::from_f32(v).to_f32()).collect()
    }

    /// `hf_bf16/` is `hf/` rounded to bf16 and saved under the hub's names
    /// (gen_fixtures `save_inkling_hub_names`, checked there against
    /// transformers' own `Interleave`): every tensor, the paired halves and
    /// each routed expert included, must read back as `hf/`'s, rounded.
    #[test]
    fn the_hubs_names_and_paired_rows_read_as_save_pretraineds_tensors() {
        let (hub, saved) = (Checkpoint::open(fixture("hf_bf16")).unwrap(), Checkpoint::open(fixture("hf")).unwrap());
        let arch = arch_of(&hub);
        let mut paired = 0;
        for desc in names::dense_tensors(&arch) {
            let mut candidates = vec![desc.name.clone()];
            candidates.extend(names::aliases(&arch, &desc.name));
            let stored = hub.resolve(&candidates).unwrap_or_else(|| panic!("{}: none of {candidates:?}", desc.name));
            assert!(stored.starts_with("model.llm."), "{}: read as {stored}", desc.name);
            paired += usize::from(hub.paired_half(stored).is_some());
            hub.check_shape(stored, &desc.shape).unwrap();
            let (rows, _) = matrix_dims(&desc.shape).unwrap();
            let want = to_bf16(saved.rows_f32(&desc.name, 0, rows).unwrap());
            assert_eq!(hub.rows_f32(stored, 0, rows).unwrap(), want, "{} as {stored}", desc.name);
            // A row block inside: the halves' rows are found by index, not only whole.
            if rows > 2 {
                assert_eq!(hub.rows_f32(stored, 1, 2).unwrap(), to_bf16(saved.rows_f32(&desc.name, 1, 2).unwrap()));
            }
        }
        // The dense layer's gate and up, and every MoE layer's shared ones.
        assert_eq!(paired, 2 * arch.layers.len(), "halves read from pairs");
        for layer in arch.expert_layers() {
            assert!(hub.has_paired_experts(&arch, layer), "layer {layer}");
            for expert in 0..arch.num_experts() {
                let want = saved.expert_f32(&arch, layer, expert).unwrap().map(to_bf16);
                assert_eq!(hub.expert_f32(&arch, layer, expert).unwrap(), want, "layer {layer} expert {expert}");
            }
        }
    }

    /// Conversion reads every stored tensor of the hub's checkpoint: the
    /// pairs count as read through their halves, nothing is left over.
    #[test]
    fn a_hub_checkpoint_converts_with_no_tensor_left_unread() {
        let out = tempfile::tempdir().unwrap();
        let opts = crate::ConvertOptions::new(crate::QuantPreset::Bf16);
        let report = crate::convert(fixture("hf_bf16"), out.path().join("c"), &opts).unwrap();
        assert!(report.ignored_tensors.is_empty(), "{:?}", report.ignored_tensors);
    }

    /// The published checkpoint's routed experts are NVFP4 (packed bytes
    /// with scale sidecars): refused by name, not misread as numbers.
    #[test]
    fn nvfp4_paired_experts_are_refused_naming_the_format() {
        use safetensors::tensor::TensorView;
        let arch = arch_of(&Checkpoint::open(fixture("hf_bf16")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture("hf_bf16").join("config.json"), dir.path().join("config.json")).unwrap();
        let layer = arch.expert_layers()[0];
        let [w13, w2] = names::paired_expert_names(&arch.core, layer).unwrap();
        let (e, i, h) = (arch.num_experts(), arch.expert_intermediate_size(), arch.core.hidden_size);
        // Two e2m1 codes a byte.
        let (w13_bytes, w2_bytes) = (vec![0u8; e * 2 * i * h / 2], vec![0u8; e * h * i / 2]);
        let tensors = [
            (w13.clone(), TensorView::new(Dtype::U8, vec![e, 2 * i, h / 2], &w13_bytes).unwrap()),
            (w2, TensorView::new(Dtype::U8, vec![e, h, i / 2], &w2_bytes).unwrap()),
        ];
        safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
        let err = Checkpoint::open(dir.path()).unwrap().expert_f32(&arch, layer, 0).unwrap_err().to_string();
        assert!(err.contains("NVFP4") && err.contains(&w13), "{err}");
    }

    #[test]
    fn only_the_four_halves_have_a_pair() {
        let layer = "model.llm.layers.2";
        assert_eq!(
            paired_source(&format!("{layer}.mlp.up_proj.weight")),
            Some((format!("{layer}.mlp.w13_dn.weight"), 1))
        );
        assert_eq!(
            paired_source(&format!("{layer}.mlp.shared_experts.gate_proj")),
            Some((format!("{layer}.mlp.shared_experts.shared_w13_weight"), 0))
        );
        assert_eq!(paired_source(&format!("{layer}.mlp.down_proj.weight")), None);
        assert_eq!(paired_source(&format!("{layer}.mlp.shared_experts.down_proj")), None);
    }
}
