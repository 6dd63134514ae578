//! Tensor names of the GQA MoE families as published, and shape checks made
//! once at load so that a forward pass never meets a malformed tensor.

use strata_format::{Container, Family, LayerKind, ModelSpec, QkNorm};
use strata_kernels::Matrix;

use crate::{Error, Result};

/// The names of one decoder layer's dense tensors.
#[derive(Debug, Clone)]
pub struct LayerNames {
    pub input_norm: String,
    pub post_attn_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub o_bias: Option<String>,
    pub q_norm: Option<String>,
    pub k_norm: Option<String>,
    pub mlp: MlpNames,
}

/// The feed-forward half of a layer.
#[derive(Debug, Clone)]
pub enum MlpNames {
    /// A dense SwiGLU MLP: gate, up, down.
    Dense([String; 3]),
    /// Routed experts behind a router.
    Moe { router: String },
}

impl LayerNames {
    pub fn new(spec: &ModelSpec, layer: usize) -> Self {
        let p = format!("model.layers.{layer}");
        let attn = |t: &str| format!("{p}.self_attn.{t}");
        let bias = |t: &str| spec.attention_bias.then(|| attn(&format!("{t}.bias")));
        let has_qk_norm = spec.qk_norm != QkNorm::None;
        let moe_prefix = match spec.family {
            Family::Mixtral => "block_sparse_moe",
            _ => "mlp",
        };
        let mlp = match spec.layers[layer] {
            LayerKind::Moe => MlpNames::Moe { router: format!("{p}.{moe_prefix}.gate.weight") },
            LayerKind::Dense => {
                MlpNames::Dense(["gate_proj", "up_proj", "down_proj"].map(|t| format!("{p}.mlp.{t}.weight")))
            }
        };
        Self {
            input_norm: format!("{p}.input_layernorm.weight"),
            post_attn_norm: format!("{p}.post_attention_layernorm.weight"),
            q: attn("q_proj.weight"),
            k: attn("k_proj.weight"),
            v: attn("v_proj.weight"),
            o: attn("o_proj.weight"),
            q_bias: bias("q_proj"),
            k_bias: bias("k_proj"),
            v_bias: bias("v_proj"),
            o_bias: bias("o_proj"),
            q_norm: has_qk_norm.then(|| attn("q_norm.weight")),
            k_norm: has_qk_norm.then(|| attn("k_norm.weight")),
            mlp,
        }
    }
}

/// The matrix `name`, checked to be `[rows, cols]`.
pub fn matrix<'c>(container: &'c Container, name: &str, rows: usize, cols: usize) -> Result<Matrix<'c>> {
    let m = container.dense(name)?;
    if (m.rows, m.cols) != (rows, cols) {
        return Err(Error::Shape { name: name.to_owned(), expected: vec![rows, cols], found: vec![m.rows, m.cols] });
    }
    Ok(m)
}

/// The f32 vector `name`, checked to hold `len` values.
pub fn vector<'c>(container: &'c Container, name: &str, len: usize) -> Result<&'c [f32]> {
    let v = container.dense_vec(name)?;
    if v.len() != len {
        return Err(Error::Shape { name: name.to_owned(), expected: vec![len], found: vec![v.len()] });
    }
    Ok(v)
}
