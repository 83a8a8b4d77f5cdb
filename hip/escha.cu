// Escha-W2 ops for ggml-cuda and ggml-hip (escha-ggml).
//
// One linear (or one expert slot) runs in three stages on the context's
// stream, with no host synchronisation (CUDA graphs stay valid):
//   1. escha_xh_kernel:  xh = f16(H128(x * rin_eff) * RS)      (per row),
//                        and mid = 0 where stage 2 sums atomically
//   2. mid = xh @ W, by one of (escha-plan.h):
//      - W decoded in registers and never stored; split over IC, summed
//        with f32 atomics: escha_gemv_kernel up to 64 rows per weight
//        in blocks of up to 32 (token generation, parallel sequences),
//        escha_mm_kernel above
//        (MoE prefill) and on the SIMT path;
//      - large dense batches: W decoded once into f16 scratch from ggml's
//        pool (escha_decode_kernel) and multiplied by cuBLAS / hipBLAS
//        through ggml's handle, f16 x f16 with f32 accumulation
//   3. escha_out_kernel: y = f16((H128(mid) * RS) * rout_eff) (+ bias)
// MoE decode slots (the plan's fused GEMV, on the
// mma path) run all three stages in one launch: escha_gemv_kernel's FUSED.
// Graph fusion (ggml_cuda_escha_try_fuse, at the end): a gate and up pair
// with their SWIGLU, or an op with its residual ADD or with its SILU and a
// MUL, in one op's launches.
// The rounding points are the contract's (docs/FORMAT.md §5); only the
// order of the f32 sum in `mid` differs from the reference, which the
// contract leaves free.
//
// Tile order: lane L of a 32-lane warp owns trellis values 8L..8L+7 of a
// tile, which sit exactly where mma.m16n8k16's B fragment wants them (rows
// 2(L%4)+{0,1,8,9}, column L/4 and L/4+8), and, read transposed, where its
// A fragment wants them. So on NVIDIA (sm_80+) each lane decodes straight
// into operand registers and the tensor cores do the dot product, leaving
// the integer pipe to the decode. Elsewhere (HIP, older NVIDIA) the same
// lane layout feeds a SIMT dot product.
//
// Warps here are logical 32-lane groups (threadIdx.x / 32): on a 64-wide
// wavefront (CDNA) two of them share a wavefront, and every shuffle stays
// inside its 32-lane half (width 32).

#include "escha.cuh"
#include "mmid.cuh"
#include "escha-kernels.cuh"
#include "escha-op.h"
#include "escha-plan.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

// ---- host side ---------------------------------------------------------------

// The node as these kernels take it: the common description
// (escha-op.h), plus contiguous ids rows.
static const char * escha_cuda_parse(const ggml_tensor * node, escha_op * op, char * err, size_t n_err) {
    if (escha_op_parse(node, op, err, n_err) != nullptr) {
        return err;
    }
    if (op->moe && op->ids->nb[0] != sizeof(int32_t)) {
        snprintf(err, n_err, "ids (%s) elements must be contiguous", op->ids->name);
        return err;
    }
    if (op->n_slots >= INT32_MAX) { // the kernels' row indices (escha_divisor)
        snprintf(err, n_err, "%s: %lld rows, more than the CUDA kernels take (2^31 - 1)", node->name, (long long) op->n_slots);
        return err;
    }
    return nullptr;
}

bool ggml_cuda_escha_supports_op(const ggml_tensor * op) {
    escha_op parsed;
    char err[256];
    return escha_cuda_parse(op, &parsed, err, sizeof err) == nullptr;
}

// Every escha kernel goes through ggml-cuda's own launcher: on Hopper and
// later a programmatic dependent launch (the kernels' escha_kernel_begin,
// escha-kernels.cuh), as the pinned tree launches its kernels, so that no
// stage waits for a launch after the one before it ends; a plain launch
// elsewhere. GGML_CUDA_PDL=0 turns it off for all of them.
template <typename Kernel, typename... Args>
static void escha_kernel_launch(Kernel kernel, const dim3 grid, cudaStream_t stream, Args &&... args) {
    ggml_cuda_kernel_launch(kernel, ggml_cuda_kernel_launch_params(grid, dim3(ESCHA_THREADS, 1, 1), (size_t) 0, stream),
                            std::forward<Args>(args)...);
}

// Launches a decode-and-multiply kernel over n_z groups, of which about
// z_busy have rows. IC is split until the grid fills two waves of resident
// blocks (more blocks in flight hide the load -> decode -> mma latency; on
// the H200 two waves beat one by 3% at 5120 -> 17408, hip/bench), keeping
// at least 8 tile rows per split; or one wave where two would take more
// than ESCHA_CUDA_MAX_SPLITS splits: that many partial sums of each output
// meet in the same f32 atomics (17408 -> 5120 at one row: 39 splits 30.0
// us, 79 splits 31.0). per_sm: the kernel's resident blocks per SM (its
// registers decide), asked once.
// fused: the fused GEMV, whose splits are whole 128-blocks (escha-plan.h).
// rows32: a dense op's 32-row GEMV blocks (escha_cuda_ksplit).
static void escha_launch(void (*kernel)(escha_mm_args), int & per_sm, escha_mm_args a, const int64_t n_z, const int64_t z_busy,
                         const int nsm, cudaStream_t stream, const bool fused = false, const bool rows32 = false) {
    if (per_sm == 0) {
        int n = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, ESCHA_THREADS, 0));
        per_sm = std::max(n, 1);
    }
    escha_consts_fill(a.dc);
    const int64_t ops      = a.pair_x > 0 ? 2 : 1; // a pair's ops share the split: one IC
    const int64_t resident = (int64_t) per_sm * nsm;
    const int64_t n_x      = a.n_x.d;
    const int64_t blocks   = ops * n_x * std::max<int64_t>(z_busy, 1);
    int ksplit = escha_cuda_ksplit(resident, blocks, a.KT, rows32);
    a.kt_chunk = escha_cuda_kt_chunk(a.KT, ksplit, fused);
    ksplit     = (a.KT + a.kt_chunk - 1) / a.kt_chunk;
    GGML_ASSERT(ops * n_x * n_z < INT32_MAX && ksplit <= 65535); // also escha_divisor's range, for the block index
    GGML_ASSERT(a.pair_x == 0 || a.pair_x == n_x * n_z);
    const dim3 grid((unsigned) (ops * n_x * n_z), (unsigned) ksplit, 1);
    escha_kernel_launch(kernel, grid, stream, a);
}

template <int K, int NTW, int MT, bool MMA>
static void escha_launch_mm(const escha_mm_args & a, const int64_t n_z, const int64_t z_busy, const int nsm, cudaStream_t stream) {
    static int per_sm = 0;
    escha_launch(escha_mm_kernel<K, NTW, MT, MMA>, per_sm, a, n_z, z_busy, nsm, stream);
}

template <int K, int NTW, int NB, bool FUSED = false>
static void escha_launch_gemv(const escha_mm_args & a, const int64_t n_z, const int64_t z_busy, const int nsm, cudaStream_t stream) {
    static int per_sm = 0;
    escha_launch(escha_gemv_kernel<K, NTW, NB, FUSED>, per_sm, a, n_z, z_busy, nsm, stream, FUSED,
                 NB == 4 && a.mode == ESCHA_CUDA_DENSE);
}

// Whether the environment variable `name` is set to off ("" or "0").
static bool escha_env_off(const char * name) {
    const char * s = getenv(name);
    return s != nullptr && !escha_env_switch(s);
}

// Whether kernels may load weights before their wait (escha_forward);
// GGML_ESCHA_EARLY=0 turns that off, for measuring.
static bool escha_early_allowed() {
    static const bool v = !escha_env_off("GGML_ESCHA_EARLY");
    return v;
}

// The fused kernel's row limit: ESCHA_CUDA_FUSED_MAX_ROWS, or 0 (off) when
// GGML_ESCHA_FUSED=0 (for measuring the three-launch path), read once.
static int64_t escha_fused_max_rows() {
    static const int64_t v = escha_env_off("GGML_ESCHA_FUSED") ? 0 : ESCHA_CUDA_FUSED_MAX_ROWS;
    return v;
}

// GGML_ESCHA_FUSED_DENSE=1: dense ops of few rows take the fused kernel
// too (the plan gives it MoE decode slots only), read once.
static bool escha_fused_dense() {
    static const bool v = escha_env_switch(getenv("GGML_ESCHA_FUSED_DENSE"));
    return v;
}

// Whether stream is capturing a CUDA (HIP) graph: scratch that kernels
// keep between ops is never allocated then (the allocation would not run
// when the graph does).
static bool escha_capturing(cudaStream_t stream) {
#ifdef GGML_USE_HIP
    hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
    CUDA_CHECK(hipStreamIsCapturing(stream, &capture));
    return capture != hipStreamCaptureStatusNone;
#else
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    return capture != cudaStreamCaptureStatusNone;
#endif
}

#ifndef GGML_USE_HIP
// The fused kernel's state between ops: mid (f32 sums) and the arrival
// counts, all 0 whenever no fused kernel runs (each one puts back what it
// used), one set per device and stream (the ops of one stream run in
// order; concurrent streams each get their own). It only grows, and a
// buffer it outgrows stays allocated: a CUDA graph captured before may
// still launch kernels that use it. It grows only outside stream capture
// (the allocation and its zeroing would not run when the graph does):
// during a capture an op it is too small for gets false and takes the
// three-launch path.
static bool escha_fused_state(const int device, cudaStream_t stream, const size_t n_mid, const size_t n_arrive, float *& mid,
                              unsigned *& arrive) {
    struct state {
        float    * mid      = nullptr;
        unsigned * arrive   = nullptr;
        size_t     n_mid    = 0;
        size_t     n_arrive = 0;
    };
    static std::mutex lock;
    static std::map<std::pair<int, cudaStream_t>, state> states;
    static std::vector<void *> outgrown; // kept, never freed (above)
    std::lock_guard<std::mutex> guard(lock);
    state & s = states[{ device, stream }];
    if (s.n_mid < n_mid || s.n_arrive < n_arrive) {
        if (escha_capturing(stream)) {
            return false;
        }
        if (s.mid != nullptr) {
            outgrown.push_back(s.mid);
            outgrown.push_back(s.arrive);
        }
        s.n_mid    = std::max(n_mid, 2 * s.n_mid);
        s.n_arrive = std::max(n_arrive, 2 * s.n_arrive);
        CUDA_CHECK(cudaMalloc((void **) &s.mid, s.n_mid * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void **) &s.arrive, s.n_arrive * sizeof(unsigned)));
        CUDA_CHECK(cudaMemsetAsync(s.mid, 0, s.n_mid * sizeof(float), stream));
        CUDA_CHECK(cudaMemsetAsync(s.arrive, 0, s.n_arrive * sizeof(unsigned), stream));
    }
    mid    = s.mid;
    arrive = s.arrive;
    return true;
}
#endif // the fused kernel runs on the mma path, never on HIP

// A row count from the environment variable `name`, or `unset` without it.
static int64_t escha_env_rows(const char * name, const int64_t unset) {
    const char * s = getenv(name);
    return s ? (int64_t) atoll(s) : unset;
}

// The dense BLAS path's threshold: ESCHA_CUDA_BLAS_MIN_ROWS, or
// GGML_ESCHA_BLAS_MIN_ROWS (0 turns the path off), read once.
static int64_t escha_blas_min_rows() {
    static const int64_t v = escha_env_rows("GGML_ESCHA_BLAS_MIN_ROWS", ESCHA_CUDA_BLAS_MIN_ROWS);
    return v;
}

// GROUPED MoE blocks sized for GGML_ESCHA_MOE_ROWS rows when set (above
// ESCHA_CUDA_GEMV_MAX_ROWS: the tensor-core prefill kernel), for measuring
// the sizes against each other; unset, 0 or less: the plan's own size
// (escha_cuda_make_plan takes only a positive one), read once.
static int64_t escha_moe_rows() {
    static const int64_t v = escha_env_rows("GGML_ESCHA_MOE_ROWS", 0);
    return v;
}

// The fused GEMV's output tiles a warp: GGML_ESCHA_FUSED_NTW=2 or 4 when
// set, otherwise ESCHA_CUDA_FUSED_NTW, read once.
static int escha_fused_ntw() {
    static const int64_t e = escha_env_rows("GGML_ESCHA_FUSED_NTW", 0);
    static const int v = e == 2 || e == 4 ? (int) e : ESCHA_CUDA_FUSED_NTW;
    return v;
}

// mid = xh @ W for a dense op (a.code, a.xh, a.mid, all a.n_rows rows):
// W decoded into f16 scratch from the pool, one weight at a time and never
// kept, then one f16 x f16 product with f32 accumulation on the vendor's
// BLAS through ggml's handle (bound to the context's stream).
static void escha_decode_then_blas(ggml_backend_cuda_context & ctx, const int K, const escha_mm_args & a, cudaStream_t stream) {
    ggml_cuda_pool_alloc<half> w(ctx.pool(), (size_t) a.IC * a.OC);
    escha_consts dc;
    escha_consts_fill(dc);
    const int64_t blocks = escha_decode_blocks(a.KT, a.NT);
    GGML_ASSERT(blocks < INT32_MAX && a.n_rows < INT32_MAX);
    escha_kernel_launch(escha_decode_kernel_for(K), dim3((unsigned) blocks, 1, 1), stream, a.code, w.get(), a.KT, a.NT, dc);
    // Column-major for BLAS: mid (OC x n_rows, ld OC) = w^T (w: IC x OC, ld IC) * xh (IC x n_rows, ld IC).
    const float alpha = 1.0f, beta = 0.0f;
    cublasHandle_t handle = ctx.cublas_handle();
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, a.OC, (int) a.n_rows, a.IC,
                              &alpha, w.get(), CUDA_R_16F, a.IC,
                                      a.xh, CUDA_R_16F, a.IC,
                              &beta,  a.mid, CUDA_R_32F, a.OC,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
}

// Whether no kernel of the graph can have written t (absent, or a leaf that
// is not a view: model weights are): what a kernel may read before it waits
// for the kernel before it. A graph that copied into such a leaf in an
// earlier node (ggml_cpy into a weight) would race with these reads; weights
// are written once, when a model loads, by copies from the host.
static bool escha_is_weight(const ggml_tensor * t) {
    return t == nullptr || (t->op == GGML_OP_NONE && t->view_src == nullptr);
}

// The rows of a dense x (every row expert 0's) as the kernels address them.
static escha_rows escha_dense_rows(const ggml_tensor * x) {
    escha_rows rows = {};
    rows.x   = (const char *) x->data;
    rows.nb1 = x->nb[1];
    rows.nb2 = x->nb[2];
    rows.nb3 = x->nb[3];
    rows.ne1 = x->ne[1];
    rows.ne2 = x->ne[2];
    rows.nx1 = x->ne[1];
    return rows;
}

// Whether an op's weights (code and per-channel vectors) are all
// escha_is_weight: what its kernels may load before their wait.
static bool escha_op_weights_only(const escha_op & o) {
    bool only = escha_is_weight(o.code);
    for (int i = 0; i < ESCHA_VEC_COUNT; i++) {
        only = only && escha_is_weight(o.vec[i].t);
    }
    return only;
}

// The per-channel vectors of a parsed op as the kernels take them.
static escha_vecs escha_vecs_of(const escha_op & op) {
    escha_vecs v;
    const auto data = [&](int i) { return op.vec[i].t ? op.vec[i].t->data : nullptr; };
    v.rin   = (const half *) data(ESCHA_VEC_RIN);   v.rin_es   = op.vec[ESCHA_VEC_RIN].es;
    v.rout  = (const half *) data(ESCHA_VEC_ROUT);  v.rout_es  = op.vec[ESCHA_VEC_ROUT].es;
    v.s_in  = (const float *) data(ESCHA_VEC_S_IN);  v.s_in_es  = op.vec[ESCHA_VEC_S_IN].es;
    v.s_out = (const float *) data(ESCHA_VEC_S_OUT); v.s_out_es = op.vec[ESCHA_VEC_S_OUT].es;
    v.bias  = (const float *) data(ESCHA_VEC_BIAS);  v.bias_es  = op.vec[ESCHA_VEC_BIAS].es;
    return v;
}

// Whether this build runs the op's multiply on tensor cores (mma).
static bool escha_use_mma() {
#ifdef GGML_USE_HIP
    return false;
#else
    // GGML_ESCHA_SIMT=1 forces the SIMT path (the one HIP runs), for testing it on NVIDIA.
    static const bool force_simt = escha_env_switch(getenv("GGML_ESCHA_SIMT"));
    const int cc = ggml_cuda_info().devices[ggml_cuda_get_device()].cc;
    return !force_simt && GGML_CUDA_CC_IS_NVIDIA(cc) && ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_AMPERE;
#endif
}

// The op's plan (escha-plan.h), with the fused kernel up to fused_max_rows,
// on the current device (its SMs decide what a large op is).
static escha_cuda_plan escha_plan_of(const escha_op & op, const int64_t fused_max_rows) {
    const int nsm = ggml_cuda_info().devices[ggml_cuda_get_device()].nsm;
    return escha_cuda_make_plan(op.moe, op.n_slots, op.n_tokens, op.n_expert, op.oc / 16, ESCHA_WARPS, escha_use_mma(),
                                escha_blas_min_rows(), fused_max_rows, escha_moe_rows(), escha_fused_ntw(), escha_fused_dense(),
                                escha_cuda_gemv_wide(op.ic / 16, op.oc / 16, nsm));
}

// What escha_forward runs beyond the op itself (ggml_cuda_escha_try_fuse):
// a second dense op of the same input and shape in the same launches
// (second), and what the output transform writes in place of the op's
// outputs, to dst (escha_epilogue); and the input transforms of later ops
// (escha_ahead below): of ops of the same x (share), from this op's input
// transform (grid z), and of the next op, whose x is what this op's output
// transform writes (next).
static constexpr int ESCHA_SHARE_MAX = ESCHA_XH_OPS - 1;
struct escha_fusion {
    const escha_op * second = nullptr; // SWIGLU: the up op; the op is the gate
    int              kind   = ESCHA_EPI_NONE;
    const float    * add    = nullptr; // ADD, MUL: the other operand
    float          * dst    = nullptr; // the fused node's output (nullptr: the op's)
    int              n_share = 0;
    escha_op         share[ESCHA_SHARE_MAX];
    bool             has_next = false;
    escha_op         next;
};

// ---- input transforms run ahead -------------------------------------------------
// A later op's xh and zeroed mid, written by an earlier op's launches
// (escha_fusion's share and next), wait in a slot until that op runs,
// which then launches no input transform of its own. Token generation only
// (up to ESCHA_CUDA_GEMV_MAX_ROWS rows), where that launch costs more than
// its work. One set of slots per device and stream, as the fused kernel's
// state: slot memory only grows, memory a slot outgrows stays allocated (a
// CUDA graph captured before may still use it), and it grows only outside
// stream capture (during one, a target that does not fit is left to compute
// its own). A slot is claimed when its producer runs and freed when its op
// runs; any later kernel that writes it waits (stream order, or the
// dependent launch's wait) for the op's kernels that read it.
static constexpr int ESCHA_AHEAD_SLOTS = 6;
struct escha_ahead_slot {
    half  * xh    = nullptr;
    size_t  n_xh  = 0;
    float * mid   = nullptr;
    size_t  n_mid = 0;
    const ggml_tensor * node = nullptr; // the op it holds xh and mid for; nullptr: free
};
struct escha_ahead_state {
    escha_ahead_slot slot[ESCHA_AHEAD_SLOTS];
    // The graph and node index try_fuse saw last: a graph evaluation starts
    // when either goes back, and frees every slot.
    const ggml_cgraph * cgraph = nullptr;
    int                 last_i = -1;
    // A node try_fuse left to ggml_cuda_compute_forward (no node after it
    // fused) whose launches still run later ops' input transforms.
    const ggml_tensor * planned = nullptr;
    escha_fusion        planned_fu;
};

static escha_ahead_state & escha_ahead_of(const int device, cudaStream_t stream) {
    static std::mutex lock;
    static std::map<std::pair<int, cudaStream_t>, escha_ahead_state> states;
    std::lock_guard<std::mutex> guard(lock);
    return states[{ device, stream }]; // std::map: the reference stays valid
}

// Whether ops run later ops' input transforms: not with GGML_ESCHA_AHEAD=0
// (for measuring), nor while the graph runs branches on concurrent streams
// (GGML_CUDA_GRAPH_OPT), where the later op may run on another stream.
static bool escha_ahead_on(ggml_backend_cuda_context & ctx) {
    static const bool off = escha_env_off("GGML_ESCHA_AHEAD");
    return !off && ctx.stream_context().concurrent_events.empty();
}

// The slot holding node's xh and mid, or nullptr (node is never nullptr,
// which marks a free slot).
static escha_ahead_slot * escha_ahead_find(escha_ahead_state & st, const ggml_tensor * node) {
    for (escha_ahead_slot & s : st.slot) {
        if (s.node == node) {
            return &s;
        }
    }
    return nullptr;
}

// Claims a free slot for node with room for n_xh halves of xh and n_mid
// floats of mid, or gives nullptr (no free slot, or none that fits during
// a capture).
static escha_ahead_slot * escha_ahead_claim(escha_ahead_state & st, const ggml_tensor * node, const size_t n_xh, const size_t n_mid,
                                            cudaStream_t stream) {
    static std::mutex outgrown_lock; // the states of several devices and streams share it
    static std::vector<void *> outgrown; // kept, never freed (above)
    escha_ahead_slot * grow = nullptr;
    for (escha_ahead_slot & s : st.slot) {
        if (s.node != nullptr) {
            continue;
        }
        if (s.n_xh >= n_xh && s.n_mid >= n_mid) {
            s.node = node;
            return &s;
        }
        grow = grow ? grow : &s;
    }
    if (grow == nullptr) {
        return nullptr;
    }
    if (escha_capturing(stream)) {
        return nullptr;
    }
    if (grow->xh != nullptr) {
        std::lock_guard<std::mutex> guard(outgrown_lock);
        outgrown.push_back(grow->xh);
        outgrown.push_back(grow->mid);
    }
    grow->n_xh  = std::max(n_xh, grow->n_xh);
    grow->n_mid = std::max(n_mid, grow->n_mid);
    CUDA_CHECK(cudaMalloc((void **) &grow->xh, grow->n_xh * sizeof(half)));
    CUDA_CHECK(cudaMalloc((void **) &grow->mid, grow->n_mid * sizeof(float)));
    grow->node = node;
    return grow;
}

// Runs the three stages of a parsed op by its plan (escha-plan.h); with a
// second op (fu.second), both in each launch: one input transform (grid z
// = 2), one multiply (the second's blocks after the first's; a multiply
// each where their code widths K differ, and on the BLAS path), and one
// output transform. Its input transform is skipped when an earlier op's
// launches ran it (a claimed slot); it runs fu.share's and fu.next's.
static void escha_forward(ggml_backend_cuda_context & ctx, const escha_op & op, const escha_fusion & fu = {}) {
    const int K  = op.k;
    const int IC = (int) op.ic;
    const int OC = (int) op.oc;
    const int64_t n_rows = op.n_slots;
    GGML_ASSERT(n_rows < INT32_MAX); // escha_cuda_parse
    cudaStream_t stream = ctx.stream();
    if (n_rows == 0) {
        return;
    }
    const bool pair = fu.second != nullptr;
    GGML_ASSERT(!pair || (!op.moe && !fu.second->moe && fu.second->ic == op.ic && fu.second->oc == op.oc &&
                          fu.second->n_slots == n_rows && fu.second->x == op.x));

    escha_rows rows = escha_dense_rows(op.x);
    if (op.moe) {
        rows.nb3 = 0;
        rows.ne1 = op.n_used;
        rows.ne2 = op.n_tokens;
        rows.ids = (const int32_t *) op.ids->data;
        rows.si1 = op.ids->nb[1] / sizeof(int32_t);
    }
    rows.n_expert = op.n_expert;

    const escha_vecs v  = escha_vecs_of(op);
    const escha_vecs v1 = pair ? escha_vecs_of(*fu.second) : v;

    const int id = ggml_cuda_get_device();
    const int nsm = ggml_cuda_info().devices[id].nsm;
    escha_cuda_plan plan = escha_plan_of(op, escha_fused_max_rows());
    float    * fused_mid    = nullptr;
    unsigned * fused_arrive = nullptr;
#ifndef GGML_USE_HIP
    if (plan.fused &&
        !escha_fused_state(id, stream, (size_t) (n_rows * OC), (size_t) (plan.n_z * (OC / 128)), fused_mid, fused_arrive)) {
        plan = escha_plan_of(op, 0); // three launches instead, with their own grid (tiles a warp)
    }
#endif
    // The fused kernel writes the op's own outputs: ggml_cuda_escha_try_fuse
    // never fuses an op that takes it.
    GGML_ASSERT(!plan.fused || (!pair && fu.kind == ESCHA_EPI_NONE));

    // The ops whose input transform these launches run besides their own
    // (escha_ahead), each with a slot claimed for it; one that finds none
    // computes its own. An op whose xh an earlier launch wrote (own) runs
    // none of its own, and so none of fu.share's (the producer looked past
    // it for those). A pair takes slots only when both of its ops have one
    // (a norm's launch wrote both: escha_try_fuse_norm); otherwise it frees
    // either and computes both.
    escha_ahead_state * st = escha_ahead_on(ctx) ? &escha_ahead_of(id, stream) : nullptr;
    escha_ahead_slot * own = st && !plan.fused ? escha_ahead_find(*st, op.dst) : nullptr;
    escha_ahead_slot * own1 = st && pair ? escha_ahead_find(*st, fu.second->dst) : nullptr;
    if (pair && (own == nullptr || own1 == nullptr)) {
        if (own) {
            own->node = nullptr;
            own = nullptr;
        }
        if (own1) {
            own1->node = nullptr;
            own1 = nullptr;
        }
    }
    GGML_ASSERT(own == nullptr || (own->n_xh >= (size_t) (n_rows * IC) && own->n_mid >= (size_t) (n_rows * OC)));
    GGML_ASSERT(own1 == nullptr || (own1->n_xh >= (size_t) (n_rows * IC) && own1->n_mid >= (size_t) (n_rows * OC)));
    const escha_op * share[ESCHA_SHARE_MAX] = {};
    escha_ahead_slot * share_slot[ESCHA_SHARE_MAX] = {};
    int n_share = 0;
    for (int j = 0; st && !own && !plan.fused && j < fu.n_share && (pair ? 2 : 1) + n_share < ESCHA_XH_OPS; j++) {
        const escha_op & o = fu.share[j];
        escha_ahead_slot * slot = escha_ahead_claim(*st, o.dst, (size_t) (n_rows * o.ic), (size_t) (n_rows * o.oc), stream);
        if (slot) {
            share[n_share]      = &o;
            share_slot[n_share] = slot;
            n_share++;
        }
    }
    escha_ahead_slot * next_slot = st && fu.has_next && !plan.fused
        ? escha_ahead_claim(*st, fu.next.dst, (size_t) (n_rows * fu.next.ic), (size_t) (n_rows * fu.next.oc), stream)
        : nullptr;

    // Dense ops' kernels load their weights (code, per-channel vectors)
    // before they wait for the kernel before them, when no kernel can have
    // written those (escha_is_weight); GGML_ESCHA_EARLY=0 turns that off,
    // for measuring.
    bool early = escha_early_allowed() && !op.moe;
    auto weights_only = [&early](const escha_op * o) {
        early = early && (o == nullptr || escha_op_weights_only(*o));
    };
    weights_only(&op);
    weights_only(fu.second);
    for (int j = 0; j < n_share; j++) {
        weights_only(share[j]);
    }
    weights_only(next_slot ? &fu.next : nullptr);

    // A pair's second op has its xh and mid after the first's.
    const int64_t ops = pair ? 2 : 1;
    ggml_cuda_pool_alloc<half>  xh(ctx.pool());
    ggml_cuda_pool_alloc<float> mid(ctx.pool());
    const unsigned gy = escha_transform_grid_y(n_rows);
    if (!plan.fused && !own) {
        xh.alloc(ops * n_rows * IC);
        mid.alloc(ops * n_rows * OC);
        // The BLAS product overwrites mid (beta = 0); the others sum into it.
        const int64_t n_mid4 = plan.family == ESCHA_CUDA_BLAS ? 0 : n_rows * OC / 4;
        escha_xh_targets t = {};
        t.t[0] = { v, xh.get(), (float4 *) mid.get(), n_mid4 };
        if (pair) {
            t.t[1] = { v1, xh.get() + n_rows * IC, (float4 *) (mid.get() + n_rows * OC), n_mid4 };
        }
        for (int j = 0; j < n_share; j++) { // zeroed for any plan: the BLAS product overwrites it
            t.t[ops + j] = { escha_vecs_of(*share[j]), share_slot[j]->xh, (float4 *) share_slot[j]->mid, n_rows * share[j]->oc / 4 };
        }
        escha_kernel_launch(escha_xh_kernel, dim3((IC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy, (unsigned) (ops + n_share)), stream,
                            rows, t, n_rows, IC, early);
    }
    half  * op_xh  = own ? own->xh : xh.get();
    float * op_mid = own ? own->mid : mid.get();
    half  * op1_xh  = own1 ? own1->xh : xh.get() + n_rows * IC; // a pair's second op
    float * op1_mid = own1 ? own1->mid : mid.get() + n_rows * OC;

    escha_mm_args a = {};
    a.code     = (const uint32_t *) op.code->data;
    a.code_es  = (int64_t) (op.code_nb_e / sizeof(uint32_t));
    a.xh       = plan.fused ? nullptr : op_xh;
    a.mid      = plan.fused ? fused_mid : op_mid;
    a.rows     = rows;
    a.v        = v;
    a.dst      = (float *) op.dst->data;
    a.arrive   = fused_arrive;
    a.KT       = IC / 16;
    a.NT       = OC / 16;
    a.IC       = IC;
    a.OC       = OC;
    a.n_rows   = n_rows;
    a.n_x      = (int) plan.n_x;
    a.mode     = plan.mode;
    a.code_early = plan.code_early && early;
    if (pair) {
        a.pair_x    = plan.n_x * plan.n_z;
        a.pair_code = (const uint32_t *) fu.second->code->data;
        a.pair_xh   = op1_xh;
        a.pair_mid  = op1_mid;
    }

    ggml_cuda_pool_alloc<int32_t> sorted(ctx.pool());
    ggml_cuda_pool_alloc<int32_t> src1_unused(ctx.pool());
    ggml_cuda_pool_alloc<int32_t> bounds(ctx.pool());
    if (plan.mode == ESCHA_CUDA_GROUPED) {
        sorted.alloc(n_rows);
        src1_unused.alloc(n_rows);
        bounds.alloc(op.n_expert + 1);
        ggml_cuda_launch_mm_ids_helper(rows.ids, src1_unused.get(), sorted.get(), bounds.get(), (int) op.n_expert, (int) op.n_tokens,
                                       (int) op.n_used, (int) rows.nx1.d, (int) rows.si1, (int) rows.nx1.d, false, stream);
        a.sorted  = sorted.get();
        a.bounds  = bounds.get();
        a.mblocks = plan.mblocks;
    }
    const int64_t n_z = plan.n_z, z_busy = plan.z_busy;

    // The multiply of one op's args m (K = k), or of a pair's two ops in one
    // launch (m.pair_x set, one K).
    auto multiply = [&](const escha_mm_args & m, const int k) {
        if (plan.family == ESCHA_CUDA_BLAS) {
            escha_decode_then_blas(ctx, k, m, stream);
            return;
        }
#ifdef GGML_USE_HIP
        if (k == 2) {
            escha_launch_mm<2, 2, 1, false>(m, n_z, z_busy, nsm, stream);
        } else {
            escha_launch_mm<3, 2, 1, false>(m, n_z, z_busy, nsm, stream);
        }
#else
        if (plan.family == ESCHA_CUDA_SIMT) {
            if (k == 2) {
                escha_launch_mm<2, 2, 1, false>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_mm<3, 2, 1, false>(m, n_z, z_busy, nsm, stream);
            }
        } else if (plan.family == ESCHA_CUDA_MMA) {
            if (k == 2) {
                escha_launch_mm<2, 2, 4, true>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_mm<3, 2, 4, true>(m, n_z, z_busy, nsm, stream);
            }
        } else if (plan.fused) {
            if (plan.ntw == 2) {
                if (k == 2) {
                    escha_launch_gemv<2, 2, 1, true>(m, n_z, z_busy, nsm, stream);
                } else {
                    escha_launch_gemv<3, 2, 1, true>(m, n_z, z_busy, nsm, stream);
                }
            } else if (k == 2) {
                escha_launch_gemv<2, 4, 1, true>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_gemv<3, 4, 1, true>(m, n_z, z_busy, nsm, stream);
            }
        } else if (plan.nb == 1 && plan.ntw == 8) {
            if (k == 2) {
                escha_launch_gemv<2, 8, 1>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_gemv<3, 8, 1>(m, n_z, z_busy, nsm, stream);
            }
        } else if (plan.nb == 1) {
            if (k == 2) {
                escha_launch_gemv<2, 4, 1>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_gemv<3, 4, 1>(m, n_z, z_busy, nsm, stream);
            }
        } else if (plan.nb == 2) {
            if (k == 2) {
                escha_launch_gemv<2, 4, 2>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_gemv<3, 4, 2>(m, n_z, z_busy, nsm, stream);
            }
        } else {
            if (k == 2) {
                escha_launch_gemv<2, 4, 4>(m, n_z, z_busy, nsm, stream);
            } else {
                escha_launch_gemv<3, 4, 4>(m, n_z, z_busy, nsm, stream);
            }
        }
#endif
    };
    if (!pair) {
        multiply(a, K);
    } else if (fu.second->k == K && plan.family != ESCHA_CUDA_BLAS) {
        multiply(a, K); // both ops' blocks in one launch
    } else {
        // Weights of two code widths (the published 27B's gate K=2, up K=3),
        // or the BLAS path: a multiply each.
        escha_mm_args a0 = a, a1 = a;
        a0.pair_x = a1.pair_x = 0;
        a1.code = a.pair_code;
        a1.xh   = a.pair_xh;
        a1.mid  = a.pair_mid;
        multiply(a0, K);
        multiply(a1, fu.second->k);
    }
    if (plan.fused) {
        return; // the kernel applied the output transform
    }

    escha_epilogue ep = {};
    ep.kind = fu.kind;
    ep.add  = fu.add;
    ep.mid1 = pair ? op1_mid : nullptr;
    ep.v1   = v1;
    escha_xh_target next = {};
    if (next_slot) {
        next = { escha_vecs_of(fu.next), next_slot->xh, (float4 *) next_slot->mid, n_rows * fu.next.oc / 4 };
    }
    float * dst = fu.dst ? fu.dst : (float *) op.dst->data;
    escha_kernel_launch(escha_out_kernel, dim3((OC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy, 1), stream,
                        rows, v, (const float *) op_mid, dst, n_rows, OC, early, ep, next);
    for (escha_ahead_slot * s : { own, own1 }) {
        if (s) {
            s->node = nullptr; // read by the kernels above; a later writer waits for them
        }
    }
}

static escha_op escha_cuda_parse_or_abort(const ggml_tensor * dst) {
    escha_op op;
    char err[256];
    if (escha_cuda_parse(dst, &op, err, sizeof err) != nullptr) {
        GGML_ABORT("%s: %s", ggml_op_name(dst->op), err);
    }
    return op;
}

void ggml_cuda_op_escha_linear(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const escha_op op = escha_cuda_parse_or_abort(dst);
    if (escha_ahead_on(ctx)) {
        // What ggml_cuda_escha_try_fuse planned for this node, if anything.
        escha_ahead_state & st = escha_ahead_of(ggml_cuda_get_device(), ctx.stream());
        if (st.planned == dst) {
            st.planned = nullptr;
            escha_forward(ctx, op, st.planned_fu);
            return;
        }
    }
    escha_forward(ctx, op);
}

void ggml_cuda_op_escha_moe(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    escha_forward(ctx, escha_cuda_parse_or_abort(dst));
}

// ---- graph fusion --------------------------------------------------------------

// Whether node j of the graph is computed and used once, not an output and,
// unless view_ok, not a view: what a node whose result a fusion never
// writes must be (ggml_node_has_n_uses, with views allowed where asked).
static bool escha_used_once(const ggml_cgraph * cgraph, const int j, const bool view_ok) {
    const ggml_tensor * t = cgraph->nodes[j];
    return (t->flags & GGML_TENSOR_FLAG_COMPUTE) && !(t->flags & GGML_TENSOR_FLAG_OUTPUT) && ggml_node_get_use_count(cgraph, j) == 1 &&
           (view_ok || t->view_src == nullptr);
}

// An f32 tensor laid out as the op's dense output: contiguous, n elements.
static bool escha_like_output(const ggml_tensor * t, const int64_t n) {
    return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && ggml_nelements(t) == n;
}

// Parses node j as a dense escha op whose kernels can take a fusion (not
// the fused one-launch kernel, which writes its own outputs).
static bool escha_fusable(const ggml_tensor * t, escha_op & op) {
    char err[256];
    return t->op == GGML_OP_ESCHA_LINEAR && escha_cuda_parse(t, &op, err, sizeof err) == nullptr && !op.moe &&
           op.dst->type == GGML_TYPE_F32 && ggml_is_contiguous(op.dst) && !escha_plan_of(op, escha_fused_max_rows()).fused;
}

// Whether node j of the graph runs nothing (ggml-cuda skips it).
static bool escha_noop(const ggml_tensor * t) {
    return !(t->flags & GGML_TENSOR_FLAG_COMPUTE) || ggml_is_empty(t) || t->op == GGML_OP_NONE || t->op == GGML_OP_RESHAPE ||
           t->op == GGML_OP_VIEW || t->op == GGML_OP_PERMUTE || t->op == GGML_OP_TRANSPOSE;
}

// Whether t's bytes may overlap u's (either without memory: yes).
static bool escha_overlaps(const ggml_tensor * t, const ggml_tensor * u) {
    if (t->data == nullptr || u->data == nullptr) {
        return true;
    }
    const char * t0 = (const char *) t->data, * u0 = (const char *) u->data;
    return t0 < u0 + ggml_nbytes(u) && u0 < t0 + ggml_nbytes(t);
}

// Nodes i, i + 1, i + 2 as a gate op, an up op of the same input and shape
// (either order) and SWIGLU(gate, up), as llama.cpp's FFN builds them: a
// and b parsed (node i, node i + 1), gate_first set.
static bool escha_pair_at(const ggml_cgraph * cgraph, const int i, escha_op & a, escha_op & b, bool & gate_first) {
    if (i + 2 >= cgraph->n_nodes || !escha_fusable(cgraph->nodes[i], a) || !escha_fusable(cgraph->nodes[i + 1], b)) {
        return false;
    }
    const ggml_tensor * glu = cgraph->nodes[i + 2];
    const ggml_tensor * n0  = cgraph->nodes[i];
    const ggml_tensor * n1  = cgraph->nodes[i + 1];
    gate_first = glu->src[0] == n0;
    return glu->op == GGML_OP_GLU && ggml_get_glu_op(glu) == GGML_GLU_OP_SWIGLU && (glu->flags & GGML_TENSOR_FLAG_COMPUTE) &&
           ggml_get_op_params_i32(glu, 1) == 0 && glu->src[1] != nullptr &&
           ((glu->src[0] == n0 && glu->src[1] == n1) || (glu->src[0] == n1 && glu->src[1] == n0)) &&
           escha_used_once(cgraph, i, false) && escha_used_once(cgraph, i + 1, false) && b.x == a.x && b.ic == a.ic &&
           b.oc == a.oc && b.n_slots == a.n_slots && escha_like_output(glu, a.n_slots * a.oc) && ggml_are_same_shape(glu, n0);
}

// Node i's op (a, n_out outputs), views that only reshape it, then an ADD
// of a tensor of the same shape (a residual): the output transform writes
// the sum; or a SILU of it and a MUL by a tensor of the same shape (the
// gate of Qwen3.5's gated norm): the output transform writes the product.
// On a match: fu's kind, operand and output, and last, the MUL or ADD node.
static bool escha_epilogue_at(const ggml_cgraph * cgraph, const int i, const int64_t n_out, escha_fusion & fu, int & last) {
    int j = i + 1;
    const ggml_tensor * prev = cgraph->nodes[i];
    if (!escha_used_once(cgraph, i, false)) {
        return false;
    }
    while (j < cgraph->n_nodes && (cgraph->nodes[j]->op == GGML_OP_RESHAPE || cgraph->nodes[j]->op == GGML_OP_VIEW)) {
        const ggml_tensor * view = cgraph->nodes[j];
        if (view->src[0] != prev || view->data != prev->data || !escha_like_output(view, n_out) ||
            !escha_used_once(cgraph, j, true)) {
            return false;
        }
        prev = view;
        j++;
    }
    int kind = ESCHA_EPI_ADD;
    if (j < cgraph->n_nodes && cgraph->nodes[j]->op == GGML_OP_UNARY && ggml_get_unary_op(cgraph->nodes[j]) == GGML_UNARY_OP_SILU) {
        const ggml_tensor * silu = cgraph->nodes[j];
        if (silu->src[0] != prev || !escha_like_output(silu, n_out) || !ggml_are_same_shape(silu, prev) ||
            !escha_used_once(cgraph, j, false)) {
            return false;
        }
        kind = ESCHA_EPI_SILU_MUL;
        prev = silu;
        j++;
    }
    if (j >= cgraph->n_nodes) {
        return false;
    }
    const ggml_tensor * node = cgraph->nodes[j];
    if (node->op != (kind == ESCHA_EPI_ADD ? GGML_OP_ADD : GGML_OP_MUL) || !(node->flags & GGML_TENSOR_FLAG_COMPUTE) ||
        (node->src[0] == prev) == (node->src[1] == prev)) {
        return false;
    }
    const ggml_tensor * other = node->src[0] == prev ? node->src[1] : node->src[0];
    if (!escha_like_output(node, n_out) || !escha_like_output(other, n_out) || !ggml_are_same_shape(node, other) ||
        !ggml_are_same_shape(node, prev)) {
        return false;
    }
    fu.kind = kind;
    fu.add  = (const float *) other->data;
    fu.dst  = (float *) node->data;
    last    = j;
    return true;
}

// The escha ops after node `last` that read x's memory, each parsed into
// ops[] by takes(j, op) (false ends the scan), up to the first other escha
// op or the first node that writes x's memory, at most max: the ops whose
// input transform an earlier launch can run (escha_plan_ahead's share,
// escha_try_fuse_norm). Gives their number.
template <typename Takes>
static int escha_readers_after(const ggml_cgraph * cgraph, const int last, const ggml_tensor * x, escha_op * ops, const int max,
                               Takes takes) {
    int n = 0;
    for (int j = last + 1; j < cgraph->n_nodes && n < max; j++) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (escha_noop(t)) {
            continue;
        }
        if (t->op == GGML_OP_ESCHA_LINEAR || t->op == GGML_OP_ESCHA_MOE) {
            if (!takes(j, ops[n])) {
                break;
            }
            n++;
            continue;
        }
        if (escha_overlaps(t, x)) {
            break;
        }
    }
    return n;
}

// The ahead state of this device and stream as of node i of cgraph, or
// nullptr (escha_ahead_on is false). The slots belong to one graph
// evaluation: a new one (another graph, or this one from its start again)
// frees them all.
static escha_ahead_state * escha_ahead_at(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i) {
    if (!escha_ahead_on(ctx)) {
        return nullptr;
    }
    escha_ahead_state * st = &escha_ahead_of(ggml_cuda_get_device(), ctx.stream());
    if (cgraph != st->cgraph || i <= st->last_i) {
        for (escha_ahead_slot & s : st->slot) {
            s.node = nullptr;
        }
    }
    st->cgraph  = cgraph;
    st->last_i  = i;
    st->planned = nullptr;
    return st;
}

// Nodes i and i + 1 as an RMS_NORM of f32 rows and a MUL of the result by
// a per-channel f32 weight (llama.cpp's norms), whose product y later escha
// ops read: escha_norm_xh_kernel computes the norm, y and those ops' input
// transforms in one launch, in place of the norm's launch and each op's
// own input transform (GGML_ESCHA_NORM_FUSION=0 turns it off, for
// measuring). The ops: dense ones of up to ESCHA_CUDA_GEMV_MAX_ROWS rows
// whose x is exactly y (a SWIGLU pair's both), after the MUL up to the
// first other escha op or the first node that writes y's memory,
// ESCHA_XH_OPS at most, each with an ahead slot claimed for it; none:
// upstream's kernels run the norm. Gives 1 (the MUL computed too) or 0.
// y may not overlap x (each warp stores its part of y while others may
// still read the row), and x's rows must be 16-byte aligned (the kernel's
// vector loads).
static int escha_try_fuse_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i) {
    static const bool off = escha_env_off("GGML_ESCHA_NORM_FUSION");
    if (off || i + 1 >= cgraph->n_nodes) {
        return 0;
    }
    const ggml_tensor * norm = cgraph->nodes[i];
    ggml_tensor * mul = cgraph->nodes[i + 1];
    const ggml_tensor * x = norm->src[0];
    if (norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || !(mul->flags & GGML_TENSOR_FLAG_COMPUTE) ||
        (mul->src[0] == norm) == (mul->src[1] == norm)) {
        return 0;
    }
    const ggml_tensor * w = mul->src[0] == norm ? mul->src[1] : mul->src[0];
    const int64_t IC = norm->ne[0], n_rows = ggml_nrows(norm);
    auto aligned = [](const ggml_tensor * t) {
        return (uintptr_t) t->data % 16 == 0 && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 && t->nb[3] % 16 == 0;
    };
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || x->data == nullptr || !aligned(x) || IC % 128 != 0 ||
        IC > INT32_MAX || n_rows == 0 || n_rows > ESCHA_CUDA_GEMV_MAX_ROWS || w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w) ||
        w->ne[0] != IC || ggml_nelements(w) != IC || !escha_like_output(mul, n_rows * IC) || !ggml_are_same_shape(mul, norm) ||
        !escha_used_once(cgraph, i, false) || escha_overlaps(mul, x)) {
        return 0;
    }
    escha_ahead_state * st = escha_ahead_at(ctx, cgraph, i);
    if (st == nullptr) {
        return 0;
    }
    escha_op ops[ESCHA_XH_OPS];
    const int n_ops = escha_readers_after(cgraph, i + 1, mul, ops, ESCHA_XH_OPS, [&](const int j, escha_op & c) {
        return escha_fusable(cgraph->nodes[j], c) && c.x->data == mul->data && c.x->type == GGML_TYPE_F32 && ggml_is_contiguous(c.x) &&
               c.ic == IC && c.n_slots == n_rows;
    });
    cudaStream_t stream = ctx.stream();
    bool early = escha_early_allowed() && escha_is_weight(w);
    escha_xh_targets t = {};
    int n = 0;
    for (int k = 0; k < n_ops; k++) {
        const escha_op & c = ops[k];
        escha_ahead_slot * slot = escha_ahead_claim(*st, c.dst, (size_t) (n_rows * IC), (size_t) (n_rows * c.oc), stream);
        if (slot) {
            t.t[n++] = { escha_vecs_of(c), slot->xh, (float4 *) slot->mid, n_rows * c.oc / 4 };
            early = early && escha_op_weights_only(c);
        }
    }
    if (n == 0) {
        return 0;
    }
    float eps;
    memcpy(&eps, norm->op_params, sizeof(float));
    const escha_rows rows = escha_dense_rows(x);
    escha_kernel_launch(escha_norm_xh_kernel, dim3((unsigned) ((IC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS), (unsigned) n_rows, (unsigned) n),
                        stream, rows, (const float *) w->data, (float *) mul->data, eps, t, n_rows, (int) IC, early);
    return 1;
}

// Whether node j is a dense op that can take its input transform from an
// earlier op's launches (escha_fusable, and not the first op of a SWIGLU
// pair, which runs its pair's), parsed into c.
static bool escha_ahead_target(const ggml_cgraph * cgraph, const int j, escha_op & c) {
    escha_op a, b;
    bool gate_first;
    return escha_fusable(cgraph->nodes[j], c) && !escha_pair_at(cgraph, j, a, b, gate_first);
}

// The later ops whose input transform op a's launches run (escha_fusion's
// share and next): a's fusion ends at node last, and its output transform
// writes out.
// - share: the ops of a's x (same tensor layout and rows) from node last
//   on, up to the first other escha op or the first node that writes x's
//   memory: a's input transform runs theirs too (grid z). Not for a pair,
//   nor when an earlier op ran a's (it ran these too, where it could).
// - next: the first escha op after last, if its x is exactly out (its
//   rows the output transform's rows) and no node between writes out's
//   memory: the output transform runs its input transform.
// Each such op is dense, of up to ESCHA_CUDA_GEMV_MAX_ROWS rows, and runs
// on this stream, where the nodes between run in order.
static void escha_plan_ahead(const ggml_cgraph * cgraph, const int last, const escha_op & a, const ggml_tensor * out,
                             escha_ahead_state & st, escha_fusion & fu) {
    if (fu.second == nullptr && escha_ahead_find(st, a.dst) == nullptr) {
        fu.n_share = escha_readers_after(cgraph, last, a.x, fu.share, ESCHA_SHARE_MAX, [&](const int j, escha_op & c) {
            return escha_ahead_target(cgraph, j, c) && c.n_slots == a.n_slots && c.x->data == a.x->data && c.x->type == a.x->type &&
                   ggml_are_same_shape(c.x, a.x) && ggml_are_same_stride(c.x, a.x);
        });
    }
    for (int j = last + 1; j < cgraph->n_nodes; j++) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (escha_noop(t)) {
            continue;
        }
        if (t->op == GGML_OP_ESCHA_LINEAR || t->op == GGML_OP_ESCHA_MOE) {
            escha_op c;
            if (escha_ahead_target(cgraph, j, c) && c.x->data == out->data && c.x->type == GGML_TYPE_F32 &&
                ggml_is_contiguous(c.x) && c.ic == a.oc && c.n_slots == a.n_slots) {
                fu.next     = c;
                fu.has_next = true;
            }
            return;
        }
        if (escha_overlaps(t, out)) {
            return;
        }
    }
}

// Why no memory-range check for the fused nodes (upstream's fusions make
// one): the fused
// sequence reads x only in its input transform and writes the last node's
// output only in its output transform, after the multiply, which waits for
// the input transform; that kernel reads the ADD / MUL operand at the very
// element each thread then writes. So the allocator's reuse of x's or the
// operand's memory for the output (in place) is safe. This holds while the
// output transform reads the operand after its wait and each thread stores
// only what it read, and while the one-launch kernel takes no fusion.
// Input transforms run ahead (escha_plan_ahead) do check: the nodes between
// the op and the later op must not write the later op's x.
// Like upstream's fusions, this runs on the node's stream; while
// GGML_CUDA_GRAPH_OPT runs branches on concurrent streams, no input
// transform runs ahead.
//
// At an RMS_NORM node, escha_try_fuse_norm; at an escha op, the fusions
// above. Gives the number of nodes after i that the launches computed too
// (0: node i runs as ggml-cuda runs it).
int ggml_cuda_escha_try_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i) {
    // GGML_ESCHA_GRAPH_FUSION=0 runs every node alone, for measuring.
    static const bool off = escha_env_off("GGML_ESCHA_GRAPH_FUSION");
    if (off) {
        return 0;
    }
    if (cgraph->nodes[i]->op == GGML_OP_RMS_NORM) {
        return escha_try_fuse_norm(ctx, cgraph, i);
    }
    escha_op a;
    if (!escha_fusable(cgraph->nodes[i], a)) {
        return 0;
    }
    const int64_t n_out = a.n_slots * a.oc;

    escha_ahead_state * st = escha_ahead_at(ctx, cgraph, i);
    if (st && a.n_slots > ESCHA_CUDA_GEMV_MAX_ROWS) {
        st = nullptr;
    }

    escha_fusion fu;
    int last = i;                              // the fusion's last node
    const ggml_tensor * out = cgraph->nodes[i]; // what its output transform writes
    const escha_op * first = &a;

    // A gate and an up op of one input, then SWIGLU(gate, up): one input
    // transform, one multiply and one output transform that writes the
    // SWIGLU's result (as llama.cpp's FFN builds it: gate, up, SWIGLU).
    escha_op b;
    bool gate_first = true;
    if (escha_pair_at(cgraph, i, a, b, gate_first)) {
        fu.second = gate_first ? &b : &a;
        first     = gate_first ? &a : &b;
        fu.kind   = ESCHA_EPI_SWIGLU;
        fu.dst    = (float *) cgraph->nodes[i + 2]->data;
        last      = i + 2;
        out       = cgraph->nodes[i + 2];
    } else {
        escha_epilogue_at(cgraph, i, n_out, fu, last);
        out = cgraph->nodes[last];
    }
    if (st) {
        escha_plan_ahead(cgraph, last, *first, out, *st, fu);
    }
    if (last > i) {
        escha_forward(ctx, *first, fu);
        return last - i;
    }
    if (st && (fu.n_share > 0 || fu.has_next)) {
        st->planned    = cgraph->nodes[i];
        st->planned_fu = fu;
    }
    return 0;
}
