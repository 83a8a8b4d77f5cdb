/*
 * escha_ref: the Escha-W2 contract as plain, scalar C99.
 *
 * This is the reference every backend is gated against (ggml's `use_ref`
 * CPU path calls it). It favours obviousness over speed: each function is a
 * literal transcription of docs/FORMAT.md, with the same rounding points.
 *
 * Conventions
 *   - f16 values travel as their IEEE binary16 bit patterns (uint16_t).
 *   - code tensors are int16 in checkpoint order:
 *       dense  [IC/16][OC/16][16K]
 *       expert [E][IC/16][OC/16][16K]
 *   - matrices are row-major; W_bare is [IC][OC]; x is [M][IC]; y is [M][OC].
 *   - every function that can reject its input returns an escha_status.
 */
#ifndef ESCHA_REF_H
#define ESCHA_REF_H

#include "../include/escha-format.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ESCHA_RS, ESCHA_TILE, ESCHA_HBLOCK and the codebook's constants come from
 * escha-format.h. */

typedef enum {
    ESCHA_OK = 0,
    ESCHA_ERR_K = -1,      /* K not in {2, 3} */
    ESCHA_ERR_DIMS = -2,   /* IC or OC not a positive multiple of 128 */
    ESCHA_ERR_NULL = -3,   /* a required pointer is NULL */
    ESCHA_ERR_IDS = -4     /* an expert id outside [0, E) */
} escha_status;

/* ---- f16 helpers (binary16 <-> binary32, round-to-nearest-even) ---- */
float escha_f16_to_f32(uint16_t h);
uint16_t escha_f32_to_f16(float f);

/* ---- codebook "cbA" (id 1) ---- */
/* f16 bits of the codebook value of a 16-bit trellis state. */
uint16_t escha_cb_half(uint16_t state);

/* ---- one tile ---- */
/* State of trellis value t (0..255) of a tile of 16K words. */
uint16_t escha_tile_state(const int16_t *tile, int K, int t);
/* Place of trellis value t in the 16x16 tile: row = input offset,
 * col = output offset. */
void escha_tile_position(int t, int *row, int *col);
/* The 256 decoded f16 values of a tile, in trellis (storage) order t. */
escha_status escha_decode_tile(const int16_t *tile, int K, uint16_t vals[256]);

/* ---- whole weights ---- */
/* W_bare[IC][OC] (f16 bits) of one dense code [IC/16][OC/16][16K]. */
escha_status escha_reconstruct(const int16_t *code, int K, int64_t IC, int64_t OC,
                               uint16_t *w_bare);

/* ---- transforms ---- */
/* Unnormalised Sylvester Walsh-Hadamard transform, in place, on each
 * contiguous 128-block of x[0..n); n must be a multiple of 128. */
void escha_h128(float *x, int64_t n);
/* rin_eff = f32(rin) * f32(s_in), rout_eff likewise; s_in/s_out may be NULL. */
void escha_fold_scales(const uint16_t *rin, const uint16_t *rout,
                       const float *s_in, const float *s_out,
                       int64_t IC, int64_t OC, float *rin_eff, float *rout_eff);

/* ---- forward ---- */
/*
 * Dense linear: y[M][OC] (f16 bits) from x[M][IC] (f32; pass f16 inputs
 * widened). rin [IC], rout [OC] f16; s_in [IC], s_out [OC] f32 and
 * bias [OC] f32 (checkpoint f16 widened exactly) are optional (NULL).
 */
escha_status escha_linear(const int16_t *code, int K, int64_t IC, int64_t OC,
                          const float *x, int64_t M,
                          const uint16_t *rin, const uint16_t *rout,
                          const float *s_in, const float *s_out,
                          const float *bias, uint16_t *y);

/*
 * Expert-indexed linear. code [E][IC/16][OC/16][16K]; x [T][NX][IC] with
 * NX == 1 (one input broadcast to every slot) or NX == N_USED; ids
 * [T][N_USED] int32; rin [E][IC], rout [E][OC] f16; optional per-expert
 * s_in [E][IC], s_out [E][OC] f32 and bias [E][OC] (f32).
 * y [T][N_USED][OC] f16 bits: slot (t, u) is expert ids[t][u] applied to
 * x[t][u % NX].
 */
escha_status escha_moe(const int16_t *code, int K, int64_t E, int64_t IC, int64_t OC,
                       const float *x, int64_t NX, const int32_t *ids,
                       int64_t N_USED, int64_t T,
                       const uint16_t *rin, const uint16_t *rout,
                       const float *s_in, const float *s_out,
                       const float *bias, uint16_t *y);

/* SwiGLU on an f16 gate_up row pair: gu [R][2I] (gate = first half),
 * out [R][I]: s = f16(g * sigmoid(g)), out = f16(s * u). */
void escha_swiglu(const uint16_t *gu, int64_t R, int64_t I, uint16_t *out);

#ifdef __cplusplus
}
#endif

#endif /* ESCHA_REF_H */
