/* The codebook as a 65536-entry f32 table read by AVX2 gathers, the other
 * way to decode on a core without AVX-512 (docs/PERFORMANCE.md, "The fused
 * GEMV's code ring, still untimed ...; AVX2 by gathers and by F16C
 * rounding, tried"): per 8 weights a state
 * extraction (shift, mask), one 8-lane gather from the 256 KB table and
 * one FMA, as the AVX2 GEMV would run it. G weights/s on one core, to set
 * against examples/kernel_timing's `avx2` figure. Not built or run by
 * cargo; the table's values are not the codebook (the rate does not depend
 * on them).
 *
 *   cc -O2 -mavx2 -mfma examples/avx2-codebook-gather.c -o /tmp/cg && /tmp/cg
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    float * tab = aligned_alloc(64, 65536 * sizeof(float));
    const int words = 1 << 22; /* 16 MB of code: beyond L2, as a weight is */
    uint32_t * code = aligned_alloc(64, (size_t) words * sizeof(uint32_t));
    for (int i = 0; i < 65536; i++) tab[i] = (float) i * 0x1p-16f;
    uint32_t r = 12345;
    for (int i = 0; i < words; i++) code[i] = r = r * 1664525u + 1013904223u;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    const __m256 x = _mm256_set1_ps(1.0f);
    const __m256i mask = _mm256_set1_epi32(0xffff);
    for (int round = 0; round < 3; round++) {
        const double t0 = now();
        for (int pass = 0; pass < 8; pass++) {
            for (int i = 0; i < words; i += 8) {
                /* one window of 8 lanes gives 8 state vectors, 2 bits apart (K=2) */
                const __m256i w = _mm256_load_si256((const __m256i *) (code + i));
                for (int j = 0; j < 8; j += 2) {
                    const __m256i s0 = _mm256_and_si256(_mm256_srli_epi32(w, 2 * j), mask);
                    const __m256i s1 = _mm256_and_si256(_mm256_srli_epi32(w, 2 * j + 2), mask);
                    acc0 = _mm256_fmadd_ps(_mm256_i32gather_ps(tab, s0, 4), x, acc0);
                    acc1 = _mm256_fmadd_ps(_mm256_i32gather_ps(tab, s1, 4), x, acc1);
                }
            }
        }
        const double weights = 8.0 * words * 8;
        printf("gathered codebook: %.2f G weights/s\n", weights / (now() - t0) * 1e-9);
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(acc0, acc1));
    printf("(sum %g)\n", o[0]);
    return 0;
}
