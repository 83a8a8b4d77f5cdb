// cuda-executor.cpp: runs the escha CUDA kernels (hip/escha-kernels.cuh,
// compiled as C++ through cuda-shim.h) on the CPU, so the kernels that an
// NVIDIA or AMD GPU runs execute for real in `cargo test`.
//
// Blocks of a grid run one after another, and so do the wavefronts (warps)
// of a block; the threads of a wavefront run as fibers (tests/shim/fibers.h)
// and its lock-step operations (shuffles, mma) meet at a barrier of its
// lanes, so each lane sees exactly what the others contributed. Scratch
// buffers start as NaN, so a kernel that reads what no stage wrote gives
// NaN instead of a lucky value.
//
// The C entry points at the end run one escha op stage by stage as escha.cu
// launches it, on the grid of its plan (hip/escha-plan.h), with the kernel
// family and the IC split chosen by the caller (tests/cuda_shim.rs), so
// every family runs whatever the batch size.
//
// build/shims.rs compiles this file twice: as CUDA (escha_cuda_shim_*), and
// with GGML_USE_HIP (escha_hip_shim_*: the kernels' HIP branches, the SIMT
// kernel only, 32- or 64-lane wavefronts, tests/hip_shim.rs). Both link into
// one test binary, so everything but the entry points has internal linkage
// (the kernels' inline members differ between the two builds).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <cmath>
#include <functional>
#include <vector>

#include "fibers.h"
#include "escha-format.h"

namespace {

#include "cuda-shim.h"
#include "../escha-kernels.cuh"
#include "../escha-plan.h"

thread_local dim3 blockIdx, blockDim, gridDim; // per test thread
thread_local int escha_shim_wave = 32, escha_shim_wave_base = 0;
thread_local unsigned char escha_shim_slots[64 * escha_fibers::kSlotBytes];

void run_thread(void * ctx, int) {
    (*(const std::function<void()> *) ctx)();
}

// Runs kernel() for every thread of grid x block, a wavefront at a time (a
// fiber group: its barrier is the wavefront's, its 32-lane warps those of
// tests/shim/fibers.h).
void launch(dim3 grid, unsigned threads, const std::function<void()> & kernel) {
    gridDim  = grid;
    blockDim = dim3(threads);
    for (unsigned bz = 0; bz < grid.z; bz++) {
        for (unsigned by = 0; by < grid.y; by++) {
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blockIdx = dim3(bx, by, bz);
                for (unsigned base = 0; base < threads; base += (unsigned) escha_shim_wave) {
                    escha_shim_wave_base = (int) base;
                    char what[112];
                    snprintf(what, sizeof what, "wavefront %u of block (%u, %u, %u) of a %u x %u x %u grid", base / escha_shim_wave, bx,
                             by, bz, grid.x, grid.y, grid.z);
                    escha_fibers::run_group((int) std::min(threads - base, (unsigned) escha_shim_wave), run_thread, (void *) &kernel,
                                            what);
                }
            }
        }
    }
    escha_shim_wave_base = 0;
}

// One OS thread runs every fiber: a plain add is atomic here.
float atomicAdd(float * p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}

unsigned atomicAdd(unsigned * p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}

#ifndef GGML_USE_HIP
float f16_bits_to_f32(uint32_t bits) {
    half h;
    h.bits = (uint16_t) bits;
    return __half2float(h);
}

void escha_shim_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    static_assert(escha_fibers::kSlotBytes >= 6 * sizeof(uint32_t), "a lane's fragments fit its slot");
    const int lane = escha_fibers::lane();
    uint32_t (*frag)[escha_fibers::kSlotBytes / 4] = (uint32_t (*)[escha_fibers::kSlotBytes / 4]) escha_fibers::warp_slots();
    for (int i = 0; i < 4; i++) {
        frag[lane][i] = a[i];
    }
    frag[lane][4] = b0;
    frag[lane][5] = b1;
    escha_fibers::warp_sync();
    // A (16x16, row-major): lane L = 4g + t holds A[g][2t..2t+1] (reg 0),
    // A[g+8][2t..] (1), A[g][2t+8..] (2), A[g+8][2t+8..] (3), low half first.
    // B (16x8): B[2t..2t+1][g] (b0), B[2t+8..2t+9][g] (b1).
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h]         = f16_bits_to_f32(frag[l][0] >> (16 * h));
            A[g + 8][2 * t + h]     = f16_bits_to_f32(frag[l][1] >> (16 * h));
            A[g][2 * t + 8 + h]     = f16_bits_to_f32(frag[l][2] >> (16 * h));
            A[g + 8][2 * t + 8 + h] = f16_bits_to_f32(frag[l][3] >> (16 * h));
            B[2 * t + h][g]         = f16_bits_to_f32(frag[l][4] >> (16 * h));
            B[2 * t + 8 + h][g]     = f16_bits_to_f32(frag[l][5] >> (16 * h));
        }
    }
    escha_fibers::warp_sync(); // fragments read: the next mma may overwrite them
    // C (16x8): c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1].
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float s = c[i];
        for (int k = 0; k < 16; k++) {
            s += A[row][k] * B[k][col]; // products of two halves are exact in f32
        }
        c[i] = s;
    }
}
#endif

template <typename T>
std::vector<T> nan_filled(size_t n) {
    std::vector<T> v(n);
    std::memset(v.data(), 0xFF, n * sizeof(T)); // NaN in f32 and f16
    return v;
}

// Kernel family of a path: 0 token generation (escha_gemv_kernel), 1
// prefill (escha_mm_kernel, 64 rows, mma), 2 SIMT (escha_mm_kernel as HIP
// runs it), 3 the weight decoded once (escha_decode_kernel) and multiplied
// by BLAS (dense only), 4 the fused token-generation kernel (the GEMV's
// FUSED: one launch, up to ESCHA_CUDA_FUSED_MAX_ROWS rows a group, not
// grouped by expert).
const int k_family_of_path[7] = { ESCHA_CUDA_GEMV, ESCHA_CUDA_MMA, ESCHA_CUDA_SIMT, ESCHA_CUDA_BLAS,
                                   ESCHA_CUDA_GEMV, ESCHA_CUDA_GEMV, ESCHA_CUDA_GEMV };
constexpr int k_path_fused = 4;
// 5: the fused kernel at 2 output tiles a warp (GGML_ESCHA_FUSED_NTW=2).
constexpr int k_path_fused2 = 5;
// 6: the token-generation GEMV as a large dense op takes it
// (escha_cuda_gemv_wide: 8 output tiles a warp for one 8-row block).
constexpr int k_path_gemv_wide = 6;

// What the executor returns for a fused op that left its state (mid, the
// arrival counts) other than all zero: the next op would start wrong.
constexpr int k_fused_state_left = -2;

// The decode-once stage: w[oc][ic] from one weight's code, on a grid of
// `blocks` blocks (fewer than the tiles need: the warps loop).
void decode_weight(int k, int64_t ic, int64_t oc, const uint32_t * code, half * w, unsigned blocks) {
    escha_consts dc;
    escha_consts_fill(dc);
    const int KT = (int) (ic / 16), NT = (int) (oc / 16);
    launch(dim3(blocks), ESCHA_THREADS, [&] { escha_decode_kernel_for(k)(code, w, KT, NT, dc); });
}

// cublasGemmEx(OP_T, OP_N, OC, n, IC, 1, w, IC, xh, IC, 0, mid, OC) with
// f32 accumulation, as the BLAS path calls it: the f16 products are exact
// in f32, and the sum runs in k order (BLAS's order is unspecified; the
// tests allow for any).
void blas_gemm_tn(const half * w, const half * xh, float * mid, int64_t n_rows, int IC, int OC) {
    for (int64_t r = 0; r < n_rows; r++) {
        for (int c = 0; c < OC; c++) {
            float s = 0.0f;
            for (int i = 0; i < IC; i++) {
                s += __half2float(w[(int64_t) c * IC + i]) * __half2float(xh[r * IC + i]);
            }
            mid[r * OC + c] = s;
        }
    }
}

// HIP: escha.cu launches the SIMT kernel only (there is no mma; the other
// families would abort or run the SIMT body with rows it does not cover).
template <int K>
bool pick(const escha_cuda_plan & p, void (*&kernel)(escha_mm_args)) {
#ifdef GGML_USE_HIP
    if (p.family != ESCHA_CUDA_SIMT) {
        return false;
    }
#endif
    switch (p.family) {
        case ESCHA_CUDA_GEMV:
            kernel = p.fused     ? (p.ntw == 2 ? escha_gemv_kernel<K, 2, 1, true> : escha_gemv_kernel<K, 4, 1, true>)
                     : p.nb == 1 ? (p.ntw == 8 ? escha_gemv_kernel<K, 8, 1> : escha_gemv_kernel<K, 4, 1>)
                     : p.nb == 2 ? escha_gemv_kernel<K, 4, 2>
                                 : escha_gemv_kernel<K, 4, 4>;
            return true;
        case ESCHA_CUDA_MMA: kernel = escha_mm_kernel<K, 2, 4, true>; return true;
        case ESCHA_CUDA_SIMT: kernel = escha_mm_kernel<K, 2, 1, false>; return true;
        default: return false;
    }
}

// What escha.cu's graph fusion adds to a dense op (escha_fusion there): a
// second op of the same input and shape in the same launches (code1, v1:
// the up op of a SWIGLU pair) and what the output transform writes.
struct fusion_args {
    const uint32_t * code1 = nullptr;
    int              k1    = 0; // the second op's K
    escha_vecs       v1    = {};
    int              kind  = ESCHA_EPI_NONE;
    const float    * add   = nullptr;
    // Input transforms run ahead (escha.cu's escha_fusion share and next):
    // later ops of the same x whose xh and mid this op's input transform
    // writes (grid z), and the next op's, from what its output transform
    // writes; own_xh / own_mid: this op's own, written by an earlier op (it
    // runs no input transform).
    int              n_share = 0;
    escha_xh_target  share[ESCHA_XH_OPS - 1] = {};
    escha_xh_target  next    = {};
    half           * own_xh  = nullptr;
    float          * own_mid = nullptr;
};

// xh, multiply, out for n_rows op rows (mode set in a by the caller; groups
// as escha.cu forms them: row blocks, one per slot, or row blocks of each of
// n_expert experts), with fu's fusion (dense, not the fused kernel) as
// escha_forward runs it.
int run_op(int k, const escha_rows & rows, const escha_vecs & v, int64_t n_rows, escha_mm_args a, int path,
           int64_t rows_per_group, int64_t most, int64_t n_expert, int ksplit, float * y, const fusion_args & fu = {}) {
    const bool fused = path == k_path_fused || path == k_path_fused2;
    const bool pair  = fu.code1 != nullptr;
    const bool ahead = fu.n_share > 0 || fu.next.xh != nullptr || fu.own_xh != nullptr;
    if (path < 0 || path > 6 || ((path == 0 || path == k_path_gemv_wide) && rows_per_group > ESCHA_CUDA_GEMV_MAX_ROWS) ||
        (path == 3 && a.mode != 0) ||
        (fused && (rows_per_group > ESCHA_CUDA_FUSED_MAX_ROWS || a.mode == ESCHA_CUDA_GROUPED)) ||
        ((pair || fu.kind != ESCHA_EPI_NONE || ahead) && (fused || a.mode != 0 || pair != (fu.kind == ESCHA_EPI_SWIGLU))) ||
        (fu.own_xh && (pair || fu.n_share > 0)) || (pair ? 2 : 1) + fu.n_share > ESCHA_XH_OPS) {
        return -1;
    }
    escha_cuda_plan plan = escha_cuda_plan_for(k_family_of_path[path], a.mode, n_rows, rows_per_group, most, n_expert, a.NT, ESCHA_WARPS,
                                               path == k_path_gemv_wide);
    if (fused) {
        plan = escha_cuda_fuse(plan, a.NT, ESCHA_WARPS, path == k_path_fused2 ? 2 : ESCHA_CUDA_FUSED_NTW);
    }
    void (*kernel)(escha_mm_args) = nullptr;
    const bool blas = plan.family == ESCHA_CUDA_BLAS;
    if (!blas && !(k == 2 ? pick<2>(plan, kernel) : pick<3>(plan, kernel))) {
        return -1;
    }
    const int IC = a.IC, OC = a.OC;
    const unsigned gy = escha_transform_grid_y(n_rows); // as escha.cu (the transforms alone, below, run grouped)
    // As escha.cu: a dense op's transforms load their vectors before the wait.
    const bool dense = rows.ids == nullptr;
    // The fused kernel's mid and arrival counts: the state escha.cu keeps
    // between ops, zeroed as it is when allocated; the kernel must leave it
    // so. The other paths' scratch starts NaN.
    // A pair's second op has its xh and mid after the first's.
    const int64_t ops = pair ? 2 : 1;
    auto xh  = nan_filled<half>(fused ? 0 : (size_t) (ops * n_rows * IC));
    auto mid = fused ? std::vector<float>((size_t) n_rows * OC, 0.0f) : nan_filled<float>((size_t) (ops * n_rows * OC));
    half  * xh1  = xh.data() + (ops - 1) * n_rows * IC;
    float * mid1 = mid.data() + (ops - 1) * n_rows * OC;
    const escha_vecs v1 = pair ? fu.v1 : v;
    std::vector<unsigned> arrive(fused ? (size_t) plan.n_z * (OC / 128) : 0, 0u);
    if (!fused && !fu.own_xh) {
        // As escha.cu: mid is zeroed only where the multiply sums into it
        // (and always for the ops run ahead).
        const int64_t n_mid4 = blas ? 0 : n_rows * OC / 4;
        escha_xh_targets t = {};
        t.t[0] = { v, xh.data(), (float4 *) mid.data(), n_mid4 };
        t.t[1] = { v1, xh1, (float4 *) mid1, n_mid4 };
        for (int j = 0; j < fu.n_share; j++) {
            t.t[ops + j] = fu.share[j];
        }
        launch(dim3((IC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy, (unsigned) (ops + fu.n_share)), ESCHA_THREADS,
               [&] { escha_xh_kernel(rows, t, n_rows, IC, dense); });
    }
    half  * op_xh  = fu.own_xh ? fu.own_xh : xh.data();
    float * op_mid = fu.own_xh ? fu.own_mid : mid.data();
    if (blas) {
        for (int64_t o = 0; o < ops; o++) {
            auto w = nan_filled<half>((size_t) IC * OC);
            // ksplit stands for the grid size here: 1 block, or escha.cu's grid.
            decode_weight(o ? fu.k1 : k, IC, OC, o ? fu.code1 : a.code, w.data(),
                          ksplit > 1 ? (unsigned) escha_decode_blocks(a.KT, a.NT) : 1);
            blas_gemm_tn(w.data(), o ? xh1 : op_xh, o ? mid1 : op_mid, n_rows, IC, OC);
        }
    } else {
        a.xh      = fused ? nullptr : op_xh;
        a.mid     = fused ? mid.data() : op_mid;
        a.arrive  = arrive.data();
        a.rows    = rows;
        a.v       = v;
        a.dst     = y;
        a.n_x     = (int) plan.n_x;
        a.mblocks = plan.mblocks;
        a.code_early = plan.code_early;
        ksplit     = std::max(1, std::min(ksplit, a.KT));
        a.kt_chunk = escha_cuda_kt_chunk(a.KT, ksplit, fused);
        ksplit     = (a.KT + a.kt_chunk - 1) / a.kt_chunk;
        escha_consts_fill(a.dc);
        if (pair && fu.k1 == k) { // both ops' blocks in one launch, as escha.cu
            a.pair_x    = plan.n_x * plan.n_z;
            a.pair_code = fu.code1;
            a.pair_xh   = xh1;
            a.pair_mid  = mid1;
            launch(dim3((unsigned) (2 * plan.n_x * plan.n_z), (unsigned) ksplit), ESCHA_THREADS, [&] { kernel(a); });
        } else {
            launch(dim3((unsigned) (plan.n_x * plan.n_z), (unsigned) ksplit), ESCHA_THREADS, [&] { kernel(a); });
        }
        if (pair && fu.k1 != k) { // code widths differ: a launch each, as escha.cu
            void (*kernel1)(escha_mm_args) = nullptr;
            if (!(fu.k1 == 2 ? pick<2>(plan, kernel1) : pick<3>(plan, kernel1))) {
                return -1;
            }
            escha_mm_args a1 = a;
            a1.code = fu.code1;
            a1.xh   = xh1;
            a1.mid  = mid1;
            launch(dim3((unsigned) (plan.n_x * plan.n_z), (unsigned) ksplit), ESCHA_THREADS, [&] { kernel1(a1); });
        }
    }
    if (fused) {
        const bool clean = std::all_of(mid.begin(), mid.end(), [](const float m) { return m == 0.0f && !std::signbit(m); }) &&
                           std::all_of(arrive.begin(), arrive.end(), [](const unsigned c) { return c == 0; });
        return clean ? 0 : k_fused_state_left;
    }
    escha_epilogue ep = {};
    ep.kind = fu.kind;
    ep.add  = fu.add;
    ep.mid1 = pair ? mid1 : nullptr;
    ep.v1   = v1;
    launch(dim3((OC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy), ESCHA_THREADS, [&] {
        escha_out_kernel(rows, v, op_mid, y, n_rows, OC, dense, ep, fu.next);
    });
    return 0;
}

bool shape_ok(int k, int64_t ic, int64_t oc) {
    return (k == 2 || k == 3) && ic > 0 && oc > 0 && ic % 128 == 0 && oc % 128 == 0;
}

} // namespace

// A later op for linear_ahead (tests/common/shim.rs's LaterOp): K k, oc
// outputs, its code and vectors (f16 bits, f32); next: its x is the first
// op's output (its IC the first op's OC), else the first op's own x; y:
// its outputs.
struct escha_shim_later {
    int              k;
    int              next;
    int64_t          oc;
    const int16_t  * code;
    const uint16_t * rin;
    const uint16_t * rout;
    const float    * s_in;
    const float    * s_out;
    const float    * bias;
    float          * y;
};

#ifdef GGML_USE_HIP
#define ESCHA_SHIM_FN(name) escha_hip_shim_##name
#else
#define ESCHA_SHIM_FN(name) escha_cuda_shim_##name
#endif

extern "C" {

#ifdef GGML_USE_HIP
// Lanes per wavefront for the calling thread's later calls: 32 (RDNA's
// wave32) or 64 (CDNA, GCN).
int escha_hip_shim_set_wave(int lanes) {
    if (lanes != 32 && lanes != 64) {
        return -1;
    }
    escha_shim_wave = lanes;
    return 0;
}
#endif

// W (ic x oc, row-major, f16 bits) as the lanes decode it: lane L's words
// b[0..3] placed where the kernels' fragment layout says they belong, rows
// 2(L%4)+{0,1} / +{8,9} of columns L/4 and L/4+8 of each 16x16 tile.
int ESCHA_SHIM_FN(decode)(int k, int64_t ic, int64_t oc, const int16_t * code, uint16_t * w) {
    if ((k != 2 && k != 3) || ic <= 0 || oc <= 0 || ic % 16 || oc % 16) {
        return -1;
    }
    const int KT = (int) (ic / 16), NT = (int) (oc / 16), W = 8 * k;
    escha_consts dc;
    escha_consts_fill(dc);
    launch(dim3(NT, KT), 32, [&] {
        const int lane = threadIdx.x;
        const uint32_t * tile = (const uint32_t *) code + ((int64_t) blockIdx.y * NT + blockIdx.x) * W;
        uint32_t b[4];
        if (k == 2) {
            escha_decode_lane<2>(tile, escha_lane_bits<2>(lane), dc, b);
        } else {
            escha_decode_lane<3>(tile, escha_lane_bits<3>(lane), dc, b);
        }
        const int g = lane / 4, t = lane % 4;
        for (int q = 0; q < 4; q++) {
            const int row = 2 * t + 8 * (q % 2), col = g + 8 * (q / 2);
            for (int h = 0; h < 2; h++) {
                w[((int64_t) blockIdx.y * 16 + row + h) * oc + blockIdx.x * 16 + col] = (uint16_t) (b[q] >> (16 * h));
            }
        }
    });
    return 0;
}

// The decode-once stage alone (the BLAS path's escha_decode_kernel): w[oc][ic]
// (f16 bits, each output channel's inputs contiguous) from the code of one
// ic x oc weight, on as many blocks as escha.cu launches.
int ESCHA_SHIM_FN(decode_weight)(int k, int64_t ic, int64_t oc, const int16_t * code, uint16_t * w) {
    if (!shape_ok(k, ic, oc)) {
        return -1;
    }
    decode_weight(k, ic, oc, (const uint32_t *) code, (half *) w, (unsigned) escha_decode_blocks((int) (ic / 16), (int) (oc / 16)));
    return 0;
}

// m dense rows of x, stride floats apart.
escha_rows dense_rows(const float * x, const int64_t stride, const int64_t m) {
    escha_rows rows = {};
    rows.x   = (const char *) x;
    rows.nb1 = stride * 4;
    rows.nb2 = rows.nb3 = rows.nb1 * m;
    rows.ne1 = rows.nx1 = m;
    rows.ne2 = 1;
    return rows;
}

// The input transform alone: xh[m][ic] (f16 bits) from x[m][ic].
int ESCHA_SHIM_FN(xh)(int64_t ic, const float * x, int64_t m, const uint16_t * rin, const float * s_in, uint16_t * xh) {
    if (ic <= 0 || ic % 128 || m <= 0) {
        return -1;
    }
    const escha_rows rows = dense_rows(x, ic, m);
    escha_vecs v = {};
    v.rin  = (const half *) rin;
    v.s_in = s_in;
    launch(dim3((unsigned) ((ic / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS), escha_transform_grid_y(m, true)), ESCHA_THREADS, [&] {
        escha_xh_targets t = {};
        t.t[0] = { v, (half *) xh, nullptr, 0 };
        escha_xh_kernel(rows, t, m, (int) ic, true);
    });
    return 0;
}

// escha.cu's norm fusion (escha_norm_xh_kernel): y[m][ic] = RMS_NORM of x's
// rows (eps) times w, and the input transforms of n_ops ops of y (op j: its
// rin[j], s_in[j]) into xh + j * m * ic, each op's mid (mid + j * m * ic,
// an op of ic outputs) zeroed, on escha.cu's grid. x's rows lie stride
// floats apart (>= ic, a multiple of 4).
int ESCHA_SHIM_FN(norm_xh)(int64_t ic, const float * x, int64_t stride, int64_t m, const float * w, float eps, int n_ops,
                            const uint16_t * const * rin, const float * const * s_in, float * y, uint16_t * xh, float * mid) {
    if (ic <= 0 || ic % 128 || m <= 0 || stride < ic || stride % 4 || n_ops < 1 || n_ops > ESCHA_XH_OPS) {
        return -1;
    }
    const escha_rows rows = dense_rows(x, stride, m);
    escha_xh_targets t = {};
    for (int j = 0; j < n_ops; j++) {
        escha_vecs v = {};
        v.rin  = (const half *) rin[j];
        v.s_in = s_in[j];
        t.t[j] = { v, (half *) xh + j * m * ic, (float4 *) (mid + j * m * ic), m * ic / 4 };
    }
    launch(dim3((unsigned) ((ic / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS), (unsigned) m, (unsigned) n_ops), ESCHA_THREADS,
           [&] { escha_norm_xh_kernel(rows, w, y, eps, t, m, (int) ic, true); });
    return 0;
}

// The output transform alone: y[m][oc] from mid[m][oc].
int ESCHA_SHIM_FN(out)(int64_t oc, const float * mid, int64_t m, const uint16_t * rout, const float * s_out, const float * bias,
                        float * y) {
    if (oc <= 0 || oc % 128 || m <= 0) {
        return -1;
    }
    const escha_rows rows = dense_rows(nullptr, oc, m); // the output transform reads no x
    escha_vecs v = {};
    v.rout  = (const half *) rout;
    v.s_out = s_out;
    v.bias  = bias;
    launch(dim3((unsigned) ((oc / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS), escha_transform_grid_y(m, true)), ESCHA_THREADS, [&] {
        escha_out_kernel(rows, v, mid, y, m, (int) oc, true, escha_epilogue{}, escha_xh_target{});
    });
    return 0;
}

// One dense op: y[m][oc] from x[m][ic] (contiguous), path as in k_family_of_path,
// IC split into ksplit parts (1: plain stores, more: f32 atomics), with
// escha.cu's graph fusions: with code1 (K = k1, and its vectors
// rin1..bias1), a second op of x as the SWIGLU pair's up op, y = silu(op) * op1; else with
// add (m x oc), y = op + add, or with silu_mul, y = silu(op) * add; else the
// op alone (linear).
// Then the n_later ops of later, whose input transforms this op's launches
// run ahead as escha.cu's do (escha_shim_later), each on the same path and
// split, from the xh and mid it left them.
int ESCHA_SHIM_FN(linear_ahead)(int k, int64_t ic, int64_t oc, const int16_t * code, const float * x, int64_t m,
                                 const uint16_t * rin, const uint16_t * rout, const float * s_in, const float * s_out,
                                 const float * bias, int k1, const int16_t * code1, const uint16_t * rin1, const uint16_t * rout1,
                                 const float * s_in1, const float * s_out1, const float * bias1, const float * add, int silu_mul,
                                 float * y, int path, int ksplit, const escha_shim_later * later, int n_later) {
    if (!shape_ok(k, ic, oc) || m <= 0 || (code1 && !shape_ok(k1, ic, oc)) || n_later < 0 || (n_later > 0 && !later)) {
        return -1;
    }
    const escha_rows rows = dense_rows(x, ic, m);
    escha_vecs v = {};
    v.rin   = (const half *) rin;
    v.rout  = (const half *) rout;
    v.s_in  = s_in;
    v.s_out = s_out;
    v.bias  = bias;
    escha_mm_args a = {};
    a.code   = (const uint32_t *) code;
    a.KT     = (int) (ic / 16);
    a.NT     = (int) (oc / 16);
    a.IC     = (int) ic;
    a.OC     = (int) oc;
    a.n_rows = m;
    a.mode   = 0;
    fusion_args fu;
    if (code1) {
        fu.code1 = (const uint32_t *) code1;
        fu.k1    = k1;
        fu.v1.rin   = (const half *) rin1;
        fu.v1.rout  = (const half *) rout1;
        fu.v1.s_in  = s_in1;
        fu.v1.s_out = s_out1;
        fu.v1.bias  = bias1;
        fu.kind = ESCHA_EPI_SWIGLU;
    } else if (add) {
        fu.kind = silu_mul ? ESCHA_EPI_SILU_MUL : ESCHA_EPI_ADD;
        fu.add  = add;
    }
    // Each later op's xh and mid: NaN until this op's launches write them.
    std::vector<std::vector<half>> lxh(n_later);
    std::vector<std::vector<float>> lmid(n_later);
    std::vector<escha_vecs> lv(n_later);
    for (int l = 0; l < n_later; l++) {
        const escha_shim_later & o = later[l];
        const int64_t lic = o.next ? oc : ic;
        if (!shape_ok(o.k, lic, o.oc) || !o.code || !o.y || (o.next && fu.next.xh) || (!o.next && fu.n_share == ESCHA_XH_OPS - 1)) {
            return -1;
        }
        lxh[l]  = nan_filled<half>((size_t) (m * lic));
        lmid[l] = nan_filled<float>((size_t) (m * o.oc));
        lv[l].rin   = (const half *) o.rin;
        lv[l].rout  = (const half *) o.rout;
        lv[l].s_in  = o.s_in;
        lv[l].s_out = o.s_out;
        lv[l].bias  = o.bias;
        const escha_xh_target t = { lv[l], lxh[l].data(), (float4 *) lmid[l].data(), m * o.oc / 4 };
        if (o.next) {
            fu.next = t;
        } else {
            fu.share[fu.n_share++] = t;
        }
    }
    int rc = run_op(k, rows, v, m, a, path, m, m, 1, ksplit, y, fu);
    for (int l = 0; l < n_later && rc == 0; l++) {
        const escha_shim_later & o = later[l];
        const int64_t lic = o.next ? oc : ic;
        const escha_rows lrows = dense_rows(o.next ? y : x, lic, m);
        escha_mm_args la = a;
        la.code = (const uint32_t *) o.code;
        la.KT   = (int) (lic / 16);
        la.NT   = (int) (o.oc / 16);
        la.IC   = (int) lic;
        la.OC   = (int) o.oc;
        fusion_args lfu;
        lfu.own_xh  = lxh[l].data();
        lfu.own_mid = lmid[l].data();
        rc = run_op(o.k, lrows, lv[l], m, la, path, m, m, 1, ksplit, o.y, lfu);
    }
    return rc;
}

int ESCHA_SHIM_FN(linear)(int k, int64_t ic, int64_t oc, const int16_t * code, const float * x, int64_t m,
                           const uint16_t * rin, const uint16_t * rout, const float * s_in, const float * s_out,
                           const float * bias, float * y, int path, int ksplit) {
    return ESCHA_SHIM_FN(linear_ahead)(k, ic, oc, code, x, m, rin, rout, s_in, s_out, bias, 0, nullptr, nullptr, nullptr, nullptr,
                                       nullptr, nullptr, nullptr, 0, y, path, ksplit, nullptr, 0);
}

// One MoE op: x[n_tokens][nx][ic], ids[n_tokens][ids_stride] (first n_used
// used), y[n_tokens][n_used][oc]; a slot whose id is outside [0, n_expert)
// comes out NaN. grouped = 0: one block row per slot
// (decode sizes); 1: slots grouped by expert (as ggml's mmid helper does
// on the device, here on the host). path as in k_family_of_path.
int ESCHA_SHIM_FN(moe)(int k, int64_t n_expert, int64_t ic, int64_t oc, const int16_t * code, const float * x, int64_t nx,
                        const int32_t * ids, int64_t ids_stride, int64_t n_used, int64_t n_tokens, const uint16_t * rin,
                        const uint16_t * rout, const float * s_in, int64_t s_in_rows, const float * s_out, int64_t s_out_rows,
                        const float * bias, int64_t bias_rows, float * y, int grouped, int path, int ksplit) {
    if (!shape_ok(k, ic, oc) || n_expert <= 0 || n_used <= 0 || n_tokens <= 0 || (nx != 1 && nx != n_used)) {
        return -1;
    }
    const int64_t n_rows = n_used * n_tokens;
    escha_rows rows = {};
    rows.x   = (const char *) x;
    rows.nb1 = ic * 4;
    rows.nb2 = rows.nb1 * nx;
    rows.nb3 = 0;
    rows.ne1 = n_used;
    rows.ne2 = n_tokens;
    rows.nx1 = nx;
    rows.ids = ids;
    rows.si1 = ids_stride;
    rows.n_expert = n_expert;
    escha_vecs v = {};
    v.rin   = (const half *) rin;   v.rin_es   = ic;
    v.rout  = (const half *) rout;  v.rout_es  = oc;
    v.s_in  = s_in;  v.s_in_es  = s_in_rows  > 1 ? ic : 0;
    v.s_out = s_out; v.s_out_es = s_out_rows > 1 ? oc : 0;
    v.bias  = bias;  v.bias_es  = bias_rows  > 1 ? oc : 0;
    escha_mm_args a = {};
    a.code    = (const uint32_t *) code;
    a.code_es = (ic / 16) * (oc / 16) * 8 * k;
    a.KT      = (int) (ic / 16);
    a.NT      = (int) (oc / 16);
    a.IC      = (int) ic;
    a.OC      = (int) oc;
    a.n_rows  = n_rows;
    std::vector<int32_t> sorted, bounds;
    if (!grouped) {
        a.mode   = 1;
        return run_op(k, rows, v, n_rows, a, path, 1, 1, n_expert, ksplit, y);
    }
    for (int64_t e = 0; e < n_expert; e++) {
        bounds.push_back((int32_t) sorted.size());
        for (int64_t t = 0; t < n_tokens; t++) {
            for (int64_t u = 0; u < n_used; u++) {
                if (ids[t * ids_stride + u] == e) {
                    sorted.push_back((int32_t) (t * n_used + u));
                }
            }
        }
    }
    bounds.push_back((int32_t) sorted.size()); // (a slot with a bad id is in no expert's list, as with ggml's helper)
    a.mode   = 2;
    a.sorted = sorted.data();
    a.bounds = bounds.data();
    // Blocks sized as escha.cu's plan sizes them, as many per expert as n_tokens rows take.
    return run_op(k, rows, v, n_rows, a, path, escha_cuda_moe_block_rows(n_rows, n_expert), n_tokens, n_expert, ksplit, y);
}

} // extern "C"
