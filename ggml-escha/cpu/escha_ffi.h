/*
 * The interface between ggml-cpu (ggml-cpu-escha.cpp) and the Rust CPU
 * kernels of escha-ggml (src/ffi/cpu_backend.rs). One descriptor covers both
 * ops: a call works on "slots", each an input row, the expert it uses and an
 * output row of dst.
 *
 *   ESCHA_LINEAR (ids == NULL): slots = x rows (i1, i2, i3), expert 0.
 *   ESCHA_MOE: slot s = t*n_used + u uses expert ids[t][u] on x[t][u % NX].
 *   dst row of slot s is dst + s*OC (dst is contiguous in both cases).
 *
 * Keep this struct in sync with `EschaOpDesc` in src/ffi/cpu_backend.rs.
 */
#ifndef ESCHA_FFI_H
#define ESCHA_FFI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct escha_op_desc {
    int32_t k;                 /* 2 or 3 */
    int32_t flags;             /* reserved, 0 */
    int64_t ic, oc, n_expert;  /* n_expert 1 for ESCHA_LINEAR */
    const int16_t * code;  size_t code_nb_e;   /* byte strides between experts */
    const uint16_t * rin;  size_t rin_nb_e;    /* f16 [E][IC] */
    const uint16_t * rout; size_t rout_nb_e;   /* f16 [E][OC] */
    const float * s_in;  size_t s_in_nb_e;     /* NULL if absent; nb_e 0: shared by all experts */
    const float * s_out; size_t s_out_nb_e;
    const float * bias;  size_t bias_nb_e;     /* NULL: no bias applied */
    const char * x;   int64_t x_ne[4];   size_t x_nb[4];    /* rows contiguous (x_nb[0] == 4) */
    const char * ids; int64_t ids_ne[2]; size_t ids_nb[2];  /* NULL for ESCHA_LINEAR */
    float * dst;
} escha_op_desc;

/* Status codes of escha_rs_forward. */
#define ESCHA_RS_OK 0
#define ESCHA_RS_BAD_DESC 1     /* inconsistent descriptor (shape, K, NULL) */
#define ESCHA_RS_BAD_EXPERT 2   /* an expert id outside [0, n_expert) */
#define ESCHA_RS_WORK_SIZE 3    /* work buffer smaller than escha_rs_work_size */
#define ESCHA_RS_PANIC 4        /* internal error (caught, never unwinds into C) */

/* Bytes of work buffer for a call with n_slots slots on n_threads threads. */
size_t escha_rs_work_size(int64_t ic, int64_t oc, int64_t n_slots, int32_t n_threads);

/* Whether a call with n_slots slots runs in one pass (phase 0, no barrier). */
bool escha_rs_single_pass(int64_t n_slots);

/* Whether a one-pass call on n_threads threads also runs phase 3 after a
 * barrier: its output blocks do not divide evenly over the threads, so the
 * leftover blocks' tiles are split over them in phase 0 and their output
 * transform waits for all of them. */
bool escha_rs_one_row_tail(int64_t oc, int64_t n_slots, int32_t n_threads);

/*
 * Phase 1 (input transform, split over slots) or 2 (products and output
 * transform, split over output blocks); every thread calls phase 1, then a
 * barrier, then phase 2; or, where escha_rs_single_pass says so, phase 0
 * (each thread transforms every input itself), and where
 * escha_rs_one_row_tail says so a barrier and phase 3. wdata is the op's
 * work buffer shared by all threads.
 */
int32_t escha_rs_forward(const escha_op_desc * desc, int32_t phase, int32_t ith, int32_t nth,
                         void * wdata, size_t wsize);

#ifdef __cplusplus
}
#endif

#endif /* ESCHA_FFI_H */
