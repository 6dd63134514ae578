//! Kimi K3's MXFP4 tensors, SiTU-GLU and latent MoE against its PyTorch reference
//! (`testdata/kimi_k3/*.npy`, written by `xtask/fixtures/kimi_k3_ref.py`):
//! the kernels composed as the reference composes its blocks.

use super::gdn::assert_all_close;
use crate::quant::QuantFormat;
use crate::simd::Isa;
use crate::{GatedAct, MatData, Matrix, Threads, ops};

/// Agreement with torch, relative to the largest magnitude of the output:
/// sums in another order, and torch's vectorised tanh and exp.
const TORCH_REL_TOL: f32 = 1e-5;

fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
    super::load_npy("kimi_k3", name)
}

fn matrix(rows: usize, cols: usize, w: &[f32]) -> Matrix<'_> {
    Matrix::new(rows, cols, MatData::F32(w)).unwrap()
}

/// Gates and ups from small to far past both saturation points.
#[test]
fn situ_glu_matches_kimi_k3_s_reference() {
    let (_, config) = load("situ_config");
    let (_, mut gate) = load("situ_gate");
    let (_, up) = load("situ_up");
    let (_, want) = load("situ_out");
    ops::situ_mul(&mut gate, &up, config[0], config[1]);
    for (i, (&got, &want)) in gate.iter().zip(&want).enumerate() {
        assert!((got - want).abs() <= 4.0 * f32::EPSILON * want.abs().max(1e-3), "{i}: got {got}, want {want}");
    }
}

#[test]
#[should_panic(expected = "must be positive numbers")]
fn situ_mul_refuses_a_beta_of_zero() {
    ops::situ_mul(&mut [1.0], &[1.0], 0.0, 25.0);
}

/// The latent MoE: the router's choice and weights (sigmoid scores, top-k by
/// score plus correction bias, renormalised, times the scaling factor), the
/// shared latent down projection, each expert a SiTU-GLU in the latent
/// (`Threads::gated_ffn` with `GatedAct::SituGlu`), the norm on the routed
/// sum, the latent up projection and the full-width shared experts.
#[test]
fn the_latent_moe_composed_of_kernels_matches_kimi_k3_s_reference() {
    let (_, config) = load("latent_moe_config");
    let [top_k, scaling, eps, beta, linear_beta] = config[..] else { panic!("config {config:?}") };
    let act = GatedAct::SituGlu { beta, linear_beta };
    let (x_shape, x) = load("latent_moe_x");
    let [tokens, hidden] = x_shape[..] else { panic!("x shape {x_shape:?}") };
    let (w1_shape, w1) = load("latent_moe_w1");
    let [experts, inter, latent] = w1_shape[..] else { panic!("w1 shape {w1_shape:?}") };
    let (shared_shape, shared_gate) = load("latent_moe_shared_gate");
    let shared_inter = shared_shape[0];
    let [(_, w2), (_, w3), (_, router), (_, bias), (_, down), (_, up), (_, norm)] =
        ["w2", "w3", "router", "bias", "down", "up", "norm"].map(|name| load(&format!("latent_moe_{name}")));
    let [(_, shared_up), (_, shared_down)] = ["up", "down"].map(|name| load(&format!("latent_moe_shared_{name}")));
    let pool = Threads::new(1).unwrap();

    // The router, token by token; the reference's choice sorted ascending.
    let (_, want_experts) = load("latent_moe_experts");
    let (_, want_weights) = load("latent_moe_weights");
    let k = top_k as usize;
    let mut scores = vec![0.0f32; experts];
    let mut weights = Vec::new();
    for t in 0..tokens {
        matrix(experts, hidden, &router).matvec(&x[t * hidden..(t + 1) * hidden], &mut scores);
        scores.iter_mut().for_each(|s| *s = ops::sigmoid(*s));
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| (scores[b] + bias[b]).total_cmp(&(scores[a] + bias[a])));
        let mut chosen = order[..k].to_vec();
        chosen.sort_unstable();
        let got: Vec<f32> = chosen.iter().map(|&e| e as f32).collect();
        assert_eq!(got, want_experts[t * k..(t + 1) * k], "token {t}'s experts");
        let sum: f32 = chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20;
        weights.extend(chosen.iter().map(|&e| scores[e] / sum * scaling));
    }
    assert_all_close(&weights, &want_weights, TORCH_REL_TOL, "routed weights");

    let mut z = vec![0.0f32; tokens * latent];
    matrix(latent, hidden, &down).matmul(&x, tokens, &mut z);
    assert_all_close(&z, &load("latent_moe_z").1, TORCH_REL_TOL, "latent input");

    // Σ_k w_k · E_k(z), each expert a SiTU-GLU in the latent.
    let mut routed = vec![0.0f32; tokens * latent];
    let mut expert_out = vec![0.0f32; latent];
    for t in 0..tokens {
        let z_t = &z[t * latent..(t + 1) * latent];
        for (&e, &w) in want_experts[t * k..(t + 1) * k].iter().zip(&weights[t * k..(t + 1) * k]) {
            let e = e as usize;
            let [gate_e, up_e] =
                [&w1, &w3].map(|w| matrix(inter, latent, &w[e * inter * latent..(e + 1) * inter * latent]));
            let down_e = matrix(latent, inter, &w2[e * latent * inter..(e + 1) * latent * inter]);
            pool.gated_ffn(&gate_e, &up_e, &down_e, act, z_t, 1, &mut expert_out);
            ops::axpy(w, &expert_out, &mut routed[t * latent..(t + 1) * latent]);
        }
    }
    assert_all_close(&routed, &load("latent_moe_routed_sum").1, TORCH_REL_TOL, "routed sum");

    // up(norm(routed)) + shared(x).
    let mut normed = vec![0.0f32; tokens * latent];
    for (row, out) in routed.chunks_exact(latent).zip(normed.chunks_exact_mut(latent)) {
        ops::rmsnorm(row, &norm, eps, out);
    }
    let mut got = vec![0.0f32; tokens * hidden];
    matrix(hidden, latent, &up).matmul(&normed, tokens, &mut got);
    let mut shared = vec![0.0f32; tokens * hidden];
    let [gate_s, up_s] = [&shared_gate, &shared_up].map(|w| matrix(shared_inter, hidden, w));
    pool.gated_ffn(&gate_s, &up_s, &matrix(hidden, shared_inter, &shared_down), act, &x, tokens, &mut shared);
    ops::axpy(1.0, &shared, &mut got);
    assert_all_close(&got, &load("latent_moe_out").1, TORCH_REL_TOL, "output");
}

/// The hub's "mxfp4-pack-quantized" `weight_packed`/`weight_scale` of a
/// weight, as the reference packs them, kept as they are: the matrix holds
/// the weight exactly, and its products on every tier are the weight's.
#[test]
fn the_reference_s_packed_mxfp4_tensors_are_its_weight() {
    let (shape, weight) = load("mxfp4_weight");
    let [rows, cols] = shape[..] else { panic!("weight shape {shape:?}") };
    let bytes = |name: &str| load(name).1.iter().map(|&v| v as u8).collect::<Vec<u8>>();
    let (packed, scale) = (bytes("mxfp4_packed"), bytes("mxfp4_scale"));
    let kept = Matrix::from_bytes(QuantFormat::Mxfp4, rows, cols, 0, &packed, &scale).unwrap();
    assert_eq!(kept.to_f32(), weight);
    let x: Vec<f32> = (0..cols).map(|c| (c as f32 * 0.37).sin()).collect();
    let mut want = vec![0.0f32; rows];
    matrix(rows, cols, &weight).matvec_with(Isa::scalar(), &x, &mut want);
    for isa in Isa::all_supported() {
        let mut got = vec![0.0f32; rows];
        kept.matvec_with(isa, &x, &mut got);
        assert_all_close(&got, &want, TORCH_REL_TOL, &format!("{isa:?}"));
    }
}
