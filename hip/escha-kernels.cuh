// Escha-W2 CUDA/HIP kernels (escha-ggml): the device side of escha.cu,
// without ggml's headers, so that the same source also compiles as C++
// through hip/shim/cuda-shim.h and runs on the CPU, as CUDA and as HIP
// (tests/cuda_shim.rs, tests/hip_shim.rs).
// Expects GGML_UNUSED, NO_DEVICE_CODE and GGML_CUDA_CC_AMPERE from the
// includer (ggml-cuda's common.cuh, or the shim). See escha.cu for the
// three stages and the tile order.
#pragma once

#include "escha-format.h"
#include "escha-plan.h"

#include <cstdint>
#include <cstring>

#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
#define ESCHA_HAVE_MMA 1
#endif

// Programmatic dependent launch (Hopper and later): escha.cu launches every
// kernel the way the pinned ggml-cuda launches its own (ggml_cuda_kernel_launch;
// GGML_CUDA_PDL=0 turns it off), so that its blocks are resident and waiting
// when the kernel before it ends instead of being launched then. Each kernel
// calls escha_pdl_wait() before it writes anything or reads anything a
// kernel may write: the kernel before it (its xh, mid, ids, or a pool buffer
// that this op's scratch reuses) is then complete and visible; and then lets
// the next kernel launch (escha_pdl_release(): that one waits for all of
// this one in turn). Only a dense op's weights (code and per-channel
// vectors, which escha.cu checks are graph leaves) are read before the
// wait. What a kernel reads or writes after the wait is not passed
// __restrict__ (nvcc may hoist such a load above the wait; and a kernel's
// parameter types must not differ between nvcc's host and device passes,
// which GGML_CUDA_RESTRICT's would); only the code words, which no kernel
// writes, are.
#if defined(GGML_CUDA_USE_PDL) && !defined(ESCHA_CUDA_SHIM)
static __device__ __forceinline__ void escha_pdl_wait() { ggml_cuda_pdl_sync(); }
static __device__ __forceinline__ void escha_pdl_release() { ggml_cuda_pdl_lc(); }
#else
static __device__ __forceinline__ void escha_pdl_wait() {}
static __device__ __forceinline__ void escha_pdl_release() {}
#endif

// The start of every escha kernel (above).
static __device__ __forceinline__ void escha_kernel_begin() {
    escha_pdl_wait();
    escha_pdl_release();
}

static constexpr float ESCHA_RS_F   = ESCHA_RS;        // f32(1/sqrt(128)) (escha-format.h)
static constexpr int   ESCHA_LANES  = 32;              // logical warp width
static constexpr int   ESCHA_WARPS  = 4;               // logical warps per block
static constexpr int   ESCHA_THREADS = ESCHA_LANES * ESCHA_WARPS;

// ---- row addressing ------------------------------------------------------

// n / d and n % d for 0 <= n < 2^31 and 1 <= d <= 2^31 by a multiply-high,
// an add and a shift, with magic numbers computed once on the host
// (Granlund and Montgomery's round-up method: m = 2^32 (2^s - d) / d + 1,
// s = ceil(log2 d)). A division by a kernel argument is otherwise about 20
// dependent instructions (I2F, MUFU.RCP, F2I and fix-ups; a call to nvcc's
// 64-bit routine where an operand is 64-bit), and the token-generation
// kernels' prologues had 6 of them in the chain before their first loads.
// Callers keep n below 2^31 (escha.cu asserts the rows and the grid).
struct escha_divisor {
    uint32_t d = 1, m = 1, s = 0;

    escha_divisor() = default;
    __host__ __device__ constexpr escha_divisor(const int64_t v) : d((uint32_t) v) {
        while (s < 31 && (uint64_t{ 1 } << s) < d) {
            s++;
        }
        m = (uint32_t) ((((uint64_t{ 1 } << s) - d) << 32) / d + 1);
    }
    __host__ __device__ constexpr uint32_t div(const uint32_t n) const {
        return ((uint32_t) (((uint64_t) n * m) >> 32) + n) >> s; // hi <= n: no overflow below 2^31
    }
    __host__ __device__ constexpr uint32_t mod(const uint32_t n) const { return n - div(n) * d; }
};

// Every n of a sample (0, 1, multiples of d and their neighbours, 2^31 - 1
// and below) against the division operator, for d = 1..256 and each power
// of two, its neighbours, and a few large odd divisors.
static constexpr bool escha_divisor_exact(const uint32_t d) {
    const escha_divisor q((int64_t) d);
    const uint32_t top = 0x7FFFFFFFu;
    for (uint32_t k = 0; k < 32; k++) {
        const uint32_t ns[] = { k, (uint32_t) (k * (uint64_t) d % (top + 1ull)), (uint32_t) ((k * (uint64_t) d + d - 1) % (top + 1ull)),
                                top - k, top / d * d - 1 + (k & 1) + (top / d * d == 0), top - k * 7919u };
        for (const uint32_t n : ns) {
            if (n <= top && (q.div(n) != n / d || q.mod(n) != n % d)) {
                return false;
            }
        }
    }
    return true;
}
static constexpr bool escha_divisors_exact() {
    for (uint32_t d = 1; d <= 256; d++) {
        if (!escha_divisor_exact(d)) {
            return false;
        }
    }
    for (uint32_t b = 2; b <= 31; b++) {
        const uint32_t p = 1u << b;
        if (!escha_divisor_exact(p - 1) || !escha_divisor_exact(p) || (b < 31 && !escha_divisor_exact(p + 1))) {
            return false;
        }
    }
    return escha_divisor_exact(2147483647u) && escha_divisor_exact(1000003u) && escha_divisor_exact(248320u);
}
static_assert(escha_divisors_exact(), "escha_divisor: n / d and n % d exactly, below 2^31");

// An expert id out of range. A GPU kernel cannot stop with an error, so
// nothing is read with it (the slot's transforms use expert 0, the multiply
// skips it) and its output is NaN, never another expert's result.
static __device__ __forceinline__ bool escha_bad_id(const int e, const int64_t n_expert) {
    return e < 0 || e >= n_expert;
}

// Op row r (dense: the flattened rows of x; MoE: slot t*n_used + u) -> its
// input row and its expert. Rows are below 2^31 (escha.cu asserts it).
struct escha_rows {
    const char    * x;
    int64_t         nb1, nb2, nb3;
    escha_divisor   ne1, ne2;  // dense: x->ne[1], x->ne[2]; MoE: n_used, T
    escha_divisor   nx1;       // rows of x per outer index: dense ne1, MoE NX
    const int32_t * ids;       // MoE ids (nullptr: dense, expert 0)
    int64_t         si1;       // ids row stride in elements
    int64_t         n_expert;  // MoE: the number of experts

    // Row r as (rest, i1): its index along ne1 and the rest above it (MoE:
    // token and slot within the token).
    __device__ __forceinline__ void split(const int64_t r, uint32_t & rest, uint32_t & i1) const {
        rest = ne1.div((uint32_t) r);
        i1   = (uint32_t) r - rest * ne1.d;
    }
    // Row r's x.
    __device__ __forceinline__ const float * x_row(const int64_t r) const {
        uint32_t rest, i1;
        split(r, rest, i1);
        const uint32_t i3 = ne2.div(rest), i2 = rest - i3 * ne2.d;
        return (const float *) (x + (int64_t) nx1.mod(i1) * nb1 + (int64_t) i2 * nb2 + (int64_t) i3 * nb3);
    }
    // Row r's expert: 0 for a dense op, and 0 in place of a bad id (then
    // bad is set).
    __device__ __forceinline__ int expert(const int64_t r, bool & bad) const {
        if (!ids) {
            bad = false;
            return 0;
        }
        uint32_t rest, i1;
        split(r, rest, i1);
        const int e = ids[(int64_t) rest * si1 + i1];
        bad = escha_bad_id(e, n_expert);
        return bad ? 0 : e;
    }
};

// Per-channel operands; an expert stride of 0 shares one vector.
struct escha_vecs {
    const half  * rin;   int64_t rin_es;
    const half  * rout;  int64_t rout_es;
    const float * s_in;  int64_t s_in_es;
    const float * s_out; int64_t s_out_es;
    const float * bias;  int64_t bias_es;
};

// ---- Hadamard-128 ----------------------------------------------------------

// Unnormalised Sylvester H128 on one 128-block held 4 values per lane
// (lane l holds elements 4l..4l+3), stages h = 1, 2, ..., 64 in order, each
// pair (a, c) -> (a + c, a - c) as in the contract.
static __device__ __forceinline__ void escha_h128_lane(float v[4], const int lane) {
    float a, c;
    a = v[0]; c = v[1]; v[0] = a + c; v[1] = a - c;
    a = v[2]; c = v[3]; v[2] = a + c; v[3] = a - c;
    a = v[0]; c = v[2]; v[0] = a + c; v[2] = a - c;
    a = v[1]; c = v[3]; v[1] = a + c; v[3] = a - c;
#pragma unroll
    for (int m = 1; m < ESCHA_LANES; m *= 2) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float p = __shfl_xor_sync(0xFFFFFFFF, v[q], m, ESCHA_LANES);
            v[q] = (lane & m) ? p - v[q] : v[q] + p;
        }
    }
}

// rin_eff of expert e at channels i0..i0+3.
static __device__ __forceinline__ void escha_rin_eff(const escha_vecs & v, const int64_t e, const int i0, float re[4]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        re[q] = __half2float(v.rin[e * v.rin_es + i0 + q]);
        if (v.s_in) {
            re[q] = __fmul_rn(re[q], v.s_in[e * v.s_in_es + i0 + q]);
        }
    }
}

// xh of one row's 128-block from the lane's 4 values xq of x and rin_eff
// (escha_xh_lane).
static __device__ __forceinline__ void escha_xh_from(const float xq[4], const float re[4], const int lane, half h[4]) {
    float u[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        u[q] = __fmul_rn(xq[q], re[q]); // __fmul_rn: never fused into the adds below
    }
    escha_h128_lane(u, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        h[q] = __float2half_rn(__fmul_rn(u[q], ESCHA_RS_F));
    }
}

// The lane's 4 values of row r's x at channels i0..i0+3.
static __device__ __forceinline__ void escha_x_lane(const escha_rows & rows, const int64_t r, const int i0, float xq[4]) {
    const float * x = rows.x_row(r);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        xq[q] = x[i0 + q];
    }
}

// What row r's input transform reads at channels i0..i0+3: the lane's 4
// values of x into xq and, unless have_re (rin_eff already in re, loaded
// before the wait), its expert's rin_eff into re.
static __device__ __forceinline__ void escha_xh_load(const escha_rows & rows, const escha_vecs & v, const int64_t r, const int i0,
                                                     const bool have_re, float xq[4], float re[4]) {
    escha_x_lane(rows, r, i0, xq);
    if (!have_re) {
        bool bad;
        escha_rin_eff(v, rows.expert(r, bad), i0, re);
    }
}

// One warp's share of the input transform: row r's 128-block at i0 - 4 *
// lane, xh = f16(H128(f32(x[r]) * rin_eff) * RS), lane l's elements
// 4l..4l+3 into h, for row r of expert e (the fused kernel's group has it
// already: no second load of the ids). The input transform kernel
// (escha_xh_load, escha_xh_from) and the fused token-generation kernel's
// prologue both run exactly this.
static __device__ __forceinline__ void escha_xh_lane(const escha_rows & rows, const escha_vecs & v, const int64_t r, const int64_t e,
                                                     const int i0, const int lane, half h[4]) {
    float xq[4], re[4];
    escha_x_lane(rows, r, i0, xq);
    escha_rin_eff(v, e, i0, re);
    escha_xh_from(xq, re, lane, h);
}

// Rows a warp of the transform kernels has in flight: their loads are all
// issued before the first row's arithmetic. Row r0 + u * gridDim.y is the
// warp's u-th, so any grid covers every row.
static constexpr int ESCHA_TRANSFORM_ROWS = 4;

// From this many rows on, escha.cu gives each warp ESCHA_TRANSFORM_ROWS
// rows (one memory round trip for them, not one a row); below it one row a
// warp, as many warps as rows. On the H200 at 512 rows the grouping took
// the output transform of 5120 -> 17408 from 27.8 to 24.3 us and the op
// from 248.2 to 240.5 us; at 4-16 rows it cost the ops 6-9% (a quarter of
// the warps, each waited for in turn), so small batches keep a row a warp.
static constexpr int64_t ESCHA_TRANSFORM_GROUP_MIN_ROWS = 128;

// The transform kernels' grid along y for n_rows rows, grouped by
// ESCHA_TRANSFORM_ROWS or not.
static inline unsigned escha_transform_grid_y(const int64_t n_rows, const bool grouped) {
    const int64_t y = grouped ? (n_rows + ESCHA_TRANSFORM_ROWS - 1) / ESCHA_TRANSFORM_ROWS : n_rows;
    return (unsigned) (y < 65535 ? y : 65535);
}

// The grid escha.cu launches them on.
static inline unsigned escha_transform_grid_y(const int64_t n_rows) {
    return escha_transform_grid_y(n_rows, n_rows >= ESCHA_TRANSFORM_GROUP_MIN_ROWS);
}

// One op's input transform output: its xh and its mid zeroed (n_mid4
// float4s; 0 where its multiply overwrites mid), with its vectors v.
struct escha_xh_target {
    escha_vecs v;
    half     * xh;
    float4   * mid;
    int64_t    n_mid4;
};

// The ops one input transform launch serves, one per grid z: the op, a
// SWIGLU pair's up op, and later ops of the same x (escha.cu's graph
// fusion), which then skip their own.
static constexpr int ESCHA_XH_OPS = 4;
struct escha_xh_targets {
    escha_xh_target t[ESCHA_XH_OPS];
};

// t.t[z] selected without indexing the parameter by a variable (which
// would copy it to local memory).
static __device__ __forceinline__ escha_xh_target escha_xh_pick(const escha_xh_targets & t, const int z) {
    escha_xh_target r = t.t[0];
#pragma unroll
    for (int j = 1; j < ESCHA_XH_OPS; j++) {
        if (z == j) {
            r = t.t[j];
        }
    }
    return r;
}

// Zeroes mid[0..n_mid4) over the whole grid (the accumulator of a later
// multiply, which saves a memset node per op).
static __device__ __forceinline__ void escha_zero_mid(float4 * mid, const int64_t n_mid4) {
    const int64_t n_threads = (int64_t) gridDim.x * gridDim.y * blockDim.x;
    for (int64_t i = ((int64_t) blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < n_mid4; i += n_threads) {
        mid[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// xh[r] = f16(H128(f32(x[r]) * rin_eff) * RS). Block: 4 logical warps, one
// 128-block each; grid (ceil(IC/512), rows, ops): grid z serves op
// targets.t[z] (escha_xh_targets), its xh and its mid zeroed.
// early (a dense op whose weights no kernel writes, escha.cu: every row is
// expert 0's): each lane loads its per-channel vectors before it waits for
// the kernel before it.
static __global__ void __launch_bounds__(ESCHA_THREADS) escha_xh_kernel(
        const escha_rows rows, const escha_xh_targets targets, const int64_t n_rows, const int IC, const bool early) {
    const escha_xh_target o = escha_xh_pick(targets, (int) blockIdx.z);
    const escha_vecs & v = o.v;
    half * xh = o.xh;
    const int lane = threadIdx.x % ESCHA_LANES;
    const int blk  = blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES;
    const int i0   = blk * 128 + lane * 4;
    const bool pre = early && blk * 128 < IC;
    float re[4] = {};
    if (pre) {
        escha_rin_eff(v, 0, i0, re);
    }
    escha_kernel_begin();
    escha_zero_mid(o.mid, o.n_mid4);
    if (blk * 128 >= IC) {
        return;
    }
    constexpr int RU = ESCHA_TRANSFORM_ROWS;
    const int64_t gy = gridDim.y;
    for (int64_t r0 = blockIdx.y; r0 < n_rows; r0 += gy * RU) {
        float xq[RU][4], rq[RU][4];
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t r = r0 + u * gy;
            if (r < n_rows) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    rq[u][q] = re[q];
                }
                escha_xh_load(rows, v, r, i0, pre, xq[u], rq[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t r = r0 + u * gy;
            if (r < n_rows) {
                half h[4];
                escha_xh_from(xq[u], rq[u], lane, h);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    xh[r * IC + i0 + q] = h[q];
                }
            }
        }
    }
}

// The row's RMS norm scale, 1/sqrt(mean(x^2) + eps), as every warp of
// escha_norm_xh_kernel computes it: lane l sums the squares of channels
// 4l + 128i .. 4l + 128i + 3 (i = 0, 1, ...) in four f32 partials, one a
// channel of the four (explicit FMAs), then p0 + p1 and p2 + p3, their sum,
// and the butterfly over the 32 lanes. Every warp of the row takes the
// same order, so every warp gets the same scale without a block barrier.
static __device__ __forceinline__ float escha_norm_scale(const float * x, const int IC, const float eps, const int lane) {
    float p[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int c = lane * 4; c < IC; c += 128) {
        const float4 v = *(const float4 *) (x + c); // rows 16-byte aligned (escha.cu checks)
        p[0] = fmaf(v.x, v.x, p[0]);
        p[1] = fmaf(v.y, v.y, p[1]);
        p[2] = fmaf(v.z, v.z, p[2]);
        p[3] = fmaf(v.w, v.w, p[3]);
    }
    float s = (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
    for (int m = ESCHA_LANES / 2; m > 0; m /= 2) {
        s += __shfl_xor_sync(0xFFFFFFFF, s, m, ESCHA_LANES);
    }
    return rsqrtf(s / (float) IC + eps);
}

// An RMS_NORM of x's rows and a MUL of the result by a per-channel weight
// w (as llama.cpp builds its norms: y = (x * scale) * w), folded into the
// input transforms of the escha ops that read y (escha.cu's graph fusion):
// one launch in place of the norm's and the transforms'. Block: 4 logical
// warps, one 128-block each; grid (ceil(IC/512), rows, ops). Every warp
// computes its row's scale itself (escha_norm_scale), then its 128-block of
// y, which grid z 0 stores to y_out (the MUL's output, for any other
// reader), and of op z's xh, as escha_xh_kernel computes it from y; op z's
// mid is zeroed. y_out must not overlap x: a warp stores its 128-block
// while other warps may still be reading the whole row. early: w and
// rin_eff (weights) are loaded before the wait.
static __global__ void __launch_bounds__(ESCHA_THREADS) escha_norm_xh_kernel(
        const escha_rows rows, const float * w, float * y_out, const float eps, const escha_xh_targets targets, const int64_t n_rows,
        const int IC, const bool early) {
    const escha_xh_target o = escha_xh_pick(targets, (int) blockIdx.z);
    const int lane = threadIdx.x % ESCHA_LANES;
    const int blk  = blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES;
    const int i0   = blk * 128 + lane * 4;
    const bool in  = blk * 128 < IC;
    float wq[4] = {}, re[4] = {};
    auto load_weights = [&]() {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            wq[q] = w[i0 + q];
        }
        escha_rin_eff(o.v, 0, i0, re);
    };
    if (early && in) {
        load_weights();
    }
    escha_kernel_begin();
    escha_zero_mid(o.mid, o.n_mid4);
    if (!in) {
        return;
    }
    if (!early) {
        load_weights();
    }
    for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
        const float * x = rows.x_row(r); // dense rows
        const float scale = escha_norm_scale(x, IC, eps, lane);
        const float4 v = *(const float4 *) (x + i0);
        const float xq[4] = { v.x, v.y, v.z, v.w };
        float y[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            y[q] = __fmul_rn(__fmul_rn(xq[q], scale), wq[q]);
        }
        if (blockIdx.z == 0) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                y_out[r * IC + i0 + q] = y[q];
            }
        }
        half h[4];
        escha_xh_from(y, re, lane, h);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            o.xh[r * IC + i0 + q] = h[q];
        }
    }
}

// rout_eff (rout times s_out where there is one) and the bias (0 without
// one) of expert e at outputs o0..o0+3.
static __device__ __forceinline__ void escha_rout_eff(const escha_vecs & v, const int64_t e, const int o0, float ro[4], float b[4]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        ro[q] = __half2float(v.rout[e * v.rout_es + o0 + q]);
        if (v.s_out) {
            ro[q] = __fmul_rn(ro[q], v.s_out[e * v.s_out_es + o0 + q]);
        }
        b[q] = v.bias ? v.bias[e * v.bias_es + o0 + q] : 0.0f;
    }
}

// The output transform of one row's 128-block, a warp's share: its
// outputs y = f16((H128(m) * RS) * rout_eff) (+ bias, rounded again), as
// f32, from their sums m (lane l's outputs 4l..4l+3, transformed in place)
// and rout_eff / bias; a bad expert's are NaN. rout == 0 gives an exact
// (signed) zero: a prune mask. The output transform kernel runs this
// directly for dense rows whose rout_eff and bias it loaded before its wait,
// and through escha_out_row otherwise; so does the fused kernel's epilogue.
static __device__ __forceinline__ void escha_out_values(const escha_vecs & v, float m[4], const float ro[4], const float b[4],
                                                        const bool bad, const int lane, float y[4]) {
    escha_h128_lane(m, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        half h = __float2half_rn(__fmul_rn(__fmul_rn(m[q], ESCHA_RS_F), ro[q]));
        if (v.bias) {
            h = __float2half_rn(__half2float(h) + b[q]);
        }
        y[q] = bad ? __uint_as_float(ESCHA_BAD_EXPERT_F32_BITS) : __half2float(h);
    }
}

// The outputs at o0 - 4 * lane (escha_out_values) of row r, its expert
// read from the ids (a bad id: NaN) and its rout_eff and bias loaded here.
static __device__ __forceinline__ void escha_out_row(const escha_rows & rows, const escha_vecs & v, float m[4], const int64_t r,
                                                     const int o0, const int lane, float y[4]) {
    bool bad;
    const int e = rows.expert(r, bad);
    float ro[4], b[4];
    escha_rout_eff(v, e, o0, ro, b);
    escha_out_values(v, m, ro, b, bad, lane, y);
}

// Row r's, from its rout_eff and bias, stored to dst[r] (the fused
// kernel's epilogue, which loads those once for its group's expert).
static __device__ __forceinline__ void escha_out_lane(const escha_vecs & v, float m[4], const float ro[4], const float b[4],
                                                      const int64_t r, const bool bad, const int o0, const int lane, const int OC,
                                                      float * dst) {
    float y[4];
    escha_out_values(v, m, ro, b, bad, lane, y);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        dst[r * OC + o0 + q] = y[q];
    }
}

// What the output transform kernel writes in place of the op's own
// outputs y (escha.cu's graph fusion, which then skips the nodes after the
// op): the sum y + add of a residual ADD (add: the other operand,
// contiguous like dst); silu(y) * y1 of a SWIGLU whose second operand is a
// second op y1 of the same input and shape (its mid and vectors); or
// silu(y) * add of a SILU of the op and a MUL (a gated norm's gate). Each
// is written exactly as ggml-cuda's own kernels for those nodes compute it.
enum escha_epilogue_kind { ESCHA_EPI_NONE = 0, ESCHA_EPI_ADD = 1, ESCHA_EPI_SWIGLU = 2, ESCHA_EPI_SILU_MUL = 3 };
struct escha_epilogue {
    int           kind;
    const float * add;
    const float * mid1;
    escha_vecs    v1;
};

// silu(x) as ggml-cuda computes it (ggml_cuda_op_silu_single), for its
// SILU kernel and, times the up value, its gated SWIGLU kernel.
static __device__ __forceinline__ float escha_silu(const float x) {
    return x / (1.0f + expf(-x));
}

// The output transform of every row; block: 4 logical warps, one 128-block
// each; grid (ceil(OC/512), rows). early: as the input transform kernel's.
// ep: what it writes to dst (escha_epilogue; its kind is the same for the
// whole grid).
// next (next.xh set: escha.cu's graph fusion, dense rows): the input
// transform of the next op, whose x is exactly what this kernel writes to
// dst (IC = OC, the same rows): its xh from each row's values as they are
// stored, and its mid zeroed; that op then skips its own.
static __global__ void __launch_bounds__(ESCHA_THREADS) escha_out_kernel(
        const escha_rows rows, const escha_vecs v, const float * mid, float * dst,
        const int64_t n_rows, const int OC, const bool early, const escha_epilogue ep, const escha_xh_target next) {
    const int lane = threadIdx.x % ESCHA_LANES;
    const int blk  = blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES;
    const int o0   = blk * 128 + lane * 4;
    const bool pre  = early && blk * 128 < OC;
    const bool pair = ep.kind == ESCHA_EPI_SWIGLU;
    float ro[4] = {}, b[4] = {}, ro1[4] = {}, b1[4] = {}, rn[4] = {};
    if (pre) {
        escha_rout_eff(v, 0, o0, ro, b);
        if (pair) {
            escha_rout_eff(ep.v1, 0, o0, ro1, b1);
        }
        if (next.xh) {
            escha_rin_eff(next.v, 0, o0, rn);
        }
    }
    escha_kernel_begin();
    escha_zero_mid(next.mid, next.n_mid4);
    if (blk * 128 >= OC) {
        return;
    }
    constexpr int RU = ESCHA_TRANSFORM_ROWS;
    const int64_t gy = gridDim.y;
    for (int64_t r0 = blockIdx.y; r0 < n_rows; r0 += gy * RU) {
        float m[RU][4], m1[RU][4];
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t r = r0 + u * gy;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                m[u][q]  = r < n_rows ? mid[r * OC + o0 + q] : 0.0f;
                m1[u][q] = pair && r < n_rows ? ep.mid1[r * OC + o0 + q] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t r = r0 + u * gy;
            if (r < n_rows) {
                float y[4];
                if (pre) {
                    escha_out_values(v, m[u], ro, b, false, lane, y);
                } else {
                    escha_out_row(rows, v, m[u], r, o0, lane, y);
                }
                if (pair) {
                    float y1[4];
                    if (pre) {
                        escha_out_values(ep.v1, m1[u], ro1, b1, false, lane, y1);
                    } else {
                        escha_out_row(rows, ep.v1, m1[u], r, o0, lane, y1);
                    }
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        y[q] = escha_silu(y[q]) * y1[q];
                    }
                } else if (ep.kind == ESCHA_EPI_ADD) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        y[q] = y[q] + ep.add[r * OC + o0 + q];
                    }
                } else if (ep.kind == ESCHA_EPI_SILU_MUL) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        y[q] = escha_silu(y[q]) * ep.add[r * OC + o0 + q];
                    }
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    dst[r * OC + o0 + q] = y[q];
                }
                if (next.xh) {
                    if (!pre) {
                        escha_rin_eff(next.v, 0, o0, rn);
                    }
                    half h[4];
                    escha_xh_from(y, rn, lane, h);
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        next.xh[r * OC + o0 + q] = h[q];
                    }
                }
            }
        }
    }
}

// ---- tile decode -----------------------------------------------------------

// Where lane L's 8 states lie in a tile of 8K words: starting bit p0 of
// value 8L's state ((8L+1)K - 16 mod 256K), as the index of its word and
// the bit offset in it, and the word offset of the next word (the tile is
// a ring). Tile-independent: computed once per lane.
template <int K>
struct escha_lane_bits {
    int w0, d1, off;
    __device__ __forceinline__ explicit escha_lane_bits(const int lane) {
        constexpr int NB = 256 * K;
        constexpr int W  = 8 * K;
        const int p0 = ((8 * lane + 1) * K - 16 + NB) % NB;
        w0  = p0 / 32;
        off = p0 % 32;
        d1  = (w0 + 1) % W;
    }
    // Each through a shuffle of its own lane (the token-generation GEMV,
    // once a kernel): ptxas then keeps them in registers. Without, it may
    // recompute them from the lane inside the decode loop (the fused
    // kernel's K=3 row took 24 more instructions after an unrelated
    // prologue change; an empty asm does not stop it, it leaves nothing in
    // the PTX; without the shuffle the 35B's fused slots ran 3-3.6% slower
    // on an H100). The warp's lanes are converged.
    __device__ __forceinline__ void pin(const int lane) {
#if defined(__CUDA_ARCH__) && !defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
        w0  = __shfl_sync(0xFFFFFFFF, w0, lane, 32);
        d1  = __shfl_sync(0xFFFFFFFF, d1, lane, 32);
        off = __shfl_sync(0xFFFFFFFF, off, lane, 32);
#else
        GGML_UNUSED(lane);
#endif
    }
};

// The words of one tile that hold lane L's 7K+16 state bits: two for both
// K. The bits start at offset off of the first word and end at off + 7K +
// 16, at most 64: p0 is 16L - 14 mod 32 for K=2 (off 2 or 18, 30 bits)
// and 24L - 13 mod 32 for K=3 (off 3, 11, 19 or 27, 37 bits).
template <int K>
struct escha_lane_words {
    uint32_t t[2];
    __device__ __forceinline__ void load(const uint32_t * __restrict__ tile, const escha_lane_bits<K> & lb) {
        t[0] = __ldg(tile + lb.w0);
        t[1] = __ldg(tile + lb.d1);
    }
};

// Decode constants as kernel parameters (escha_consts_fill sets them), so
// that nvcc cannot fold them into instruction forms that load the integer
// ALU pipe, the one the decode saturates:
// - cutting a state out of the window is a left and a right shift; as a
//   multiply by m[i] = 1 << i (an IMAD reading the constant bank) the left
//   shift runs on the FMA pipe instead;
// - (p & mask) ^ xr is one LOP3 only if one operand is a register: with
//   two immediates nvcc emits two.
struct escha_consts {
    uint32_t m[32];
    uint32_t mask, xr;
};

static void escha_consts_fill(escha_consts & c) {
    for (int i = 0; i < 32; i++) {
        c.m[i] = 1u << i;
    }
    c.mask = ESCHA_CBA_MASK;
    c.xr   = ESCHA_CBA_XOR;
}

// Decodes lane L's 8 values of one tile into 4 half2 words, in mma B
// fragment order: b[0] = values 8L+{0,1}, b[1] = {2,3}, b[2] = {4,5},
// b[3] = {6,7}. The lane's state bits are aligned once into a 32-bit
// window (one funnel shift by the lane's offset), so that every state is
// then cut out at a compile-time position: (window << jK) >> 16; K=2 takes
// four windows 2 bits apart, each state then one shift or one byte permute
// (on the H200 29.3 us against 29.7 for 5120 -> 17408, hip/bench), K=3's
// last two states come from the window and the 5 bits after it. Codebook:
// r = (s * 0xCBAC1FED & 0x8FFF8FFF) ^ 0x3B603B60,
// value = f16(lo16(r)) + f16(hi16(r)) rounded once to f16: one HADD2 of
// r's two halves (operand swizzles), and the two values of a half2 then
// joined by one byte permute.
// REG_LOP: mask and xr from the parameters (one LOP3, and a register);
// the prefill kernel, short of registers and not bound by the decode,
// keeps them immediates.
template <int K, bool REG_LOP = true>
static __device__ __forceinline__ void escha_decode_lane(const escha_lane_words<K> & lw, const int off, const escha_consts & c,
                                                         uint32_t b[4]) {
#ifdef GGML_USE_HIP
    // AMD: 32-bit multiplies are slow and a 3-input logic op takes any
    // constants, so plain shifts and immediates.
    GGML_UNUSED(c);
    auto cut_l = [](const uint32_t w, const int sh) -> uint32_t { return w << sh; };
    constexpr uint32_t mask = ESCHA_CBA_MASK, xr = ESCHA_CBA_XOR;
#else
    auto cut_l = [&c](const uint32_t w, const int sh) -> uint32_t { return w * c.m[sh]; };
    const uint32_t mask = REG_LOP ? c.mask : ESCHA_CBA_MASK;
    const uint32_t xr   = REG_LOP ? c.xr   : ESCHA_CBA_XOR;
#endif
    auto cut = [&cut_l](const uint32_t w, const int sh) -> uint32_t { return cut_l(w, sh) >> 16; };
    const uint32_t hi = __funnelshift_l(lw.t[1], lw.t[0], off); // window bits [0, 32)
    // K=2: also the windows 2, 4 and 6 bits on, so that every state sits at
    // window bit 0 or 8 and is cut out in one operation: a shift by 16 or a
    // byte permute. They are the first window times 4, 16, 64 (an IMAD on
    // the FMA pipe, not a funnel shift on the integer pipe the decode fills:
    // 29.80 -> 28.45 us for 5120 -> 17408 on the H200); their low 6 bits are
    // then zeros, not the lane's next bits, and no state reads them. K=3:
    // window bits [32, 37), the rest of what the lane's states need.
    uint32_t wn[4] = { hi, 0, 0, 0 };
    uint32_t lo = 0;
    if constexpr (K == 2) {
        wn[1] = cut_l(hi, 2);
        wn[2] = cut_l(hi, 4);
        wn[3] = cut_l(hi, 6);
    } else {
        lo = lw.t[1] << off;
    }
    uint32_t r[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int sh = j * K; // value j's state: window bits [sh, sh + 16)
        uint32_t s;
        if constexpr (K == 2) {
            s = j < 4 ? wn[j] >> 16 : __byte_perm(wn[j - 4], 0, 0x4421); // bits [0, 16) or [8, 24) of window 2(j - 4)
        } else {
            s = sh == 0 ? hi >> 16 : sh + 16 <= 32 ? cut(hi, sh) : __funnelshift_l(lo, hi, sh) >> 16;
        }
        r[j] = ((s * ESCHA_CBA_MUL) & mask) ^ xr;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        half2 ha, hb;
        memcpy(&ha, &r[2 * q], 4);
        memcpy(&hb, &r[2 * q + 1], 4);
        const half2 ta = __hadd2(__low2half2(ha), __high2half2(ha)); // both halves: value 2q
        const half2 tb = __hadd2(__low2half2(hb), __high2half2(hb)); // both halves: value 2q + 1
        uint32_t ua, ub;
        memcpy(&ua, &ta, 4);
        memcpy(&ub, &tb, 4);
        b[q] = __byte_perm(ua, ub, 0x7610);
    }
}

template <int K, bool REG_LOP = true>
static __device__ __forceinline__ void escha_decode_lane(const uint32_t * __restrict__ tile, const escha_lane_bits<K> & lb,
                                                         const escha_consts & c, uint32_t b[4]) {
    escha_lane_words<K> lw;
    lw.load(tile, lb);
    escha_decode_lane<K, REG_LOP>(lw, lb.off, c, b);
}

// ---- decode once (the BLAS path) ----------------------------------------------

// Orders a warp's shared-memory writes before its lanes read each other's.
// On AMD a wavefront runs in lock step: only the compiler's order matters,
// held by fences around a wave barrier.
static __device__ __forceinline__ void escha_syncwarp() {
#if defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
    __syncwarp();
#endif
}

// The decode-once kernel's unit of work: 8 consecutive tiles along IC of one
// 16-channel output group (a 16 x 128 piece of w), staged in a warp's own
// shared rows (+4 words a row against bank conflicts).
static constexpr int ESCHA_DECODE_KT   = 8;
static constexpr int ESCHA_DECODE_SROW = ESCHA_DECODE_KT * 8 + 4;

// Units of a KT x NT-tile weight: the kernel's loop and its grid.
static __host__ __device__ __forceinline__ int64_t escha_decode_units(const int KT, const int NT) {
    return (int64_t) ((KT + ESCHA_DECODE_KT - 1) / ESCHA_DECODE_KT) * NT;
}

// Decodes a whole weight (one expert's code) into f16, w[oc][ic]: each
// output channel's IC weights contiguous, the A operand of a TN GEMM
// (cuBLAS / hipBLAS OP_T, lda = IC) whose product with xh is mid. Every
// value is the contract's weight bit for bit (the same lane decode as the
// multiply kernels). A warp takes a unit (consecutive warps the units of
// consecutive output groups, so they read adjacent code), decodes its tiles
// into shared rows (lane L's 4 half2 words: rows L/4 and L/4 + 8, k pairs
// kq and kq + 8), then writes each of the 16 rows' 256 bytes with 16-byte
// stores: whole lines, where storing each lane's words straight from the
// fragment layout wrote 4-byte pieces of 32-byte sectors and ran at a third
// of the card's write bandwidth. Grid: any number of blocks (a warp loops
// over the units it owns); escha_decode_blocks gives one unit a warp.
template <int K>
static __global__ void __launch_bounds__(ESCHA_THREADS) escha_decode_kernel(
        const uint32_t * __restrict__ code, half * w, const int KT, const int NT, const escha_consts dc) {
    escha_kernel_begin(); // w: pool scratch an earlier kernel may have used
    constexpr int W = 8 * K, SROW = ESCHA_DECODE_SROW;
    __shared__ __align__(16) uint32_t stage[ESCHA_WARPS][16 * SROW]; // read back as uint4
    const int lane = threadIdx.x % ESCHA_LANES, wi = threadIdx.x / ESCHA_LANES;
    uint32_t * s = stage[wi];
    const escha_lane_bits<K> lb(lane);
    const int64_t IC = (int64_t) KT * 16;
    const int n = lane / 4, q = lane % 4;
    const int64_t units = escha_decode_units(KT, NT);
    const int64_t warps = (int64_t) gridDim.x * ESCHA_WARPS;
    for (int64_t g = (int64_t) blockIdx.x * ESCHA_WARPS + wi; g < units; g += warps) {
        const int64_t nt = g % NT, k0 = (g / NT) * ESCHA_DECODE_KT;
        const int nk = (int) min((int64_t) ESCHA_DECODE_KT, (int64_t) KT - k0);
        // Every tile's words are loaded before the first decode: one memory
        // round trip a unit, not one a tile. (IC is a multiple of 128, so a
        // unit has its 8 tiles; one short of them would decode its last tile
        // again into staging rows that are never stored.)
        escha_lane_words<K> lw[ESCHA_DECODE_KT];
#pragma unroll
        for (int t = 0; t < ESCHA_DECODE_KT; t++) {
            lw[t].load(code + ((k0 + min(t, nk - 1)) * NT + nt) * W, lb);
        }
#pragma unroll
        for (int t = 0; t < ESCHA_DECODE_KT; t++) {
            uint32_t b[4];
            escha_decode_lane<K>(lw[t], lb.off, dc, b);
            s[n * SROW + t * 8 + q]           = b[0]; // k kq, kq+1 of output n
            s[n * SROW + t * 8 + 4 + q]       = b[1]; // k kq+8, kq+9
            s[(n + 8) * SROW + t * 8 + q]     = b[2]; // the same of output n + 8
            s[(n + 8) * SROW + t * 8 + 4 + q] = b[3];
        }
        escha_syncwarp();
        // 16-byte chunks: 2 a tile, 16 rows; the row and chunk of c by
        // compile-time shifts (a unit short of 8 tiles skips its missing ones)
        constexpr int CH = ESCHA_DECODE_KT * 2;
        static_assert(16 * CH % ESCHA_LANES == 0, "whole rounds of chunks");
#pragma unroll
        for (int i = 0; i < 16 * CH / ESCHA_LANES; i++) {
            const int c = i * ESCHA_LANES + lane;
            const int r = c / CH, ch = c % CH;
            if (ch < nk * 2) {
                const uint4 v = *(const uint4 *) (s + r * SROW + ch * 4);
                *(uint4 *) (w + (nt * 16 + r) * IC + k0 * 16 + ch * 8) = v;
            }
        }
        escha_syncwarp(); // the rows are read before the next unit overwrites them
    }
}

// The decode-once kernel of a K (both share one signature) and the grid
// every caller launches it on: one unit a warp (more per warp measured
// slower on the H200).
using escha_decode_fn = void (*)(const uint32_t *, half *, int, int, escha_consts);
static inline escha_decode_fn escha_decode_kernel_for(const int K) {
    return K == 2 ? escha_decode_kernel<2> : escha_decode_kernel<3>;
}
static inline int64_t escha_decode_blocks(const int KT, const int NT) {
    return (escha_decode_units(KT, NT) + ESCHA_WARPS - 1) / ESCHA_WARPS;
}

// ---- the decode-and-multiply kernel -----------------------------------------

struct escha_mm_args {
    const uint32_t * code;     // the code tensor as 32-bit words
    int64_t          code_es;  // words per expert
    const half     * xh;       // [n_rows][IC]
    float          * mid;      // [n_rows][OC], zeroed, summed atomically
    int              KT, NT, IC, OC;
    int64_t          n_rows;
    int              kt_chunk; // tile rows per split (gridDim.y splits)
    escha_divisor    n_x;      // blocks along the output tiles
    int              mode;     // 0 dense, 1 one slot per group, 2 grouped by expert
    const int32_t  * sorted;   // mode 2: slots sorted by expert
    const int32_t  * bounds;   // mode 2: [E + 1]
    int              mblocks;  // mode 2: row blocks per expert
    escha_consts     dc;       // decode constants, set by escha_launch
    // The op's rows: mode 1 takes each slot's expert from them (its ids and
    // n_expert), and the fused token-generation kernel (escha_gemv_kernel's
    // FUSED) reads x itself and writes dst: mid and arrive start at 0 and it
    // leaves them so.
    escha_rows       rows;
    escha_vecs       v;
    float          * dst;
    unsigned       * arrive;   // per group and 128 outputs: the warps done with them
    bool             code_early; // GEMV, dense only: first code loads before the wait (escha_gemv_kernel)
    // Two dense ops of one shape that share their input (a gate and up pair,
    // escha.cu's graph fusion) in one launch: blocks from pair_x on along x
    // work on the second, whose code, xh and mid these are; 0: one op.
    int64_t          pair_x;
    const uint32_t * pair_code;
    const half     * pair_xh;
    float          * pair_mid;
};

#if defined(ESCHA_HAVE_MMA) && defined(ESCHA_CUDA_SHIM)
static __device__ __forceinline__ void escha_mma(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
    escha_shim_mma_m16n8k16(c, a, b0, b1); // the warp-collective mma, emulated (hip/shim)
}
#elif defined(ESCHA_HAVE_MMA)
static __device__ __forceinline__ void escha_mma(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// The rows one block works on: group z is a row block of a dense op, one
// MoE slot (mode 1) or a row block of one expert's slots (mode 2).
struct escha_group {
    int64_t         e = 0, first = 0, count = 0;
    const int32_t * list = nullptr;
    int64_t         n_out = 0; // rows whose outputs the group owns (a slot with a bad id: 1, count 0)
    bool            bad = false; // mode 1: the slot's id is out of range (e is then 0)

    escha_group() = default;
    __device__ __forceinline__ escha_group(const escha_mm_args & a, const int z, const int rows) {
        if (a.mode == 0) {
            first = (int64_t) z * rows;
            count = min((int64_t) rows, a.n_rows - first);
            n_out = count;
        } else if (a.mode == 1) {
            first = z;
            e     = a.rows.expert(z, bad); // 0 for a bad id
            count = bad ? 0 : 1;           // a bad id: no multiply
            n_out = 1;
        } else {
            e = z / a.mblocks;
            const int32_t lo = a.bounds[e] + (z % a.mblocks) * rows;
            count = min(rows, a.bounds[e + 1] - lo);
            first = lo;
            list  = a.sorted;
            n_out = count;
        }
    }
    // Op row of the group's i-th row; -1 past its end (padding rows).
    __device__ __forceinline__ int64_t row(const int i) const {
        return i < count ? (list ? (int64_t) list[first + i] : first + i) : -1;
    }
    // Op row of the group's i-th output row (i < n_out).
    __device__ __forceinline__ int64_t out_row(const int i) const {
        return count == 0 ? first : row(i);
    }
};

// What one warp of a multiply block works on: NTW tile columns from nt0,
// the tile rows [kt_begin, kt_end) of its IC split, the rows of group g
// (block x = output block + n_x * group). init() is false for a warp past
// the output edge or with an empty split; g.count may still be 0 (a slot
// with a bad id, whose outputs the fused kernel still writes).
// edge_last: a warp past the output edge still sets up its group and split
// before it gets false. Same result; when it was added, nvcc 13 then gave
// the token-generation kernel (4 tiles a warp) 56 registers instead of
// 62-63 and a loop of 48.5 instructions a tile instead of 49.75 (K=2; K=3
// 52.75 instead of 54.5), 9 blocks an SM instead of 8 (docs/PERFORMANCE.md). The prefill kernel keeps
// the early return (with edge_last its register count moved too, and its
// 512-row times went both ways), and so does the fused kernel (not timed
// with edge_last).
// code: the group's expert at tile (0, nt0); kq: the lane's k pair (and
// +8) in a tile.
struct escha_warp_work {
    int              lane, nt0, kt_begin, kt_end, kq;
    int64_t          bx;        // the block's index along x within its op (a pair's second op: less pair_x)
    escha_group      g;
    const uint32_t * code;
    const half     * xh;        // the op's xh and mid (a pair's second op: its own)
    float          * mid;
    int64_t          kt_stride; // words from one tile row to the next

    __device__ __forceinline__ bool init(const escha_mm_args & a, const int ntw, const int rows, const int words_per_tile,
                                         const bool edge_last = false) {
        lane = threadIdx.x % ESCHA_LANES;
        bx   = blockIdx.x;
        const bool second = a.pair_x > 0 && bx >= a.pair_x;
        const uint32_t * op_code = second ? a.pair_code : a.code;
        xh   = second ? a.pair_xh : a.xh;
        mid  = second ? a.pair_mid : a.mid;
        bx  -= second ? a.pair_x : 0;
        const int64_t z = a.n_x.div((uint32_t) bx); // the grid is below 2^31 blocks (escha.cu)
        nt0  = ((int) (bx - z * a.n_x.d) * ESCHA_WARPS + threadIdx.x / ESCHA_LANES) * ntw;
        if (!edge_last && nt0 >= a.NT) {
            return false;
        }
        kt_begin = blockIdx.y * a.kt_chunk;
        kt_end   = min(a.KT, kt_begin + a.kt_chunk);
        if (kt_begin >= kt_end) {
            return false;
        }
        g         = escha_group(a, (int) z, rows);
        code      = op_code + g.e * a.code_es + (int64_t) nt0 * words_per_tile;
        kt_stride = (int64_t) a.NT * words_per_tile;
        kq        = (lane % 4) * 2;
        return nt0 < a.NT;
    }
};

// Block: 4 logical warps; warp w of block x takes NTW consecutive tile
// columns, a range of kt_chunk tile rows (blockIdx.y), and up to MT*16 rows
// of its group. On the mma path the decoded tile is the B operand (k x n =
// input x output), so every decoded tile serves MT*16 rows: the prefill
// kernel. Without mma (HIP, pre-Ampere) MT is 1 and it serves all batches.
template <int K, int NTW, int MT, bool MMA>
static __global__ void __launch_bounds__(ESCHA_THREADS, MT > 1 ? 3 : 1) escha_mm_kernel(const escha_mm_args a) {
    constexpr int W    = 8 * K;   // 32-bit words per tile
    constexpr int ROWS = MT * 16;
    escha_kernel_begin(); // before init, which reads the ids or the expert grouping
    escha_warp_work work;
    if (!work.init(a, NTW, ROWS, W) || work.g.count == 0) {
        return;
    }
    const int lane = work.lane, nt0 = work.nt0, kt_begin = work.kt_begin, kt_end = work.kt_end, kq = work.kq;
    const escha_group & g = work.g;
    const uint32_t * code = work.code;
    const int64_t kt_stride = work.kt_stride;
    const escha_lane_bits<K> lb(lane);

#ifdef ESCHA_HAVE_MMA
    if constexpr (MMA) {
        float acc[MT][NTW][8];
        int64_t rlo[MT], rhi[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            rlo[mt] = g.row(mt * 16 + lane / 4);
            rhi[mt] = g.row(mt * 16 + lane / 4 + 8);
#pragma unroll
            for (int w = 0; w < NTW; w++) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[mt][w][i] = 0.0f;
                }
            }
        }
        for (int kt = kt_begin; kt < kt_end; kt++) {
            uint32_t A[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int64_t c0 = (int64_t) kt * 16 + kq;
                A[mt][0] = rlo[mt] >= 0 ? *(const uint32_t *) (work.xh + rlo[mt] * a.IC + c0)     : 0u;
                A[mt][2] = rlo[mt] >= 0 ? *(const uint32_t *) (work.xh + rlo[mt] * a.IC + c0 + 8) : 0u;
                A[mt][1] = rhi[mt] >= 0 ? *(const uint32_t *) (work.xh + rhi[mt] * a.IC + c0)     : 0u;
                A[mt][3] = rhi[mt] >= 0 ? *(const uint32_t *) (work.xh + rhi[mt] * a.IC + c0 + 8) : 0u;
            }
            const uint32_t * tiles = code + kt * kt_stride;
#pragma unroll
            for (int w = 0; w < NTW; w++) {
                uint32_t b[4];
                escha_decode_lane<K, false>(tiles + w * W, lb, a.dc, b);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    escha_mma(acc[mt][w] + 0, A[mt], b[0], b[1]);
                    escha_mma(acc[mt][w] + 4, A[mt], b[2], b[3]);
                }
            }
        }
        // C fragment: c0,c1 at (row lane/4, cols kq, kq+1), c2,c3 at row + 8.
        // Without an IC split each output has one writer: plain stores.
        const bool split = gridDim.y > 1;
        auto put = [&](float * p, const float val) {
            if (split) {
                atomicAdd(p, val);
            } else {
                *p = val;
            }
        };
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int w = 0; w < NTW; w++) {
#pragma unroll
                for (int nb = 0; nb < 2; nb++) {
                    const int col = (nt0 + w) * 16 + nb * 8 + kq;
                    if (rlo[mt] >= 0) {
                        put(work.mid + rlo[mt] * a.OC + col,     acc[mt][w][nb * 4 + 0]);
                        put(work.mid + rlo[mt] * a.OC + col + 1, acc[mt][w][nb * 4 + 1]);
                    }
                    if (rhi[mt] >= 0) {
                        put(work.mid + rhi[mt] * a.OC + col,     acc[mt][w][nb * 4 + 2]);
                        put(work.mid + rhi[mt] * a.OC + col + 1, acc[mt][w][nb * 4 + 3]);
                    }
                }
            }
        }
        return;
    }
#endif // ESCHA_HAVE_MMA

    // SIMT: each lane sums its 4 k values per tile column into per-row
    // partials; the 4 lanes sharing a column reduce once at the end.
    static_assert(MMA || MT == 1, "the SIMT path takes 16 rows per block");
    float acc[16][NTW][2];
    int64_t rows16[16];
#pragma unroll
    for (int m = 0; m < 16; m++) {
        rows16[m] = g.row(m);
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            acc[m][w][0] = 0.0f;
            acc[m][w][1] = 0.0f;
        }
    }
    for (int kt = kt_begin; kt < kt_end; kt++) {
        const uint32_t * tiles = code + kt * kt_stride;
        float wv[NTW][8];
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            uint32_t b[4];
            escha_decode_lane<K>(tiles + w * W, lb, a.dc, b);
#pragma unroll
            for (int p = 0; p < 4; p++) {
                half2 h;
                memcpy(&h, &b[p], 4);
                const float2 f = __half22float2(h);
                wv[w][2 * p]     = f.x;
                wv[w][2 * p + 1] = f.y;
            }
        }
#pragma unroll
        for (int m = 0; m < 16; m++) {
            if (rows16[m] < 0) {
                break;
            }
            const half * xr = work.xh + rows16[m] * a.IC + (int64_t) kt * 16 + kq;
            half2 h01, h89;
            memcpy(&h01, xr, 4);
            memcpy(&h89, xr + 8, 4);
            const float2 x01 = __half22float2(h01);
            const float2 x89 = __half22float2(h89);
#pragma unroll
            for (int w = 0; w < NTW; w++) {
                // wv[w][0..3]: rows kq, kq+1, kq+8, kq+9 of column lane/4; [4..7]: column lane/4 + 8
                acc[m][w][0] += x01.x * wv[w][0] + x01.y * wv[w][1] + x89.x * wv[w][2] + x89.y * wv[w][3];
                acc[m][w][1] += x01.x * wv[w][4] + x01.y * wv[w][5] + x89.x * wv[w][6] + x89.y * wv[w][7];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 16; m++) {
        if (rows16[m] < 0) {
            break;
        }
#pragma unroll
        for (int w = 0; w < NTW; w++) {
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float s = acc[m][w][c];
                s += __shfl_xor_sync(0xFFFFFFFF, s, 1, ESCHA_LANES);
                s += __shfl_xor_sync(0xFFFFFFFF, s, 2, ESCHA_LANES);
                if (lane % 4 == 0) {
                    atomicAdd(work.mid + rows16[m] * a.OC + (nt0 + w) * 16 + c * 8 + lane / 4, s);
                }
            }
        }
    }
}

#ifdef ESCHA_HAVE_MMA
#define ESCHA_GEMV_MMA 1

// A warp's arrival at a count shared by the warps whose sums (relaxed
// atomics into mid, every lane's) one of them finishes: true for the warp
// that arrives last, whose lanes may then read all of those sums. On
// NVIDIA lane 0 counts with an acquire-release atomic: the warp barrier
// before it orders the other lanes' sums before its release, and the one
// after it carries its acquire to them. That is the message passing of the
// PTX memory model without a fence in every lane: __threadfence is
// fence.sc.gpu (MEMBAR.SC.GPU), where a release or an acquire is enough.
// In the CPU shim (the fused kernel runs on the mma path only: not on HIP)
// the fences.
static __device__ __forceinline__ bool escha_arrive_last(unsigned * count, const unsigned expected, const int lane) {
    unsigned before = 0;
#if defined(__CUDA_ARCH__) && !defined(ESCHA_CUDA_SHIM)
    __syncwarp();
    if (lane == 0) {
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
    }
    before = __shfl_sync(0xFFFFFFFF, before, 0, ESCHA_LANES);
    __syncwarp();
    return before + 1 == expected;
#else
    __threadfence();
    escha_syncwarp();
    if (lane == 0) {
        before = atomicAdd(count, 1u);
    }
    before = __shfl_sync(0xFFFFFFFF, before, 0, ESCHA_LANES);
    if (before + 1 != expected) {
        return false;
    }
    __threadfence();
    return true;
#endif
}
#endif // ESCHA_HAVE_MMA

// Tile rows of code the fused kernel keeps in flight, each in its own
// slot of a per-warp ring in shared memory (K=3, 4 tiles a warp: 3 KB).
// A MoE decode slot's grid is under half a wave: with one row in flight
// (registers) every warp waits on HBM every row.
#ifndef ESCHA_FUSED_AHEAD
#define ESCHA_FUSED_AHEAD 8
#endif
static_assert(ESCHA_FUSED_AHEAD >= 2, "the ring's wait reads the row ahead");
// Which code widths the fused kernel's ring serves (bit K set: K=2 -> 4,
// K=3 -> 8); the others load one row ahead in registers. Both: with the
// experts' code from HBM, as in a model, the ring made the 35B's down
// slots 17% and gate_up 6% faster on the H200 (docs/PERFORMANCE.md).
#ifndef ESCHA_FUSED_RING_KS
#define ESCHA_FUSED_RING_KS 12
#endif

// Tile rows of code the token-generation GEMV (not the fused kernel, whose
// ring serves it) prefetches into L2 ahead of the row it decodes, 0 for
// none. Under Nsight Compute (one H100, 5120 -> 17408 K=2, code from HBM)
// 19% of the GEMV's warp samples wait on one instruction, the first use of
// a row's code: ptxas issues the next row's loads at the end of an
// iteration, as their registers are the decode's, so the row is not in
// flight while the one before decodes; a prefetch takes no register.
// Timed there: the batch-1 ops 1-2.7% faster at 2 (3 and 4 the same, 1
// slower than none; into L1 no faster), the 27B shape's tg128 1.3-1.8%.
#ifndef ESCHA_GEMV_L2_AHEAD
#define ESCHA_GEMV_L2_AHEAD 2
#endif

// 16 bytes from global to shared memory without a register stop: an
// asynchronous copy on sm_80 and later (waited for by escha_copy_wait),
// a plain copy elsewhere (the shim; the fused kernel runs on the mma path,
// never on HIP).
static __device__ __forceinline__ void escha_copy16(uint32_t * dst, const uint32_t * src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t) __cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
    memcpy(dst, src, 16);
#endif
}
// Brings the 32-byte sector at p into L2 (no register, nothing waits for
// it); a no-op where PTX is not the target.
static __device__ __forceinline__ void escha_prefetch_l2(const uint32_t * p) {
#if defined(__CUDA_ARCH__) && !defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    GGML_UNUSED(p);
#endif
}
// Closes the lane's group of escha_copy16 copies (an empty group too).
static __device__ __forceinline__ void escha_copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of the lane's groups are in flight, then lets the
// warp's lanes read what the others copied.
template <int N>
static __device__ __forceinline__ void escha_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GGML_USE_HIP) && !defined(ESCHA_CUDA_SHIM)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
    escha_syncwarp();
}

// The token-generation kernel (mma path, up to NB*8 rows per group): the
// decoded tile is the A operand (m x k = output x input), so one
// m16n8k16 covers a whole 16x16 tile and the inputs are the B operand with
// n = 8 rows. A lane's decoded words are then A's registers in the order
// {b0, b2, b1, b3} (rows lane/4 and +8 are its two output columns, k pairs
// kq and kq+8). Against the prefill kernel at batch 1 this halves the mma
// count and the accumulators, and it software-pipelines the loads: the next
// tile row's code words and inputs are in flight while this one decodes.
//
// FUSED (token generation, up to ESCHA_CUDA_FUSED_MAX_ROWS rows, one
// launch per op): each warp computes the xh of its own rows and IC split
// (whole 128-blocks, into its own shared rows) with the input transform's
// code, sums into mid, and counts itself done with its 128 outputs in
// arrive; the last of the warps that share them (2 per IC split, all
// splits) applies the output transform, and puts mid and the count back
// to 0 for the next op. The xh redundancy (one per warp) is small next to
// the decode at these row counts.
template <int K, int NTW, int NB, bool FUSED = false>
static __global__ void __launch_bounds__(ESCHA_THREADS) escha_gemv_kernel(const escha_mm_args a) {
#ifdef ESCHA_GEMV_MMA
    constexpr int W    = 8 * K;
    constexpr int ROWS = NB * 8;
    static_assert(!FUSED || (NB == 1 && (NTW == 2 || NTW == 4)), "the fused kernel: 8-row blocks, 128 outputs a group of 8 / NTW warps");
    // code_early: a dense op, whose init reads nothing, loads its first
    // tile row of code (which no kernel writes) while the kernel before it
    // (the input transform) still runs, and only then waits for it.
    const bool early = !FUSED && a.code_early;
    if (!early) {
        escha_kernel_begin(); // before init, which reads the ids
    }
    escha_warp_work work;
    if (!work.init(a, NTW, ROWS, W, !FUSED) || (!FUSED && work.g.count == 0)) {
        return;
    }
    escha_lane_bits<K> lb(work.lane);
    lb.pin(work.lane);
    const int lane = work.lane, nt0 = work.nt0, kt_begin = work.kt_begin, kt_end = work.kt_end, kq = work.kq;
    const escha_group & g = work.g;

    // The lane's code words at tile row kt: q[i] + w * W for tile column
    // nt0 + w (compile-time offsets from one pointer per word).
    constexpr int NW = 2;
    const uint32_t * q[NW];
    q[0] = work.code + kt_begin * work.kt_stride + lb.w0;
    q[1] = work.code + kt_begin * work.kt_stride + lb.d1;
    auto load_code = [&](escha_lane_words<K> (&cw)[NTW]) {
#pragma unroll
        for (int w = 0; w < NTW; w++) {
#pragma unroll
            for (int i = 0; i < NW; i++) {
                cw[w].t[i] = __ldg(q[i] + w * W);
            }
        }
    };
    escha_lane_words<K> cw[NTW];
    const bool any = g.count > 0; // false: a fused slot with a bad id, which only arrives
    // The fused kernel's ring: tile row kt in slot (kt - kt_begin) % D, one
    // copy group a row (empty past kt_end, so that the waits' depths are
    // constants). Its rows' NTW tiles are contiguous and 16-byte aligned
    // (W is 16 or 24 words). The slot index is taken unsigned: a signed
    // modulo by D cost 7-9 instructions a row.
    constexpr bool RING = FUSED && ((ESCHA_FUSED_RING_KS >> K) & 1);
    constexpr int D = ESCHA_FUSED_AHEAD, RW = NTW * W;
    uint32_t * ring = nullptr;
    auto ring_issue = [&](const int kt) {
        if (kt < kt_end) {
            uint32_t * dst = ring + ((unsigned) (kt - kt_begin) % D) * RW;
            const uint32_t * src = work.code + (int64_t) kt * work.kt_stride;
            for (int c = lane * 4; c < RW; c += ESCHA_LANES * 4) {
                escha_copy16(dst + c, src + c);
            }
        }
        escha_copy_commit();
    };
    auto ring_words = [&](const int kt, escha_lane_words<K> (&cw)[NTW]) {
        const uint32_t * row = ring + ((unsigned) (kt - kt_begin) % D) * RW;
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            cw[w].t[0] = row[w * W + lb.w0];
            cw[w].t[1] = row[w * W + lb.d1];
        }
    };
    // The first tile rows of code go out here: the fused kernel computes
    // its xh below (its loads and Hadamard) while they are in flight, and
    // an early dense op loads its first before the wait for its input
    // transform.
    if constexpr (RING) {
        __shared__ __align__(16) uint32_t ring_all[ESCHA_WARPS][D * RW];
        ring = ring_all[threadIdx.x / ESCHA_LANES];
        for (int i = 0; any && i < D; i++) {
            ring_issue(kt_begin + i);
        }
    } else if (any) {
        load_code(cw);
    }
    // The fused kernel's output transform: the 128 outputs this warp's 16 *
    // NTW are part of, and the lane's 4 at o0. Their rout_eff and bias are
    // loaded by the last warp, in the epilogue: issued in the prologue they
    // timed even for K=3 and 25% slower for K=2 on an H100 (nvcc gave the
    // K=2 kernel 72 registers for them; docs/PERFORMANCE.md).
    const int o128 = nt0 / 8, o0 = o128 * 128 + lane * 4;
    // B fragment: lane holds input row lane/4 of each 8-row block, k pairs
    // kq and kq + 8. A padding row reads row 0 instead: its products land in
    // output columns that are never stored, and no load is predicated. The
    // fused kernel stages its own xh here; the others point into xh after
    // the wait (below).
    const half * xr[NB];
    if constexpr (FUSED) {
        constexpr int CH = ESCHA_CUDA_FUSED_KT_MAX * 16;
        __shared__ __align__(16) half xs_all[ESCHA_WARPS][ESCHA_CUDA_FUSED_MAX_ROWS * CH];
        half * xs = xs_all[threadIdx.x / ESCHA_LANES];
        const int n_blk = (kt_end - kt_begin) / 8; // whole 128-blocks (kt_chunk is a multiple of 8)
        for (int i = 0; i < g.count; i++) {
            for (int b = 0; b < n_blk; b++) {
                half h[4];
                escha_xh_lane(a.rows, a.v, g.row(i), g.e, kt_begin * 16 + b * 128 + lane * 4, lane, h);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    xs[i * CH + b * 128 + lane * 4 + u] = h[u];
                }
            }
        }
        escha_syncwarp(); // each lane reads other lanes' xh
        const int slot = lane / 4;
        xr[0] = xs + (slot < g.count ? slot : 0) * CH + kq;
    }
    auto load_x = [&](uint32_t (&X)[NB][2]) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            X[nb][0] = *(const uint32_t *) (xr[nb]);
            X[nb][1] = *(const uint32_t *) (xr[nb] + 8);
        }
    };

    float acc[NTW][NB][4];
#pragma unroll
    for (int w = 0; w < NTW; w++) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[w][nb][i] = 0.0f;
            }
        }
    }
    // The row a loop iteration decodes, taken from the loads in flight
    // before they are refilled with the next row's.
    auto take_row = [&](const uint32_t (&X)[NB][2], const escha_lane_words<K> (&cw)[NTW], uint32_t (&Xc)[NB][2],
                        escha_lane_words<K> (&cc)[NTW]) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            Xc[nb][0] = X[nb][0];
            Xc[nb][1] = X[nb][1];
        }
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            cc[w] = cw[w];
        }
    };
    // One tile row's products: each tile's decoded A fragment times every
    // 8-row block's inputs.
    auto row_products = [&](const escha_lane_words<K> (&cc)[NTW], const uint32_t (&Xc)[NB][2]) {
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            uint32_t b[4];
            escha_decode_lane<K>(cc[w], lb.off, a.dc, b);
            const uint32_t A[4] = { b[0], b[2], b[1], b[3] };
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                escha_mma(acc[w][nb], A, Xc[nb][0], Xc[nb][1]);
            }
        }
    };
    uint32_t X[NB][2];
    if (early) {
        escha_kernel_begin(); // xh is complete from here
    }
    if constexpr (!FUSED) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            const int64_t r = g.row(nb * 8 + lane / 4);
            xr[nb] = work.xh + (r >= 0 ? r : g.row(0)) * a.IC + (int64_t) kt_begin * 16 + kq;
        }
    }
    if (any) {
        load_x(X);
    }
    if constexpr (RING) {
        if (any) {
            escha_copy_wait<D - 1>(); // the first row's group
            ring_words(kt_begin, cw);
        }
        for (int kt = kt_begin; any && kt < kt_end; kt++) {
            uint32_t Xc[NB][2];
            escha_lane_words<K> cc[NTW];
            take_row(X, cw, Xc, cc);
            // D + (kt - kt_begin) groups so far: rows up to kt + 1 landed
            // at D - 2 in flight. Row kt + D refills row kt's slot, whose
            // words every lane read before that wait's barrier.
            escha_copy_wait<D - 2>();
            ring_issue(kt + D);
            if (kt + 1 < kt_end) {
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    xr[nb] += 16;
                }
            }
            load_x(X);
            ring_words(kt + 1, cw); // past kt_end: a slot's stale words, never decoded
            row_products(cc, Xc);
        }
    }
    // Prefetch into L2 (ESCHA_GEMV_L2_AHEAD): lane l takes 32-byte sector l
    // of the warp's row, as an offset from its first code pointer (q[0] is
    // at word lb.w0 of row kt); rows past the split's end are never asked
    // for, so none lies past the weight.
    constexpr int PF_SECTORS = NTW * W / 8;
    const int64_t pf_off = (int64_t) ESCHA_GEMV_L2_AHEAD * work.kt_stride + (lane % PF_SECTORS) * 8 - lb.w0;
    const int kt_pf_end = kt_end - ESCHA_GEMV_L2_AHEAD;
    for (int kt = kt_begin; !RING && any && kt < kt_end; kt++) {
        uint32_t Xc[NB][2];
        escha_lane_words<K> cc[NTW];
        take_row(X, cw, Xc, cc);
        if (ESCHA_GEMV_L2_AHEAD > 0 && kt < kt_pf_end) {
            escha_prefetch_l2(q[0] + pf_off);
        }
        // Next tile row's loads (the last iteration reloads its own row:
        // in bounds, and no branch).
        if (kt + 1 < kt_end) {
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                xr[nb] += 16;
            }
#pragma unroll
            for (int i = 0; i < NW; i++) {
                q[i] += work.kt_stride;
            }
        }
        load_x(X);
        load_code(cw);
        row_products(cc, Xc);
    }
    // C fragment: c0,c1 at (output lane/4, rows kq, kq+1), c2,c3 at output + 8.
    const bool split = gridDim.y > 1;
    auto put = [&](const int64_t r, const int col, const float val) {
        if (r < 0) {
            return;
        }
        float * p = work.mid + r * a.OC + col;
        if (split) {
            atomicAdd(p, val);
        } else {
            *p = val;
        }
    };
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const int64_t r0 = g.row(nb * 8 + kq);
        const int64_t r1 = g.row(nb * 8 + kq + 1);
#pragma unroll
        for (int w = 0; w < NTW; w++) {
            const int col = (nt0 + w) * 16 + lane / 4;
            put(r0, col,     acc[w][nb][0]);
            put(r1, col,     acc[w][nb][1]);
            put(r0, col + 8, acc[w][nb][2]);
            put(r1, col + 8, acc[w][nb][3]);
        }
    }
    if constexpr (FUSED) {
        const int64_t z = a.n_x.div((uint32_t) work.bx);
        unsigned * count = a.arrive + z * (a.OC / 128) + o128;
        if (!escha_arrive_last(count, (8 / NTW) * gridDim.y, lane)) {
            return;
        }
        float ro[4], ob[4];
        escha_rout_eff(a.v, g.e, o0, ro, ob);
        // Every other warp's sums, read from L2 (__ldcg: not this SM's L1).
        for (int i = 0; i < g.n_out; i++) {
            const int64_t r = g.out_row(i);
            float m[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                m[q] = __ldcg(work.mid + r * a.OC + o0 + q);
                work.mid[r * a.OC + o0 + q] = 0.0f;
            }
            escha_out_lane(a.v, m, ro, ob, r, g.bad, o0, lane, a.OC, a.dst);
        }
        if (lane == 0) {
            *count = 0;
        }
    }
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif // ESCHA_GEMV_MMA
}
