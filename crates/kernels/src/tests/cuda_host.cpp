// `products.cu`'s arithmetic built for the host (a test, `tests/cuda.rs`):
// the kernel's `lane_sum` and `reduce_lanes` as written, CUDA's correctly
// rounded intrinsics as the host's IEEE operations (compiled with
// `-ffp-contract=off`, and `std::fmaf` the fused multiply-add), over every
// row and vector as the kernel's threads cover them. Reads its inputs from
// the file named by argv[1], writes the products to argv[2].
//
// Input, little-endian: Params (12 u32), n (u32), then qs (u32 byte count,
// bytes), scales (u32 count, f32s), codes (u32 count, i32s), lane scales
// (u32 count, f32s). Output: n * rows f32s, `out[t * rows + r]`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define STRATA_HOST_CHECK 1

static inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __int2float_rn(int a) { return static_cast<float>(a); }
using std::min;

#include "../cuda/products.cu"

template <typename T> static bool read_vec(FILE* f, std::vector<T>& v) {
    uint32_t count = 0;
    if (fread(&count, sizeof count, 1, f) != 1) return false;
    v.resize(count);
    return count == 0 || fread(v.data(), sizeof(T), count, f) == count;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in) return 3;
    Params p;
    uint32_t n = 0;
    std::vector<unsigned char> qs;
    std::vector<float> scales, lane_scales;
    std::vector<int> codes;
    if (fread(&p, sizeof p, 1, in) != 1 || fread(&n, sizeof n, 1, in) != 1 || !read_vec(in, qs) ||
        !read_vec(in, scales) || !read_vec(in, codes) || !read_vec(in, lane_scales)) {
        return 4;
    }
    fclose(in);
    std::vector<float> out(static_cast<size_t>(n) * p.rows);
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t r = 0; r < p.rows; r++) {
            float l[LANES];
            for (uint32_t k = 0; k < LANES; k++) {
                l[k] = lane_sum(
                    qs.data() + static_cast<size_t>(r) * p.row_bytes,
                    scales.data() + static_cast<size_t>(r) * p.groups_per_row,
                    codes.data() + static_cast<size_t>(t) * p.blocks * p.block_cols,
                    lane_scales.data() + static_cast<size_t>(t) * p.blocks * LANES,
                    k,
                    p
                );
            }
            out[static_cast<size_t>(t) * p.rows + r] = reduce_lanes(l);
        }
    }
    FILE* result = fopen(argv[2], "wb");
    if (!result) return 5;
    if (!out.empty() && fwrite(out.data(), sizeof(float), out.size(), result) != out.size()) return 6;
    return fclose(result) == 0 ? 0 : 7;
}
