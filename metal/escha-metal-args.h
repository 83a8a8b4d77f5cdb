// Arguments of the escha Metal kernels, shared by the host (ggml-metal-escha.cpp,
// the Linux shim executor) and the shader (escha.metal).
//
// The shader side has no includes: at build time the contents of this file
// replace the `#include "escha-metal-args.h"` line of escha.metal, because
// ggml-metal compiles each kernel source on its own, without include paths.
#ifndef ESCHA_METAL_ARGS_H
#define ESCHA_METAL_ARGS_H

#ifndef __METAL_VERSION__
#include <stdint.h>
#endif

// Simdgroups per threadgroup (both kernels) and threads per simdgroup.
#define ESCHA_MTL_NSG 4
#define ESCHA_MTL_SIMD 32
// Rows (tokens) that the prefill kernel multiplies by each decoded tile.
#define ESCHA_MTL_NR 8
// From this many rows on (dense) or tokens (MoE) the prefill kernels run.
#define ESCHA_MTL_PREFILL_MIN 8
// Rows of the dense simdgroup-matrix kernel, used from this many rows on.
#define ESCHA_MTL_NR_MMA 32
#define ESCHA_MTL_MMA_MIN 32

typedef struct {
    int32_t  k;          // bits per weight, 2 or 3
    int32_t  ic;         // input channels
    int32_t  oc;         // output channels
    int32_t  nrows;      // dense: rows of x (ne11*ne12*ne13); MoE: tokens T
    int32_t  ne11;       // dense: x ne[1]; MoE: NX (rows of x per token)
    int32_t  ne12;       // dense: x ne[2]
    uint64_t nb11;       // x strides in bytes
    uint64_t nb12;
    uint64_t nb13;
    int32_t  n_used;     // MoE: slots per token (dense: 1)
    int32_t  n_expert;   // MoE: experts E (dense: 1)
    uint64_t nbi1;       // MoE: ids row stride in bytes
    uint64_t code_es;    // bytes per expert of the code
    int32_t  rin_es;     // elements per expert: rin, rout
    int32_t  rout_es;
    int32_t  s_in_es;    // elements per expert; 0 = one row shared by all experts
    int32_t  s_out_es;
    int32_t  bias_es;
    int32_t  has_s_in;   // 0/1: the optional sources present
    int32_t  has_s_out;
    int32_t  has_bias;
    int32_t  slot_cap;   // MoE prefill: capacity of each expert's slot list
} escha_metal_args;

#endif // ESCHA_METAL_ARGS_H
