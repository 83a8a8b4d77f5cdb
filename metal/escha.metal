// Metal kernels for GGML_OP_ESCHA_LINEAR and GGML_OP_ESCHA_MOE (Escha-W2).
//
// The numerics are those of docs/FORMAT.md §5/§6 (C reference:
// ggml-escha/ref/escha_ref.c): the same rounding points, the same Hadamard
// butterfly order; only the f32 order of the `mid` sum differs (lanes and
// simdgroups each sum a part), which the format's order bound covers.
//
// Layout of the work (one threadgroup = ESCHA_MTL_NSG simdgroups of 32):
//   - a threadgroup owns one 128-block of outputs, so the output Hadamard
//     runs on data the threadgroup already holds;
//   - a lane decodes the 8 values t = 8*lane .. 8*lane+7 of a tile: the
//     tensor-core tile order puts them at 4 input rows x 2 output columns, so
//     the lane multiplies them by 4 inputs and keeps 2 column partial sums;
//   - both 128-point Hadamards run in registers, 4 values per lane, with
//     simd_shuffle_xor for the strides 1..16 and in-lane for 32 and 64.
// GEMV (token generation): the simdgroups split IC; the main loop has no
// threadgroup barrier; one barrier joins the partial sums at the end.
// Prefill: each decoded tile is used for ESCHA_MTL_NR rows; the simdgroups
// split the 8 output tiles of the block and share the transformed inputs.
// Large dense batches: tiles decoded into threadgroup memory, multiplied by
// ESCHA_MTL_NR_MMA rows with simdgroup 8x8 matrix multiply-accumulates.
//
// This file also compiles as C++ through metal/shim/metal-shim.h, which is
// how the kernels are executed and tested on Linux.

#ifndef ESCHA_METAL_SHIM
#include <metal_stdlib>
using namespace metal;
#endif

#include "escha-format.h"
#include "escha-metal-args.h"

// Keep every f32 operation as written: the contract pins the Hadamard
// butterflies, x*rin_eff before the first butterfly and (mid*RS)*rout_eff.
// Fast math may contract or reassociate them (Metal < 3.2 cannot opt out).
#if defined(__METAL_VERSION__) && __METAL_VERSION__ >= 320
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)
#endif

#ifdef ESCHA_METAL_SHIM
#define ESCHA_UNROLL
#define ESCHA_TG_MEM(i) // the shim's `threadgroup` qualifier is empty, so is this
#else
#define ESCHA_UNROLL _Pragma("clang loop unroll(full)")
#define ESCHA_TG_MEM(i) [[threadgroup(i)]]
#endif

#define ESCHA_RS_F ESCHA_RS

// Codebook cbA: f16(lo16(r)) + f16(hi16(r)) with Metal's native half add (RNE).
static inline float escha_cb(uint s) {
    const uint r = ((s * ESCHA_CBA_MUL) & ESCHA_CBA_MASK) ^ ESCHA_CBA_XOR;
    const half2 h = as_type<half2>(r);
    return float(h.x + h.y);
}

// The 8 values t = 8*lane + j (j = 0..7) of one tile of 16K int16 (8K uint32
// words, `w32`). Value t's 16-bit state starts at stream position
// (t+1)K - 16 (mod 256K), MSB first; the lane's 8 states lie in 3 words.
template <int K>
static inline void escha_decode_lane(device const uint * w32, ushort lane, thread float * w) {
    const int N  = 256 * K;
    const int NW = 8 * K;
    int p0 = (8 * (int) lane + 1) * K - 16;
    if (p0 < 0) {
        p0 += N;
    }
    const int m0 = p0 >> 5;
    const int off0 = p0 & 31;
    // Three scalars, not an array: which word a value starts in depends on
    // the lane, and a dynamically indexed register array would spill.
    const uint wd0 = w32[m0];
    const uint wd1 = w32[m0 + 1 >= NW ? m0 + 1 - NW : m0 + 1];
    const uint wd2 = w32[m0 + 2 >= NW ? m0 + 2 - NW : m0 + 2];
    const ulong lo2 = (ulong(wd0) << 32) | ulong(wd1); // stream bits from word m0
    const ulong hi2 = (ulong(wd1) << 32) | ulong(wd2); // from word m0 + 1
    ESCHA_UNROLL
    for (int j = 0; j < 8; j++) {
        const int rel = off0 + j * K;          // 0 .. 31 + 7K < 64
        const ulong two = rel < 32 ? lo2 : hi2;
        const uint s = uint(two >> (48 - (rel & 31))) & 0xFFFFu;
        w[j] = escha_cb(s);
    }
}

// Unnormalised Sylvester H128 on a 128-block held as element 32*q + lane in
// v[q]: butterflies h = 1..16 across lanes, 32 and 64 inside the lane. Each
// butterfly is (a + b, a - b) with a the lower index, as in the reference.
static inline float4 escha_h128_simd(float4 v, ushort lane) {
    for (ushort h = 1; h < 32; h <<= 1) {
        const float4 o = simd_shuffle_xor(v, h);
        v = (lane & h) ? (o - v) : (v + o);
    }
    const float4 a = float4(v.x + v.y, v.x - v.y, v.z + v.w, v.z - v.w);
    return float4(a.x + a.z, a.y + a.w, a.x - a.z, a.y - a.w);
}

// xh of one 128-block of an input row: f16(H128(x * rin_eff) * RS), widened.
static inline float4 escha_input_block(device const float * x, device const half * rin,
                                       device const float * s_in, ushort lane) {
    float4 v;
    ESCHA_UNROLL
    for (int q = 0; q < 4; q++) {
        const int i = 32 * q + lane;
        float r = float(rin[i]);
        if (s_in) {
            r = r * s_in[i];
        }
        v[q] = x[i] * r;
    }
    v = escha_h128_simd(v, lane);
    ESCHA_UNROLL
    for (int q = 0; q < 4; q++) {
        v[q] = float(half(v[q] * ESCHA_RS_F));
    }
    return v;
}

// y of one 128-block: f16((H128(mid) * RS) * rout_eff), then f16(y + bias).
static inline void escha_output_block(float4 mid, device const half * rout, device const float * s_out,
                                      device const float * bias, device float * y, ushort lane) {
    const float4 v = escha_h128_simd(mid, lane);
    ESCHA_UNROLL
    for (int q = 0; q < 4; q++) {
        const int i = 32 * q + lane;
        float r = float(rout[i]);
        if (s_out) {
            r = r * s_out[i];
        }
        half h = half((v[q] * ESCHA_RS_F) * r);
        if (bias) {
            h = half(float(h) + bias[i]);
        }
        y[i] = float(h);
    }
}

// One linear (one expert's tensors), offsets already applied.
struct escha_weights {
    device const uint  * code;   // [IC/16][OC/16][8K] uint32 words
    device const half  * rin;
    device const half  * rout;
    device const float * s_in;   // or null
    device const float * s_out;  // or null
    device const float * bias;   // or null
};

static inline escha_weights escha_weights_of(constant escha_metal_args & args, int e,
        device const char * code, device const half * rin, device const half * rout,
        device const float * s_in, device const float * s_out, device const float * bias) {
    escha_weights w;
    w.code  = (device const uint *) (code + (ulong) e * args.code_es);
    w.rin   = rin  + (ulong) e * args.rin_es;
    w.rout  = rout + (ulong) e * args.rout_es;
    w.s_in  = args.has_s_in  ? s_in  + (ulong) e * args.s_in_es  : nullptr;
    w.s_out = args.has_s_out ? s_out + (ulong) e * args.s_out_es : nullptr;
    w.bias  = args.has_bias  ? bias  + (ulong) e * args.bias_es  : nullptr;
    return w;
}

// The lane's 4 input rows of a tile at block-relative row `rb`:
// rb, rb+1, rb+8, rb+9 (rows of values j = 0, 1, 2, 3; j + 4 same rows).
// acc gets += a . w[0..3] for column lane/4, += a . w[4..7] for column lane/4 + 8.
static inline float2 escha_dot4x2(float a0, float a1, float a2, float a3, thread const float * w, float2 acc) {
    acc.x += a0 * w[0];
    acc.x += a1 * w[1];
    acc.x += a2 * w[2];
    acc.x += a3 * w[3];
    acc.y += a0 * w[4];
    acc.y += a1 * w[5];
    acc.y += a2 * w[6];
    acc.y += a3 * w[7];
    return acc;
}

// GEMV: one input row -> outputs [ob*128, ob*128 + 128) of one row.
// shm: NSG*128 floats of inputs + NSG*128 floats of partial sums.
template <int K>
static inline void escha_gemv_row(constant escha_metal_args & args, escha_weights w,
        device const float * x, device float * y, int ob,
        threadgroup float * shm, ushort lane, ushort sg) {
    threadgroup float * sx = shm + sg * 128;
    threadgroup float * sm = shm + ESCHA_MTL_NSG * 128;
    const int nkb = args.ic / 128;
    const int ntoc = args.oc / 16;
    const int tw = 8 * K; // uint32 words per tile

    float2 acc[8]; // per output tile of the block: columns lane/4 and lane/4 + 8
    ESCHA_UNROLL
    for (int n = 0; n < 8; n++) {
        acc[n] = float2(0.0f);
    }

    for (int kb = sg; kb < nkb; kb += ESCHA_MTL_NSG) {
        const float4 xh = escha_input_block(x + kb * 128, w.rin + kb * 128,
                                            w.s_in ? w.s_in + kb * 128 : nullptr, lane);
        ESCHA_UNROLL
        for (int q = 0; q < 4; q++) {
            sx[32 * q + lane] = xh[q];
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (int ktl = 0; ktl < 8; ktl++) {
            const int rb = ktl * 16 + (lane & 3) * 2;
            const float a0 = sx[rb], a1 = sx[rb + 1], a2 = sx[rb + 8], a3 = sx[rb + 9];
            device const uint * tiles = w.code + ((ulong) (kb * 8 + ktl) * ntoc + ob * 8) * tw;
            ESCHA_UNROLL
            for (int n = 0; n < 8; n++) {
                float v[8];
                escha_decode_lane<K>(tiles + n * tw, lane, v);
                acc[n] = escha_dot4x2(a0, a1, a2, a3, v, acc[n]);
            }
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
    }

    // Lanes 4c .. 4c+3 hold parts of the same two columns.
    ESCHA_UNROLL
    for (int n = 0; n < 8; n++) {
        acc[n] += simd_shuffle_xor(acc[n], (ushort) 1);
        acc[n] += simd_shuffle_xor(acc[n], (ushort) 2);
    }
    if ((lane & 3) == 0) {
        const int c = lane >> 2;
        ESCHA_UNROLL
        for (int n = 0; n < 8; n++) {
            sm[sg * 128 + n * 16 + c] = acc[n].x;
            sm[sg * 128 + n * 16 + c + 8] = acc[n].y;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
        float4 mid;
        ESCHA_UNROLL
        for (int q = 0; q < 4; q++) {
            float s = sm[32 * q + lane];
            for (int g = 1; g < ESCHA_MTL_NSG; g++) {
                s += sm[g * 128 + 32 * q + lane];
            }
            mid[q] = s;
        }
        const int o = ob * 128;
        escha_output_block(mid, w.rout + o, w.s_out ? w.s_out + o : nullptr, w.bias ? w.bias + o : nullptr, y + o, lane);
    }
}

// Dense: row `row` of x (rows flattened over ne[1..3]).
static inline device const float * escha_dense_row(constant escha_metal_args & args, device const char * x, int row) {
    const int i1 = row % args.ne11;
    const int i2 = (row / args.ne11) % args.ne12;
    const int i3 = row / (args.ne11 * args.ne12);
    return (device const float *) (x + i1 * args.nb11 + i2 * args.nb12 + i3 * args.nb13);
}

// MoE: the input of slot t*n_used + u, x[t][u % NX].
static inline device const float * escha_moe_x(constant escha_metal_args & args, device const char * x, int slot) {
    const int t = slot / args.n_used;
    const int u = slot % args.n_used;
    return (device const float *) (x + (ulong) (u % args.ne11) * args.nb11 + (ulong) t * args.nb12);
}

// The rows of one prefill step: `count` dense rows from `first`, or the MoE
// slots list[first ..]. Addresses are computed when needed rather than kept
// in per-thread arrays (which dynamic indexing would spill).
struct escha_rowset {
    device const char * x;
    device       float * dst;
    device const int  * list;  // null for dense
    int first;
    int count;
};

static inline device const float * escha_rowset_x(constant escha_metal_args & args, thread const escha_rowset & rs, int r) {
    return rs.list ? escha_moe_x(args, rs.x, rs.list[rs.first + r]) : escha_dense_row(args, rs.x, rs.first + r);
}

static inline device float * escha_rowset_y(constant escha_metal_args & args, thread const escha_rowset & rs, int r) {
    const int row = rs.list ? rs.list[rs.first + r] : rs.first + r;
    return rs.dst + (ulong) row * args.oc;
}

// Prefill: up to NR input rows -> outputs
// [ob*128, ob*128 + 128) of each. Simdgroup sg multiplies output tiles
// 2sg, 2sg+1 of the block for all rows; each tile is decoded once.
// shm: NR*128 floats of inputs + NR*128 floats of sums.
template <int K>
static inline void escha_prefill_rows(constant escha_metal_args & args, escha_weights w,
        thread const escha_rowset & rows, int ob,
        threadgroup float * shm, ushort lane, ushort sg) {
    const int NR = ESCHA_MTL_NR;
    threadgroup float * sx = shm;
    threadgroup float * sm = shm + NR * 128;
    const int nkb = args.ic / 128;
    const int ntoc = args.oc / 16;
    const int tw = 8 * K;

    float2 acc0[NR]; // per row: tile 2sg, columns lane/4 and lane/4 + 8
    float2 acc1[NR]; // per row: tile 2sg+1, the same columns
    ESCHA_UNROLL
    for (int r = 0; r < NR; r++) {
        acc0[r] = float2(0.0f);
        acc1[r] = float2(0.0f);
    }

    for (int kb = 0; kb < nkb; kb++) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int r = sg; r < NR; r += ESCHA_MTL_NSG) {
            float4 xh = float4(0.0f);
            if (r < rows.count) {
                xh = escha_input_block(escha_rowset_x(args, rows, r) + kb * 128, w.rin + kb * 128,
                                       w.s_in ? w.s_in + kb * 128 : nullptr, lane);
            }
            ESCHA_UNROLL
            for (int q = 0; q < 4; q++) {
                sx[r * 128 + 32 * q + lane] = xh[q];
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int ktl = 0; ktl < 8; ktl++) {
            const int rb = ktl * 16 + (lane & 3) * 2;
            device const uint * tiles = w.code + ((ulong) (kb * 8 + ktl) * ntoc + ob * 8 + 2 * sg) * tw;
            float v0[8], v1[8];
            escha_decode_lane<K>(tiles, lane, v0);
            escha_decode_lane<K>(tiles + tw, lane, v1);
            ESCHA_UNROLL
            for (int r = 0; r < NR; r++) {
                threadgroup const float * a = sx + r * 128 + rb;
                acc0[r] = escha_dot4x2(a[0], a[1], a[8], a[9], v0, acc0[r]);
                acc1[r] = escha_dot4x2(a[0], a[1], a[8], a[9], v1, acc1[r]);
            }
        }
    }

    ESCHA_UNROLL
    for (int r = 0; r < NR; r++) {
        acc0[r] += simd_shuffle_xor(acc0[r], (ushort) 1);
        acc0[r] += simd_shuffle_xor(acc0[r], (ushort) 2);
        acc1[r] += simd_shuffle_xor(acc1[r], (ushort) 1);
        acc1[r] += simd_shuffle_xor(acc1[r], (ushort) 2);
    }
    if ((lane & 3) == 0) {
        const int c = (2 * sg) * 16 + (lane >> 2);
        ESCHA_UNROLL
        for (int r = 0; r < NR; r++) {
            sm[r * 128 + c]      = acc0[r].x;
            sm[r * 128 + c + 8]  = acc0[r].y;
            sm[r * 128 + c + 16] = acc1[r].x;
            sm[r * 128 + c + 24] = acc1[r].y;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int o = ob * 128;
    for (int r = sg; r < NR; r += ESCHA_MTL_NSG) {
        if (r < rows.count) {
            float4 mid;
            ESCHA_UNROLL
            for (int q = 0; q < 4; q++) {
                mid[q] = sm[r * 128 + 32 * q + lane];
            }
            escha_output_block(mid, w.rout + o, w.s_out ? w.s_out + o : nullptr, w.bias ? w.bias + o : nullptr,
                               escha_rowset_y(args, rows, r) + o, lane);
        }
    }
}

// Prefill with simdgroup matrices: up to NR_MMA rows -> outputs
// [ob*128, ob*128 + 128) of each. Per 16-row strip of the weight, the 4
// simdgroups decode the strip's 8 tiles (2 each) into threadgroup memory;
// then simdgroup sg multiplies all rows by the strip's columns
// 32sg .. 32sg+31 with 8x8 matrix multiply-accumulates. xh and the weights
// are f16 values, so every product is exact in f32, as in the reference.
// shm: NR_MMA*128 floats of inputs (reused for the sums) + 16*128 floats of weights.
template <int K>
static inline void escha_mma_rows(constant escha_metal_args & args, escha_weights w,
        thread const escha_rowset & rows, int ob,
        threadgroup float * shm, ushort lane, ushort sg) {
    const int NR = ESCHA_MTL_NR_MMA;
    const int NTB = NR / 8; // 8-row blocks of rows
    threadgroup float * sx = shm;
    threadgroup float * sw = shm + NR * 128;
    const int nkb = args.ic / 128;
    const int ntoc = args.oc / 16;
    const int tw = 8 * K;

    simdgroup_float8x8 acc[NTB][4]; // [row block][8-column block of this simdgroup's 32 columns]
    ESCHA_UNROLL
    for (int tb = 0; tb < NTB; tb++) {
        ESCHA_UNROLL
        for (int cb = 0; cb < 4; cb++) {
            acc[tb][cb] = make_filled_simdgroup_matrix<float, 8>(0.0f);
        }
    }

    for (int kb = 0; kb < nkb; kb++) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int r = sg; r < NR; r += ESCHA_MTL_NSG) {
            float4 xh = float4(0.0f);
            if (r < rows.count) {
                xh = escha_input_block(escha_rowset_x(args, rows, r) + kb * 128, w.rin + kb * 128,
                                       w.s_in ? w.s_in + kb * 128 : nullptr, lane);
            }
            ESCHA_UNROLL
            for (int q = 0; q < 4; q++) {
                sx[r * 128 + 32 * q + lane] = xh[q];
            }
        }
        for (int ktl = 0; ktl < 8; ktl++) {
            threadgroup_barrier(mem_flags::mem_threadgroup); // inputs written, last strip read
            device const uint * tiles = w.code + ((ulong) (kb * 8 + ktl) * ntoc + ob * 8 + 2 * sg) * tw;
            for (int n = 0; n < 2; n++) {
                float v[8];
                escha_decode_lane<K>(tiles + n * tw, lane, v);
                ESCHA_UNROLL
                for (int j = 0; j < 8; j++) {
                    const int row = (lane & 3) * 2 + (j & 1) + ((j >> 1) & 1) * 8;
                    const int col = (2 * sg + n) * 16 + (lane >> 2) + (j >= 4 ? 8 : 0);
                    sw[row * 128 + col] = v[j];
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            ESCHA_UNROLL
            for (int kk = 0; kk < 2; kk++) {
                simdgroup_float8x8 b[4];
                ESCHA_UNROLL
                for (int cb = 0; cb < 4; cb++) {
                    simdgroup_load(b[cb], sw + kk * 8 * 128 + sg * 32 + cb * 8, 128);
                }
                ESCHA_UNROLL
                for (int tb = 0; tb < NTB; tb++) {
                    simdgroup_float8x8 a;
                    simdgroup_load(a, sx + tb * 8 * 128 + ktl * 16 + kk * 8, 128);
                    ESCHA_UNROLL
                    for (int cb = 0; cb < 4; cb++) {
                        simdgroup_multiply_accumulate(acc[tb][cb], a, b[cb], acc[tb][cb]);
                    }
                }
            }
        }
    }

    threadgroup_barrier(mem_flags::mem_threadgroup);
    ESCHA_UNROLL
    for (int tb = 0; tb < NTB; tb++) {
        ESCHA_UNROLL
        for (int cb = 0; cb < 4; cb++) {
            simdgroup_store(acc[tb][cb], sx + tb * 8 * 128 + sg * 32 + cb * 8, 128);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int o = ob * 128;
    for (int r = sg; r < NR; r += ESCHA_MTL_NSG) {
        if (r < rows.count) {
            float4 mid;
            ESCHA_UNROLL
            for (int q = 0; q < 4; q++) {
                mid[q] = sx[r * 128 + 32 * q + lane];
            }
            escha_output_block(mid, w.rout + o, w.s_out ? w.s_out + o : nullptr, w.bias ? w.bias + o : nullptr,
                               escha_rowset_y(args, rows, r) + o, lane);
        }
    }
}

// ---- dense: GGML_OP_ESCHA_LINEAR ------------------------------------------

// grid (OC/128, rows, 1), threads (32, NSG, 1)
template <int K>
kernel void kernel_escha_linear_gemv(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * code  [[buffer(1)]],
        device const char  * x     [[buffer(2)]],
        device const half  * rin   [[buffer(3)]],
        device const half  * rout  [[buffer(4)]],
        device const float * s_in  [[buffer(5)]],
        device const float * s_out [[buffer(6)]],
        device const float * bias  [[buffer(7)]],
        device       float * dst   [[buffer(8)]],
        threadgroup  float * shm   ESCHA_TG_MEM(0),
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const int row = tgpig.y;
    const escha_weights w = escha_weights_of(args, 0, code, rin, rout, s_in, s_out, bias);
    escha_gemv_row<K>(args, w, escha_dense_row(args, x, row), dst + (ulong) row * args.oc, tgpig.x, shm, lane, sg);
}

// grid (OC/128, ceil(rows/NR), 1), threads (32, NSG, 1)
template <int K>
kernel void kernel_escha_linear_prefill(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * code  [[buffer(1)]],
        device const char  * x     [[buffer(2)]],
        device const half  * rin   [[buffer(3)]],
        device const half  * rout  [[buffer(4)]],
        device const float * s_in  [[buffer(5)]],
        device const float * s_out [[buffer(6)]],
        device const float * bias  [[buffer(7)]],
        device       float * dst   [[buffer(8)]],
        threadgroup  float * shm   ESCHA_TG_MEM(0),
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const escha_weights w = escha_weights_of(args, 0, code, rin, rout, s_in, s_out, bias);
    escha_rowset rows;
    rows.x = x;
    rows.dst = dst;
    rows.list = nullptr;
    rows.first = tgpig.y * ESCHA_MTL_NR;
    rows.count = min(ESCHA_MTL_NR, args.nrows - rows.first);
    escha_prefill_rows<K>(args, w, rows, tgpig.x, shm, lane, sg);
}

// grid (OC/128, ceil(rows/NR_MMA), 1), threads (32, NSG, 1)
template <int K>
kernel void kernel_escha_linear_mma(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * code  [[buffer(1)]],
        device const char  * x     [[buffer(2)]],
        device const half  * rin   [[buffer(3)]],
        device const half  * rout  [[buffer(4)]],
        device const float * s_in  [[buffer(5)]],
        device const float * s_out [[buffer(6)]],
        device const float * bias  [[buffer(7)]],
        device       float * dst   [[buffer(8)]],
        threadgroup  float * shm   ESCHA_TG_MEM(0),
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const escha_weights w = escha_weights_of(args, 0, code, rin, rout, s_in, s_out, bias);
    escha_rowset rows;
    rows.x = x;
    rows.dst = dst;
    rows.list = nullptr;
    rows.first = tgpig.y * ESCHA_MTL_NR_MMA;
    rows.count = min(ESCHA_MTL_NR_MMA, args.nrows - rows.first);
    escha_mma_rows<K>(args, w, rows, tgpig.x, shm, lane, sg);
}

// ---- expert-indexed: GGML_OP_ESCHA_MOE ------------------------------------
// Slot s = t*n_used + u: expert ids[t][u] on x[t][u % NX] -> dst[t][u].
// An id outside [0, E) cannot be reported from the GPU: its outputs are NaN.

static inline int escha_moe_id(constant escha_metal_args & args, device const char * ids, int t, int u) {
    return ((device const int *) (ids + (ulong) t * args.nbi1))[u];
}

static inline void escha_fill_nan(device float * y, int ob, ushort lane, ushort sg) {
    if (sg == 0) {
        for (int q = 0; q < 4; q++) {
            y[ob * 128 + 32 * q + lane] = as_type<float>(ESCHA_BAD_EXPERT_F32_BITS);
        }
    }
}

// grid (OC/128, n_used, T), threads (32, NSG, 1)
template <int K>
kernel void kernel_escha_moe_gemv(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * code  [[buffer(1)]],
        device const char  * x     [[buffer(2)]],
        device const half  * rin   [[buffer(3)]],
        device const half  * rout  [[buffer(4)]],
        device const float * s_in  [[buffer(5)]],
        device const float * s_out [[buffer(6)]],
        device const float * bias  [[buffer(7)]],
        device       float * dst   [[buffer(8)]],
        device const char  * ids   [[buffer(9)]],
        threadgroup  float * shm   ESCHA_TG_MEM(0),
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const int u = tgpig.y;
    const int t = tgpig.z;
    const int slot = t * args.n_used + u;
    device float * y = dst + (ulong) slot * args.oc;
    const int e = escha_moe_id(args, ids, t, u);
    if (e < 0 || e >= args.n_expert) {
        escha_fill_nan(y, tgpig.x, lane, sg);
        return;
    }
    const escha_weights w = escha_weights_of(args, e, code, rin, rout, s_in, s_out, bias);
    escha_gemv_row<K>(args, w, escha_moe_x(args, x, slot), y, tgpig.x, shm, lane, sg);
}

// Groups the slots by expert for the prefill kernel. scratch: counts[E+1],
// then E+1 lists of slot_cap slots (list E: slots with an invalid id), each
// in ascending slot order. grid (ceil((E+1)/32), 1, 1), threads (32, 1, 1).
kernel void kernel_escha_moe_map(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * ids     [[buffer(9)]],
        device       int   * scratch [[buffer(10)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]]) {
    const int e = tgpig.x * 32 + lane;
    if (e > args.n_expert) {
        return;
    }
    device int * list = scratch + (args.n_expert + 1) + (ulong) e * args.slot_cap;
    int n = 0;
    for (int t = 0; t < args.nrows; t++) {
        for (int u = 0; u < args.n_used; u++) {
            const int id = escha_moe_id(args, ids, t, u);
            const bool bad = id < 0 || id >= args.n_expert;
            if (bad ? e == args.n_expert : id == e) {
                list[n++] = t * args.n_used + u;
            }
        }
    }
    scratch[e] = n;
}

// grid (OC/128, G, E+1) with any G >= 1 (chunks of NR slots are strided by
// G), threads (32, NSG, 1). Each threadgroup decodes its expert's tiles once
// per NR slots.
template <int K>
kernel void kernel_escha_moe_prefill(
        constant escha_metal_args & args [[buffer(0)]],
        device const char  * code    [[buffer(1)]],
        device const char  * x       [[buffer(2)]],
        device const half  * rin     [[buffer(3)]],
        device const half  * rout    [[buffer(4)]],
        device const float * s_in    [[buffer(5)]],
        device const float * s_out   [[buffer(6)]],
        device const float * bias    [[buffer(7)]],
        device       float * dst     [[buffer(8)]],
        device const int   * scratch [[buffer(10)]],
        threadgroup  float * shm     ESCHA_TG_MEM(0),
        uint3  tgpig [[threadgroup_position_in_grid]],
        uint3  tgpg  [[threadgroups_per_grid]],
        ushort lane  [[thread_index_in_simdgroup]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const int e = tgpig.z;
    const int cnt = scratch[e];
    device const int * list = scratch + (args.n_expert + 1) + (ulong) e * args.slot_cap;
    if (e == args.n_expert) {
        for (int i = tgpig.y; i < cnt; i += tgpg.y) {
            escha_fill_nan(dst + (ulong) list[i] * args.oc, tgpig.x, lane, sg);
        }
        return;
    }
    const escha_weights w = escha_weights_of(args, e, code, rin, rout, s_in, s_out, bias);
    for (int c0 = tgpig.y * ESCHA_MTL_NR; c0 < cnt; c0 += tgpg.y * ESCHA_MTL_NR) {
        escha_rowset rows;
        rows.x = x;
        rows.dst = dst;
        rows.list = list;
        rows.first = c0;
        rows.count = min(ESCHA_MTL_NR, cnt - c0);
        escha_prefill_rows<K>(args, w, rows, tgpig.x, shm, lane, sg);
    }
}

// ---- decode only (tests): W_bare[IC][OC] as f16 ---------------------------
// grid (OC/16, IC/16, 1), threads (32, 1, 1)
template <int K>
kernel void kernel_escha_decode(
        constant escha_metal_args & args [[buffer(0)]],
        device const char * code [[buffer(1)]],
        device       half * dst  [[buffer(8)]],
        uint3  tgpig [[threadgroup_position_in_grid]],
        ushort lane  [[thread_index_in_simdgroup]]) {
    const int nt = tgpig.x, kt = tgpig.y;
    device const uint * tile = (device const uint *) code + ((ulong) kt * (args.oc / 16) + nt) * (8 * K);
    float v[8];
    escha_decode_lane<K>(tile, lane, v);
    for (int j = 0; j < 8; j++) {
        const int row = (lane & 3) * 2 + (j & 1) + ((j >> 1) & 1) * 8;
        const int col = (lane >> 2) + (j >= 4 ? 8 : 0);
        dst[(ulong) (kt * 16 + row) * args.oc + nt * 16 + col] = half(v[j]);
    }
}

typedef decltype(kernel_escha_linear_gemv<2>)    escha_linear_gemv_t;
typedef decltype(kernel_escha_linear_prefill<2>) escha_linear_prefill_t;
typedef decltype(kernel_escha_linear_mma<2>)     escha_linear_mma_t;
typedef decltype(kernel_escha_moe_gemv<2>)       escha_moe_gemv_t;
typedef decltype(kernel_escha_moe_prefill<2>)    escha_moe_prefill_t;
typedef decltype(kernel_escha_decode<2>)         escha_decode_t;

template [[host_name("kernel_escha_linear_gemv_k2")]]    kernel escha_linear_gemv_t    kernel_escha_linear_gemv<2>;
template [[host_name("kernel_escha_linear_gemv_k3")]]    kernel escha_linear_gemv_t    kernel_escha_linear_gemv<3>;
template [[host_name("kernel_escha_linear_prefill_k2")]] kernel escha_linear_prefill_t kernel_escha_linear_prefill<2>;
template [[host_name("kernel_escha_linear_prefill_k3")]] kernel escha_linear_prefill_t kernel_escha_linear_prefill<3>;
template [[host_name("kernel_escha_linear_mma_k2")]]     kernel escha_linear_mma_t     kernel_escha_linear_mma<2>;
template [[host_name("kernel_escha_linear_mma_k3")]]     kernel escha_linear_mma_t     kernel_escha_linear_mma<3>;
template [[host_name("kernel_escha_moe_gemv_k2")]]       kernel escha_moe_gemv_t       kernel_escha_moe_gemv<2>;
template [[host_name("kernel_escha_moe_gemv_k3")]]       kernel escha_moe_gemv_t       kernel_escha_moe_gemv<3>;
template [[host_name("kernel_escha_moe_prefill_k2")]]    kernel escha_moe_prefill_t    kernel_escha_moe_prefill<2>;
template [[host_name("kernel_escha_moe_prefill_k3")]]    kernel escha_moe_prefill_t    kernel_escha_moe_prefill<3>;
template [[host_name("kernel_escha_decode_k2")]]         kernel escha_decode_t         kernel_escha_decode<2>;
template [[host_name("kernel_escha_decode_k3")]]         kernel escha_decode_t         kernel_escha_decode<3>;
