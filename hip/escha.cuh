// Escha-W2 ops (GGML_OP_ESCHA_LINEAR, GGML_OP_ESCHA_MOE) for ggml-cuda and
// ggml-hip (escha-ggml). The numerics are those of docs/FORMAT.md §5/§6.
#pragma once

#include "common.cuh"

// Whether the CUDA/HIP backend can run this escha op (types, layout).
bool ggml_cuda_escha_supports_op(const ggml_tensor * op);

void ggml_cuda_op_escha_linear(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void ggml_cuda_op_escha_moe(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
