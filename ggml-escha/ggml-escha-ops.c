// Constructors of GGML_OP_ESCHA_LINEAR and GGML_OP_ESCHA_MOE (escha-ggml).
// Compiled into ggml-base; the shapes are those of docs/FORMAT.md.

#include "../ggml-impl.h"

// Every check names the op and the offending tensor.
#define CHECK(cond, fmt, ...) do { if (!(cond)) { GGML_ABORT("%s: " fmt, fn, __VA_ARGS__); } } while (0)

static const char * tname(const struct ggml_tensor * t) {
    return t && t->name[0] ? t->name : "(unnamed)";
}

// An optional per-channel vector: NULL, or F32 [n] / [n, n_expert].
static void check_vec(const char * fn, const char * what, const struct ggml_tensor * t, enum ggml_type type,
                      int64_t n, int64_t n_expert, bool per_expert_required) {
    if (t == NULL) {
        return;
    }
    CHECK(t->type == type, "%s (%s) must be %s, got %s", what, tname(t), ggml_type_name(type), ggml_type_name(t->type));
    CHECK(ggml_is_contiguous(t), "%s (%s) must be contiguous", what, tname(t));
    CHECK(t->ne[0] == n, "%s (%s) has %lld channels, expected %lld", what, tname(t), (long long) t->ne[0], (long long) n);
    const int64_t rows = ggml_nrows(t);
    CHECK(rows == n_expert || (!per_expert_required && rows == 1),
          "%s (%s) has %lld rows, expected %lld", what, tname(t), (long long) rows, (long long) n_expert);
}

// Shared checks; returns K and fills IC, OC, E from the code tensor.
static int escha_check_code(const char * fn, const struct ggml_tensor * code, bool moe,
                            int64_t * ic, int64_t * oc, int64_t * n_expert) {
    CHECK(code != NULL, "%s", "code tensor is NULL");
    CHECK(code->type == GGML_TYPE_I16, "code (%s) must be I16, got %s", tname(code), ggml_type_name(code->type));
    CHECK(ggml_is_contiguous(code), "code (%s) must be contiguous", tname(code));
    CHECK(code->ne[0] == 32 || code->ne[0] == 48, "code (%s) ne[0] = %lld, must be 16*K with K 2 or 3",
          tname(code), (long long) code->ne[0]);
    CHECK(moe || code->ne[3] == 1, "code (%s) of a dense linear must be 3-D", tname(code));
    *oc = code->ne[1] * 16;
    *ic = code->ne[2] * 16;
    *n_expert = code->ne[3];
    CHECK(*ic % 128 == 0 && *oc % 128 == 0, "code (%s): dimensions must be multiples of 128, got IC=%lld OC=%lld",
          tname(code), (long long) *ic, (long long) *oc);
    return (int) (code->ne[0] / 16);
}

static void escha_set_srcs(struct ggml_tensor * result, int first, struct ggml_tensor * rin, struct ggml_tensor * rout,
                           struct ggml_tensor * s_in, struct ggml_tensor * s_out, struct ggml_tensor * bias) {
    result->src[first + 0] = rin;
    result->src[first + 1] = rout;
    result->src[first + 2] = s_in;
    result->src[first + 3] = s_out;
    result->src[first + 4] = bias;
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
    const char * fn = "ggml_escha_linear";
    int64_t ic, oc, ne;
    const int k = escha_check_code(fn, code, false, &ic, &oc, &ne);
    CHECK(x != NULL && x->type == GGML_TYPE_F32, "x (%s) must be F32", tname(x));
    CHECK(x->ne[0] == ic, "x (%s) has %lld inputs, the code (%s) takes IC=%lld", tname(x), (long long) x->ne[0], tname(code), (long long) ic);
    CHECK(x->nb[0] == sizeof(float), "x (%s) rows must be contiguous", tname(x));
    CHECK(rin != NULL && rout != NULL, "rin and rout are required (code %s)", tname(code));
    check_vec(fn, "rin", rin, GGML_TYPE_F16, ic, 1, true);
    check_vec(fn, "rout", rout, GGML_TYPE_F16, oc, 1, true);
    check_vec(fn, "s_in", s_in, GGML_TYPE_F32, ic, 1, true);
    check_vec(fn, "s_out", s_out, GGML_TYPE_F32, oc, 1, true);
    check_vec(fn, "bias", bias, GGML_TYPE_F32, oc, 1, true);

    struct ggml_tensor * result = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, oc, x->ne[1], x->ne[2], x->ne[3]);
    ggml_set_op_params_i32(result, 0, k);
    ggml_set_op_params_i32(result, 1, 128);
    ggml_set_op_params_i32(result, 2, bias != NULL ? 1 : 0);
    result->op     = GGML_OP_ESCHA_LINEAR;
    result->src[0] = code;
    result->src[1] = x;
    escha_set_srcs(result, 2, rin, rout, s_in, s_out, bias);
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
    const char * fn = "ggml_escha_moe";
    int64_t ic, oc, ne;
    const int k = escha_check_code(fn, code, true, &ic, &oc, &ne);
    CHECK(ids != NULL && ids->type == GGML_TYPE_I32, "ids (%s) must be I32", tname(ids));
    CHECK(ids->ne[2] == 1 && ids->ne[3] == 1, "ids (%s) must be 2-D [n_used, T]", tname(ids));
    CHECK(x != NULL && x->type == GGML_TYPE_F32, "x (%s) must be F32", tname(x));
    CHECK(x->ne[0] == ic, "x (%s) has %lld inputs, the code (%s) takes IC=%lld", tname(x), (long long) x->ne[0], tname(code), (long long) ic);
    CHECK(x->nb[0] == sizeof(float), "x (%s) rows must be contiguous", tname(x));
    CHECK(x->ne[3] == 1, "x (%s) must be 3-D [IC, NX, T]", tname(x));
    CHECK(x->ne[2] == ids->ne[1], "x (%s) has %lld tokens, ids (%s) %lld", tname(x), (long long) x->ne[2], tname(ids), (long long) ids->ne[1]);
    CHECK(x->ne[1] > 0 && ids->ne[0] % x->ne[1] == 0, "x (%s): %lld rows per token do not divide n_used = %lld",
          tname(x), (long long) x->ne[1], (long long) ids->ne[0]);
    CHECK(rin != NULL && rout != NULL, "rin and rout are required (code %s)", tname(code));
    check_vec(fn, "rin", rin, GGML_TYPE_F16, ic, ne, true);
    check_vec(fn, "rout", rout, GGML_TYPE_F16, oc, ne, true);
    check_vec(fn, "s_in", s_in, GGML_TYPE_F32, ic, ne, false);
    check_vec(fn, "s_out", s_out, GGML_TYPE_F32, oc, ne, false);
    check_vec(fn, "bias", bias, GGML_TYPE_F32, oc, ne, false);

    struct ggml_tensor * result = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, oc, ids->ne[0], ids->ne[1]);
    ggml_set_op_params_i32(result, 0, k);
    ggml_set_op_params_i32(result, 1, 128);
    ggml_set_op_params_i32(result, 2, bias != NULL ? 1 : 0);
    result->op     = GGML_OP_ESCHA_MOE;
    result->src[0] = code;
    result->src[1] = x;
    result->src[2] = ids;
    escha_set_srcs(result, 3, rin, rout, s_in, s_out, bias);
    return result;
}
