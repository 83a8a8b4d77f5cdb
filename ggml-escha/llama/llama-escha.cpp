// See llama-escha.h. Compiled into libllama (patches/0005-llama-escha.patch).
#include "llama-escha.h"
#include "escha-op.h"

#include "llama-arch.h"
#include "llama-impl.h"
#include "llama-model-loader.h"
#include "llama-model.h"

#include "ggml-backend.h"

#include <cmath>
#include <vector>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace {

struct registration {
    const llama_model * model;
    llama_escha_weight w;
    // What creating `<stem>.bias` later needs.
    std::string stem;
    llm_arch arch;
    llm_tensor tensor;
    int bid, xid, flags;
    int64_t oc, n_exp;
};

// Per model being loaded.
struct model_state {
    bool published = false;  // `<arch>.escha.version` = 1 (§8 layout (a))
    bool apply_bias = true;  // escha.apply_bias, absent = true
    bool creating_bias = false;
    std::set<std::string> arch_biases; // stems whose bias the architecture creates itself
    std::set<std::string> asked;       // coded stems the architecture asked for (skipped ones too)
};

std::mutex g_mutex;
std::unordered_map<const ggml_tensor *, registration> g_weights;
std::unordered_map<const void *, model_state> g_models;

const char * const k_leaves[] = { "escha_code", "escha_rin", "escha_rout", "escha_s_in", "escha_s_out" };
const char * const k_published_tables[] = { "escha_lut", "escha_dep_k2", "escha_dep_k3" };

// The cbA codebook value of a state (docs/FORMAT.md §3), to check a file's
// lookup table against. libllama cannot call the CPU backend's reference,
// so the three-instruction hash is restated here with ggml's RNE halves.
uint16_t cba_half(uint32_t state) {
    const uint32_t r = ((state * ESCHA_CBA_MUL) & ESCHA_CBA_MASK) ^ ESCHA_CBA_XOR;
    return ggml_fp32_to_fp16(ggml_fp16_to_fp32((ggml_fp16_t) (r & 0xFFFF)) + ggml_fp16_to_fp32((ggml_fp16_t) (r >> 16)));
}

std::vector<uint8_t> read_from_file(llama_model_loader & ml, const char * name) {
    const auto * w = ml.get_weight(name);
    std::vector<uint8_t> buf(ggml_nbytes(w->tensor));
    ml.files.at(w->idx)->seek(w->offs, SEEK_SET);
    ml.files.at(w->idx)->read_raw(buf.data(), buf.size());
    return buf;
}

// A published dependency table (i16 {16, 256}, row t = value t of a tile):
// the stream positions of value t's 16 state bits, derived from §2 up to the
// two conventions the format does not fix (the order the 16 bits are listed
// in, and where position 0 is): every row is 16 consecutive positions mod
// 256K, all rows in the same direction, and row t starts K positions after
// row t-1 (or all before). Returns an empty string when it is such a table.
std::string dep_table_error(const char * name, const int16_t * v, int k) {
    const int n = 256 * k;
    auto at = [&](int t, int j) { return (int) v[t * 16 + j]; };
    auto mod = [n](int x) { return ((x % n) + n) % n; };
    for (int i = 0; i < 16 * 256; i++) {
        if (v[i] < 0 || v[i] >= n) {
            return format("%s: entry [%d][%d] = %d is not a stream position (0..%d)", name, i / 16, i % 16, v[i], n - 1);
        }
    }
    const int d = mod(at(0, 1) - at(0, 0)) == 1 ? 1 : -1;  // bit order
    const int e = mod(at(1, 0) - at(0, 0)) == k ? 1 : -1;  // value order
    for (int t = 0; t < 256; t++) {
        for (int j = 0; j < 16; j++) {
            const int want = mod(at(0, 0) + e * k * t + d * j);
            if (at(t, j) != want) {
                return format("%s: entry [%d][%d] = %d, expected %d: not the state-bit positions of docs/FORMAT.md §2 "
                    "(each value's 16 state bits are consecutive stream positions, %d after the previous value's)",
                    name, t, j, at(t, j), want, k);
            }
        }
    }
    return "";
}

// The published layout's global tables: the lookup table must be our
// codebook bit for bit, the dependency tables the state-bit positions of
// the format (dep_table_error).
void check_published_tables(llama_model_loader & ml) {
    if (const ggml_tensor * lut = ml.get_tensor_meta("escha_lut")) {
        if (lut->type != GGML_TYPE_F16 || ggml_nelements(lut) != 65536 || lut->ne[0] != 65536) {
            throw std::runtime_error(format("escha_lut: %s with %lld entries, expected f16[65536]", ggml_type_name(lut->type), (long long) ggml_nelements(lut)));
        }
        const std::vector<uint8_t> raw = read_from_file(ml, "escha_lut");
        const auto * v = (const uint16_t *) raw.data();
        for (uint32_t s = 0; s < 65536; s++) {
            if (v[s] != cba_half(s)) {
                throw std::runtime_error(format("escha_lut: entry %u is 0x%04x but codebook cbA (id 1) gives 0x%04x; "
                    "the file was coded with another codebook", s, v[s], cba_half(s)));
            }
        }
    }
    for (const auto [name, k] : { std::pair<const char *, int>{ "escha_dep_k2", 2 }, { "escha_dep_k3", 3 } }) {
        const ggml_tensor * t = ml.get_tensor_meta(name);
        if (t == nullptr) {
            continue;
        }
        if (t->type != GGML_TYPE_I16 || t->ne[0] != 16 || t->ne[1] != 256 || t->ne[2] != 1 || t->ne[3] != 1) {
            throw std::runtime_error(format("%s: %s {%lld, %lld, %lld, %lld}, expected i16 {16, 256}", name, ggml_type_name(t->type),
                (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3]));
        }
        const std::vector<uint8_t> raw = read_from_file(ml, name);
        const std::string err = dep_table_error(name, (const int16_t *) raw.data(), k);
        if (!err.empty()) {
            throw std::runtime_error(err);
        }
    }
}

// A bool key, honouring --override-kv.
bool get_bool(llama_model_loader & ml, const char * key, bool absent) {
    if (auto it = ml.kv_overrides.find(key); it != ml.kv_overrides.end() && it->second.tag == LLAMA_KV_OVERRIDE_TYPE_BOOL) {
        return it->second.val_bool;
    }
    const int64_t id = gguf_find_key(ml.metadata, key);
    if (id < 0) {
        return absent;
    }
    if (gguf_get_kv_type(ml.metadata, id) != GGUF_TYPE_BOOL) {
        throw std::runtime_error(format("%s: type %s, expected bool", key, gguf_type_name(gguf_get_kv_type(ml.metadata, id))));
    }
    return gguf_get_val_bool(ml.metadata, id);
}

// Reads the escha keys once per model. Caller holds g_mutex.
model_state & state_of(const llama_model_base & model, llama_model_loader & ml) {
    auto [it, fresh] = g_models.try_emplace(&model);
    model_state & st = it->second;
    if (!fresh) {
        return st;
    }
    uint32_t version = 0;
    if (ml.get_key(std::string("escha.format_version"), version, false) && version != 2) {
        throw std::runtime_error(format("escha.format_version = %u; this reader knows version 2 (docs/FORMAT.md §8)", version));
    }
    const std::string published_key = ml.get_arch_name() + ".escha.version";
    if (ml.get_key(published_key, version, false)) {
        if (version != 1) {
            throw std::runtime_error(format("%s = %u; only the published layout version 1 is known", published_key.c_str(), version));
        }
        st.published = true;
        check_published_tables(ml);
        // Its tensors are brought to upstream's conventions in place after
        // loading (llama_escha_finish_load), which a read-only mapping forbids.
        if (ml.use_mmap) {
            LLAMA_LOG_INFO("%s: %s = 1 (published layout): loading without mmap to reconcile its tensors\n", __func__, published_key.c_str());
            ml.use_mmap = false;
        }
    }
    uint32_t codebook = 0;
    if (ml.get_key(std::string("escha.codebook"), codebook, false) && codebook != ESCHA_CODEBOOK_CBA) {
        throw std::runtime_error(format("escha.codebook = %u; only codebook %d (cbA) is defined", codebook, ESCHA_CODEBOOK_CBA));
    }
    st.apply_bias = get_bool(ml, "escha.apply_bias", true);
    return st;
}

// A coded weight's bias is added to an F32 output (by the escha op or the
// architecture's graph): any type but F32 / F16 would abort there.
void check_bias_type(const ggml_tensor * b) {
    if (b != nullptr && b->type != GGML_TYPE_F32 && b->type != GGML_TYPE_F16) {
        throw std::runtime_error(format("%s: type %s, expected f32 (or f16)", ggml_get_name(b), ggml_type_name(b->type)));
    }
}

// `<stem>.escha_*` tensors of the file whose stem was never loaded as a
// coded weight: without this, the loader's tensor count fails unnamed.
void check_orphans(llama_model_loader & ml, const std::set<std::string> & asked) {
    for (const auto & [name, w] : ml.weights_map) {
        const size_t dot = name.rfind('.');
        if (dot == std::string::npos || name.compare(dot + 1, 6, "escha_") != 0) {
            continue; // ordinary tensors, and the published layout's global tables (checked apart)
        }
        const std::string stem = name.substr(0, dot);
        if (asked.count(stem)) {
            continue;
        }
        if (ml.get_tensor_meta((stem + ".weight").c_str()) != nullptr) {
            throw std::runtime_error(format("%s: %s also has an ordinary %s.weight; a coded weight carries %s.escha_code instead of .weight",
                name.c_str(), stem.c_str(), stem.c_str(), stem.c_str()));
        }
        if (ml.get_tensor_meta((stem + ".escha_code").c_str()) == nullptr) {
            throw std::runtime_error(format("%s: escha tensor without %s.escha_code", name.c_str(), stem.c_str()));
        }
        throw std::runtime_error(format("%s: architecture %s never asks for %s.weight (no such tensor in this model)",
            name.c_str(), ml.get_arch_name().c_str(), stem.c_str()));
    }
}

} // namespace

bool llama_escha_create_tensor(llama_model_base & model, llama_model_loader & ml, const LLM_TN_IMPL & tn,
                               std::initializer_list<int64_t> ne, int flags, ggml_tensor ** out) {
    using L = llama_model_loader;
    *out = nullptr;
    if (tn.suffix != nullptr && strcmp(tn.suffix, "bias") == 0 && !ml.files.empty()) {
        // The architecture adds this bias itself: the escha op must not.
        const std::string name = tn.str();
        const std::string stem = name.substr(0, name.size() - strlen(".bias"));
        if (ml.get_tensor_meta((stem + ".escha_code").c_str()) != nullptr) {
            check_bias_type(ml.get_tensor_meta(name.c_str()));
            std::lock_guard<std::mutex> lock(g_mutex);
            model_state & st = state_of(model, ml);
            if (!st.creating_bias) {
                st.arch_biases.insert(stem);
            }
        }
        return false;
    }
    if (tn.suffix == nullptr || strcmp(tn.suffix, "weight") != 0 || ml.files.empty()) {
        return false;
    }
    const std::string name = tn.str();
    const std::string stem = name.substr(0, name.size() - strlen(".weight"));
    const std::string code_name = stem + ".escha_code";
    const ggml_tensor * meta = ml.get_tensor_meta(code_name.c_str());
    if (ml.get_tensor_meta(name.c_str()) != nullptr) {
        if (meta != nullptr) {
            throw std::runtime_error(format("%s: has both %s and %s; a coded weight carries %s instead of .weight",
                stem.c_str(), name.c_str(), code_name.c_str(), code_name.c_str()));
        }
        return false; // an ordinary weight
    }
    if (meta == nullptr) {
        return false;
    }
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        state_of(model, ml).asked.insert(stem);
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
    // The shape rule of the op the weight will feed (escha-op.h).
    const ggml_tensor * const vec[ESCHA_VEC_COUNT] = { w.rin, w.rout, w.s_in, w.s_out, nullptr };
    char err[256];
    if (!escha_check_weight(experts, w.code, vec, err, sizeof err)) {
        throw std::runtime_error(format("%s: %s", stem.c_str(), err));
    }

    std::lock_guard<std::mutex> lock(g_mutex);
    state_of(model, ml);
    g_weights[w.code] = { &model, w, stem, tn.arch, tn.tensor, tn.bid, tn.xid, req_flags, oc, experts ? n_exp : 0 };
    *out = w.code;
    return true;
}

void llama_escha_finish_tensors(llama_model_base & model, llama_model_loader & ml) {
    std::vector<registration *> want_bias;
    bool published = false, apply_bias = true;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto st = g_models.find(&model);
        published = st != g_models.end() && st->second.published;
        check_orphans(ml, st != g_models.end() ? st->second.asked : std::set<std::string>{});
        for (const char * name : k_published_tables) {
            if (!published && ml.get_tensor_meta(name) != nullptr) {
                throw std::runtime_error(format("%s: a global table of the published layout, but the file has no coded weights "
                    "or no %s.escha.version", name, ml.get_arch_name().c_str()));
            }
        }
        if (st == g_models.end()) {
            return; // no coded weight in this model
        }
        apply_bias = st->second.apply_bias;
        for (auto & [code, reg] : g_weights) {
            if (reg.model == (const llama_model *) &model && !st->second.arch_biases.count(reg.stem) &&
                ml.get_tensor_meta((reg.stem + ".bias").c_str()) != nullptr) {
                want_bias.push_back(&reg);
            }
        }
        st->second.creating_bias = true;
    }
    for (registration * reg : want_bias) {
        const LLM_TN_IMPL tn(reg->arch, reg->tensor, "bias", reg->bid, reg->xid);
        ggml_tensor * b = reg->n_exp > 0 ? model.create_tensor(ml, tn, { reg->oc, reg->n_exp }, reg->flags)
                                         : model.create_tensor(ml, tn, { reg->oc }, reg->flags);
        check_bias_type(b);
        std::lock_guard<std::mutex> lock(g_mutex);
        reg->w.bias = apply_bias ? b : nullptr; // created either way: every file tensor must be
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_models[&model].creating_bias = false;
    if (published) {
        for (const char * name : k_published_tables) {
            ml.n_created += ml.get_tensor_meta(name) != nullptr; // checked, never loaded
        }
    }
}

const llama_escha_weight * llama_escha_find(const ggml_tensor * w) {
    if (w == nullptr || w->type != GGML_TYPE_I16) {
        return nullptr; // no ordinary weight is i16: skip the lookup
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_weights.find(w);
    return it == g_weights.end() ? nullptr : &it->second.w;
}

namespace {

// Moves `n_heads` groups of `unit` consecutive indices along `axis`, starting
// at index `first`: group j of the result is group src[j] of the input, in
// every slab of the other dimensions. The tensor must be contiguous; along
// axis 0 only for non-block types.
void move_heads(ggml_tensor * t, int axis, int64_t first, int64_t unit, const std::vector<int64_t> & src) {
    if (t == nullptr) {
        return;
    }
    if (!ggml_is_contiguous(t) || (axis == 0 && ggml_blck_size(t->type) != 1)) {
        throw std::runtime_error(format("%s: cannot reorder DeltaNet V heads in a %s tensor along dim %d", ggml_get_name(t), ggml_type_name(t->type), axis));
    }
    if (first + (int64_t) src.size() * unit > t->ne[axis]) {
        throw std::runtime_error(format("%s: V heads %lld..%lld exceed ne[%d] = %lld", ggml_get_name(t), (long long) first,
            (long long) (first + src.size() * unit), axis, (long long) t->ne[axis]));
    }
    std::vector<uint8_t> a(ggml_nbytes(t));
    ggml_backend_tensor_get(t, a.data(), 0, a.size());
    std::vector<uint8_t> b = a;
    const size_t stride = t->nb[axis], slab = t->nb[axis] * t->ne[axis];
    for (size_t o = 0; o < a.size() / slab; o++) {
        for (size_t j = 0; j < src.size(); j++) {
            memcpy(b.data() + o * slab + (first + j * unit) * stride, a.data() + o * slab + (first + src[j] * unit) * stride, unit * stride);
        }
    }
    ggml_backend_tensor_set(t, b.data(), 0, b.size());
}

// Upstream's converter stores DeltaNet V heads tiled ([K0, K1, .., K0, K1, ..])
// where checkpoints group them by key head; the published layout keeps the
// grouped order. Coded weights move by whole 128-channel blocks (8 tiles),
// with their per-channel vectors (docs/FORMAT.md §8).
void reorder_v_heads(llama_model * model, int il) {
    const auto & hp = model->hparams;
    auto & L = model->layers[il];
    const int64_t nk = hp.ssm_n_group, nv = hp.ssm_dt_rank;
    if (nk == 0 || nv == 0 || nk == nv) {
        return;
    }
    const int64_t hv = hp.ssm_d_inner / nv, qk = 2 * nk * hp.ssm_d_state, per_k = nv / nk;
    std::vector<int64_t> src(nv);
    for (int64_t j = 0; j < nv; j++) {
        src[j] = (j % nk) * per_k + j / nk;
    }
    move_heads(L.ssm_a, 0, 0, 1, src);
    move_heads(L.ssm_dt, 0, 0, 1, src);
    move_heads(L.ssm_beta, 1, 0, 1, src);
    move_heads(L.ssm_alpha, 1, 0, 1, src);
    move_heads(L.ssm_conv1d, 1, qk, hv, src);
    // Output channels (rows) of the V part of qkv and of the z gate.
    for (auto [w, first] : { std::pair<ggml_tensor *, int64_t>{ L.wqkv, qk }, { L.wqkv_gate, 0 } }) {
        if (const llama_escha_weight * e = llama_escha_find(w)) {
            if (first % 128 != 0 || hv % 128 != 0) {
                throw std::runtime_error(format("%s: V heads of %lld channels at offset %lld are not whole 128-channel blocks", ggml_get_name(w), (long long) hv, (long long) first));
            }
            move_heads(e->code, 1, first / 16, hv / 16, src);
            move_heads(e->rout, 0, first, hv, src);
            move_heads(e->s_out, 0, first, hv, src);
            move_heads(e->bias, 0, first, hv, src);
        } else {
            move_heads(w, 1, first, hv, src);
        }
    }
    // Input channels (columns) of the output projection.
    if (const llama_escha_weight * e = llama_escha_find(L.ssm_out)) {
        if (hv % 128 != 0) {
            throw std::runtime_error(format("%s: V heads of %lld channels are not whole 128-channel blocks", ggml_get_name(L.ssm_out), (long long) hv));
        }
        move_heads(e->code, 2, 0, hv / 16, src);
        move_heads(e->rin, 0, 0, hv, src);
        move_heads(e->s_in, 0, 0, hv, src);
    } else {
        move_heads(L.ssm_out, 0, 0, hv, src);
    }
}

// ssm_a holds raw A_log in the published layout; upstream's graph wants -exp(A_log).
void a_from_a_log(ggml_tensor * t) {
    if (t->type != GGML_TYPE_F32) {
        throw std::runtime_error(format("%s: type %s, expected f32 A_log", ggml_get_name(t), ggml_type_name(t->type)));
    }
    std::vector<float> v(ggml_nelements(t));
    ggml_backend_tensor_get(t, v.data(), 0, ggml_nbytes(t));
    for (float & x : v) {
        x = -expf(x);
    }
    ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
}

} // namespace

void llama_escha_finish_load(llama_model * model) {
    bool published = false;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto st = g_models.find((const llama_model_base *) model);
        published = st != g_models.end() && st->second.published;
    }
    if (published) {
        for (int il = 0; il < (int) model->layers.size(); il++) {
            if (model->layers[il].ssm_a != nullptr) {
                a_from_a_log(model->layers[il].ssm_a);
                reorder_v_heads(model, il);
            }
        }
    }
    std::vector<const ggml_tensor *> vecs;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        // Biases the architecture adds itself to a coded weight's output.
        if (auto st = g_models.find((const llama_model_base *) model); st != g_models.end()) {
            for (const std::string & stem : st->second.arch_biases) {
                const ggml_tensor * b = model->get_tensor((stem + ".bias").c_str());
                if (b != nullptr && b->buffer != nullptr) {
                    vecs.push_back(b);
                }
            }
        }
        for (const auto & [code, reg] : g_weights) {
            if (reg.model == model) {
                for (const ggml_tensor * t : { reg.w.rin, reg.w.rout, reg.w.s_in, reg.w.s_out, reg.w.bias }) {
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

namespace {
// 0 for a tensor of the format other than a code, -1 for a tensor not of the format.
int64_t escha_weights_of(const std::string & name, const ggml_tensor * t) {
    const size_t dot = name.rfind('.');
    const std::string leaf = name.substr(dot == std::string::npos ? 0 : dot + 1);
    if (leaf.rfind("escha_", 0) != 0) {
        return -1;
    }
    // {16K, OC/16, IC/16, E}, checked against the architecture when the tensor is created
    return leaf == "escha_code" ? t->ne[1] * 16 * t->ne[2] * 16 * t->ne[3] : 0;
}
} // namespace

uint64_t llama_escha_n_params(const llama_model_loader & ml) {
    int64_t n = (int64_t) ml.n_elements;
    for (const auto & [name, w] : ml.weights_map) {
        const int64_t weights = escha_weights_of(name, w.tensor);
        if (weights >= 0) {
            n += weights - ggml_nelements(w.tensor);
        }
    }
    return (uint64_t) n;
}

std::string llama_escha_ftype_name(const llama_model_loader & ml) {
    for (const auto & [name, w] : ml.weights_map) {
        if (escha_weights_of(name, w.tensor) > 0) {
            return "Escha-W2 + " + ml.ftype_name();
        }
    }
    return ml.ftype_name();
}

void llama_escha_forget(const llama_model * model) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_models.erase((const llama_model_base *) model);
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

// The escha op's bias: `<stem>.bias` when the architecture has none of its
// own for this weight and escha.apply_bias is not false (then set to null
// at load), as F32.
static ggml_tensor * bias_of(ggml_context * ctx, const llama_escha_weight * e) {
    if (e->bias == nullptr) {
        return nullptr;
    }
    return e->bias->type == GGML_TYPE_F32 ? e->bias : ggml_cast(ctx, e->bias, GGML_TYPE_F32);
}

static ggml_tensor * rows_contiguous(ggml_context * ctx, ggml_tensor * x) {
    return x->nb[0] == ggml_type_size(x->type) ? x : ggml_cont(ctx, x);
}

ggml_tensor * llama_escha_mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    const llama_escha_weight * e = llama_escha_find(w);
    if (e == nullptr) {
        return ggml_mul_mat(ctx, w, x);
    }
    return ggml_escha_linear(ctx, e->code, rows_contiguous(ctx, x), e->rin, e->rout, e->s_in, e->s_out, bias_of(ctx, e));
}

ggml_tensor * llama_escha_mul_mat_id(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids) {
    const llama_escha_weight * e = llama_escha_find(w);
    if (e == nullptr) {
        return ggml_mul_mat_id(ctx, w, x, ids);
    }
    return ggml_escha_moe(ctx, e->code, rows_contiguous(ctx, x), ids, e->rin, e->rout, e->s_in, e->s_out, bias_of(ctx, e));
}
