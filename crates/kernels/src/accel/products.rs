//! What the two GPU backends (`crate::gpu`, wgpu; `crate::cuda`, CUDA)
//! share of the integer path's products: the kernel's parameters, the
//! activations in the order the kernels read them, the dispatch's pieces,
//! and the host side of a product and of the gated FFN around the device's
//! kernel. Each backend only moves buffers and launches its kernel
//! ([`ProductsDevice`]), so the two cannot drift apart in what they compute
//! around it.

use crate::act::{ActElem, ActivationPrecision, LANES, Layout, QuantizedActs};
use crate::error::{Error, Result};
use crate::matrix::{MatData, Matrix};
use crate::threads::GatedAct;

/// Rows per workgroup (thread block): the kernels' `ROWS`.
pub(crate) const ROWS_PER_GROUP: usize = 4;

/// Product lanes per row: a workgroup is `LANES x ROWS_PER_GROUP`
/// invocations, one per lane and row.
pub(crate) const LANES_PER_ROW: usize = LANES;

/// The most workgroups along one dispatch dimension that WebGPU
/// guarantees (CUDA's grid y and z share it): rows spread over two
/// dimensions, activation vectors over one.
pub(crate) const GROUPS_PER_DIM_MAX: usize = 65_535;

/// The kernels' parameter block (`products.wgsl`'s uniform, `products.cu`'s
/// by-value argument), field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub rows: u32,
    pub cols: u32,
    pub group: u32,
    pub groups_per_row: u32,
    pub row_bytes: u32,
    pub blocks: u32,
    pub block_cols: u32,
    pub lane_cols: u32,
    pub q4: u32,
    pub pad: [u32; 3],
}

/// The kernels' parameters of a `[rows, cols]` matrix of `layout` with
/// `group` columns per scale, or why they do not fit its u32 indices.
pub(crate) fn params(layout: Layout, rows: usize, cols: usize, group: usize) -> Result<Params> {
    let too_large = || Error::Gpu { reason: format!("a [{rows}, {cols}] matrix is too large for 32-bit indices") };
    let row_bytes = match layout {
        Layout::Q8 => cols,
        Layout::Q4 => cols.div_ceil(2),
    };
    // Every index the shader forms stays below the weight bytes or the
    // codes of 65535 vectors (`token_chunks`), 4 bytes each.
    let blocks = cols.div_ceil(layout.block_cols());
    rows.checked_mul(row_bytes).filter(|&b| u32::try_from(b).is_ok()).ok_or_else(too_large)?;
    blocks
        .checked_mul(layout.block_cols())
        .and_then(|c| c.checked_mul(GROUPS_PER_DIM_MAX))
        .filter(|&c| u32::try_from(c).is_ok())
        .ok_or_else(too_large)?;
    let u = |v: usize| u32::try_from(v).map_err(|_| too_large());
    Ok(Params {
        rows: u(rows)?,
        cols: u(cols)?,
        group: u(group)?,
        groups_per_row: u(cols.div_ceil(group))?,
        row_bytes: u(row_bytes)?,
        blocks: u(blocks)?,
        block_cols: u(layout.block_cols())?,
        lane_cols: u(layout.lane_cols())?,
        q4: u32::from(layout == Layout::Q4),
        pad: [0; 3],
    })
}

/// A matrix as a device takes it: the container's own q8 or q4 bytes
/// (rows back to back) and scales, and the kernels' parameters.
pub(crate) struct Uploadable<'a> {
    pub layout: Layout,
    pub qs: &'a [u8],
    pub scales: &'a [f32],
    pub params: Params,
}

impl<'a> Uploadable<'a> {
    /// `m` as it is stored, if it is q8 or q4 with a group the integer
    /// path takes and its indices fit the kernels' u32; anything else stays
    /// on the host ([`Error::GpuUnsupported`], or [`Error::Gpu`] for its size).
    pub(crate) fn of(m: &Matrix<'a>) -> Result<Self> {
        let (layout, qs, scales, group): (Layout, &[u8], &[f32], usize) = match m.data {
            MatData::Q8 { qs, scales, group } if Layout::Q8.supports_group(group) => {
                (Layout::Q8, bytemuck::cast_slice(qs), scales, group)
            }
            MatData::Q4 { qs, scales, group } if Layout::Q4.supports_group(group) => (Layout::Q4, qs, scales, group),
            data => return Err(Error::GpuUnsupported { format: data.format().name(), group: data.group() }),
        };
        // The kernels index in u32: every count must fit.
        let params = params(layout, m.rows, m.cols, group)?;
        Ok(Self { layout, qs, scales, params })
    }
}

/// The dispatch of the products of a `rows`-row matrix with `n` vectors:
/// workgroups `(x, n, z)`, rows spread over x and z; `None` where there is
/// nothing to compute.
///
/// # Panics
/// If it exceeds WebGPU's limits ([`token_chunks`] keeps `n` within them).
pub(crate) fn dispatch(rows: usize, n: usize) -> Option<[u32; 3]> {
    let row_groups = rows.div_ceil(ROWS_PER_GROUP);
    if row_groups == 0 || n == 0 {
        return None;
    }
    let x = row_groups.min(GROUPS_PER_DIM_MAX);
    let z = row_groups.div_ceil(x);
    assert!(z <= GROUPS_PER_DIM_MAX && n <= GROUPS_PER_DIM_MAX, "dispatch within WebGPU's limits");
    Some([x as u32, n as u32, z as u32])
}

/// `xs` (`[n, cols]`) quantized for `layout` by the CPU's quantizer
/// ([`crate::act`]) at `precision`, in column order (each block's plane
/// order undone), one `i32` a code, and the lane scales: what the kernels
/// read.
pub(crate) fn column_acts(
    layout: Layout,
    precision: ActivationPrecision,
    xs: &[f32],
    n: usize,
    cols: usize,
) -> (Vec<i32>, Vec<f32>) {
    match precision {
        ActivationPrecision::Int16 => column_codes(&QuantizedActs::<i16>::new(layout, xs, n, cols)),
        ActivationPrecision::Int8 => column_codes(&QuantizedActs::<i8>::new(layout, xs, n, cols)),
    }
}

fn column_codes<E: ActElem>(acts: &QuantizedActs<E>) -> (Vec<i32>, Vec<f32>) {
    let layout = acts.layout();
    let block = layout.block_cols();
    let mut codes = Vec::new();
    let mut lane_scales = Vec::new();
    for t in 0..acts.n() {
        let row = acts.row(t);
        for plane_order in row.q.chunks_exact(block) {
            codes.extend((0..block).map(|j| plane_order[layout.position::<E>(j)].into()));
        }
        debug_assert_eq!(row.lane_scales.len(), row.q.len() / block * LANES);
        lane_scales.extend_from_slice(row.lane_scales);
    }
    (codes, lane_scales)
}

/// `xs` (`[n, x_cols]`) and `ys` (`[n, y_cols]`) in pieces of at most
/// [`GROUPS_PER_DIM_MAX`] vectors, one dispatch's worth.
pub(crate) fn token_chunks<'a>(
    xs: &'a [f32],
    x_cols: usize,
    ys: &'a mut [f32],
    y_cols: usize,
) -> impl Iterator<Item = (&'a [f32], &'a mut [f32])> {
    let (x_step, y_step) = (GROUPS_PER_DIM_MAX * x_cols.max(1), GROUPS_PER_DIM_MAX * y_cols.max(1));
    xs.chunks(x_step).zip(ys.chunks_mut(y_step))
}

/// A q8/q4 matrix on a device.
pub(crate) trait ProductsMatrix {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
}

/// A device that runs the products kernel: all a backend does itself.
pub(crate) trait ProductsDevice {
    type Matrix: ProductsMatrix;

    /// `outs[i] = matrices[i] · xs` for the `n <= GROUPS_PER_DIM_MAX`
    /// vectors `xs` (`[n, cols]`, every matrix `cols` wide), each `out`
    /// `[n, rows_i]`, in one submission, the activations quantized at
    /// `precision` once per layout ([`column_acts`]); waits for the results.
    ///
    /// # Panics
    /// If the device fails (it is lost, or out of memory).
    fn products(
        &self,
        matrices: &[&Self::Matrix],
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        outs: &mut [&mut [f32]],
    );
}

/// `ys[t] = W xs[t]` for the `n` inputs `xs` (`[n, cols]`) on `device`: bit
/// for bit the CPU's integer path.
///
/// # Panics
/// If `xs` is not `[n, cols]` or `ys` not `[n, rows]`, or the device fails.
pub(crate) fn matmul<D: ProductsDevice>(
    device: &D,
    m: &D::Matrix,
    precision: ActivationPrecision,
    xs: &[f32],
    n: usize,
    ys: &mut [f32],
) {
    let (rows, cols) = (m.rows(), m.cols());
    assert_eq!(Some(xs.len()), n.checked_mul(cols), "device matmul: xs must be [n, cols]");
    assert_eq!(Some(ys.len()), n.checked_mul(rows), "device matmul: ys must be [n, rows]");
    if cols == 0 {
        // An empty sum: `xs` has no elements to chunk by token, so no
        // dispatch would write `ys`.
        ys.fill(0.0);
        return;
    }
    for (xs, ys) in token_chunks(xs, cols, ys, rows) {
        let n = xs.len() / cols;
        device.products(&[m], precision, xs, n, &mut [ys]);
    }
}

/// The gated feed-forward block of one expert (or a dense MLP) on
/// `[gate, up, down]`: gate and up in one submission, the activation `act`
/// on the host (a device's `exp` is not correctly rounded), then down; bit
/// for bit [`crate::Threads::gated_ffn`] where the CPU takes the integer
/// path.
///
/// # Panics
/// As [`crate::Threads::gated_ffn`], and if the device fails.
pub(crate) fn gated_ffn<D: ProductsDevice>(
    device: &D,
    [gate, up, down]: [&D::Matrix; 3],
    act: GatedAct<'_>,
    precision: ActivationPrecision,
    xs: &[f32],
    n: usize,
    ys: &mut [f32],
) {
    let (inter, hidden) = (gate.rows(), gate.cols());
    act.check(inter, hidden);
    assert!(up.rows() == inter && up.cols() == hidden, "expert_ffn: up must be shaped like gate");
    assert!(down.rows() == hidden && down.cols() == inter, "expert_ffn: down must be [hidden, inter]");
    assert_eq!(Some(xs.len()), n.checked_mul(hidden), "expert_ffn: xs must be [n, hidden]");
    assert_eq!(Some(ys.len()), n.checked_mul(hidden), "expert_ffn: ys must be [n, hidden]");
    for (xs, ys) in token_chunks(xs, hidden, ys, hidden) {
        let n = ys.len() / hidden.max(1);
        let mut g = vec![0.0f32; n * inter];
        let mut u = vec![0.0f32; n * inter];
        device.products(&[gate, up], precision, xs, n, &mut [&mut g, &mut u]);
        act.apply(0..inter, &mut g, &mut u);
        matmul(device, down, precision, &g, n, ys);
        act.add_down_bias(ys);
    }
}
