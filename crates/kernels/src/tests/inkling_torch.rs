//! Inkling's short convolution against transformers' `InklingShortConvolution`
//! on a small seeded case (`testdata/inkling_blocks/sconv_*.npy`, written by
//! `xtask/fixtures/inkling_ref.py`).

use super::gdn::assert_all_close;
use crate::gdn;

/// Agreement with torch, relative to the largest magnitude of the output.
const TORCH_REL_TOL: f32 = 1e-6;

#[test]
fn the_short_convolution_with_its_residual_matches_transformers() {
    let (x_shape, x) = super::load_npy("inkling_blocks", "sconv_x");
    let (w_shape, weight) = super::load_npy("inkling_blocks", "sconv_weight");
    let (_, want) = super::load_npy("inkling_blocks", "sconv_out");
    let [tokens, channels] = x_shape[..] else { panic!("sconv_x shape {x_shape:?}") };
    assert_eq!(w_shape, [channels, 4], "kernel 4");
    let fresh_state = || vec![0.0f32; channels * 3];

    let mut whole = x.clone();
    gdn::causal_conv1d_residual(&mut whole, channels, &weight, &mut fresh_state());
    assert_all_close(&whole, &want, TORCH_REL_TOL, "prefill");

    // Passes of 4, 1 and the rest, the state carried between them (a
    // chunked prefill, then decode): the same bits as one pass.
    let mut passes = x.clone();
    let mut state = fresh_state();
    let (first, rest) = passes.split_at_mut(4 * channels);
    let (second, third) = rest.split_at_mut(channels);
    for pass in [first, second, third] {
        gdn::causal_conv1d_residual(pass, channels, &weight, &mut state);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&passes), bits(&whole), "passes of 4 + 1 + {} tokens", tokens - 5);
    // The state holds the last three inputs of each channel, oldest first.
    let last: Vec<f32> = (0..channels)
        .flat_map(|c| (tokens - 3..tokens).map(move |t| (t, c)))
        .map(|(t, c)| x[t * channels + c])
        .collect();
    assert_eq!(state, last);
}
