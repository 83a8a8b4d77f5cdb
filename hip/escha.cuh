// Escha-W2 ops (GGML_OP_ESCHA_LINEAR, GGML_OP_ESCHA_MOE) for ggml-cuda and
// ggml-hip (escha-ggml). The numerics are those of docs/FORMAT.md §5/§6.
#pragma once

#include "common.cuh"

// Whether the CUDA/HIP backend can run this escha op (types, layout).
bool ggml_cuda_escha_supports_op(const ggml_tensor * op);

void ggml_cuda_op_escha_linear(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void ggml_cuda_op_escha_moe(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Node i and the nodes after it as one escha launch sequence, where they
// form a pattern that the escha kernels finish themselves (a gate and up op
// pair and their SWIGLU; an op, its reshapes and a residual ADD, or a SILU
// and a MUL; an RMS_NORM and its MUL by a weight, with the input transforms
// of the escha ops that read the product): the number of nodes after i
// that this ran (0: none fused, node i not run). Called at escha ops and
// at RMS_NORM nodes (where 0 leaves the node to ggml-cuda's own fusions).
int ggml_cuda_escha_try_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
