// Constructors of GGML_OP_ESCHA_LINEAR and GGML_OP_ESCHA_MOE (escha-ggml).
// Compiled into ggml-base. The node layout, the op parameters and the shape
// rule are those of include/escha-op.h, which every backend parses.

#include "../../ggml-impl.h"
#include "../include/escha-op.h"

// Checks the operands by the shape rule, aborting with a message that names
// the constructor and the offending tensor.
static void escha_require(const char * fn, bool moe, const struct ggml_tensor * code, const struct ggml_tensor * x,
                          const struct ggml_tensor * ids, const struct ggml_tensor * const vec[ESCHA_VEC_COUNT]) {
    char err[256];
    if (!escha_check_shapes(moe, code, x, ids, vec, err, sizeof err)) {
        GGML_ABORT("%s: %s", fn, err);
    }
}

static void escha_set_node(struct ggml_tensor * result, bool moe, struct ggml_tensor * code, struct ggml_tensor * x,
                           struct ggml_tensor * ids, struct ggml_tensor * const vec[ESCHA_VEC_COUNT]) {
    ggml_set_op_params_i32(result, ESCHA_PARAM_K, (int32_t) (code->ne[0] / ESCHA_TILE));
    ggml_set_op_params_i32(result, ESCHA_PARAM_CODEBOOK, ESCHA_CODEBOOK_CBA);
    ggml_set_op_params_i32(result, ESCHA_PARAM_HAS_BIAS, vec[ESCHA_VEC_BIAS] != NULL ? 1 : 0);
    result->op = moe ? GGML_OP_ESCHA_MOE : GGML_OP_ESCHA_LINEAR;
    result->src[ESCHA_SRC_CODE] = code;
    result->src[ESCHA_SRC_X] = x;
    if (moe) {
        result->src[ESCHA_SRC_IDS] = ids;
    }
    for (int v = 0; v < ESCHA_VEC_COUNT; v++) {
        result->src[escha_vec_slot(moe, v)] = vec[v];
    }
}

struct ggml_tensor * ggml_escha_linear(
        struct ggml_context * ctx,
        struct ggml_tensor  * code,
        struct ggml_tensor  * x,
        struct ggml_tensor  * rin,
        struct ggml_tensor  * rout,
        struct ggml_tensor  * s_in,
        struct ggml_tensor  * s_out,
        struct ggml_tensor  * bias) {
    struct ggml_tensor * const vec[ESCHA_VEC_COUNT] = { rin, rout, s_in, s_out, bias };
    escha_require("ggml_escha_linear", false, code, x, NULL, (const struct ggml_tensor * const *) vec);
    struct ggml_tensor * result = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, code->ne[1] * ESCHA_TILE, x->ne[1], x->ne[2], x->ne[3]);
    escha_set_node(result, false, code, x, NULL, vec);
    return result;
}

struct ggml_tensor * ggml_escha_moe(
        struct ggml_context * ctx,
        struct ggml_tensor  * code,
        struct ggml_tensor  * x,
        struct ggml_tensor  * ids,
        struct ggml_tensor  * rin,
        struct ggml_tensor  * rout,
        struct ggml_tensor  * s_in,
        struct ggml_tensor  * s_out,
        struct ggml_tensor  * bias) {
    struct ggml_tensor * const vec[ESCHA_VEC_COUNT] = { rin, rout, s_in, s_out, bias };
    escha_require("ggml_escha_moe", true, code, x, ids, (const struct ggml_tensor * const *) vec);
    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, code->ne[1] * ESCHA_TILE, ids->ne[0], ids->ne[1]);
    escha_set_node(result, true, code, x, ids, vec);
    return result;
}
