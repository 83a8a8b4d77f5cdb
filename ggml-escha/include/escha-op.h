/*
 * escha-op.h: what a GGML_OP_ESCHA_LINEAR / GGML_OP_ESCHA_MOE node is, for
 * every backend. The op constructors (ops/ggml-escha-ops.c) build nodes by
 * this description; the CPU glue, CUDA/HIP and Metal read them through
 * escha_op_parse, which each backend's supports_op and compute call first,
 * so the operand layout, the per-expert strides, the shape rule and the
 * expert-id policy have one home in C (the Rust statement of the shape rule
 * is src/validate.rs).
 *
 * Header-only (static inline), C99 and C++; needs ggml.h.
 */
#ifndef ESCHA_OP_H
#define ESCHA_OP_H

#include "escha-format.h"
#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- source slots ----------------------------------------------------------
 * src[0] code  I16 [16K, OC/16, IC/16] (dense) or [16K, OC/16, IC/16, E] (MoE)
 * src[1] x     F32, rows contiguous: dense [IC, ...] (any rows), MoE [IC, NX, T]
 * src[2] ids   I32 [n_used, T] (MoE only)
 * then the per-channel vectors, from escha_vec_slot(moe): rin, rout (F16,
 * required), s_in, s_out, bias (F32, optional: NULL). Each vector has one row
 * per expert, or (optional ones of MoE) one row shared by all experts.
 */
enum escha_src_slot {
    ESCHA_SRC_CODE = 0,
    ESCHA_SRC_X = 1,
    ESCHA_SRC_IDS = 2,
};

enum escha_vec_id {
    ESCHA_VEC_RIN = 0,
    ESCHA_VEC_ROUT,
    ESCHA_VEC_S_IN,
    ESCHA_VEC_S_OUT,
    ESCHA_VEC_BIAS,
    ESCHA_VEC_COUNT,
};

/* The source slot of vector v. */
static inline int escha_vec_slot(bool moe, int v) {
    return (moe ? 3 : 2) + v;
}

/* ---- op parameters (int32 op_params) --------------------------------------- */
enum escha_param {
    ESCHA_PARAM_K = 0,        /* bits per weight: 2 or 3 (= code ne[0] / 16) */
    ESCHA_PARAM_CODEBOOK = 1, /* codebook id: ESCHA_CODEBOOK_CBA */
    ESCHA_PARAM_HAS_BIAS = 2, /* 1 when the bias source is set */
};

/* ---- expert ids ------------------------------------------------------------
 * An id outside [0, n_expert) is bad graph input. A host backend stops with
 * an error naming the op's code tensor. A device kernel, which cannot stop,
 * reads nothing with it and writes NaN (ESCHA_BAD_EXPERT_F32_BITS, in
 * escha-format.h for the kernels) to that slot's whole output row, never
 * another expert's result.
 */

static inline bool escha_expert_ok(int64_t e, int64_t n_expert) {
    return e >= 0 && e < n_expert;
}

/* ---- the parsed node ------------------------------------------------------- */
typedef struct escha_vec {
    const struct ggml_tensor * t; /* NULL: an optional vector left out */
    int64_t rows;                 /* 0 absent, 1 shared by all experts, else n_expert */
    int64_t es;                   /* elements from one expert's vector to the next; 0 shared */
    size_t  nb_e;                 /* the same in bytes */
} escha_vec;

typedef struct escha_op {
    bool moe;
    int  k;
    int  codebook;
    int64_t ic, oc, n_expert;     /* n_expert 1 for dense */
    const struct ggml_tensor * code, * x, * ids, * dst;
    size_t    code_nb_e;          /* bytes from one expert's code to the next */
    escha_vec vec[ESCHA_VEC_COUNT];
    /* Output rows ("slots"). Dense: every row of x, expert 0 (n_used = nx =
     * 1, n_tokens = rows of x). MoE: slot t*n_used + u is expert ids[t][u] on
     * x row (u % nx) of token t. dst row s is dst + s*OC. */
    int64_t n_used, nx, n_tokens, n_slots;
} escha_op;

/* ---- the shape rule --------------------------------------------------------
 * Whether code, x, ids (MoE) and the vectors form an escha op; on failure a
 * message naming the operand goes to err. The op constructors abort with it;
 * escha_op_parse refuses the node with it.
 */
static inline const char * escha_tname_(const struct ggml_tensor * t) {
    return t && t->name[0] ? t->name : "(unnamed)";
}

static inline bool escha_check_vec_(const char * what, const struct ggml_tensor * t, enum ggml_type type, int64_t n,
                                    int64_t n_expert, bool shared_ok, char * err, size_t n_err) {
    if (t == NULL) {
        return true;
    }
    if (t->type != type) {
        snprintf(err, n_err, "%s (%s) must be %s, got %s", what, escha_tname_(t), ggml_type_name(type), ggml_type_name(t->type));
        return false;
    }
    if (!ggml_is_contiguous(t)) {
        snprintf(err, n_err, "%s (%s) must be contiguous", what, escha_tname_(t));
        return false;
    }
    if (t->ne[0] != n) {
        snprintf(err, n_err, "%s (%s) has %lld channels, expected %lld", what, escha_tname_(t), (long long) t->ne[0], (long long) n);
        return false;
    }
    const int64_t rows = ggml_nrows(t);
    if (rows != n_expert && !(shared_ok && rows == 1)) {
        snprintf(err, n_err, "%s (%s) has %lld rows, expected %lld", what, escha_tname_(t), (long long) rows, (long long) n_expert);
        return false;
    }
    return true;
}

/* The weight's part of the rule: the code and its vectors (what a loader
 * can check before any input exists). */
static inline bool escha_check_weight(bool moe, const struct ggml_tensor * code, const struct ggml_tensor * const vec[ESCHA_VEC_COUNT],
                                      char * err, size_t n_err) {
#define ESCHA_REFUSE_(...) do { snprintf(err, n_err, __VA_ARGS__); return false; } while (0)
    if (code == NULL) {
        ESCHA_REFUSE_("code tensor is NULL");
    }
    if (code->type != GGML_TYPE_I16) {
        ESCHA_REFUSE_("code (%s) must be I16, got %s", escha_tname_(code), ggml_type_name(code->type));
    }
    if (!ggml_is_contiguous(code)) {
        ESCHA_REFUSE_("code (%s) must be contiguous", escha_tname_(code));
    }
    if (code->ne[0] != 2 * ESCHA_TILE && code->ne[0] != 3 * ESCHA_TILE) {
        ESCHA_REFUSE_("code (%s) ne[0] = %lld, must be 16*K with K 2 or 3", escha_tname_(code), (long long) code->ne[0]);
    }
    if (!moe && code->ne[3] != 1) {
        ESCHA_REFUSE_("code (%s) of a dense linear must be 3-D", escha_tname_(code));
    }
    const int64_t ic = code->ne[2] * ESCHA_TILE, oc = code->ne[1] * ESCHA_TILE, n_expert = code->ne[3];
    if (ic % ESCHA_HBLOCK != 0 || oc % ESCHA_HBLOCK != 0 || ic <= 0 || oc <= 0) {
        ESCHA_REFUSE_("code (%s): dimensions must be positive multiples of 128, got IC=%lld OC=%lld", escha_tname_(code),
                      (long long) ic, (long long) oc);
    }
    if (vec[ESCHA_VEC_RIN] == NULL || vec[ESCHA_VEC_ROUT] == NULL) {
        ESCHA_REFUSE_("rin and rout are required (code %s)", escha_tname_(code));
    }
#undef ESCHA_REFUSE_
    /* Only the optional vectors of an MoE op may be shared by all experts. */
    return escha_check_vec_("rin", vec[ESCHA_VEC_RIN], GGML_TYPE_F16, ic, n_expert, false, err, n_err) &&
           escha_check_vec_("rout", vec[ESCHA_VEC_ROUT], GGML_TYPE_F16, oc, n_expert, false, err, n_err) &&
           escha_check_vec_("s_in", vec[ESCHA_VEC_S_IN], GGML_TYPE_F32, ic, n_expert, moe, err, n_err) &&
           escha_check_vec_("s_out", vec[ESCHA_VEC_S_OUT], GGML_TYPE_F32, oc, n_expert, moe, err, n_err) &&
           escha_check_vec_("bias", vec[ESCHA_VEC_BIAS], GGML_TYPE_F32, oc, n_expert, moe, err, n_err);
}

/* The whole rule: the weight, then x and (MoE) ids. */
static inline bool escha_check_shapes(bool moe, const struct ggml_tensor * code, const struct ggml_tensor * x,
                                      const struct ggml_tensor * ids, const struct ggml_tensor * const vec[ESCHA_VEC_COUNT],
                                      char * err, size_t n_err) {
#define ESCHA_REFUSE_(...) do { snprintf(err, n_err, __VA_ARGS__); return false; } while (0)
    if (!escha_check_weight(moe, code, vec, err, n_err)) {
        return false;
    }
    const int64_t ic = code->ne[2] * ESCHA_TILE;
    if (moe) {
        if (ids == NULL || ids->type != GGML_TYPE_I32) {
            ESCHA_REFUSE_("ids (%s) must be I32", escha_tname_(ids));
        }
        if (ids->ne[2] != 1 || ids->ne[3] != 1) {
            ESCHA_REFUSE_("ids (%s) must be 2-D [n_used, T]", escha_tname_(ids));
        }
    }
    if (x == NULL || x->type != GGML_TYPE_F32) {
        ESCHA_REFUSE_("x (%s) must be F32", escha_tname_(x));
    }
    if (x->ne[0] != ic) {
        ESCHA_REFUSE_("x (%s) has %lld inputs, the code (%s) takes IC=%lld", escha_tname_(x), (long long) x->ne[0],
                      escha_tname_(code), (long long) ic);
    }
    if (x->nb[0] != sizeof(float)) {
        ESCHA_REFUSE_("x (%s) rows must be contiguous", escha_tname_(x));
    }
    if (moe) {
        if (x->ne[3] != 1) {
            ESCHA_REFUSE_("x (%s) must be 3-D [IC, NX, T]", escha_tname_(x));
        }
        if (x->ne[2] != ids->ne[1]) {
            ESCHA_REFUSE_("x (%s) has %lld tokens, ids (%s) %lld", escha_tname_(x), (long long) x->ne[2], escha_tname_(ids),
                          (long long) ids->ne[1]);
        }
        if (x->ne[1] <= 0 || ids->ne[0] % x->ne[1] != 0) {
            ESCHA_REFUSE_("x (%s): %lld rows per token do not divide n_used = %lld", escha_tname_(x), (long long) x->ne[1],
                          (long long) ids->ne[0]);
        }
    }
#undef ESCHA_REFUSE_
    return true;
}

/* ---- parse -----------------------------------------------------------------
 * Reads an escha node into p. Returns NULL, or why the node is not one this
 * description covers (another op, a shape outside the rule, a codebook other
 * than cbA, op parameters that disagree with the operands); err holds the
 * message, which names the operand.
 */
static inline const char * escha_op_parse(const struct ggml_tensor * dst, escha_op * p, char * err, size_t n_err) {
    memset(p, 0, sizeof *p);
    if (dst->op != GGML_OP_ESCHA_LINEAR && dst->op != GGML_OP_ESCHA_MOE) {
        snprintf(err, n_err, "%s is not an escha op", ggml_op_name(dst->op));
        return err;
    }
    const bool moe = dst->op == GGML_OP_ESCHA_MOE;
    const struct ggml_tensor * vec[ESCHA_VEC_COUNT];
    for (int v = 0; v < ESCHA_VEC_COUNT; v++) {
        vec[v] = dst->src[escha_vec_slot(moe, v)];
    }
    const struct ggml_tensor * code = dst->src[ESCHA_SRC_CODE];
    const struct ggml_tensor * x = dst->src[ESCHA_SRC_X];
    const struct ggml_tensor * ids = moe ? dst->src[ESCHA_SRC_IDS] : NULL;
    if (!escha_check_shapes(moe, code, x, ids, vec, err, n_err)) {
        return err;
    }
    const int32_t * params = (const int32_t *) dst->op_params;
    p->moe = moe;
    p->k = (int) (code->ne[0] / ESCHA_TILE);
    p->codebook = params[ESCHA_PARAM_CODEBOOK];
    if (params[ESCHA_PARAM_K] != p->k) {
        snprintf(err, n_err, "op parameter K = %d, but code (%s) has K = %d", params[ESCHA_PARAM_K], escha_tname_(code), p->k);
        return err;
    }
    if (p->codebook != ESCHA_CODEBOOK_CBA) {
        snprintf(err, n_err, "code (%s): codebook %d; only codebook %d (cbA) is implemented", escha_tname_(code), p->codebook,
                 ESCHA_CODEBOOK_CBA);
        return err;
    }
    if (params[ESCHA_PARAM_HAS_BIAS] != (vec[ESCHA_VEC_BIAS] != NULL)) {
        snprintf(err, n_err, "op parameter has_bias = %d disagrees with the bias source (code %s)", params[ESCHA_PARAM_HAS_BIAS],
                 escha_tname_(code));
        return err;
    }
    if (dst->type != GGML_TYPE_F32 || !ggml_is_contiguous(dst)) {
        snprintf(err, n_err, "result of code (%s) must be contiguous F32", escha_tname_(code));
        return err;
    }
    p->ic = code->ne[2] * ESCHA_TILE;
    p->oc = code->ne[1] * ESCHA_TILE;
    p->n_expert = code->ne[3];
    p->code = code;
    p->x = x;
    p->ids = ids;
    p->dst = dst;
    p->code_nb_e = code->nb[3];
    for (int v = 0; v < ESCHA_VEC_COUNT; v++) {
        escha_vec * e = &p->vec[v];
        e->t = vec[v];
        e->rows = vec[v] ? ggml_nrows(vec[v]) : 0;
        e->es = e->rows > 1 ? vec[v]->ne[0] : 0;
        e->nb_e = e->rows > 1 ? vec[v]->nb[1] : 0;
    }
    if (moe) {
        p->n_used = ids->ne[0];
        p->nx = x->ne[1];
        p->n_tokens = ids->ne[1];
    } else {
        p->n_used = 1;
        p->nx = 1;
        p->n_tokens = x->ne[1] * x->ne[2] * x->ne[3];
    }
    p->n_slots = p->n_used * p->n_tokens;
    return NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* ESCHA_OP_H */
