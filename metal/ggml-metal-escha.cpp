// ggml-metal glue for the escha ops: what ggml-metal asks of an op
// (supported? extra memory? batch size?) and its encoding. The decisions
// themselves (kernels, grids, arguments) come from escha-metal-plan.h, the
// code that the Linux shim tests execute.

#include "ggml-metal-escha.h"

#include "escha-metal-plan.h"

static bool escha_is_op(const ggml_tensor * op) {
    return op->op == GGML_OP_ESCHA_LINEAR || op->op == GGML_OP_ESCHA_MOE;
}

// Rows of an optional per-channel source: 0 absent, else its row count.
static int64_t escha_rows(const ggml_tensor * t) {
    return t ? ggml_nrows(t) : 0;
}

static escha_metal_shape escha_shape_of(const ggml_tensor * op) {
    const bool moe = op->op == GGML_OP_ESCHA_MOE;
    const int o = moe ? 3 : 2; // index of rin among the sources
    const ggml_tensor * code = op->src[0];
    const ggml_tensor * x = op->src[1];
    escha_metal_shape s;
    memset(&s, 0, sizeof s);
    s.moe = moe;
    s.k = (int) (code->ne[0] / 16);
    s.ic = code->ne[2] * 16;
    s.oc = code->ne[1] * 16;
    s.n_expert = moe ? code->ne[3] : 1;
    for (int i = 0; i < 4; i++) {
        s.x_ne[i] = x->ne[i];
        s.x_nb[i] = x->nb[i];
    }
    s.n_used = moe ? op->src[2]->ne[0] : 1;
    s.n_tokens = moe ? op->src[2]->ne[1] : 0;
    s.ids_nb1 = moe ? op->src[2]->nb[1] : 0;
    s.s_in_rows = escha_rows(op->src[o + 2]);
    s.s_out_rows = escha_rows(op->src[o + 3]);
    s.bias_rows = escha_rows(op->src[o + 4]);
    return s;
}

static bool escha_is(const ggml_tensor * t, ggml_type type, bool optional) {
    return t == nullptr ? optional : t->type == type && ggml_is_contiguous(t);
}

bool ggml_metal_escha_supports_op(const ggml_tensor * op) {
    if (!escha_is_op(op)) {
        return false;
    }
    const bool moe = op->op == GGML_OP_ESCHA_MOE;
    const int o = moe ? 3 : 2;
    const ggml_tensor * x = op->src[1];
    if (!escha_is(op->src[0], GGML_TYPE_I16, false) || x == nullptr || x->type != GGML_TYPE_F32 ||
        x->nb[0] != sizeof(float) || x->nb[1] % sizeof(float) != 0 || !escha_is(op, GGML_TYPE_F32, false) ||
        !escha_is(op->src[o], GGML_TYPE_F16, false) || !escha_is(op->src[o + 1], GGML_TYPE_F16, false) ||
        !escha_is(op->src[o + 2], GGML_TYPE_F32, true) || !escha_is(op->src[o + 3], GGML_TYPE_F32, true) ||
        !escha_is(op->src[o + 4], GGML_TYPE_F32, true)) {
        return false;
    }
    if (moe && (op->src[2] == nullptr || op->src[2]->type != GGML_TYPE_I32 || op->src[2]->nb[0] != sizeof(int32_t))) {
        return false;
    }
    const escha_metal_shape s = escha_shape_of(op);
    escha_metal_plan p;
    return escha_metal_make_plan(&s, ESCHA_MTL_PATH_AUTO, &p);
}

size_t ggml_metal_escha_extra_size(const ggml_tensor * op) {
    if (op->op != GGML_OP_ESCHA_MOE) {
        return 0;
    }
    // The largest plan the op can get: the prefill path's slot lists.
    return escha_metal_moe_scratch_bytes(op->src[0]->ne[3], op->src[2]->ne[0], op->src[2]->ne[1]);
}

int64_t ggml_metal_escha_batch_size(const ggml_tensor * op) {
    return op->op == GGML_OP_ESCHA_MOE ? op->src[2]->ne[1] : ggml_nrows(op->src[1]);
}

ggml_metal_pipeline_with_params ggml_metal_escha_get_pipeline(ggml_metal_library_t lib, const char * name) {
    ggml_metal_pipeline_with_params res = ggml_metal_library_get_pipeline(lib, name);
    if (!res.pipeline) {
        res = ggml_metal_library_compile_pipeline(lib, name, name, nullptr);
    }
    return res;
}

int ggml_metal_escha_encode(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op,
                            ggml_metal_escha_buffer_id_fn buffer_id) {
    const bool moe = op->op == GGML_OP_ESCHA_MOE;
    const int o = moe ? 3 : 2;
    const escha_metal_shape s = escha_shape_of(op);
    escha_metal_plan p;
    if (!escha_metal_make_plan(&s, ESCHA_MTL_PATH_AUTO, &p)) {
        GGML_ABORT("%s: escha op %s (code %s) has a shape the Metal kernels do not take", __func__, op->name,
                   op->src[0]->name);
    }

    ggml_metal_buffer_id buf[ESCHA_MTL_BUF_COUNT] = {};
    const ggml_metal_buffer_id bid_dst = buffer_id(op);
    buf[ESCHA_MTL_BUF_CODE] = buffer_id(op->src[0]);
    buf[ESCHA_MTL_BUF_X] = buffer_id(op->src[1]);
    buf[ESCHA_MTL_BUF_RIN] = buffer_id(op->src[o]);
    buf[ESCHA_MTL_BUF_ROUT] = buffer_id(op->src[o + 1]);
    // Absent optional sources are never read (args.has_*); bind dst there.
    buf[ESCHA_MTL_BUF_S_IN] = op->src[o + 2] ? buffer_id(op->src[o + 2]) : bid_dst;
    buf[ESCHA_MTL_BUF_S_OUT] = op->src[o + 3] ? buffer_id(op->src[o + 3]) : bid_dst;
    buf[ESCHA_MTL_BUF_BIAS] = op->src[o + 4] ? buffer_id(op->src[o + 4]) : bid_dst;
    buf[ESCHA_MTL_BUF_DST] = bid_dst;
    buf[ESCHA_MTL_BUF_IDS] = moe ? buffer_id(op->src[2]) : bid_dst;
    // The MoE slot lists lie after the result (ggml_metal_escha_extra_size).
    buf[ESCHA_MTL_BUF_SCRATCH] = bid_dst;
    buf[ESCHA_MTL_BUF_SCRATCH].offs += ggml_nbytes(op);

    for (int i = 0; i < p.n; i++) {
        const escha_metal_dispatch & d = p.d[i];
        if (i > 0) {
            ggml_metal_encoder_memory_barrier(enc); // the map kernel's lists are read next
        }
        const ggml_metal_pipeline_with_params pipeline = ggml_metal_escha_get_pipeline(lib, d.name);
        if (pipeline.pipeline == nullptr ||
            d.tptg[0] * d.tptg[1] * d.tptg[2] > ggml_metal_pipeline_max_theads_per_threadgroup(pipeline)) {
            GGML_ABORT("%s: Metal pipeline %s is missing or takes fewer than %d threads per threadgroup", __func__,
                       d.name, d.tptg[0] * d.tptg[1] * d.tptg[2]);
        }
        ggml_metal_encoder_set_pipeline(enc, pipeline);
        ggml_metal_encoder_set_bytes(enc, &p.args, sizeof(p.args), ESCHA_MTL_BUF_ARGS);
        for (int b = ESCHA_MTL_BUF_CODE; b < ESCHA_MTL_BUF_COUNT; b++) {
            ggml_metal_encoder_set_buffer(enc, buf[b], b);
        }
        if (d.smem > 0) {
            ggml_metal_encoder_set_threadgroup_memory_size(enc, d.smem, 0);
        }
        ggml_metal_encoder_dispatch_threadgroups(enc, d.tg[0], d.tg[1], d.tg[2], d.tptg[0], d.tptg[1], d.tptg[2]);
    }
    return 1;
}
