// ggml-metal glue for the escha ops: what ggml-metal asks of an op
// (supported? extra memory? batch size?) and its encoding. The decisions
// themselves (kernels, grids, arguments) come from escha-metal-plan.h, the
// code that the Linux shim tests execute.

#include "ggml-metal-escha.h"

#include "escha-metal-plan.h"
#include "escha-op.h"

// The plan's view of a parsed node (escha-metal-plan.h keeps no ggml
// dependency, so that the shim executes it).
static escha_metal_shape escha_shape_of(const escha_op & op) {
    escha_metal_shape s;
    memset(&s, 0, sizeof s);
    s.moe = op.moe;
    s.k = op.k;
    s.ic = op.ic;
    s.oc = op.oc;
    s.n_expert = op.n_expert;
    for (int i = 0; i < 4; i++) {
        s.x_ne[i] = op.x->ne[i];
        s.x_nb[i] = op.x->nb[i];
    }
    s.n_used = op.n_used;
    s.n_tokens = op.moe ? op.n_tokens : 0;
    s.ids_nb1 = op.moe ? op.ids->nb[1] : 0;
    s.s_in_rows = op.vec[ESCHA_VEC_S_IN].rows;
    s.s_out_rows = op.vec[ESCHA_VEC_S_OUT].rows;
    s.bias_rows = op.vec[ESCHA_VEC_BIAS].rows;
    return s;
}

// The node as the kernels take it: the common description, then what the
// Metal kernels add (32-bit aligned x rows, contiguous ids rows, a plan).
static const char * escha_metal_parse(const ggml_tensor * node, escha_op * op, escha_metal_plan * plan, char * err, size_t n_err) {
    if (escha_op_parse(node, op, err, n_err) != nullptr) {
        return err;
    }
    if (op->x->nb[1] % sizeof(float) != 0 || (op->moe && op->ids->nb[0] != sizeof(int32_t))) {
        snprintf(err, n_err, "code (%s): x rows or ids are not 4-byte strided", op->code->name);
        return err;
    }
    const escha_metal_shape s = escha_shape_of(*op);
    if (!escha_metal_make_plan(&s, ESCHA_MTL_PATH_AUTO, plan)) {
        snprintf(err, n_err, "code (%s) has a shape the Metal kernels do not take", op->code->name);
        return err;
    }
    return nullptr;
}

bool ggml_metal_escha_supports_op(const ggml_tensor * op) {
    if (op->op != GGML_OP_ESCHA_LINEAR && op->op != GGML_OP_ESCHA_MOE) {
        return false;
    }
    escha_op parsed;
    escha_metal_plan p;
    char err[256];
    return escha_metal_parse(op, &parsed, &p, err, sizeof err) == nullptr;
}

size_t ggml_metal_escha_extra_size(const ggml_tensor * op) {
    escha_op parsed;
    char err[256];
    if (op->op != GGML_OP_ESCHA_MOE || escha_op_parse(op, &parsed, err, sizeof err) != nullptr) {
        return 0;
    }
    // The largest plan the op can get: the prefill path's slot lists.
    return escha_metal_moe_scratch_bytes(parsed.n_expert, parsed.n_used, parsed.n_tokens);
}

int64_t ggml_metal_escha_batch_size(const ggml_tensor * op) {
    escha_op parsed;
    char err[256];
    return escha_op_parse(op, &parsed, err, sizeof err) == nullptr ? parsed.n_tokens : 0;
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
    escha_op parsed;
    escha_metal_plan p;
    char err[256];
    if (escha_metal_parse(op, &parsed, &p, err, sizeof err) != nullptr) {
        GGML_ABORT("%s: escha op %s: %s", __func__, op->name, err);
    }
    const bool moe = parsed.moe;
    const auto vec = [&](int v) { return parsed.vec[v].t; };

    ggml_metal_buffer_id buf[ESCHA_MTL_BUF_COUNT] = {};
    const ggml_metal_buffer_id bid_dst = buffer_id(op);
    buf[ESCHA_MTL_BUF_CODE] = buffer_id(parsed.code);
    buf[ESCHA_MTL_BUF_X] = buffer_id(parsed.x);
    buf[ESCHA_MTL_BUF_RIN] = buffer_id(vec(ESCHA_VEC_RIN));
    buf[ESCHA_MTL_BUF_ROUT] = buffer_id(vec(ESCHA_VEC_ROUT));
    // Absent optional sources are never read (args.has_*); bind dst there.
    buf[ESCHA_MTL_BUF_S_IN] = vec(ESCHA_VEC_S_IN) ? buffer_id(vec(ESCHA_VEC_S_IN)) : bid_dst;
    buf[ESCHA_MTL_BUF_S_OUT] = vec(ESCHA_VEC_S_OUT) ? buffer_id(vec(ESCHA_VEC_S_OUT)) : bid_dst;
    buf[ESCHA_MTL_BUF_BIAS] = vec(ESCHA_VEC_BIAS) ? buffer_id(vec(ESCHA_VEC_BIAS)) : bid_dst;
    buf[ESCHA_MTL_BUF_DST] = bid_dst;
    buf[ESCHA_MTL_BUF_IDS] = moe ? buffer_id(parsed.ids) : bid_dst;
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
