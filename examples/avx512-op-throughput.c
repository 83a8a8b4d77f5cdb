/* Throughput of the single AVX-512 instructions the batch-1 GEMV of the
 * avx512fp16 path is made of (docs/PERFORMANCE.md, "Where the MoE decode
 * slots' warps wait; ... the CPU GEMV's conversion through memory, tried"):
 * 16 independent instructions a loop, ns a loop on one core. An instruction
 * that issues twice a cycle takes as long as vpaddd; once a cycle, twice as
 * long. Not built or run by cargo.
 *
 *   cc -O2 -mavx512f -mavx512bw -mavx512vbmi -mavx512fp16 examples/avx512-op-throughput.c -o /tmp/ot && /tmp/ot
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static _Alignas(64) uint16_t buf[64];
#define LOOPS 20000000L
#define X8(s) s s s s s s s s
#define TIME(name, two)                                                                     \
    do {                                                                                    \
        const double t0 = now();                                                            \
        for (long i = 0; i < LOOPS; i++) {                                                  \
            __asm__ volatile(X8(two) : : "r"(buf) : "xmm0", "xmm1", "xmm8", "xmm9", "memory"); \
        }                                                                                   \
        printf("%-22s %.3f ns a loop\n", name, (now() - t0) / LOOPS * 1e9);                \
    } while (0)

int main(void) {
    TIME("vpaddd", "vpaddd %%zmm8, %%zmm9, %%zmm0\n\tvpaddd %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vpternlogd", "vpternlogd $0x6a, %%zmm8, %%zmm9, %%zmm0\n\tvpternlogd $0x6a, %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vpmullw", "vpmullw %%zmm8, %%zmm9, %%zmm0\n\tvpmullw %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vpmulhuw", "vpmulhuw %%zmm8, %%zmm9, %%zmm0\n\tvpmulhuw %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vpmaddwd", "vpmaddwd %%zmm8, %%zmm9, %%zmm0\n\tvpmaddwd %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vaddph", "vaddph %%zmm8, %%zmm9, %%zmm0\n\tvaddph %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vpmultishiftqb", "vpmultishiftqb %%zmm8, %%zmm9, %%zmm0\n\tvpmultishiftqb %%zmm8, %%zmm9, %%zmm1\n\t");
    TIME("vcvtph2ps (memory)", "vcvtph2ps (%0), %%zmm0\n\tvcvtph2ps 32(%0), %%zmm1\n\t");
    TIME("vcvtph2ps (register)", "vcvtph2ps %%ymm8, %%zmm0\n\tvcvtph2ps %%ymm9, %%zmm1\n\t");
    return 0;
}
