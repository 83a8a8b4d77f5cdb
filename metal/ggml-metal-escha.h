// ggml-metal glue for GGML_OP_ESCHA_LINEAR and GGML_OP_ESCHA_MOE (escha-ggml).
// Copied into ggml/src/ggml-metal/ at build time; patch 0007 calls these
// from ggml-metal's supports_op, encode switch, buffer alloc size and
// offload decision.
#pragma once

#include "ggml.h"
#include "ggml-metal-device.h"

#ifdef __cplusplus
extern "C" {
#endif

// Whether the escha kernels take this op (types, layouts, shapes).
bool ggml_metal_escha_supports_op(const struct ggml_tensor * op);

// Bytes an op needs after its result in the same buffer (the MoE prefill
// slot lists); 0 for other ops.
size_t ggml_metal_escha_extra_size(const struct ggml_tensor * op);

// Rows (dense) or tokens (MoE) of an escha op: the batch that decides
// offloading to the GPU when the weights sit in host memory.
int64_t ggml_metal_escha_batch_size(const struct ggml_tensor * op);

// The kernel pipeline `name` of the library (compiled on first use).
struct ggml_metal_pipeline_with_params ggml_metal_escha_get_pipeline(ggml_metal_library_t lib, const char * name);

// Encodes an escha op; `buffer_id` maps a tensor to its Metal buffer and
// offset (ggml-metal-ops.cpp's ggml_metal_get_buffer_id). Returns the
// number of nodes consumed (1).
typedef struct ggml_metal_buffer_id (*ggml_metal_escha_buffer_id_fn)(const struct ggml_tensor * t);
int ggml_metal_escha_encode(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const struct ggml_tensor * op,
                            ggml_metal_escha_buffer_id_fn buffer_id);

#ifdef __cplusplus
}
#endif
