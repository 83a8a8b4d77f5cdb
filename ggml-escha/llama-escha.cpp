// See llama-escha.h. Compiled into libllama (patches/0005-llama-escha.patch).
#include "llama-escha.h"

#include "llama-arch.h"
#include "llama-impl.h"
#include "llama-model-loader.h"
#include "llama-model.h"

#include "ggml-backend.h"

#include <cmath>
#include <vector>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace {

struct registration {
    const llama_model * model;
    llama_escha_weight w;
};

std::mutex g_mutex;
std::unordered_map<const ggml_tensor *, registration> g_weights;

const char * const k_leaves[] = { "escha_code", "escha_rin", "escha_rout", "escha_s_in", "escha_s_out" };

} // namespace

bool llama_escha_create_tensor(llama_model_base & model, llama_model_loader & ml, const LLM_TN_IMPL & tn,
                               std::initializer_list<int64_t> ne, int flags, ggml_tensor ** out) {
    using L = llama_model_loader;
    *out = nullptr;
    if (tn.suffix == nullptr || strcmp(tn.suffix, "weight") != 0 || ml.files.empty()) {
        return false;
    }
    const std::string name = tn.str();
    if (ml.get_tensor_meta(name.c_str()) != nullptr) {
        return false; // an ordinary weight
    }
    const std::string stem = name.substr(0, name.size() - strlen(".weight"));
    const std::string code_name = stem + ".escha_code";
    const ggml_tensor * meta = ml.get_tensor_meta(code_name.c_str());
    if (meta == nullptr) {
        return false;
    }

    // Every escha_* tensor of this stem must be one we know.
    const std::string prefix = stem + ".escha_";
    for (auto it = ml.weights_map.lower_bound(prefix); it != ml.weights_map.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        bool known = false;
        for (const char * leaf : k_leaves) {
            known = known || it->first == stem + "." + leaf;
        }
        if (!known) {
            throw std::runtime_error(format("%s: unknown escha tensor (a newer format feature? refusing to guess)", it->first.c_str()));
        }
    }

    if (meta->type != GGML_TYPE_I16) {
        throw std::runtime_error(format("%s: type %s, escha codes are i16", code_name.c_str(), ggml_type_name(meta->type)));
    }
    const int64_t k16 = meta->ne[0];
    if (k16 != 32 && k16 != 48) {
        throw std::runtime_error(format("%s: ne[0] = %lld is not 16*K with K = 2 or 3", code_name.c_str(), (long long) k16));
    }
    const int64_t ic = meta->ne[2] * 16, oc = meta->ne[1] * 16, n_exp = meta->ne[3];
    if (ic % 128 != 0 || oc % 128 != 0) {
        throw std::runtime_error(format("%s: IC = %lld and OC = %lld must be multiples of 128", code_name.c_str(), (long long) ic, (long long) oc));
    }
    const int64_t * req = ne.begin();
    const bool experts = ne.size() == 3;
    if (ne.size() < 2 || ne.size() > 3 || req[0] != ic || req[1] != oc || (experts ? req[2] != n_exp : n_exp != 1)) {
        std::string want;
        for (int64_t v : ne) {
            want += (want.empty() ? "" : ", ") + std::to_string(v);
        }
        throw std::runtime_error(format("%s: codes a weight of ne {%lld, %lld, %lld} but the model expects %s {%s}",
            code_name.c_str(), (long long) ic, (long long) oc, (long long) n_exp, name.c_str(), want.c_str()));
    }

    // Sidecars are required whenever the code is (unless the whole weight is skipped).
    const int req_flags = (flags & L::TENSOR_SKIP) ? flags : (flags & ~L::TENSOR_NOT_REQUIRED);
    const int opt_flags = flags | L::TENSOR_NOT_REQUIRED;
    auto leaf = [&](const char * suffix) { return LLM_TN_IMPL(tn.arch, tn.tensor, suffix, tn.bid, tn.xid); };
    llama_escha_weight w = {};
    if (experts) {
        w.code  = model.create_tensor(ml, leaf("escha_code"),  { k16, oc / 16, ic / 16, n_exp }, flags);
        w.rin   = model.create_tensor(ml, leaf("escha_rin"),   { ic, n_exp }, req_flags);
        w.rout  = model.create_tensor(ml, leaf("escha_rout"),  { oc, n_exp }, req_flags);
        w.s_in  = model.create_tensor(ml, leaf("escha_s_in"),  { ic, n_exp }, opt_flags);
        w.s_out = model.create_tensor(ml, leaf("escha_s_out"), { oc, n_exp }, opt_flags);
    } else {
        w.code  = model.create_tensor(ml, leaf("escha_code"),  { k16, oc / 16, ic / 16 }, flags);
        w.rin   = model.create_tensor(ml, leaf("escha_rin"),   { ic }, req_flags);
        w.rout  = model.create_tensor(ml, leaf("escha_rout"),  { oc }, req_flags);
        w.s_in  = model.create_tensor(ml, leaf("escha_s_in"),  { ic }, opt_flags);
        w.s_out = model.create_tensor(ml, leaf("escha_s_out"), { oc }, opt_flags);
    }
    if (w.code == nullptr) {
        return true; // skipped by the caller's flags
    }
    auto check_type = [&](ggml_tensor * t, ggml_type type) {
        if (t != nullptr && t->type != type) {
            throw std::runtime_error(format("%s: type %s, expected %s", ggml_get_name(t), ggml_type_name(t->type), ggml_type_name(type)));
        }
    };
    check_type(w.rin, GGML_TYPE_F16);
    check_type(w.rout, GGML_TYPE_F16);
    check_type(w.s_in, GGML_TYPE_F32);
    check_type(w.s_out, GGML_TYPE_F32);

    std::lock_guard<std::mutex> lock(g_mutex);
    g_weights[w.code] = { &model, w };
    *out = w.code;
    return true;
}

const llama_escha_weight * llama_escha_find(const ggml_tensor * w) {
    if (w == nullptr || w->type != GGML_TYPE_I16) {
        return nullptr; // no ordinary weight is i16: skip the lookup
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_weights.find(w);
    return it == g_weights.end() ? nullptr : &it->second.w;
}

void llama_escha_check_values(const llama_model * model) {
    std::vector<const ggml_tensor *> vecs;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        for (const auto & [code, reg] : g_weights) {
            if (reg.model == model) {
                for (const ggml_tensor * t : { reg.w.rin, reg.w.rout, reg.w.s_in, reg.w.s_out }) {
                    if (t != nullptr && t->buffer != nullptr) { // no buffer: a metadata-only pass
                        vecs.push_back(t);
                    }
                }
            }
        }
    }
    std::vector<uint8_t> raw;
    for (const ggml_tensor * t : vecs) {
        raw.resize(ggml_nbytes(t));
        ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
        const int64_t n = ggml_nelements(t);
        for (int64_t i = 0; i < n; i++) {
            const float v = t->type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(((const ggml_fp16_t *) raw.data())[i]) : ((const float *) raw.data())[i];
            if (!std::isfinite(v)) {
                throw std::runtime_error(format("%s: non-finite value %f at index %lld", ggml_get_name(t), v, (long long) i));
            }
        }
    }
}

void llama_escha_forget(const llama_model * model) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto it = g_weights.begin(); it != g_weights.end();) {
        it = it->second.model == model ? g_weights.erase(it) : std::next(it);
    }
}

ggml_op llama_escha_placement_op(const char * suffix, ggml_op weight_op) {
    if (strcmp(suffix, "escha_code") == 0) {
        return weight_op == GGML_OP_MUL_MAT_ID ? GGML_OP_ESCHA_MOE : GGML_OP_ESCHA_LINEAR;
    }
    // Sidecars are probed as an elementwise operand: that keeps them out of
    // repacking CPU buffer types (which only take their own weight ops) and
    // on the device of the layer otherwise.
    return GGML_OP_ADD;
}

ggml_tensor * llama_escha_probe(ggml_context * ctx, ggml_tensor * code, ggml_op op, int n_used) {
    const int64_t ic = code->ne[2] * 16, oc = code->ne[1] * 16, n_exp = code->ne[3];
    if (op == GGML_OP_ESCHA_MOE) {
        ggml_tensor * rin  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, ic, n_exp);
        ggml_tensor * rout = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, oc, n_exp);
        ggml_tensor * x    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ic, 1, 512);
        ggml_tensor * ids  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used > 0 ? n_used : 1, 512);
        return ggml_escha_moe(ctx, code, x, ids, rin, rout, nullptr, nullptr, nullptr);
    }
    ggml_tensor * rin  = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, ic);
    ggml_tensor * rout = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, oc);
    ggml_tensor * x    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ic, 512);
    return ggml_escha_linear(ctx, code, x, rin, rout, nullptr, nullptr, nullptr);
}

static ggml_tensor * rows_contiguous(ggml_context * ctx, ggml_tensor * x) {
    return x->nb[0] == ggml_type_size(x->type) ? x : ggml_cont(ctx, x);
}

ggml_tensor * llama_escha_mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    const llama_escha_weight * e = llama_escha_find(w);
    if (e == nullptr) {
        return ggml_mul_mat(ctx, w, x);
    }
    // Biases, where the architecture has them, are added by its graph.
    return ggml_escha_linear(ctx, e->code, rows_contiguous(ctx, x), e->rin, e->rout, e->s_in, e->s_out, nullptr);
}

ggml_tensor * llama_escha_mul_mat_id(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids) {
    const llama_escha_weight * e = llama_escha_find(w);
    if (e == nullptr) {
        return ggml_mul_mat_id(ctx, w, x, ids);
    }
    return ggml_escha_moe(ctx, e->code, rows_contiguous(ctx, x), ids, e->rin, e->rout, e->s_in, e->s_out, nullptr);
}
