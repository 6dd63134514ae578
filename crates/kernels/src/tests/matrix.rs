//! `Matrix`: construction checks, byte views, products and dequantization.

use proptest::prelude::*;

use super::{CASES, cols, group, values};
use crate::quant::{QuantFormat, f32_to_bf16_bits, quantize_q4, quantize_q8};
use crate::simd::Isa;
use crate::{Error, MatData, Matrix};

/// Owned storage of one matrix in some format, so tests can borrow it.
struct Owned {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    group: usize,
    f32s: Vec<f32>,
    bf16s: Vec<u16>,
    i8s: Vec<i8>,
    u8s: Vec<u8>,
    scales: Vec<f32>,
}

impl Owned {
    fn new(format: QuantFormat, rows: usize, cols: usize, group: usize, src: &[f32]) -> Self {
        let mut owned = Owned {
            format,
            rows,
            cols,
            group,
            f32s: Vec::new(),
            bf16s: Vec::new(),
            i8s: Vec::new(),
            u8s: Vec::new(),
            scales: Vec::new(),
        };
        match format {
            QuantFormat::F32 => owned.f32s = src.to_vec(),
            QuantFormat::Bf16 => owned.bf16s = f32_to_bf16_bits(src),
            QuantFormat::Q8 => (owned.i8s, owned.scales) = quantize_q8(src, rows, cols, group),
            QuantFormat::Q4 => (owned.u8s, owned.scales) = quantize_q4(src, rows, cols, group),
            QuantFormat::Mxfp4 => unreachable!("{KEPT_ONLY}"),
        }
        owned
    }

    fn data(&self) -> MatData<'_> {
        match self.format {
            QuantFormat::F32 => MatData::F32(&self.f32s),
            QuantFormat::Bf16 => MatData::Bf16(&self.bf16s),
            QuantFormat::Q8 => MatData::Q8 { qs: &self.i8s, scales: &self.scales, group: self.group },
            QuantFormat::Q4 => MatData::Q4 { qs: &self.u8s, scales: &self.scales, group: self.group },
            QuantFormat::Mxfp4 => unreachable!("{KEPT_ONLY}"),
        }
    }

    fn matrix(&self) -> Matrix<'_> {
        Matrix::new(self.rows, self.cols, self.data()).unwrap()
    }

    fn weight_bytes(&self) -> &[u8] {
        match self.format {
            QuantFormat::F32 => bytemuck::cast_slice(&self.f32s),
            QuantFormat::Bf16 => bytemuck::cast_slice(&self.bf16s),
            QuantFormat::Q8 => bytemuck::cast_slice(&self.i8s),
            QuantFormat::Q4 => &self.u8s,
            QuantFormat::Mxfp4 => unreachable!("{KEPT_ONLY}"),
        }
    }
}

/// Why the cases here never hold MXFP4, which Strata keeps and never
/// quantizes to.
const KEPT_ONLY: &str = "mxfp4 is kept as stored, never quantized to: its matrices are tests/mxfp4.rs's";

/// The formats Strata quantizes to.
fn format() -> impl Strategy<Value = QuantFormat> {
    prop::sample::select(QuantFormat::ALL.into_iter().filter(|&f| f != QuantFormat::Mxfp4).collect::<Vec<_>>())
}

/// (format, rows, cols, group, weights source, n inputs, xs).
#[allow(clippy::type_complexity)]
fn product_case() -> impl Strategy<Value = (QuantFormat, usize, usize, usize, Vec<f32>, usize, Vec<f32>)> {
    (format(), 1usize..=6, cols(), group(), 1usize..=6).prop_flat_map(|(format, rows, cols, group, n)| {
        (Just(format), Just(rows), Just(cols), Just(group), values(rows * cols), Just(n), values(n * cols))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Every tier's matvec against an f64 product of the dequantized matrix.
    /// On the integer path the inputs are quantized to int16 first, which
    /// adds up to half a step (`max|x of its lane| / 32767 / 2`) per column.
    #[test]
    fn matvec_matches_dequantized_product(
        (format, rows, cols, group, src, _n, xs) in product_case()
    ) {
        let owned = Owned::new(format, rows, cols, group, &src);
        let m = owned.matrix();
        let w = m.to_f32();
        let x = &xs[..cols];
        // Quantization runs over lanes of 4 (q8) or 8 (q4) columns.
        let lane = if format == QuantFormat::Q8 { 4 } else { 8 };
        let half_step: Vec<f32> = (0..cols)
            .map(|c| {
                let block = &x[c / lane * lane..((c / lane + 1) * lane).min(cols)];
                block.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 32767.0 / 2.0
            })
            .collect();
        for isa in Isa::all_supported() {
            let mut y = vec![f32::NAN; rows];
            m.matvec_with(isa, x, &mut y);
            for r in 0..rows {
                let row = &w[r * cols..(r + 1) * cols];
                let want: f64 = row.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let mag: f32 = row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
                let quant: f32 = if m.uses_int_path(isa) {
                    row.iter().zip(&half_step).map(|(a, h)| a.abs() * h).sum::<f32>() * 1.03
                } else {
                    0.0
                };
                let got = y[r];
                let tol = super::REL_TOL * mag + 1e-6 + quant;
                prop_assert!(
                    (f64::from(got) - want).abs() <= f64::from(tol),
                    "{} {:?} row {}: got {}, want {} (tol {})", format, isa, r, got, want, tol
                );
            }
        }
    }

    /// `matmul` is exactly `n` matvecs, on every tier.
    #[test]
    fn matmul_equals_matvecs_bitwise(
        (format, rows, cols, group, src, n, xs) in product_case()
    ) {
        let owned = Owned::new(format, rows, cols, group, &src);
        let m = owned.matrix();
        for isa in Isa::all_supported() {
            let mut ys = vec![f32::NAN; n * rows];
            m.matmul_with(isa, &xs, n, &mut ys);
            for t in 0..n {
                let mut y = vec![f32::NAN; rows];
                m.matvec_with(isa, &xs[t * cols..(t + 1) * cols], &mut y);
                prop_assert_eq!(
                    bits(&ys[t * rows..(t + 1) * rows]),
                    bits(&y),
                    "{} {:?} input {}", format, isa, t
                );
            }
        }
    }

    /// Byte views give the same matrix as typed slices, and row ranges
    /// address the same rows.
    #[test]
    fn from_bytes_and_row_range_agree((format, rows, cols, group, src, _n, _xs) in product_case()) {
        let owned = Owned::new(format, rows, cols, group, &src);
        let m = owned.matrix();
        let viewed = Matrix::from_bytes(
            format, rows, cols, group, owned.weight_bytes(), bytemuck::cast_slice(&owned.scales),
        ).unwrap();
        prop_assert_eq!(viewed, m);
        let full = m.to_f32();
        for start in 0..rows {
            let sub = m.row_range(start, rows - start).unwrap();
            prop_assert_eq!(sub.to_f32(), full[start * cols..].to_vec());
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn row_to_f32_is_q_times_scale() {
    let src: Vec<f32> = (0..15).map(|i| i as f32 * 0.37 - 2.0).collect();
    let (qs, scales) = quantize_q8(&src, 3, 5, 2);
    let m = Matrix::new(3, 5, MatData::Q8 { qs: &qs, scales: &scales, group: 2 }).unwrap();
    let mut row = vec![0.0; 5];
    m.row_to_f32(1, &mut row);
    let want: Vec<f32> = (0..5).map(|c| f32::from(qs[5 + c]) * scales[3 + c / 2]).collect();
    assert_eq!(row, want);

    let bits = f32_to_bf16_bits(&src);
    let m = Matrix::new(3, 5, MatData::Bf16(&bits)).unwrap();
    m.row_to_f32(2, &mut row);
    assert_eq!(row[0], f32::from_bits(u32::from(bits[10]) << 16));
}

#[test]
fn new_rejects_wrong_lengths() {
    let w = [0.0f32; 6];
    assert!(Matrix::new(2, 3, MatData::F32(&w)).is_ok());
    assert_eq!(
        Matrix::new(2, 4, MatData::F32(&w)),
        Err(Error::Length {
            format: "f32",
            what: "weights",
            unit: "elements",
            rows: 2,
            cols: 4,
            expected: 8,
            actual: 6,
        })
    );
    assert!(Matrix::new(3, 3, MatData::Bf16(&[0u16; 8])).is_err());

    let (qs, scales) = quantize_q8(&[1.0; 12], 2, 6, 4);
    let ok = MatData::Q8 { qs: &qs, scales: &scales, group: 4 };
    assert!(Matrix::new(2, 6, ok).is_ok());
    let short_scales = MatData::Q8 { qs: &qs, scales: &scales[1..], group: 4 };
    assert!(matches!(
        Matrix::new(2, 6, short_scales),
        Err(Error::Length { what: "scales", expected: 4, actual: 3, .. })
    ));
    let zero_group = MatData::Q8 { qs: &qs, scales: &scales, group: 0 };
    assert_eq!(Matrix::new(2, 6, zero_group), Err(Error::InvalidGroup { format: "q8", group: 0 }));

    // q4 rows are ceil(cols / 2) bytes: 5 columns need 3 bytes per row.
    let (qs4, scales4) = quantize_q4(&[1.0; 10], 2, 5, 4);
    assert_eq!(qs4.len(), 6);
    assert!(Matrix::new(2, 5, MatData::Q4 { qs: &qs4, scales: &scales4, group: 4 }).is_ok());
    assert!(Matrix::new(2, 5, MatData::Q4 { qs: &qs4[..5], scales: &scales4, group: 4 }).is_err());

    assert!(matches!(Matrix::new(usize::MAX, 2, MatData::F32(&w)), Err(Error::ShapeOverflow { .. })));
}

#[test]
fn from_bytes_rejects_bad_lengths() {
    let f32s = vec![0.0f32; 8];
    let bytes: &[u8] = bytemuck::cast_slice(&f32s);
    assert!(Matrix::from_bytes(QuantFormat::F32, 2, 4, 0, bytes, &[]).is_ok());
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::F32, 2, 4, 0, &bytes[..31], &[]),
        Err(Error::Length { unit: "bytes", expected: 32, actual: 31, .. })
    ));
    // Ungrouped formats carry no scales.
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::F32, 2, 4, 0, bytes, &bytes[..4]),
        Err(Error::Length { what: "scales", expected: 0, .. })
    ));
    // 2 rows x 4 cols q8 in groups of 3: 8 bytes, 2 * 2 scales = 16 bytes.
    assert!(Matrix::from_bytes(QuantFormat::Q8, 2, 4, 3, &bytes[..8], &bytes[..16]).is_ok());
    assert!(Matrix::from_bytes(QuantFormat::Q8, 2, 4, 3, &bytes[..8], &bytes[..12]).is_err());
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::Q4, 2, 4, 0, &bytes[..4], &[]),
        Err(Error::InvalidGroup { format: "q4", group: 0 })
    ));
    // q4, 3 rows x 3 cols: 2 bytes per row.
    assert!(Matrix::from_bytes(QuantFormat::Q4, 3, 3, 2, &bytes[..6], &bytes[..24]).is_ok());
    assert!(Matrix::from_bytes(QuantFormat::Q4, 3, 3, 2, &bytes[..5], &bytes[..24]).is_err());
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::Bf16, usize::MAX, 3, 0, bytes, &[]),
        Err(Error::ShapeOverflow { format: "bf16", .. })
    ));
}

#[test]
fn from_bytes_rejects_misaligned_buffers() {
    // A `Vec<f32>` is 4-aligned, so offset 1 is misaligned for f32 and u16.
    let backing = vec![0.0f32; 16];
    let bytes: &[u8] = bytemuck::cast_slice(&backing);
    let odd = &bytes[1..];
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::F32, 1, 4, 0, &odd[..16], &[]),
        Err(Error::Misaligned { format: "f32", what: "weights", align: 4, .. })
    ));
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::Bf16, 1, 4, 0, &odd[..8], &[]),
        Err(Error::Misaligned { format: "bf16", align: 2, .. })
    ));
    // Byte-sized codes never misalign; their f32 scales can.
    assert!(Matrix::from_bytes(QuantFormat::Q8, 1, 4, 2, &odd[..4], &bytes[..8]).is_ok());
    assert!(matches!(
        Matrix::from_bytes(QuantFormat::Q4, 1, 4, 2, &bytes[..2], &odd[..8]),
        Err(Error::Misaligned { format: "q4", what: "scales", .. })
    ));
    // bf16 only needs 2-byte alignment.
    assert!(Matrix::from_bytes(QuantFormat::Bf16, 1, 4, 0, &bytes[2..10], &[]).is_ok());
}

#[test]
fn row_range_checks_bounds() {
    let w = [0.0f32; 6];
    let m = Matrix::new(3, 2, MatData::F32(&w)).unwrap();
    assert_eq!(m.row_range(1, 2).unwrap().rows, 2);
    assert_eq!(m.row_range(3, 0).unwrap().rows, 0);
    assert_eq!(m.row_range(2, 2), Err(Error::RowRange { start: 2, count: 2, rows: 3 }));
    assert!(m.row_range(usize::MAX, 2).is_err());
}

#[test]
fn error_messages_carry_context() {
    let err = Matrix::new(2, 4, MatData::F32(&[0.0; 6])).unwrap_err();
    assert_eq!(err.to_string(), "f32 weights for a [2, 4] matrix: expected 8 elements, got 6");
}

#[test]
#[should_panic(expected = "x length")]
fn matvec_asserts_lengths() {
    let w = [0.0f32; 6];
    let m = Matrix::new(2, 3, MatData::F32(&w)).unwrap();
    m.matvec(&[0.0; 2], &mut [0.0; 2]);
}

#[test]
#[should_panic]
fn hand_built_inconsistent_matrix_panics_instead_of_reading_out_of_bounds() {
    let w = [1.0f32; 4];
    let m = Matrix { rows: 2, cols: 4, data: MatData::F32(&w) };
    m.matvec(&[1.0; 4], &mut [0.0; 2]);
}
