// Products of q8/q4 weights, in the container's own layout, with activations
// quantized on the host: the integer path's definition (`crate::int`), the
// same operations in the same order, so the results are the CPU's bit for bit.
//
// A workgroup computes ROWS rows for one activation vector: invocation
// (k, i) is product lane k of row i, and accumulates that lane over the
// row's blocks in ascending order, as `int::dot_ref` does; invocation 0 of
// the row then adds the 16 lane sums in `int::reduce_lanes`'s tree.

struct Params {
    rows: u32,
    cols: u32,
    // Columns per weight scale; a power of two covering whole lanes.
    group: u32,
    groups_per_row: u32,
    // Bytes per weight row: cols for q8, ceil(cols / 2) for q4.
    row_bytes: u32,
    // Blocks per row, the partial last one included.
    blocks: u32,
    block_cols: u32,
    lane_cols: u32,
    // 1 for q4 nibbles, 0 for q8 bytes.
    q4: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// The weight bytes, four to a word (little-endian), rows back to back.
@group(0) @binding(0) var<storage, read> qs: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<f32>;
// Activation codes in column order, `blocks * block_cols` per vector.
@group(0) @binding(2) var<storage, read> codes: array<i32>;
// One scale per product lane, `blocks * 16` per vector.
@group(0) @binding(3) var<storage, read> lane_scales: array<f32>;
// `out[t * rows + r]`.
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const LANES: u32 = 16u;
const ROWS: u32 = 4u;

var<workgroup> sums: array<array<f32, 16>, 4>;

fn byte_at(i: u32) -> u32 {
    return (qs[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// The signed code of column c of the row whose bytes start at row_start.
fn code(row_start: u32, c: u32) -> i32 {
    if (p.q4 == 0u) {
        return bitcast<i32>(byte_at(row_start + c) << 24u) >> 24u;
    }
    let b = byte_at(row_start + c / 2u);
    let nibble = select(b >> 4u, b & 0xfu, (c & 1u) == 0u);
    return i32(nibble) - 8;
}

@compute @workgroup_size(16, 4, 1)
fn products(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let k = lid.x;
    let r = (wid.z * nwg.x + wid.x) * ROWS + lid.y;
    let t = wid.y;
    var facc = 0.0;
    if (r < p.rows) {
        let row_start = r * p.row_bytes;
        let x0 = t * p.blocks * p.block_cols;
        for (var b = 0u; b < p.blocks; b++) {
            let c0 = b * p.block_cols + k * p.lane_cols;
            var isum = 0i;
            var w_scale = 0.0;
            if (c0 < p.cols) {
                w_scale = scales[r * p.groups_per_row + c0 / p.group];
                let c_end = min(c0 + p.lane_cols, p.cols);
                for (var c = c0; c < c_end; c++) {
                    isum += code(row_start, c) * codes[x0 + c];
                }
            }
            let s = w_scale * lane_scales[(t * p.blocks + b) * LANES + k];
            facc = fma(f32(isum), s, facc);
        }
    }
    sums[lid.y][k] = facc;
    workgroupBarrier();
    if (k == 0u && r < p.rows) {
        let l = sums[lid.y];
        var v8: array<f32, 8>;
        for (var i = 0u; i < 8u; i++) {
            v8[i] = l[i] + l[i + 8u];
        }
        var v4: array<f32, 4>;
        for (var i = 0u; i < 4u; i++) {
            v4[i] = v8[i] + v8[i + 4u];
        }
        let v2_0 = v4[0] + v4[2];
        let v2_1 = v4[1] + v4[3];
        out[t * p.rows + r] = v2_0 + v2_1;
    }
}
