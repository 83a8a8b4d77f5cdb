// ggml-cpu side of GGML_OP_ESCHA_LINEAR / GGML_OP_ESCHA_MOE (escha-ggml).
//
// The op runs the Rust kernels of escha-ggml (escha_ffi.h) split over
// ggml's own threads: phase 1 (input transform) by slots, a barrier, phase
// 2 (products and output transform) by output blocks. ggml's reference CPU
// backend (params->use_ref, used by test-backend-ops) runs the C reference
// instead, so the harness compares Rust against C.

#include "../../ggml-cpu/ggml-cpu-impl.h"
#include "../../ggml-impl.h"
#include "../include/escha-op.h"
#include "../ref/escha_ref.h"
#include "escha_ffi.h"

#include <cstring>
#include <vector>

// Without the Rust staticlib (a build of the tree outside escha-ggml) every
// call takes the C reference path.
#ifdef GGML_ESCHA_NO_RUST
static size_t escha_rs_work_size(int64_t, int64_t, int64_t, int32_t) { return 0; }
static int32_t escha_rs_forward(const escha_op_desc *, int32_t, int32_t, int32_t, void *, size_t) { return ESCHA_RS_PANIC; }
static bool escha_rs_single_pass(int64_t) { return false; }
static const bool escha_have_rust = false;
#else
static const bool escha_have_rust = true;
#endif

// The FFI descriptor of a parsed node (escha_ffi.h).
static escha_op_desc escha_desc(const escha_op & op) {
    escha_op_desc d;
    memset(&d, 0, sizeof(d));
    d.k = op.k;
    d.ic = op.ic;
    d.oc = op.oc;
    d.n_expert = op.n_expert;
    d.code = (const int16_t *) op.code->data;
    d.code_nb_e = op.code_nb_e;
    auto data = [&](int v) { return op.vec[v].t ? op.vec[v].t->data : nullptr; };
    d.rin  = (const uint16_t *) data(ESCHA_VEC_RIN);  d.rin_nb_e   = op.vec[ESCHA_VEC_RIN].nb_e;
    d.rout = (const uint16_t *) data(ESCHA_VEC_ROUT); d.rout_nb_e  = op.vec[ESCHA_VEC_ROUT].nb_e;
    d.s_in  = (const float *) data(ESCHA_VEC_S_IN);   d.s_in_nb_e  = op.vec[ESCHA_VEC_S_IN].nb_e;
    d.s_out = (const float *) data(ESCHA_VEC_S_OUT);  d.s_out_nb_e = op.vec[ESCHA_VEC_S_OUT].nb_e;
    d.bias  = (const float *) data(ESCHA_VEC_BIAS);   d.bias_nb_e  = op.vec[ESCHA_VEC_BIAS].nb_e;
    d.x = (const char *) op.x->data;
    for (int i = 0; i < 4; i++) {
        d.x_ne[i] = op.x->ne[i];
        d.x_nb[i] = op.x->nb[i];
    }
    if (op.ids) {
        d.ids = (const char *) op.ids->data;
        d.ids_ne[0] = op.ids->ne[0]; d.ids_ne[1] = op.ids->ne[1];
        d.ids_nb[0] = op.ids->nb[0]; d.ids_nb[1] = op.ids->nb[1];
    }
    d.dst = (float *) op.dst->data;
    return d;
}

// The parsed node; a node that supports_op would have refused is a bug in
// the graph, named by its code tensor.
static escha_op escha_parse_or_abort(const ggml_tensor * dst) {
    escha_op op;
    char err[256];
    if (escha_op_parse(dst, &op, err, sizeof err) != nullptr) {
        GGML_ABORT("%s: %s", ggml_op_name(dst->op), err);
    }
    return op;
}

// The C reference, one slot at a time, slots split over threads.
static void escha_forward_ref(const escha_op & op, const escha_op_desc & d, int ith, int nth) {
    const int64_t ic = d.ic, oc = d.oc;
    const bool moe = op.moe;
    const int64_t n_slots = op.n_slots;
    const int64_t per = (n_slots + nth - 1) / nth;
    std::vector<uint16_t> y(oc);
    for (int64_t s = ith * per; s < std::min(n_slots, (ith + 1) * per); s++) {
        int64_t e = 0;
        const char * xr;
        if (moe) {
            const int64_t n_used = d.ids_ne[0], t = s / n_used, u = s % n_used;
            e = *(const int32_t *) (d.ids + u * d.ids_nb[0] + t * d.ids_nb[1]);
            if (!escha_expert_ok(e, d.n_expert)) {
                GGML_ABORT("escha_moe (%s): expert id %lld out of range [0, %lld)", op.code->name, (long long) e, (long long) d.n_expert);
            }
            xr = d.x + (u % d.x_ne[1]) * d.x_nb[1] + t * d.x_nb[2];
        } else {
            const int64_t i1 = s % d.x_ne[1], i2 = (s / d.x_ne[1]) % d.x_ne[2], i3 = s / (d.x_ne[1] * d.x_ne[2]);
            xr = d.x + i1 * d.x_nb[1] + i2 * d.x_nb[2] + i3 * d.x_nb[3];
        }
        auto at = [e](const void * p, size_t nb_e) { return p ? (const char *) p + e * nb_e : nullptr; };
        const escha_status st = escha_linear(
            (const int16_t *) at(d.code, d.code_nb_e), d.k, ic, oc, (const float *) xr, 1,
            (const uint16_t *) at(d.rin, d.rin_nb_e), (const uint16_t *) at(d.rout, d.rout_nb_e),
            (const float *) at(d.s_in, d.s_in_nb_e), (const float *) at(d.s_out, d.s_out_nb_e),
            (const float *) at(d.bias, d.bias_nb_e), y.data());
        GGML_ASSERT(st == ESCHA_OK && "escha: C reference rejected the op");
        float * out = d.dst + s * oc;
        for (int64_t c = 0; c < oc; c++) {
            out[c] = escha_f16_to_f32(y[c]);
        }
    }
}

static const char * escha_rs_error(int32_t rc) {
    switch (rc) {
        case ESCHA_RS_BAD_DESC:   return "inconsistent operands";
        case ESCHA_RS_BAD_EXPERT: return "expert id out of range";
        case ESCHA_RS_WORK_SIZE:  return "work buffer too small";
        default:                  return "internal error in the Rust kernels";
    }
}

extern "C" void ggml_compute_forward_escha(const ggml_compute_params * params, ggml_tensor * dst) {
    const escha_op op = escha_parse_or_abort(dst);
    const escha_op_desc d = escha_desc(op);
    if (params->use_ref || !escha_have_rust) {
        escha_forward_ref(op, d, params->ith, params->nth);
        return;
    }
    // One pass needs no barrier (every thread transforms the inputs
    // itself) unless its leftover output blocks are split by tiles (phase 3
    // then transforms them once all are summed).
    const bool single = escha_rs_single_pass(op.n_slots);
    const int32_t one_pass[] = { 0, 3 };
    const int32_t two_pass[] = { 1, 2 };
    const int n = single ? (escha_rs_one_row_tail(op.oc, op.n_slots, params->nth) ? 2 : 1) : 2;
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            ggml_barrier(params->threadpool);
        }
        const int32_t phase = single ? one_pass[i] : two_pass[i];
        const int32_t rc = escha_rs_forward(&d, phase, params->ith, params->nth, params->wdata, params->wsize);
        if (rc != ESCHA_RS_OK) {
            GGML_ABORT("%s (%s): %s", ggml_op_name(dst->op), dst->src[0]->name, escha_rs_error(rc));
        }
    }
}

extern "C" size_t ggml_escha_cpu_work_size(const ggml_tensor * node, int n_tasks) {
    if (!escha_have_rust) {
        return 0;
    }
    const escha_op op = escha_parse_or_abort(node);
    return escha_rs_work_size(op.ic, op.oc, op.n_slots, n_tasks);
}

// Everything the description covers: the Rust kernels and the C reference
// take any strides of x rows and ids.
extern "C" bool ggml_escha_cpu_supports_op(const ggml_tensor * op) {
    escha_op parsed;
    char err[256];
    return escha_op_parse(op, &parsed, err, sizeof err) == nullptr;
}
