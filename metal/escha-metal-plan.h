// escha-metal-plan.h: the host-side decisions for the escha Metal kernels
// (which kernels, grid and threadgroup sizes, threadgroup memory, argument
// struct, MoE scratch size), as plain C++ with no Metal or ggml dependency.
// ggml-metal-escha.cpp encodes exactly these dispatches; the Linux shim
// executor runs them, so the same plan is tested without a Mac.
#ifndef ESCHA_METAL_PLAN_H
#define ESCHA_METAL_PLAN_H

#include "escha-metal-args.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// The shapes of one escha op, as ggml describes them (ne/nb of the sources).
struct escha_metal_shape {
    bool     moe;
    int      k;          // from the code's ne[0] / 16
    int64_t  ic, oc;     // 16 * code ne[2], 16 * code ne[1]
    int64_t  n_expert;   // code ne[3] (1 for dense)
    int64_t  x_ne[4];    // x (src[1]) ne and nb (bytes)
    uint64_t x_nb[4];
    int64_t  n_used;     // MoE: ids ne[0]; dense: 1
    int64_t  n_tokens;   // MoE: ids ne[1]; dense: unused
    uint64_t ids_nb1;    // MoE: ids nb[1]
    int64_t  s_in_rows;  // rows of the optional sources: 0 = absent, 1 or n_expert
    int64_t  s_out_rows;
    int64_t  bias_rows;
};

// Buffer indices of the kernels (escha.metal uses the same numbers).
enum escha_metal_buffer {
    ESCHA_MTL_BUF_ARGS = 0,
    ESCHA_MTL_BUF_CODE,
    ESCHA_MTL_BUF_X,
    ESCHA_MTL_BUF_RIN,
    ESCHA_MTL_BUF_ROUT,
    ESCHA_MTL_BUF_S_IN,
    ESCHA_MTL_BUF_S_OUT,
    ESCHA_MTL_BUF_BIAS,
    ESCHA_MTL_BUF_DST,
    ESCHA_MTL_BUF_IDS,
    ESCHA_MTL_BUF_SCRATCH,
    ESCHA_MTL_BUF_COUNT,
};

struct escha_metal_dispatch {
    char   name[48];     // kernel function name in the library
    int    tg[3];        // threadgroups per grid
    int    tptg[3];      // threads per threadgroup
    size_t smem;         // threadgroup memory at index 0, bytes
};

struct escha_metal_plan {
    escha_metal_args     args;
    int                  n;          // dispatches, run in order with a memory barrier between them
    escha_metal_dispatch d[2];
    size_t               scratch;    // bytes after dst (MoE prefill slot lists), 0 if none
};

// MoE prefill scratch: counts[E+1] then E+1 slot lists of T*n_used int32.
static inline size_t escha_metal_moe_scratch_bytes(int64_t n_expert, int64_t n_used, int64_t n_tokens) {
    return (size_t) (n_expert + 1) * (size_t) (1 + n_used * n_tokens) * sizeof(int32_t);
}

// Rows (dense) or tokens (MoE) that the op multiplies: the batch size that
// decides offloading and the GEMV/prefill choice.
static inline int64_t escha_metal_batch(const escha_metal_shape * s) {
    return s->moe ? s->n_tokens : s->x_ne[1] * s->x_ne[2] * s->x_ne[3];
}

static inline void escha_metal_set_dispatch(escha_metal_dispatch * d, const char * kind, int k,
                                            int tg0, int tg1, int tg2, int t0, int t1, size_t smem) {
    snprintf(d->name, sizeof d->name, "kernel_escha_%s_k%d", kind, k);
    d->tg[0] = tg0;
    d->tg[1] = tg1;
    d->tg[2] = tg2;
    d->tptg[0] = t0;
    d->tptg[1] = t1;
    d->tptg[2] = 1;
    d->smem = smem;
}

// Kernel families; ESCHA_MTL_PATH_AUTO chooses by batch size.
enum escha_metal_path {
    ESCHA_MTL_PATH_AUTO = -1,
    ESCHA_MTL_PATH_GEMV = 0,
    ESCHA_MTL_PATH_PREFILL = 1,
    ESCHA_MTL_PATH_MMA = 2, // dense only
};

// Fills `p` for shape `s` on kernel family `path`. Returns false (with `p`
// untouched) for shapes the kernels do not take; supports_op rejects those
// first.
static inline bool escha_metal_make_plan(const escha_metal_shape * s, int path, escha_metal_plan * p) {
    if ((s->k != 2 && s->k != 3) || s->ic <= 0 || s->oc <= 0 || s->ic % 128 != 0 || s->oc % 128 != 0) {
        return false;
    }
    const int64_t batch = escha_metal_batch(s);
    if (batch <= 0 || batch > INT32_MAX / 2 || s->oc / 128 > 65535 || s->n_expert <= 0) {
        return false;
    }
    escha_metal_plan r;
    memset(&r, 0, sizeof r);
    escha_metal_args & a = r.args;
    a.k = s->k;
    a.ic = (int32_t) s->ic;
    a.oc = (int32_t) s->oc;
    a.nb11 = s->x_nb[1];
    a.nb12 = s->x_nb[2];
    a.nb13 = s->x_nb[3];
    a.n_expert = (int32_t) s->n_expert;
    a.code_es = (uint64_t) (s->ic / 16) * (uint64_t) (s->oc / 16) * (uint64_t) (32 * s->k);
    a.rin_es = (int32_t) s->ic;
    a.rout_es = (int32_t) s->oc;
    a.has_s_in = s->s_in_rows > 0;
    a.has_s_out = s->s_out_rows > 0;
    a.has_bias = s->bias_rows > 0;
    a.s_in_es = s->s_in_rows > 1 ? (int32_t) s->ic : 0;
    a.s_out_es = s->s_out_rows > 1 ? (int32_t) s->oc : 0;
    a.bias_es = s->bias_rows > 1 ? (int32_t) s->oc : 0;

    if (path == ESCHA_MTL_PATH_AUTO) {
        path = !s->moe && batch >= ESCHA_MTL_MMA_MIN ? ESCHA_MTL_PATH_MMA
             : batch >= ESCHA_MTL_PREFILL_MIN        ? ESCHA_MTL_PATH_PREFILL
                                                     : ESCHA_MTL_PATH_GEMV;
    }
    if (path < ESCHA_MTL_PATH_GEMV || path > ESCHA_MTL_PATH_MMA || (s->moe && path == ESCHA_MTL_PATH_MMA)) {
        return false;
    }
    const bool prefill = path == ESCHA_MTL_PATH_PREFILL;
    const int nob = (int) (s->oc / 128);
    const int threads = ESCHA_MTL_SIMD;
    const size_t smem_gemv = 2 * ESCHA_MTL_NSG * 128 * sizeof(float);
    const size_t smem_prefill = 2 * ESCHA_MTL_NR * 128 * sizeof(float);
    const size_t smem_mma = (ESCHA_MTL_NR_MMA + 16) * 128 * sizeof(float);
    const int chunks = (int) ((batch + ESCHA_MTL_NR - 1) / ESCHA_MTL_NR);
    const int chunks_mma = (int) ((batch + ESCHA_MTL_NR_MMA - 1) / ESCHA_MTL_NR_MMA);

    if (!s->moe) {
        a.nrows = (int32_t) batch;
        a.ne11 = (int32_t) s->x_ne[1];
        a.ne12 = (int32_t) s->x_ne[2];
        a.n_used = 1;
        r.n = 1;
        if (path == ESCHA_MTL_PATH_MMA) {
            escha_metal_set_dispatch(&r.d[0], "linear_mma", s->k, nob, chunks_mma, 1, threads, ESCHA_MTL_NSG, smem_mma);
        } else if (prefill) {
            escha_metal_set_dispatch(&r.d[0], "linear_prefill", s->k, nob, chunks, 1, threads, ESCHA_MTL_NSG, smem_prefill);
        } else {
            escha_metal_set_dispatch(&r.d[0], "linear_gemv", s->k, nob, (int) batch, 1, threads, ESCHA_MTL_NSG, smem_gemv);
        }
    } else {
        if (s->n_used <= 0 || s->x_ne[1] <= 0 || s->n_used % s->x_ne[1] != 0 || s->n_used > 65535) {
            return false;
        }
        a.nrows = (int32_t) s->n_tokens;
        a.ne11 = (int32_t) s->x_ne[1]; // NX
        a.ne12 = (int32_t) s->x_ne[2];
        a.n_used = (int32_t) s->n_used;
        a.nbi1 = s->ids_nb1;
        if (prefill) {
            a.slot_cap = (int32_t) (s->n_used * s->n_tokens);
            r.scratch = escha_metal_moe_scratch_bytes(s->n_expert, s->n_used, s->n_tokens);
            r.n = 2;
            escha_metal_set_dispatch(&r.d[0], "moe_map", 0, (int) ((s->n_expert + 1 + 31) / 32), 1, 1, 32, 1, 0);
            snprintf(r.d[0].name, sizeof r.d[0].name, "kernel_escha_moe_map");
            // One chunk of NR slots per token block and expert: with top-k
            // routing an expert serves each token at most once; more slots
            // per expert are covered by the kernel's chunk stride.
            escha_metal_set_dispatch(&r.d[1], "moe_prefill", s->k, nob, chunks, (int) s->n_expert + 1, threads,
                                     ESCHA_MTL_NSG, smem_prefill);
        } else {
            r.n = 1;
            escha_metal_set_dispatch(&r.d[0], "moe_gemv", s->k, nob, (int) s->n_used, (int) s->n_tokens, threads,
                                     ESCHA_MTL_NSG, smem_gemv);
        }
    }
    *p = r;
    return true;
}

#endif // ESCHA_METAL_PLAN_H
