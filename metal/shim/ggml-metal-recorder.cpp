// ggml-metal-recorder.cpp: the parts of ggml-metal's device API that
// ggml-metal-escha.cpp calls (pipelines, encoder), implemented on the CPU:
// the encoder logs every call and runs each dispatch through the shim
// executor with the buffers bound at that moment. With it, the glue's real
// code path (ggml tensor -> supports_op, extra size, encode) runs on Linux
// on ops built by ggml's own constructors. For tests/metal_shim.rs.

#include "ggml-metal-escha.h"

#include "escha-metal-plan.h"
#include "ggml.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace escha_shim {
void run_dispatch(const escha_metal_dispatch & d, const escha_metal_args & args, const void * const * bufs);
}

struct ggml_metal_pipeline {
    std::string name;
};

struct ggml_metal_library {
    std::map<std::string, ggml_metal_pipeline> pipelines;
};

struct ggml_metal_encoder {
    const ggml_metal_pipeline * pipeline = nullptr;
    std::vector<unsigned char> args;
    ggml_metal_buffer_id buf[ESCHA_MTL_BUF_COUNT] = {};
    size_t smem = 0;
    std::string log;
};

static void logf(ggml_metal_encoder_t enc, const char * fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf(ggml_metal_encoder_t enc, const char * fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    enc->log += line;
    enc->log += '\n';
}

extern "C" {

ggml_metal_pipeline_with_params ggml_metal_library_get_pipeline(ggml_metal_library_t lib, const char * name) {
    ggml_metal_pipeline_with_params res = {};
    auto it = lib->pipelines.find(name);
    res.pipeline = it == lib->pipelines.end() ? nullptr : &it->second;
    return res;
}

ggml_metal_pipeline_with_params ggml_metal_library_compile_pipeline(ggml_metal_library_t lib, const char * base,
                                                                    const char * name, ggml_metal_cv_t cv) {
    (void) base;
    (void) cv;
    ggml_metal_pipeline_with_params res = {};
    ggml_metal_pipeline & p = lib->pipelines[name];
    p.name = name;
    res.pipeline = &p;
    return res;
}

int ggml_metal_pipeline_max_theads_per_threadgroup(ggml_metal_pipeline_with_params pipeline) {
    (void) pipeline;
    return 1024; // what Apple GPUs report for light kernels
}

void ggml_metal_encoder_set_pipeline(ggml_metal_encoder_t enc, ggml_metal_pipeline_with_params pipeline) {
    enc->pipeline = pipeline.pipeline;
    enc->smem = 0;
    logf(enc, "pipeline %s", pipeline.pipeline ? pipeline.pipeline->name.c_str() : "(null)");
}

void ggml_metal_encoder_set_bytes(ggml_metal_encoder_t enc, void * data, size_t size, int idx) {
    if (idx == ESCHA_MTL_BUF_ARGS) {
        enc->args.assign((unsigned char *) data, (unsigned char *) data + size);
    }
    logf(enc, "bytes %d size %zu", idx, size);
}

void ggml_metal_encoder_set_buffer(ggml_metal_encoder_t enc, ggml_metal_buffer_id buffer, int idx) {
    if (idx >= 0 && idx < ESCHA_MTL_BUF_COUNT) {
        enc->buf[idx] = buffer;
    }
}

void ggml_metal_encoder_set_threadgroup_memory_size(ggml_metal_encoder_t enc, size_t size, int idx) {
    if (idx == 0) {
        enc->smem = size;
    }
    logf(enc, "smem %d size %zu", idx, size);
}

void ggml_metal_encoder_memory_barrier(ggml_metal_encoder_t enc) {
    logf(enc, "barrier");
}

void ggml_metal_encoder_dispatch_threadgroups(ggml_metal_encoder_t enc, int tg0, int tg1, int tg2, int tptg0,
                                              int tptg1, int tptg2) {
    logf(enc, "dispatch (%d, %d, %d) x (%d, %d, %d)", tg0, tg1, tg2, tptg0, tptg1, tptg2);
    if (enc->pipeline == nullptr || enc->args.size() != sizeof(escha_metal_args)) {
        logf(enc, "error: dispatch without pipeline or args");
        return;
    }
    escha_metal_dispatch d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", enc->pipeline->name.c_str());
    d.tg[0] = tg0;
    d.tg[1] = tg1;
    d.tg[2] = tg2;
    d.tptg[0] = tptg0;
    d.tptg[1] = tptg1;
    d.tptg[2] = tptg2;
    d.smem = enc->smem;
    escha_metal_args args;
    memcpy(&args, enc->args.data(), sizeof args);
    const void * bufs[ESCHA_MTL_BUF_COUNT] = {};
    for (int i = ESCHA_MTL_BUF_CODE; i < ESCHA_MTL_BUF_COUNT; i++) {
        // A "Metal buffer" here is host memory: base pointer plus offset.
        bufs[i] = enc->buf[i].metal ? (const char *) enc->buf[i].metal + enc->buf[i].offs : nullptr;
    }
    escha_shim::run_dispatch(d, args, bufs);
}

} // extern "C"

// ---- running an escha op built by ggml through the glue ---------------------------

namespace {

// What ggml-metal-ops.cpp's ggml_metal_get_buffer_id does, for host
// tensors: the op's result gets its own allocation of the size the buffer
// type reports (result + ggml_metal_escha_extra_size).
thread_local const ggml_tensor * g_dst = nullptr;
thread_local void * g_dst_mem = nullptr;

ggml_metal_buffer_id buffer_id(const ggml_tensor * t) {
    if (t == g_dst) {
        return {g_dst_mem, 0};
    }
    return {t->data, 0};
}

int run_op(ggml_tensor * op, float * y, char * log, size_t log_len) {
    std::string text;
    int rc = 0;
    if (!ggml_metal_escha_supports_op(op)) {
        text = "unsupported\n";
        rc = -2;
    } else {
        const size_t extra = ggml_metal_escha_extra_size(op);
        const size_t n = ggml_nbytes(op);
        std::vector<float> mem((n + extra) / sizeof(float) + 1, NAN);
        g_dst = op;
        g_dst_mem = mem.data();
        ggml_metal_library lib;
        ggml_metal_encoder enc;
        char head[128];
        snprintf(head, sizeof head, "batch %lld extra %zu\n", (long long) ggml_metal_escha_batch_size(op), extra);
        enc.log = head;
        const int consumed = ggml_metal_escha_encode(&lib, &enc, op, buffer_id);
        g_dst = nullptr;
        g_dst_mem = nullptr;
        memcpy(y, mem.data(), n);
        text = enc.log;
        rc = consumed == 1 ? 0 : -3;
    }
    if (log && log_len) {
        snprintf(log, log_len, "%s", text.c_str());
    }
    return rc;
}

ggml_context * new_ctx(size_t data_bytes) {
    ggml_init_params params = {data_bytes + 64 * ggml_tensor_overhead() + (1 << 20), nullptr, false};
    return ggml_init(params);
}

ggml_tensor * vec(ggml_context * ctx, ggml_type type, int64_t n, int64_t rows, const void * data, const char * name) {
    if (data == nullptr) {
        return nullptr;
    }
    ggml_tensor * t = rows > 1 ? ggml_new_tensor_2d(ctx, type, n, rows) : ggml_new_tensor_1d(ctx, type, n);
    memcpy(t->data, data, ggml_nbytes(t));
    ggml_set_name(t, name);
    return t;
}

} // namespace

extern "C" {

// Dense: ggml_escha_linear on x [m][ic] given as a view of rows of ic + pad
// floats; y [m][oc]. Returns 0, or -2 if supports_op says no; `log` gets the
// encoder's calls.
int escha_metal_shim_ggml_linear(int k, int64_t ic, int64_t oc, const int16_t * code, const float * x, int64_t m,
                                 int64_t pad, const uint16_t * rin, const uint16_t * rout, const float * s_in,
                                 const float * s_out, const float * bias, float * y, char * log, size_t log_len) {
    const size_t bytes = (size_t) (ic / 16) * (oc / 16) * 32 * k + (size_t) m * (ic + pad) * 4 + 16 * (ic + oc);
    ggml_context * ctx = new_ctx(bytes);
    ggml_tensor * c = ggml_new_tensor_3d(ctx, GGML_TYPE_I16, 16 * k, oc / 16, ic / 16);
    memcpy(c->data, code, ggml_nbytes(c));
    ggml_set_name(c, "code");
    ggml_tensor * xw = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ic + pad, m);
    for (int64_t r = 0; r < m; r++) {
        memcpy((char *) xw->data + r * xw->nb[1], x + r * ic, ic * sizeof(float));
    }
    ggml_tensor * xv = pad ? ggml_view_2d(ctx, xw, ic, m, xw->nb[1], 0) : xw;
    ggml_set_name(xv, "x");
    ggml_tensor * op = ggml_escha_linear(ctx, c, xv, vec(ctx, GGML_TYPE_F16, ic, 1, rin, "rin"),
                                         vec(ctx, GGML_TYPE_F16, oc, 1, rout, "rout"),
                                         vec(ctx, GGML_TYPE_F32, ic, 1, s_in, "s_in"),
                                         vec(ctx, GGML_TYPE_F32, oc, 1, s_out, "s_out"),
                                         vec(ctx, GGML_TYPE_F32, oc, 1, bias, "bias"));
    ggml_set_name(op, "out");
    const int rc = run_op(op, y, log, log_len);
    ggml_free(ctx);
    return rc;
}

// MoE: ggml_escha_moe with ids [n_used, T] as a view of the first n_used
// rows of an [ids_stride, T] tensor (as build_moe_ffn makes them), x [T][nx][ic];
// s_in/s_out/bias with *_rows rows (1 shared or E). y [T][n_used][oc].
int escha_metal_shim_ggml_moe(int k, int64_t n_expert, int64_t ic, int64_t oc, const int16_t * code, const float * x,
                              int64_t nx, const int32_t * ids, int64_t ids_stride, int64_t n_used, int64_t n_tokens,
                              const uint16_t * rin, const uint16_t * rout, const float * s_in, int64_t s_in_rows,
                              const float * s_out, int64_t s_out_rows, const float * bias, int64_t bias_rows, float * y,
                              char * log, size_t log_len) {
    const size_t bytes = (size_t) n_expert * ((ic / 16) * (oc / 16) * 32 * k + 16 * (ic + oc)) +
                         (size_t) n_tokens * (nx * ic * 4 + ids_stride * 4);
    ggml_context * ctx = new_ctx(bytes);
    ggml_tensor * c = ggml_new_tensor_4d(ctx, GGML_TYPE_I16, 16 * k, oc / 16, ic / 16, n_expert);
    memcpy(c->data, code, ggml_nbytes(c));
    ggml_set_name(c, "code");
    ggml_tensor * xt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ic, nx, n_tokens);
    memcpy(xt->data, x, ggml_nbytes(xt));
    ggml_set_name(xt, "x");
    ggml_tensor * idw = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, ids_stride, n_tokens);
    memcpy(idw->data, ids, ggml_nbytes(idw));
    ggml_tensor * idv = ids_stride != n_used ? ggml_view_2d(ctx, idw, n_used, n_tokens, idw->nb[1], 0) : idw;
    ggml_set_name(idv, "ids");
    ggml_tensor * op = ggml_escha_moe(ctx, c, xt, idv, vec(ctx, GGML_TYPE_F16, ic, n_expert, rin, "rin"),
                                      vec(ctx, GGML_TYPE_F16, oc, n_expert, rout, "rout"),
                                      vec(ctx, GGML_TYPE_F32, ic, s_in_rows, s_in, "s_in"),
                                      vec(ctx, GGML_TYPE_F32, oc, s_out_rows, s_out, "s_out"),
                                      vec(ctx, GGML_TYPE_F32, oc, bias_rows, bias, "bias"));
    ggml_set_name(op, "out");
    const int rc = run_op(op, y, log, log_len);
    ggml_free(ctx);
    return rc;
}

} // extern "C"
