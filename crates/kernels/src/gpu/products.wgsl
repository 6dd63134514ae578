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
            facc = exact_fma(isum, s, facc);
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

// ---- An exactly rounded fused multiply-add, in integer arithmetic ----
//
// WGSL's `fma` may be a multiply and an add (Vulkan allows it, and lavapipe
// does so), so the lanes' `fma(isum, s, acc)` is computed here from the bits:
// the exact product and sum in 64-bit integers, rounded once to nearest even.

struct U64 {
    hi: u32,
    lo: u32,
}

fn shl64(x: U64, n: u32) -> U64 {
    if (n == 0u) {
        return x;
    }
    if (n >= 32u) {
        return U64(x.lo << (n - 32u), 0u);
    }
    return U64((x.hi << n) | (x.lo >> (32u - n)), x.lo << n);
}

// `x >> n` for n < 64, the bits shifted out dropped.
fn shr64(x: U64, n: u32) -> U64 {
    if (n == 0u) {
        return x;
    }
    if (n >= 32u) {
        return U64(0u, x.hi >> (n - 32u));
    }
    return U64(x.hi >> n, (x.lo >> n) | (x.hi << (32u - n)));
}

// `x >> n` for any n, with bit 0 set if any bit shifted out was (sticky).
fn shr64_sticky(x: U64, n: u32) -> U64 {
    if (n >= 64u) {
        return U64(0u, select(0u, 1u, (x.hi | x.lo) != 0u));
    }
    let kept = shr64(x, n);
    let lost = sub64(x, shl64(kept, n));
    return U64(kept.hi, kept.lo | select(0u, 1u, (lost.hi | lost.lo) != 0u));
}

fn add64(a: U64, b: U64) -> U64 {
    let lo = a.lo + b.lo;
    return U64(a.hi + b.hi + select(0u, 1u, lo < a.lo), lo);
}

// `a - b` for a >= b.
fn sub64(a: U64, b: U64) -> U64 {
    return U64(a.hi - b.hi - select(0u, 1u, a.lo < b.lo), a.lo - b.lo);
}

fn lt64(a: U64, b: U64) -> bool {
    return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

fn clz64(x: U64) -> u32 {
    if (x.hi != 0u) {
        return countLeadingZeros(x.hi);
    }
    return 32u + countLeadingZeros(x.lo);
}

// `a * b` for a, b < 2^24.
fn mul24(a: u32, b: u32) -> U64 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let low = a0 * b0;
    let mid = a1 * b0 + a0 * b1;
    let lo = low + (mid << 16u);
    return U64(a1 * b1 + (mid >> 16u) + select(0u, 1u, lo < low), lo);
}

// A finite, non-zero f32 as `m * 2^e`, m < 2^24, normalized to a 64-bit
// value whose leading bit is bit 62 (so every shift below is exact where
// it must be, and bits 0 and 1 are free for the sticky bit).
struct Wide {
    m: U64,
    e: i32,
}

fn widen(m: U64, e: i32) -> Wide {
    let shift = clz64(m) - 1u;
    return Wide(shl64(m, shift), e - i32(shift));
}

fn mantissa(bits: u32) -> u32 {
    let field = (bits >> 23u) & 0xffu;
    return select((bits & 0x7fffffu) | 0x800000u, bits & 0x7fffffu, field == 0u);
}

fn exponent(bits: u32) -> i32 {
    return max(i32((bits >> 23u) & 0xffu), 1) - 150;
}

// `a * s + c` rounded once to nearest even, as `f32::mul_add` computes it,
// for |a| < 2^24.
fn exact_fma(a: i32, s: f32, c: f32) -> f32 {
    let sb = bitcast<u32>(s);
    let cb = bitcast<u32>(c);
    let special = ((sb >> 23u) & 0xffu) == 0xffu || ((cb >> 23u) & 0xffu) == 0xffu;
    if (a == 0 || (sb & 0x7fffffffu) == 0u || special) {
        // An exactly zero product, a NaN or an infinity: the separate
        // operations round as the fused one.
        return f32(a) * s + c;
    }
    var big = widen(mul24(u32(abs(a)), mantissa(sb)), exponent(sb));
    var big_neg = (a < 0) != ((sb >> 31u) == 1u);
    if ((cb & 0x7fffffffu) != 0u) {
        var small = widen(U64(0u, mantissa(cb)), exponent(cb));
        var small_neg = (cb >> 31u) == 1u;
        if (small.e > big.e || (small.e == big.e && lt64(big.m, small.m))) {
            let t = big;
            big = small;
            small = t;
            let tn = big_neg;
            big_neg = small_neg;
            small_neg = tn;
        }
        var aligned = shr64_sticky(small.m, u32(big.e - small.e));
        // Bits 0 and 1 collapse into a sticky bit 0: bits 0 and 1 of `big`
        // are zero, so a sum that lost bits can never look like a tie.
        aligned.lo = (aligned.lo & ~3u) | select(0u, 1u, (aligned.lo & 3u) != 0u);
        if (small_neg == big_neg) {
            big.m = add64(big.m, aligned);
        } else {
            big.m = sub64(big.m, aligned);
        }
    }
    if ((big.m.hi | big.m.lo) == 0u) {
        return 0.0;
    }
    let lead = 63u - clz64(big.m);
    // The exponent of the result's last bit, no lower than a subnormal's.
    let lsb_e = max(big.e + i32(lead) - 23, -149);
    let shift = lsb_e - big.e;
    var m = 0u;
    if (shift <= 0) {
        m = shl64(big.m, u32(-shift)).lo;
    } else if (shift < 64) {
        let sh = u32(shift);
        let kept = shr64(big.m, sh);
        let rem = sub64(big.m, shl64(kept, sh));
        let half = shl64(U64(0u, 1u), sh - 1u);
        m = kept.lo;
        if (lt64(half, rem) || (rem.hi == half.hi && rem.lo == half.lo && (m & 1u) == 1u)) {
            m += 1u;
        }
    } else if (shift == 64) {
        m = select(0u, 1u, lt64(U64(0x80000000u, 0u), big.m));
    }
    let sign = select(0u, 0x80000000u, big_neg);
    let field = lsb_e + 149;
    if (field >= 255) {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    return bitcast<f32>(sign | min((u32(field) << 23u) + m, 0x7f800000u));
}
