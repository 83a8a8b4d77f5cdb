// Escha-W2 in llama.cpp's model loader and graph builders. Hooked in by
// patches/0005-llama-escha.patch; all logic lives in llama-escha.cpp.
//
// A GGUF stem that carries `<stem>.escha_code` (and sidecars) instead of
// `<stem>.weight` (docs/FORMAT.md §8) is loaded as a coded weight: the code
// tensor stands in for the weight in the model's layer struct, and every
// projection multiply (build_lora_mm / build_lora_mm_id) on it becomes
// GGML_OP_ESCHA_LINEAR / GGML_OP_ESCHA_MOE.
#pragma once

#include "ggml.h"

#include <cstdint>
#include <initializer_list>
#include <string>

struct llama_model;
struct llama_model_base;
struct llama_model_loader;
struct LLM_TN_IMPL;

struct llama_escha_weight {
    ggml_tensor * code;
    ggml_tensor * rin;
    ggml_tensor * rout;
    ggml_tensor * s_in;  // optional
    ggml_tensor * s_out; // optional
    ggml_tensor * bias;  // optional: `<stem>.bias` when the architecture has none of its own
};

// The llama_model_base::create_tensor hook. Returns false when `tn` is not a
// coded weight (the caller creates it as usual). Otherwise creates and
// validates the escha tensors, stores the code tensor in *out (nullptr when
// the caller asked to skip it) and returns true. Throws std::runtime_error
// naming the tensor for incomplete or inconsistent escha tensors.
bool llama_escha_create_tensor(llama_model_base & model, llama_model_loader & ml, const LLM_TN_IMPL & tn,
                               std::initializer_list<int64_t> ne, int flags, ggml_tensor ** out);

// The coded weight whose code tensor is `w`, or nullptr.
const llama_escha_weight * llama_escha_find(const ggml_tensor * w);

// After the architecture has created its tensors, before the loader counts
// them: creates the `<stem>.bias` of coded weights that the architecture did
// not ask for (the escha op applies them when escha.apply_bias is true),
// accounts for the global tables of the published layout (§8 (a)), and
// throws, naming the tensor, for a `<stem>.escha_*` tensor that no coded
// weight the architecture asked for owns.
void llama_escha_finish_tensors(llama_model_base & model, llama_model_loader & ml);

// After the data is loaded: throws, naming the tensor, if a scale vector
// (rin, rout, s_in, s_out) or a bias of a coded weight (applied by the escha
// op or by the architecture) holds NaN or infinity; for the
// published layout (`<arch>.escha.version` = 1), brings its non-contract
// conventions to upstream's (ssm_a = -exp(A_log), DeltaNet V-head order).
void llama_escha_finish_load(llama_model * model);

// What llama.cpp reports of a file (llama_model_n_params, llama_model_desc,
// llama-bench's model column): a code tensor counts as the IC x OC (x E)
// weights it codes, not as its 16-bit code words, and the format's own
// vectors (escha_rin, escha_rout, escha_s_in, escha_s_out, the published
// layout's tables) count as the block scales of llama.cpp's quants do: not
// at all. The file type of a file with coded weights is named
// "Escha-W2 + <type of the other weights>".
uint64_t llama_escha_n_params(const llama_model_loader & ml);
std::string llama_escha_ftype_name(const llama_model_loader & ml);

// Drops the registrations of a model being freed.
void llama_escha_forget(const llama_model * model);

// Placement: the op a tensor with this suffix is probed with (code: the
// escha op of the weight's op; sidecars: GGML_OP_ADD).
ggml_op llama_escha_placement_op(const char * suffix, ggml_op weight_op);

// A dummy escha op on `code` for supports_op probing (n_used experts, 512 tokens).
ggml_tensor * llama_escha_probe(ggml_context * ctx, ggml_tensor * code, ggml_op op, int n_used);

// ggml_mul_mat / ggml_mul_mat_id, or the escha op when `w` is a coded weight.
ggml_tensor * llama_escha_mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);
ggml_tensor * llama_escha_mul_mat_id(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids);
