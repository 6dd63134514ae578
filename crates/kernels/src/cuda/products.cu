// Products of q8/q4 weights, in the container's own layout, with activations
// quantized on the host: the integer path's definition (`crate::int`), the
// same operations in the same order as `crate::gpu`'s `products.wgsl`, so the
// results are the CPU's bit for bit.
//
// A thread block computes ROWS rows for one activation vector: thread
// (k, i) is product lane k of row i, and accumulates that lane over the
// row's blocks in ascending order, as `int::dot_ref` does; thread 0 of the
// row then adds the 16 lane sums in `int::reduce_lanes`'s tree.
//
// Compiled by NVRTC with `--fmad=false` (no multiply and add is contracted
// into a fused one behind our back) and without flushing subnormals; every
// float operation is also written as its correctly rounded intrinsic
// (`__fmul_rn`, `__fadd_rn`, `__fmaf_rn`), which the compiler never fuses or
// reorders. Unlike WGSL's `fma`, CUDA's `__fmaf_rn` is the IEEE fused
// multiply-add on every NVIDIA GPU, so the lanes need no integer emulation.

#define LANES 16u
#define ROWS 4u

// `crate::accel::products::Params`, field for field.
struct Params {
    unsigned int rows;
    unsigned int cols;
    // Columns per weight scale; a power of two covering whole lanes.
    unsigned int group;
    unsigned int groups_per_row;
    // Bytes per weight row: cols for q8, ceil(cols / 2) for q4.
    unsigned int row_bytes;
    // Blocks per row, the partial last one included.
    unsigned int blocks;
    unsigned int block_cols;
    unsigned int lane_cols;
    // 1 for q4 nibbles, 0 for q8 bytes.
    unsigned int q4;
    unsigned int pad0;
    unsigned int pad1;
    unsigned int pad2;
};

// The signed code of column c of the row whose bytes start at row.
__device__ __forceinline__ int code(const unsigned char* __restrict__ row, unsigned int c, unsigned int q4) {
    if (q4 == 0u) {
        return (int)(signed char)row[c];
    }
    const unsigned int b = row[c >> 1];
    const unsigned int nibble = (c & 1u) == 0u ? (b & 0xfu) : (b >> 4);
    return (int)nibble - 8;
}

// Lane k's sum over one row's blocks, in ascending order, as `int::dot_ref`
// accumulates `facc[k]`. row: the row's weight bytes; row_scales: its
// `groups_per_row` scales; x: one vector's codes; x_scales: its lane scales.
__device__ __forceinline__ float lane_sum(
    const unsigned char* __restrict__ row,
    const float* __restrict__ row_scales,
    const int* __restrict__ x,
    const float* __restrict__ x_scales,
    unsigned int k,
    const Params& p
) {
    float facc = 0.0f;
    for (unsigned int b = 0u; b < p.blocks; b++) {
        const unsigned int c0 = b * p.block_cols + k * p.lane_cols;
        int isum = 0;
        float w_scale = 0.0f;
        if (c0 < p.cols) {
            w_scale = row_scales[c0 / p.group];
            const unsigned int c_end = min(c0 + p.lane_cols, p.cols);
            for (unsigned int c = c0; c < c_end; c++) {
                isum += code(row, c, p.q4) * x[c];
            }
        }
        // |isum| < 2^24 (`crate::int`'s module docs): exact as a float.
        const float s = __fmul_rn(w_scale, x_scales[b * LANES + k]);
        facc = __fmaf_rn(__int2float_rn(isum), s, facc);
    }
    return facc;
}

// The 16 lane sums added in `int::reduce_lanes`'s tree: lane i with i + 8,
// then i + 4, i + 2, i + 1.
__device__ __forceinline__ float reduce_lanes(const float* l) {
    float v8[8];
    for (unsigned int i = 0u; i < 8u; i++) {
        v8[i] = __fadd_rn(l[i], l[i + 8u]);
    }
    float v4[4];
    for (unsigned int i = 0u; i < 4u; i++) {
        v4[i] = __fadd_rn(v8[i], v8[i + 4u]);
    }
    const float v2_0 = __fadd_rn(v4[0], v4[2]);
    const float v2_1 = __fadd_rn(v4[1], v4[3]);
    return __fadd_rn(v2_0, v2_1);
}

// The kernel; a host build of the two functions above (the test
// `the_cuda_kernels_arithmetic_equals_the_integer_definition_on_the_host`)
// leaves it out.
#ifndef STRATA_HOST_CHECK
// qs: the weight bytes, rows back to back. scales: `rows * groups_per_row`.
// codes: activation codes in column order, `blocks * block_cols` per vector.
// lane_scales: one per product lane, `blocks * 16` per vector.
// out: `out[t * rows + r]`.
extern "C" __global__ void __launch_bounds__(LANES * ROWS) products(
    const unsigned char* __restrict__ qs,
    const float* __restrict__ scales,
    const int* __restrict__ codes,
    const float* __restrict__ lane_scales,
    float* __restrict__ out,
    const Params p
) {
    __shared__ float sums[ROWS][LANES];
    const unsigned int k = threadIdx.x;
    const unsigned int r = (blockIdx.z * gridDim.x + blockIdx.x) * ROWS + threadIdx.y;
    const unsigned int t = blockIdx.y;
    float facc = 0.0f;
    if (r < p.rows) {
        facc = lane_sum(
            qs + (size_t)r * p.row_bytes,
            scales + (size_t)r * p.groups_per_row,
            codes + (size_t)t * p.blocks * p.block_cols,
            lane_scales + (size_t)t * p.blocks * LANES,
            k,
            p
        );
    }
    sums[threadIdx.y][k] = facc;
    __syncthreads();
    if (k == 0u && r < p.rows) {
        out[(size_t)t * p.rows + r] = reduce_lanes(sums[threadIdx.y]);
    }
}
#endif
