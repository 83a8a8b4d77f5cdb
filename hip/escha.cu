// Escha-W2 ops for ggml-cuda and ggml-hip (escha-ggml).
//
// One linear (or one expert slot) runs in three kernels on the context's
// stream, with no host synchronisation (CUDA graphs stay valid):
//   1. escha_xh_kernel:  xh = f16(H128(x * rin_eff) * RS)      (per row),
//                        and mid = 0
//   2. mid += xh @ W, W decoded in registers and never stored; split over
//      IC, summed with f32 atomics: escha_gemv_kernel up to 16 rows per
//      weight (token generation), escha_mm_kernel above (prefill) and on
//      the SIMT path
//   3. escha_out_kernel: y = f16((H128(mid) * RS) * rout_eff) (+ bias)
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

#include <cstdlib>

// ---- host side ---------------------------------------------------------------

bool ggml_cuda_escha_supports_op(const ggml_tensor * op) {
    const bool moe = op->op == GGML_OP_ESCHA_MOE;
    const ggml_tensor * code = op->src[0];
    const ggml_tensor * x    = op->src[1];
    const int first = moe ? 3 : 2;
    if (code == nullptr || x == nullptr || op->src[first] == nullptr || op->src[first + 1] == nullptr) {
        return false;
    }
    if (code->type != GGML_TYPE_I16 || !ggml_is_contiguous(code) || (code->ne[0] != 32 && code->ne[0] != 48)) {
        return false;
    }
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    if (moe && (op->src[2]->type != GGML_TYPE_I32 || op->src[2]->nb[0] != sizeof(int32_t))) {
        return false;
    }
    for (int i = first; i < first + 2; i++) {
        if (op->src[i]->type != GGML_TYPE_F16 || !ggml_is_contiguous(op->src[i])) {
            return false;
        }
    }
    for (int i = first + 2; i < first + 5; i++) {
        if (op->src[i] && (op->src[i]->type != GGML_TYPE_F32 || !ggml_is_contiguous(op->src[i]))) {
            return false;
        }
    }
    return true;
}

// Elements per expert of an optional per-channel operand: 0 when one vector
// is shared by all experts (or the operand is absent).
static int64_t escha_expert_stride(const ggml_tensor * t) {
    return t == nullptr || ggml_nrows(t) == 1 ? 0 : t->ne[0];
}

// Launches a decode-and-multiply kernel over n_z groups, of which about
// z_busy have rows. IC is split until the grid fills two waves of resident
// blocks (more blocks in flight hide the load -> decode -> mma latency; on
// the H200 two waves beat one by 11% at 5120 -> 17408, hip/bench), keeping
// at least 8 tile rows per split. per_sm: the kernel's resident blocks per
// SM (its registers decide), asked once.
static void escha_launch(void (*kernel)(escha_mm_args), int & per_sm, escha_mm_args a, const int64_t n_z, const int64_t z_busy,
                         const int nsm, cudaStream_t stream) {
    if (per_sm == 0) {
        int n = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, ESCHA_THREADS, 0));
        per_sm = std::max(n, 1);
    }
    escha_consts_fill(a.dc);
    const int64_t resident = (int64_t) per_sm * nsm;
    const int64_t blocks   = a.n_x * std::max<int64_t>(z_busy, 1);
    int ksplit = (int) std::max<int64_t>(1, std::min<int64_t>(2 * resident / blocks, a.KT / 8));
    a.kt_chunk = (a.KT + ksplit - 1) / ksplit;
    ksplit     = (a.KT + a.kt_chunk - 1) / a.kt_chunk;
    GGML_ASSERT(a.n_x * n_z < INT32_MAX && ksplit <= 65535);
    const dim3 grid((unsigned) (a.n_x * n_z), (unsigned) ksplit, 1);
    kernel<<<grid, ESCHA_THREADS, 0, stream>>>(a);
}

template <int K, int NTW, int MT, bool MMA>
static void escha_launch_mm(const escha_mm_args & a, const int64_t n_z, const int64_t z_busy, const int nsm, cudaStream_t stream) {
    static int per_sm = 0;
    escha_launch(escha_mm_kernel<K, NTW, MT, MMA>, per_sm, a, n_z, z_busy, nsm, stream);
}

template <int K, int NTW, int NB>
static void escha_launch_gemv(const escha_mm_args & a, const int64_t n_z, const int64_t z_busy, const int nsm, cudaStream_t stream) {
    static int per_sm = 0;
    escha_launch(escha_gemv_kernel<K, NTW, NB>, per_sm, a, n_z, z_busy, nsm, stream);
}

// Runs the three stages for n_rows op rows. moe: ids given (mode 1 or 2).
static void escha_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const escha_rows & rows, const int64_t n_rows,
                          const escha_vecs & v, const int64_t n_expert, const int64_t n_tokens) {
    const ggml_tensor * code = dst->src[0];
    const int K  = ggml_get_op_params_i32(dst, 0);
    const int IC = (int) (code->ne[2] * 16);
    const int OC = (int) (code->ne[1] * 16);
    cudaStream_t stream = ctx.stream();
    if (n_rows == 0) {
        return;
    }
    GGML_ASSERT(K == 2 || K == 3);

    ggml_cuda_pool_alloc<half>  xh(ctx.pool(), n_rows * IC);
    ggml_cuda_pool_alloc<float> mid(ctx.pool(), n_rows * OC);

    const unsigned gy = (unsigned) std::min<int64_t>(n_rows, 65535);
    escha_xh_kernel<<<dim3((IC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy, 1), ESCHA_THREADS, 0, stream>>>(
        rows, v, xh.get(), n_rows, IC, (float4 *) mid.get(), n_rows * OC / 4);

    const int id = ggml_cuda_get_device();
    const int cc = ggml_cuda_info().devices[id].cc;
    const int nsm = ggml_cuda_info().devices[id].nsm;
#ifdef GGML_USE_HIP
    const bool use_mma = false;
    GGML_UNUSED(cc);
#else
    // GGML_ESCHA_SIMT=1 forces the SIMT path (the one HIP runs), for testing it on NVIDIA.
    static const bool force_simt = getenv("GGML_ESCHA_SIMT") != nullptr;
    const bool use_mma = !force_simt && GGML_CUDA_CC_IS_NVIDIA(cc) && ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_AMPERE;
#endif

    escha_mm_args a = {};
    a.code    = (const uint32_t *) code->data;
    a.code_es = code->ne[2] * code->ne[1] * 8 * K;
    a.xh      = xh.get();
    a.mid     = mid.get();
    a.KT      = IC / 16;
    a.NT      = OC / 16;
    a.IC      = IC;
    a.OC      = OC;
    a.n_rows  = n_rows;
    a.n_expert = n_expert;

    // Rows per group: dense ops share one weight over all rows; an MoE op
    // at decode batch sizes runs each slot on its own (no grouping pass),
    // larger batches group the slots by expert on the device.
    const bool    moe     = rows.ids != nullptr;
    const int64_t n_used  = moe ? rows.ne1 : 1;
    const bool    direct  = moe && n_tokens <= 8;
    const int64_t per_grp = !moe ? n_rows : (direct ? 1 : n_tokens);
    // mma: up to 16 rows per group the token-generation kernel (8 or 16
    // rows a block), above it the prefill kernel (64); SIMT: 16.
    const bool    big     = use_mma && per_grp > 16;
    const int     NB      = per_grp <= 8 ? 1 : 2;
    const int     ROWS    = !use_mma ? 16 : (big ? 64 : NB * 8);
    const int     NTW     = !use_mma || big ? 2 : 4;
    a.n_x = (a.NT + NTW * ESCHA_WARPS - 1) / (NTW * ESCHA_WARPS);

    ggml_cuda_pool_alloc<int32_t> sorted(ctx.pool());
    ggml_cuda_pool_alloc<int32_t> src1_unused(ctx.pool());
    ggml_cuda_pool_alloc<int32_t> bounds(ctx.pool());
    int64_t n_z, z_busy;
    if (!moe) {
        a.mode = 0;
        n_z = z_busy = (n_rows + ROWS - 1) / ROWS;
    } else if (direct) {
        a.mode   = 1;
        a.ids    = rows.ids;
        a.n_used = (int) n_used;
        a.si1    = rows.si1;
        n_z = z_busy = n_rows;
    } else {
        a.mode = 2;
        sorted.alloc(n_rows);
        src1_unused.alloc(n_rows);
        bounds.alloc(n_expert + 1);
        ggml_cuda_launch_mm_ids_helper(rows.ids, src1_unused.get(), sorted.get(), bounds.get(), (int) n_expert, (int) n_tokens,
                                       (int) n_used, (int) rows.nx1, (int) rows.si1, (int) rows.nx1, false, stream);
        a.sorted  = sorted.get();
        a.bounds  = bounds.get();
        a.mblocks = (int) ((n_tokens + ROWS - 1) / ROWS);
        n_z    = n_expert * a.mblocks;
        z_busy = std::min<int64_t>(n_expert, n_rows) + n_rows / ROWS;
    }

#ifdef GGML_USE_HIP
    if (K == 2) {
        escha_launch_mm<2, 2, 1, false>(a, n_z, z_busy, nsm, stream);
    } else {
        escha_launch_mm<3, 2, 1, false>(a, n_z, z_busy, nsm, stream);
    }
#else
    if (!use_mma) {
        if (K == 2) {
            escha_launch_mm<2, 2, 1, false>(a, n_z, z_busy, nsm, stream);
        } else {
            escha_launch_mm<3, 2, 1, false>(a, n_z, z_busy, nsm, stream);
        }
    } else if (big) {
        if (K == 2) {
            escha_launch_mm<2, 2, 4, true>(a, n_z, z_busy, nsm, stream);
        } else {
            escha_launch_mm<3, 2, 4, true>(a, n_z, z_busy, nsm, stream);
        }
    } else if (NB == 1) {
        if (K == 2) {
            escha_launch_gemv<2, 4, 1>(a, n_z, z_busy, nsm, stream);
        } else {
            escha_launch_gemv<3, 4, 1>(a, n_z, z_busy, nsm, stream);
        }
    } else {
        if (K == 2) {
            escha_launch_gemv<2, 4, 2>(a, n_z, z_busy, nsm, stream);
        } else {
            escha_launch_gemv<3, 4, 2>(a, n_z, z_busy, nsm, stream);
        }
    }
#endif

    escha_out_kernel<<<dim3((OC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, gy, 1), ESCHA_THREADS, 0, stream>>>(
        rows, v, mid.get(), (float *) dst->data, n_rows, OC);
}

static escha_vecs escha_get_vecs(const ggml_tensor * dst, const int first) {
    const ggml_tensor * rin   = dst->src[first + 0];
    const ggml_tensor * rout  = dst->src[first + 1];
    const ggml_tensor * s_in  = dst->src[first + 2];
    const ggml_tensor * s_out = dst->src[first + 3];
    const ggml_tensor * bias  = dst->src[first + 4];
    escha_vecs v;
    v.rin   = (const half *) rin->data;                       v.rin_es   = escha_expert_stride(rin);
    v.rout  = (const half *) rout->data;                      v.rout_es  = escha_expert_stride(rout);
    v.s_in  = s_in  ? (const float *) s_in->data  : nullptr;  v.s_in_es  = escha_expert_stride(s_in);
    v.s_out = s_out ? (const float *) s_out->data : nullptr;  v.s_out_es = escha_expert_stride(s_out);
    v.bias  = bias  ? (const float *) bias->data  : nullptr;  v.bias_es  = escha_expert_stride(bias);
    return v;
}

void ggml_cuda_op_escha_linear(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[1];
    escha_rows rows;
    rows.x   = (const char *) x->data;
    rows.nb1 = x->nb[1];
    rows.nb2 = x->nb[2];
    rows.nb3 = x->nb[3];
    rows.ne1 = x->ne[1];
    rows.ne2 = x->ne[2];
    rows.nx1 = x->ne[1];
    rows.ids = nullptr;
    rows.si1 = 0;
    rows.n_expert = 1;
    escha_forward(ctx, dst, rows, x->ne[1] * x->ne[2] * x->ne[3], escha_get_vecs(dst, 2), 1, 1);
}

void ggml_cuda_op_escha_moe(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * code = dst->src[0];
    const ggml_tensor * x    = dst->src[1];
    const ggml_tensor * ids  = dst->src[2];
    const int64_t n_used   = ids->ne[0];
    const int64_t n_tokens = ids->ne[1];
    escha_rows rows;
    rows.x   = (const char *) x->data;
    rows.nb1 = x->nb[1];
    rows.nb2 = x->nb[2];
    rows.nb3 = 0;
    rows.ne1 = n_used;
    rows.ne2 = n_tokens;
    rows.nx1 = x->ne[1];
    rows.ids = (const int32_t *) ids->data;
    rows.si1 = ids->nb[1] / sizeof(int32_t);
    rows.n_expert = code->ne[3];
    escha_forward(ctx, dst, rows, n_used * n_tokens, escha_get_vecs(dst, 3), code->ne[3], n_tokens);
}
