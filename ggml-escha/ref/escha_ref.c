/*
 * escha_ref.c: the Escha-W2 contract as plain, scalar C99.
 *
 * Every function is a literal transcription of the format contract
 * (shared docs escha-reference.md sections 1, 2 and 4; semantic ground truth is
 * EschaLabs/escha-mlx escha_mlx/ref.py), with the same rounding points.
 * Clarity over speed: this file is the oracle other backends are gated on.
 *
 * Floating point assumptions: IEEE binary32 `float` evaluated in binary32
 * (FLT_EVAL_METHOD == 0, i.e. SSE/NEON, not x87), round-to-nearest-even,
 * and NO contraction of a*b+c into a fused multiply-add anywhere (the dot
 * product in escha_linear is specified as acc = acc + (a*b), each rounded).
 * Contraction is switched off below for every compiler we know of; ISO C
 * modes of GCC (-std=c99) already default to -ffp-contract=off, GNU modes
 * and C++ builds do not, hence the explicit pragmas.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#include "escha_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* f16 helpers                                                               */
/* ------------------------------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact for all 65536 inputs: zeros, subnormals, normals, inf, NaN (a NaN
 * stays a quiet NaN with its sign and payload shifted into the f32
 * mantissa, bit-identical to F16C's vcvtph2ps). */
float escha_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1Fu;
    uint32_t man = (uint32_t)h & 0x3FFu;

    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign); /* +-0 */
        /* subnormal: man * 2^-24; normalise into an f32 normal */
        exp = 127 - 14; /* exponent of 2^-14 */
        while ((man & 0x400u) == 0) {
            man <<= 1;
            exp--;
        }
        man &= 0x3FFu;
        return bits_f32(sign | (exp << 23) | (man << 13));
    }
    if (exp == 31) {
        if (man == 0)
            return bits_f32(sign | 0x7F800000u); /* inf */
        /* NaN: quiet it (as F16C hardware does), keep sign and payload */
        return bits_f32(sign | 0x7FC00000u | (man << 13));
    }
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* binary32 -> binary16, round-to-nearest-even, subnormal results, overflow
 * to inf, NaN -> quiet NaN (sign and top payload bits kept), signed zeros
 * preserved. */
uint16_t escha_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;

    if (ax >= 0x7F800000u) {
        if (ax > 0x7F800000u) /* NaN: force the quiet bit */
            return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
        return (uint16_t)(sign | 0x7C00u); /* inf */
    }
    /* |f| >= 65520 (halfway between 65504 and 2^16) rounds to inf */
    if (ax >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);
    if (ax < 0x38800000u) {
        /* |f| < 2^-14: result is subnormal or zero, in units of 2^-24.
         * |f| <= 2^-25 rounds to zero (2^-25 itself is a tie -> even 0). */
        uint32_t e, mant, shift, r, rem, half;
        if (ax <= 0x33000000u)
            return (uint16_t)sign;
        e = ax >> 23;                         /* 102..112 */
        mant = (ax & 0x7FFFFFu) | 0x800000u;  /* value = mant * 2^(e-150) */
        shift = 126u - e;                     /* 14..24 */
        r = mant >> shift;
        rem = mant & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* may carry into 0x400: the smallest normal, correct */
        return (uint16_t)(sign | r);
    }
    {
        /* normal: rebias exponent (127 -> 15), round 23 -> 10 mantissa bits;
         * a mantissa carry correctly bumps the exponent. */
        uint32_t r = ax - ((127u - 15u) << 23);
        uint32_t h = r >> 13;
        uint32_t rem = r & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
}

/* ------------------------------------------------------------------------ */
/* codebook cbA (id 1)                                                       */
/* ------------------------------------------------------------------------ */

/* r = ((s * MUL) mod 2^32 & MASK) ^ XOR (escha-format.h);
 * value = f16(lo16(r)) + f16(hi16(r)) with one f16 RNE rounding. Both halves
 * lie in +-[0.125, 2), so the f32 sum is exact and a single f32->f16 RNE
 * conversion equals the fp16 addition. */
uint16_t escha_cb_half(uint16_t state)
{
    uint32_t r = (uint32_t)((uint32_t)state * (uint32_t)ESCHA_CBA_MUL);
    float lo, hi, sum;
    r &= UINT32_C(0xFFFFFFFF);
    r = (r & (uint32_t)ESCHA_CBA_MASK) ^ (uint32_t)ESCHA_CBA_XOR;
    lo = escha_f16_to_f32((uint16_t)(r & 0xFFFFu));
    hi = escha_f16_to_f32((uint16_t)(r >> 16));
    sum = lo + hi;
    return escha_f32_to_f16(sum);
}

/* ------------------------------------------------------------------------ */
/* one tile                                                                  */
/* ------------------------------------------------------------------------ */

/* Bitstream: the tile's 16K uint16 words viewed as 8K little-endian uint32
 * words w32[m] = u16[2m] | u16[2m+1] << 16, read as one circular MSB-first
 * bit string of 256K bits (position p = bit 31 - p%32 of w32[p/32]). Value
 * t's state is positions [(t+1)K - 16, (t+1)K) mod 256K, first position =
 * most significant bit. Returns 0 for K not in {2,3}, t outside 0..255 or a
 * NULL tile. */
uint16_t escha_tile_state(const int16_t *tile, int K, int t)
{
    long nbits, first, i;
    uint32_t state = 0;

    if (tile == NULL || (K != 2 && K != 3) || t < 0 || t > 255)
        return 0;
    nbits = 256L * K;
    first = (long)(t + 1) * K - 16;
    for (i = 0; i < 16; i++) {
        long p = ((first + i) % nbits + nbits) % nbits;
        long m = p / 32;
        uint32_t w = (uint32_t)(uint16_t)tile[2 * m]
                   | ((uint32_t)(uint16_t)tile[2 * m + 1] << 16);
        uint32_t bit = (w >> (31 - (p % 32))) & 1u;
        state = (state << 1) | bit;
    }
    return (uint16_t)state;
}

/* Tensor-core tile order: value t = 8L + j sits at
 *   row (input offset)  = (L & 3)*2 + (j & 1) + ((j >> 1) & 1)*8
 *   col (output offset) = 2*((L >> 3) + (j >= 4 ? 4 : 0)) + ((L >> 2) & 1)
 * A bijection from t in 0..255 onto the 256 cells. */
void escha_tile_position(int t, int *row, int *col)
{
    int L = (t >> 3) & 31;
    int j = t & 7;
    if (row != NULL)
        *row = (L & 3) * 2 + (j & 1) + ((j >> 1) & 1) * 8;
    if (col != NULL)
        *col = 2 * ((L >> 3) + (j >= 4 ? 4 : 0)) + ((L >> 2) & 1);
}

escha_status escha_decode_tile(const int16_t *tile, int K, uint16_t vals[256])
{
    int t;
    if (K != 2 && K != 3)
        return ESCHA_ERR_K;
    if (tile == NULL || vals == NULL)
        return ESCHA_ERR_NULL;
    for (t = 0; t < 256; t++)
        vals[t] = escha_cb_half(escha_tile_state(tile, K, t));
    return ESCHA_OK;
}

/* ------------------------------------------------------------------------ */
/* whole weights                                                             */
/* ------------------------------------------------------------------------ */

static int dims_ok(int64_t IC, int64_t OC)
{
    return IC > 0 && OC > 0 && IC % ESCHA_HBLOCK == 0 && OC % ESCHA_HBLOCK == 0;
}

/* Tile (kt, nt) of a dense code [IC/16][OC/16][16K]. */
static const int16_t *tile_ptr(const int16_t *code, int K, int64_t OC,
                               int64_t kt, int64_t nt)
{
    return code + (kt * (OC / ESCHA_TILE) + nt) * (int64_t)(ESCHA_TILE * K);
}

/* W_bare[kt*16 + row][nt*16 + col] = vals[t] of tile (kt, nt). */
escha_status escha_reconstruct(const int16_t *code, int K, int64_t IC, int64_t OC,
                               uint16_t *w_bare)
{
    int64_t kt, nt;
    if (K != 2 && K != 3)
        return ESCHA_ERR_K;
    if (!dims_ok(IC, OC))
        return ESCHA_ERR_DIMS;
    if (code == NULL || w_bare == NULL)
        return ESCHA_ERR_NULL;
    for (kt = 0; kt < IC / ESCHA_TILE; kt++) {
        for (nt = 0; nt < OC / ESCHA_TILE; nt++) {
            uint16_t vals[256];
            int t;
            escha_decode_tile(tile_ptr(code, K, OC, kt, nt), K, vals);
            for (t = 0; t < 256; t++) {
                int row, col;
                escha_tile_position(t, &row, &col);
                w_bare[(kt * ESCHA_TILE + row) * OC + nt * ESCHA_TILE + col] = vals[t];
            }
        }
    }
    return ESCHA_OK;
}

/* ------------------------------------------------------------------------ */
/* transforms                                                                */
/* ------------------------------------------------------------------------ */

/* Unnormalised Sylvester WHT on each contiguous 128-block, f32 butterflies
 * h = 1, 2, ..., 64: (a, b) -> (a + b, a - b). A trailing partial block
 * (n not a multiple of 128) is left untouched. */
void escha_h128(float *x, int64_t n)
{
    int64_t blk;
    if (x == NULL || n <= 0)
        return;
    for (blk = 0; blk + ESCHA_HBLOCK <= n; blk += ESCHA_HBLOCK) {
        float *v = x + blk;
        int h;
        for (h = 1; h < ESCHA_HBLOCK; h *= 2) {
            int i, k;
            for (i = 0; i < ESCHA_HBLOCK; i += 2 * h) {
                for (k = i; k < i + h; k++) {
                    float a = v[k];
                    float b = v[k + h];
                    v[k] = a + b;
                    v[k + h] = a - b;
                }
            }
        }
    }
}

/* rin_eff = f32(rin) * f32(s_in) (just f32(rin) when s_in is NULL), rout_eff
 * likewise; kept in f32 (rounding to f16 here is a known deviation). */
void escha_fold_scales(const uint16_t *rin, const uint16_t *rout,
                       const float *s_in, const float *s_out,
                       int64_t IC, int64_t OC, float *rin_eff, float *rout_eff)
{
    int64_t i;
    if (rin != NULL && rin_eff != NULL) {
        for (i = 0; i < IC; i++) {
            float v = escha_f16_to_f32(rin[i]);
            rin_eff[i] = s_in != NULL ? v * s_in[i] : v;
        }
    }
    if (rout != NULL && rout_eff != NULL) {
        for (i = 0; i < OC; i++) {
            float v = escha_f16_to_f32(rout[i]);
            rout_eff[i] = s_out != NULL ? v * s_out[i] : v;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */
/* ------------------------------------------------------------------------ */

/* Rows of x processed per pass over the code (bounds scratch memory; each
 * pass decodes every tile once). */
#define ESCHA_ROW_CHUNK 64

/*
 * Per row m:
 *   tmp  = f32(x[m]) * rin_eff                          (f32)
 *   xh   = f16(H128(tmp) * RS), widened to f32
 *   mid  = sum_{r = 0..IC-1, ascending} xh[r] * W[r][c]  acc = acc + (a*b),
 *          acc starting at 0.0f, no FMA, zero activations not skipped
 *   y    = f16((H128(mid)[c] * RS) * rout_eff[c])
 *   y    = f16(f32(y) + f32(bias[c]))                    (bias != NULL)
 * The weight is decoded one 16-row strip (one kt) at a time; the strips are
 * visited in ascending kt and their rows in ascending order, so every
 * accumulator sees r ascending.
 */
escha_status escha_linear(const int16_t *code, int K, int64_t IC, int64_t OC,
                          const float *x, int64_t M,
                          const uint16_t *rin, const uint16_t *rout,
                          const float *s_in, const float *s_out,
                          const float *bias, uint16_t *y)
{
    float *rin_eff, *rout_eff, *xh, *mid, *strip;
    int64_t m0, i, c, kt, nt;

    if (K != 2 && K != 3)
        return ESCHA_ERR_K;
    if (!dims_ok(IC, OC) || M < 0)
        return ESCHA_ERR_DIMS;
    if (code == NULL || x == NULL || rin == NULL || rout == NULL || y == NULL)
        return ESCHA_ERR_NULL;
    if (M == 0)
        return ESCHA_OK;

    rin_eff = (float *)malloc((size_t)IC * sizeof(float));
    rout_eff = (float *)malloc((size_t)OC * sizeof(float));
    xh = (float *)malloc((size_t)ESCHA_ROW_CHUNK * (size_t)IC * sizeof(float));
    mid = (float *)malloc((size_t)ESCHA_ROW_CHUNK * (size_t)OC * sizeof(float));
    strip = (float *)malloc((size_t)ESCHA_TILE * (size_t)OC * sizeof(float));
    if (rin_eff == NULL || rout_eff == NULL || xh == NULL || mid == NULL || strip == NULL) {
        free(rin_eff);
        free(rout_eff);
        free(xh);
        free(mid);
        free(strip);
        return ESCHA_ERR_NULL; /* allocation failure: no dedicated code */
    }

    escha_fold_scales(rin, rout, s_in, s_out, IC, OC, rin_eff, rout_eff);

    for (m0 = 0; m0 < M; m0 += ESCHA_ROW_CHUNK) {
        int64_t mc = M - m0 < ESCHA_ROW_CHUNK ? M - m0 : ESCHA_ROW_CHUNK;
        int64_t m;

        /* input transform */
        for (m = 0; m < mc; m++) {
            const float *xr = x + (m0 + m) * IC;
            float *t = xh + m * IC;
            for (i = 0; i < IC; i++)
                t[i] = xr[i] * rin_eff[i];
            escha_h128(t, IC);
            for (i = 0; i < IC; i++) {
                float s = t[i] * ESCHA_RS;
                t[i] = escha_f16_to_f32(escha_f32_to_f16(s));
            }
        }

        /* mid = xh @ W_bare, r ascending */
        for (i = 0; i < mc * OC; i++)
            mid[i] = 0.0f;
        for (kt = 0; kt < IC / ESCHA_TILE; kt++) {
            int rr;
            for (nt = 0; nt < OC / ESCHA_TILE; nt++) {
                uint16_t vals[256];
                int t;
                escha_decode_tile(tile_ptr(code, K, OC, kt, nt), K, vals);
                for (t = 0; t < 256; t++) {
                    int row, col;
                    escha_tile_position(t, &row, &col);
                    strip[(int64_t)row * OC + nt * ESCHA_TILE + col] =
                        escha_f16_to_f32(vals[t]);
                }
            }
            for (m = 0; m < mc; m++) {
                float *acc = mid + m * OC;
                for (rr = 0; rr < ESCHA_TILE; rr++) {
                    float a = xh[m * IC + kt * ESCHA_TILE + rr];
                    const float *w = strip + (int64_t)rr * OC;
                    for (c = 0; c < OC; c++) {
                        float prod = a * w[c];
                        acc[c] = acc[c] + prod;
                    }
                }
            }
        }

        /* output transform (+ bias) */
        for (m = 0; m < mc; m++) {
            float *md = mid + m * OC;
            uint16_t *yr = y + (m0 + m) * OC;
            escha_h128(md, OC);
            for (c = 0; c < OC; c++) {
                float s = md[c] * ESCHA_RS;
                float v = s * rout_eff[c];
                uint16_t h = escha_f32_to_f16(v);
                if (bias != NULL) {
                    float b = escha_f16_to_f32(h) + bias[c];
                    h = escha_f32_to_f16(b);
                }
                yr[c] = h;
            }
        }
    }

    free(rin_eff);
    free(rout_eff);
    free(xh);
    free(mid);
    free(strip);
    return ESCHA_OK;
}

/*
 * Slot (t, u) = expert e = ids[t][u] applied to x[t][u % NX]: exactly the
 * dense escha_linear (M = 1) on expert e's slices of code/rin/rout/s_in/
 * s_out/bias. All ids are validated before anything is computed.
 */
escha_status escha_moe(const int16_t *code, int K, int64_t E, int64_t IC, int64_t OC,
                       const float *x, int64_t NX, const int32_t *ids,
                       int64_t N_USED, int64_t T,
                       const uint16_t *rin, const uint16_t *rout,
                       const float *s_in, const float *s_out,
                       const float *bias, uint16_t *y)
{
    int64_t t, u, n, code_stride;

    if (K != 2 && K != 3)
        return ESCHA_ERR_K;
    if (!dims_ok(IC, OC) || E <= 0 || N_USED < 0 || T < 0 ||
        (N_USED > 0 && NX != 1 && NX != N_USED))
        return ESCHA_ERR_DIMS;
    if (code == NULL || x == NULL || ids == NULL || rin == NULL || rout == NULL ||
        y == NULL)
        return ESCHA_ERR_NULL;
    for (n = 0; n < T * N_USED; n++)
        if (ids[n] < 0 || (int64_t)ids[n] >= E)
            return ESCHA_ERR_IDS;

    code_stride = (IC / ESCHA_TILE) * (OC / ESCHA_TILE) * (int64_t)(ESCHA_TILE * K);
    for (t = 0; t < T; t++) {
        for (u = 0; u < N_USED; u++) {
            int64_t e = ids[t * N_USED + u];
            escha_status st = escha_linear(
                code + e * code_stride, K, IC, OC,
                x + (t * NX + (u % NX)) * IC, 1,
                rin + e * IC, rout + e * OC,
                s_in != NULL ? s_in + e * IC : NULL,
                s_out != NULL ? s_out + e * OC : NULL,
                bias != NULL ? bias + e * OC : NULL,
                y + (t * N_USED + u) * OC);
            if (st != ESCHA_OK)
                return st;
        }
    }
    return ESCHA_OK;
}

/* g = f32(gate), u = f32(up); s = f16(g / (1 + expf(-g))); out = f16(f32(s) * u).
 * (f32(s) * u of two halves is exact in f32, so this equals fp16 s*u.) */
void escha_swiglu(const uint16_t *gu, int64_t R, int64_t I, uint16_t *out)
{
    int64_t r, i;
    if (gu == NULL || out == NULL || R <= 0 || I <= 0)
        return;
    for (r = 0; r < R; r++) {
        const uint16_t *row = gu + r * 2 * I;
        for (i = 0; i < I; i++) {
            float g = escha_f16_to_f32(row[i]);
            float u = escha_f16_to_f32(row[I + i]);
            float den = 1.0f + expf(-g);
            float sg = g / den;
            uint16_t s = escha_f32_to_f16(sg);
            float p = escha_f16_to_f32(s) * u;
            out[r * I + i] = escha_f32_to_f16(p);
        }
    }
}
