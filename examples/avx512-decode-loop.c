/* The avx512vbmi GEMV's decode loop alone, in registers, to see what bounds
 * batch 1 on a given core (docs/PERFORMANCE.md, "What bounds batch 1 on
 * Zen 5"). Eight tiles of one tile row, each two groups of 16 lanes, four
 * value pairs a group: one masked multishift and one 32-bit multiply a
 * value vector, the hash halves moved to where an f32 holds them, the
 * codebook's mask and xor, their exact sum, the rounding to f16's 11 bits,
 * one FMA into accumulators in memory, as src/cpu/avx512.rs does.
 *
 * Variants (-D, default 0), each checked against the contract's codebook on
 * all 65536 states before it is timed:
 *   LO=1    the low half moved by two shifts instead of vpmaddwd
 *   MASK=1  the mask and xor by vpandd + vpxord instead of one vpternlogd
 *   RND=1   the rounding by integer operations instead of Veltkamp's split
 *   RND=2   the rounding by adding and subtracting the sum's own binade
 *           times 2^13 (an and and an integer add make it): two FP adds
 *           and two integer operations instead of a multiply and an FMA
 *
 *   cc -O3 -march=icelake-server -mf16c examples/avx512-decode-loop.c -o /tmp/dl && /tmp/dl
 *
 * Prints core cycles per 32 weights: TSC cycles scaled by the core clock
 * over the TSC's, measured by a chain of dependent scalar adds (one a core
 * cycle). Not built or run by cargo. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

#ifndef LO
#define LO 0
#endif
#ifndef MASK
#define MASK 0
#endif
#ifndef RND
#define RND 0
#endif

/* src/format.rs: CBA_MUL, CBA_MASK, CBA_XOR; src/cpu/mod.rs: the halves'
 * mask and xor where an f32 holds them. */
#define MUL 0xCBAC1FEDu
#define M32 0x8FFF8FFFu
#define X32 0x3B603B60u
#define HMASK ((((M32 & 0x8000u) << 16) | ((M32 & 0x7FFFu) << 13)))
#define HXOR ((((X32 & 0x8000u) << 16) | ((X32 & 0x7FFFu) << 13)))
#define I(x) _mm512_set1_epi32((int) (x))
#define PS _mm512_castsi512_ps
#define SI _mm512_castps_si512

static double tsc(void) { unsigned a; return (double) __rdtscp(&a); }

/* A state per dword, zero-extended, as the GEMV's masked multishift cuts it. */
static inline __m512i cut(__m512i ctrl, __m512i src) {
    __m512i o;
    __asm__("vpmultishiftqb %2, %1, %0%{%3%}%{z%}" : "=v"(o) : "v"(ctrl), "v"(src), "Yk"((__mmask64) 0x3333333333333333ull));
    return o;
}

/* The value of each dword's state, times 2^-112. */
static inline __m512 value(__m512i s) {
    __m512i h = _mm512_mullo_epi32(s, I(MUL));
#if LO
    __m512i lo = _mm512_srai_epi32(_mm512_slli_epi32(h, 16), 3);
#else
    __m512i lo = _mm512_madd_epi16(h, I(1 << 13));
#endif
    __m512i hi = _mm512_srai_epi32(h, 3);
#if MASK
    lo = _mm512_xor_si512(_mm512_and_si512(lo, I(HMASK)), I(HXOR));
    hi = _mm512_xor_si512(_mm512_and_si512(hi, I(HMASK)), I(HXOR));
#else
    lo = _mm512_ternarylogic_epi32(lo, I(HMASK), I(HXOR), 0x6a);
    hi = _mm512_ternarylogic_epi32(hi, I(HMASK), I(HXOR), 0x6a);
#endif
    __m512 v = _mm512_add_ps(PS(lo), PS(hi));
#if RND == 1
    __m512i b = SI(v), odd = _mm512_and_si512(_mm512_srli_epi32(b, 13), I(1));
    return PS(_mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(b, I(0xFFF)), odd), I(~0x1FFFu)));
#elif RND == 2
    __m512 c = PS(_mm512_add_epi32(_mm512_and_si512(SI(v), I(0xFF800000u)), I(13 << 23)));
    return _mm512_sub_ps(_mm512_add_ps(v, c), c);
#else
    __m512 c = _mm512_mul_ps(v, _mm512_set1_ps(8193.f));
    return _mm512_fnmadd_ps(v, _mm512_set1_ps(8192.f), c);
#endif
}

/* The contract: the two f16 halves of (s * MUL & MASK) ^ XOR added in f16. */
static float contract(uint32_t s) {
    uint32_t h = ((s * MUL) & M32) ^ X32;
    float sum = _cvtsh_ss((uint16_t) h) + _cvtsh_ss((uint16_t) (h >> 16));
    return _cvtsh_ss(_cvtss_sh(sum, 0));
}

static const int64_t CTRL[8] = { 0x0a020c040e0600, 0x0c0406080a0200, 0x0b030d050f0701, 0x0d0507090b0301,
                                 0x08000a020c0400, 0x0e0608000a0402, 0x09010b030d0501, 0x0f07010b050301 };

__attribute__((noinline)) static void tile_rows(const __m512i * code, long n, __m512 acc[8][4], const float * xs) {
    for (long kt = 0; kt < n; kt++) {
        __m512 xv[4];
        for (int i = 0; i < 4; i++) xv[i] = _mm512_set1_ps(xs[(kt * 4 + i) & 63]);
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
            __m512i w = _mm512_load_si512(&code[(kt * 8 + t) & 1023]);
            _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) {
                __m512i src = _mm512_permutexvar_epi16(_mm512_set1_epi16((short) (g + 3)), w);
                _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
                    __m512 a = value(cut(_mm512_set1_epi64(CTRL[2 * p]), src));
                    __m512 b = value(cut(_mm512_set1_epi64(CTRL[2 * p + 1]), src));
                    __m512 * c = &acc[t][g * 2 + (p >> 1)];
                    *c = _mm512_fmadd_ps(a, xv[(2 * p) & 3], *c);
                    *c = _mm512_fmadd_ps(b, xv[(2 * p + 1) & 3], *c);
                }
            }
        }
    }
}

int main(void) {
    float up = 1.0f;
    for (int i = 0; i < 112; i++) up *= 2.0f;
    int bad = 0;
    for (uint32_t s0 = 0; s0 < 65536; s0 += 16) {
        float o[16];
        __m512i s = _mm512_add_epi32(I(s0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        _mm512_storeu_ps(o, _mm512_mul_ps(value(s), _mm512_set1_ps(up)));
        for (int i = 0; i < 16; i++) bad += o[i] != contract(s0 + i);
    }
    long n = 400000000;
    uint64_t x = 1;
    double t0 = tsc();
    for (long i = 0; i < n; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    double core_per_tsc = 4.0 * n / (tsc() - t0);
    static __m512i code[1024];
    static float xs[64];
    for (int i = 0; i < 1024; i++) code[i] = I(i * 2654435761u);
    for (int i = 0; i < 64; i++) xs[i] = 1.0f + i;
    __m512 acc[8][4];
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
        long rows = 500000;
        t0 = tsc();
        tile_rows(code, rows, acc, xs);
        double c = (tsc() - t0) * core_per_tsc / (rows * 8 * 8);
        best = c < best ? c : best;
    }
    float sink[16];
    _mm512_storeu_ps(sink, acc[3][2]);
    printf("LO=%d MASK=%d RND=%d: %s (%d of 65536 states wrong), %.2f core cycles per 32 weights (core/TSC %.3f)%s\n", LO, MASK, RND,
           bad ? "NOT the contract" : "the contract's values", bad, best, core_per_tsc, sink[0] == 12345.f ? "!" : "");
    return bad != 0;
}
