// ggml-cpu side of GGML_OP_ESCHA_LINEAR / GGML_OP_ESCHA_MOE (escha-ggml).
//
// The op runs the Rust kernels of escha-ggml (escha_ffi.h) split over
// ggml's own threads: phase 1 (input transform) by slots, a barrier, phase
// 2 (products and output transform) by output blocks. ggml's reference CPU
// backend (params->use_ref, used by test-backend-ops) runs the C reference
// instead, so the harness compares Rust against C.

#include "../ggml-cpu/ggml-cpu-impl.h"
#include "../ggml-impl.h"
#include "escha_ffi.h"
#include "escha_ref.h"

#include <cstring>
#include <vector>

// Without the Rust staticlib (a build of the tree outside escha-ggml) every
// call takes the C reference path.
#ifdef GGML_ESCHA_NO_RUST
static size_t escha_rs_work_size(int64_t, int64_t, int64_t, int32_t) { return 0; }
static int32_t escha_rs_forward(const escha_op_desc *, int32_t, int32_t, int32_t, void *, size_t) { return ESCHA_RS_PANIC; }
static const bool escha_have_rust = false;
#else
static const bool escha_have_rust = true;
#endif

static bool escha_is_moe(const ggml_tensor * dst) {
    return dst->op == GGML_OP_ESCHA_MOE;
}

// Per-expert byte stride of an optional vector: 0 when shared by all experts.
static size_t escha_nb_e(const ggml_tensor * t) {
    return t == nullptr || ggml_nrows(t) == 1 ? 0 : t->nb[1];
}

static escha_op_desc escha_desc(const ggml_tensor * dst) {
    const bool moe = escha_is_moe(dst);
    const ggml_tensor * code = dst->src[0];
    const int first = moe ? 3 : 2;
    const ggml_tensor * rin   = dst->src[first + 0];
    const ggml_tensor * rout  = dst->src[first + 1];
    const ggml_tensor * s_in  = dst->src[first + 2];
    const ggml_tensor * s_out = dst->src[first + 3];
    const ggml_tensor * bias  = dst->src[first + 4];
    const ggml_tensor * x     = dst->src[1];
    const ggml_tensor * ids   = moe ? dst->src[2] : nullptr;

    escha_op_desc d;
    memset(&d, 0, sizeof(d));
    d.k = (int32_t) (code->ne[0] / 16);
    d.ic = code->ne[2] * 16;
    d.oc = code->ne[1] * 16;
    d.n_expert = code->ne[3];
    d.code = (const int16_t *) code->data;   d.code_nb_e = code->nb[3];
    d.rin  = (const uint16_t *) rin->data;   d.rin_nb_e  = escha_nb_e(rin);
    d.rout = (const uint16_t *) rout->data;  d.rout_nb_e = escha_nb_e(rout);
    if (s_in)  { d.s_in  = (const float *) s_in->data;  d.s_in_nb_e  = escha_nb_e(s_in); }
    if (s_out) { d.s_out = (const float *) s_out->data; d.s_out_nb_e = escha_nb_e(s_out); }
    if (bias)  { d.bias  = (const float *) bias->data;  d.bias_nb_e  = escha_nb_e(bias); }
    d.x = (const char *) x->data;
    for (int i = 0; i < 4; i++) {
        d.x_ne[i] = x->ne[i];
        d.x_nb[i] = x->nb[i];
    }
    if (ids) {
        d.ids = (const char *) ids->data;
        d.ids_ne[0] = ids->ne[0]; d.ids_ne[1] = ids->ne[1];
        d.ids_nb[0] = ids->nb[0]; d.ids_nb[1] = ids->nb[1];
    }
    d.dst = (float *) dst->data;
    return d;
}

// Slots of a call: x rows for ESCHA_LINEAR, (token, used expert) pairs for
// ESCHA_MOE. Decided by the ids shape, not its data pointer, which is not
// yet set when the graph is planned.
static int64_t escha_n_slots(const escha_op_desc & d) {
    return d.ids_ne[0] > 0 ? d.ids_ne[0] * d.ids_ne[1] : d.x_ne[1] * d.x_ne[2] * d.x_ne[3];
}
// The C reference, one slot at a time, slots split over threads.
static void escha_forward_ref(const escha_op_desc & d, int ith, int nth) {
    const int64_t ic = d.ic, oc = d.oc;
    const bool moe = d.ids != nullptr;
    const int64_t n_slots = escha_n_slots(d);
    const int64_t per = (n_slots + nth - 1) / nth;
    std::vector<uint16_t> y(oc);
    for (int64_t s = ith * per; s < std::min(n_slots, (ith + 1) * per); s++) {
        int64_t e = 0;
        const char * xr;
        if (moe) {
            const int64_t n_used = d.ids_ne[0], t = s / n_used, u = s % n_used;
            e = *(const int32_t *) (d.ids + u * d.ids_nb[0] + t * d.ids_nb[1]);
            GGML_ASSERT(e >= 0 && e < d.n_expert && "escha_moe: expert id out of range");
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
    const escha_op_desc d = escha_desc(dst);
    if (params->use_ref || !escha_have_rust) {
        escha_forward_ref(d, params->ith, params->nth);
        return;
    }
    for (int32_t phase = 1; phase <= 2; phase++) {
        const int32_t rc = escha_rs_forward(&d, phase, params->ith, params->nth, params->wdata, params->wsize);
        if (rc != ESCHA_RS_OK) {
            GGML_ABORT("%s (%s): %s", ggml_op_name(dst->op), dst->src[0]->name, escha_rs_error(rc));
        }
        if (phase == 1) {
            ggml_barrier(params->threadpool);
        }
    }
}

extern "C" size_t ggml_escha_cpu_work_size(const ggml_tensor * node, int n_tasks) {
    if (!escha_have_rust) {
        return 0;
    }
    const escha_op_desc d = escha_desc(node);
    return escha_rs_work_size(d.ic, d.oc, escha_n_slots(d), n_tasks);
}

extern "C" bool ggml_escha_cpu_supports_op(const ggml_tensor * op) {
    const ggml_tensor * code = op->src[0];
    const ggml_tensor * x    = op->src[1];
    const int first = escha_is_moe(op) ? 3 : 2;
    if (code->type != GGML_TYPE_I16 || !ggml_is_contiguous(code) || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float)) {
        return false;
    }
    if (op->src[first]->type != GGML_TYPE_F16 || op->src[first + 1]->type != GGML_TYPE_F16 ||
        !ggml_is_contiguous(op->src[first]) || !ggml_is_contiguous(op->src[first + 1])) {
        return false;
    }
    for (int i = first + 2; i < first + 5; i++) {
        if (op->src[i] && (op->src[i]->type != GGML_TYPE_F32 || !ggml_is_contiguous(op->src[i]))) {
            return false;
        }
    }
    return true;
}
