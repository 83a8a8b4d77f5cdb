/*
 * escha-format.h: the numeric constants of the Escha-W2 format
 * (docs/FORMAT.md), the one home of each for C, C++, CUDA/HIP and Metal.
 * Included by the C reference, the op constructors and their parser, the
 * llama.cpp loader and the CUDA/HIP kernels; build/tree.rs inlines it into the
 * Metal shader, which ggml-metal compiles without include paths. The Rust
 * side states the same values once, in src/format.rs.
 *
 * Plain preprocessor definitions only, so that every one of those
 * languages reads this file as it is.
 */
#ifndef ESCHA_FORMAT_H
#define ESCHA_FORMAT_H

/* Tile edge: a tile is 16 input rows x 16 output columns. */
#define ESCHA_TILE 16
/* Hadamard block: IC and OC are multiples of it; H128 acts on each block. */
#define ESCHA_HBLOCK 128
/* 1/sqrt(128) as the f32 constant the format pins (bits 0x3DB504F3). */
#define ESCHA_RS 0.088388347648f

/* Codebook ids (`escha.codebook`, op parameter ESCHA_PARAM_CODEBOOK). The
 * format defines one: cbA. */
#define ESCHA_CODEBOOK_CBA 1

/* cbA: r = ((state * MUL) mod 2^32 & MASK) ^ XOR; the value is
 * f16(lo16(r)) + f16(hi16(r)) with one f16 round-to-nearest-even. */
#define ESCHA_CBA_MUL 0xCBAC1FEDu
#define ESCHA_CBA_MASK 0x8FFF8FFFu
#define ESCHA_CBA_XOR 0x3B603B60u

/* What a device kernel writes to the output row of a slot whose expert id
 * is out of range (the policy is stated in escha-op.h): a quiet NaN. */
#define ESCHA_BAD_EXPERT_F32_BITS 0x7FC00000u

#endif /* ESCHA_FORMAT_H */
