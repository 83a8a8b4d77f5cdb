// escha-plan.h: the host-side decisions for the escha CUDA/HIP kernels
// (which multiply kernel, how rows are grouped, the grid's groups), as plain
// C++ with no CUDA or ggml dependency: escha.cu launches exactly this plan,
// and the shim executor (hip/shim) runs the same plan on the CPU.
#pragma once

#include <cstdint>

// Multiply kernels: escha_mm_kernel on the SIMT path (HIP, pre-Ampere
// NVIDIA), escha_gemv_kernel (mma, token generation and small batches:
// blocks of up to 32 rows, dense batches up to 64 rows), escha_mm_kernel with mma
// (prefill, 64 rows a block), and for large dense batches the weight
// decoded once into f16 (escha_decode_kernel) and multiplied by the
// vendor's BLAS on tensor cores.
enum escha_cuda_family {
    ESCHA_CUDA_SIMT = 0,
    ESCHA_CUDA_GEMV = 1,
    ESCHA_CUDA_MMA = 2,
    ESCHA_CUDA_BLAS = 3,
};

// Row grouping (escha_mm_args.mode).
enum escha_cuda_mode {
    ESCHA_CUDA_DENSE = 0,    // row blocks of one weight
    ESCHA_CUDA_PER_SLOT = 1, // MoE, one group per slot (decode batch sizes)
    ESCHA_CUDA_GROUPED = 2,  // MoE, slots grouped by expert on the device
};

// A switch from the environment (GGML_ESCHA_SIMT): on when set to anything
// but "" or "0", so GGML_ESCHA_SIMT=0 means off, as a user reads it.
static constexpr bool escha_env_switch(const char * value) {
    return value != nullptr && value[0] != '\0' && !(value[0] == '0' && value[1] == '\0');
}
static_assert(!escha_env_switch(nullptr) && !escha_env_switch("") && !escha_env_switch("0"), "unset, empty and 0 are off");
static_assert(escha_env_switch("1") && escha_env_switch("00") && escha_env_switch("yes"), "anything else is on");

// MoE ops with at most this many tokens run each slot on its own.
static constexpr int64_t ESCHA_CUDA_DIRECT_MAX_TOKENS = 8;

// Rows one weight serves in the GEMV kernel at most (a dense op's rows, or
// the rows an expert gets on average); above it the tensor-core prefill
// kernel. A GEMV block takes 8, 16 or 32 of them
// (ESCHA_CUDA_GEMV_BLOCK_MAX_ROWS): a dense op of 33-64 rows runs as row
// groups of 32. On the H200 (docs/PERFORMANCE.md; the kernel alone, hip/bench
// ESCHA_BENCH_MID) 64 rows as one 64-row block (2 tile columns a warp, its
// 64 accumulators) took 127 us for 5120 -> 17408 and 118 us for 17408 ->
// 5120, as two groups of 32-row blocks 83.5 and 82.0 us (the whole op 89.2
// and 88.0, Q4_K 94.7 and 96.6); the 64-row block's 16 input loads a tile
// row a warp put the L1 at 82% of its peak.
static constexpr int64_t ESCHA_CUDA_GEMV_MAX_ROWS = 64;
static constexpr int64_t ESCHA_CUDA_GEMV_BLOCK_MAX_ROWS = 32;
static_assert(ESCHA_CUDA_GEMV_BLOCK_MAX_ROWS == 32, "escha.cu launches GEMV blocks of 1, 2 or 4 8-row blocks");

// The rows a block of a GROUPED MoE op is sized for: twice the rows an
// expert gets on average (n_rows slots over n_expert experts), at most 32,
// not the most it can get (n_tokens). An expert with more rows takes more
// blocks (escha_cuda_plan.mblocks covers n_tokens). Measured on the H200
// with the 35B-A3B's experts (docs/PERFORMANCE.md, device-bench moe-perf):
// blocks of n_tokens rows took the 64-row tensor-core kernel, three
// quarters empty at 512 tokens (16 rows an expert on average: 3258 us for
// gate_up); 32-row GEMV blocks took 380 us there and 1064 us at 2048
// tokens, ahead of 16 rows (417, 1304) and 64 (513, 1279), and the
// tensor-core kernel lost at every size up to 2048 tokens.
// GGML_ESCHA_MOE_ROWS (escha.cu) replaces it, for measuring.
static constexpr int64_t ESCHA_CUDA_MOE_BLOCK_MAX_ROWS = 32;
static constexpr int64_t escha_cuda_moe_block_rows(const int64_t n_rows, const int64_t n_expert) {
    const int64_t avg = n_expert <= 0 || n_rows <= n_expert ? 1 : (n_rows + n_expert - 1) / n_expert;
    return 2 * avg < ESCHA_CUDA_MOE_BLOCK_MAX_ROWS ? 2 * avg : ESCHA_CUDA_MOE_BLOCK_MAX_ROWS;
}
static_assert(escha_cuda_moe_block_rows(4096, 256) == 32 && escha_cuda_moe_block_rows(72, 256) == 2 &&
                  escha_cuda_moe_block_rows(1024, 256) == 8 && escha_cuda_moe_block_rows(27, 8) == 8 &&
                  escha_cuda_moe_block_rows(60, 8) == 16 && escha_cuda_moe_block_rows(16384, 256) == 32,
              "twice the average over the experts, rounded up, at most 32");

// The fused GEMV (one launch per op: input transform, multiply and output
// transform in one kernel, escha_gemv_kernel's FUSED) serves groups of at
// most this many rows, on the mma path; the plan gives it MoE decode slots
// (one row a group) only, the shim runs it dense too; GGML_ESCHA_FUSED=0
// turns it off. Its IC splits are whole 128-blocks, at most
// ESCHA_CUDA_FUSED_KT_MAX tile rows (the warp's xh is staged in shared
// memory).
static constexpr int64_t ESCHA_CUDA_FUSED_MAX_ROWS = 4;
static constexpr int     ESCHA_CUDA_FUSED_KT_MAX   = 32;

// Output tiles per warp of the fused GEMV: 4, or 2 with
// GGML_ESCHA_FUSED_NTW=2. A MoE decode slot is small (35B gate_up: 8 slots
// x 64 tiles x 16 splits of whole 128-blocks): with 4 tiles a warp its grid
// is 512 blocks, 0.43 waves of the H200, 22% achieved occupancy and 38% of
// the issue slots busy (Nsight Compute); 2 tiles a warp double the warps,
// but timed on the H200 the 2-tile grid was slower (gate_up 13.72 against
// 11.10 us a token, down equal at 9.20), so 4 stays the default; with the
// code ring too (an H100, code from HBM: down 10.03 against 9.84 us).
static constexpr int ESCHA_CUDA_FUSED_NTW = 4;

// Output tiles per warp of the dense GEMV with one 8-row block (1-8 rows:
// token generation, MTP verify windows) in a large op: 8 where it has at
// least ESCHA_CUDA_GEMV_WIDE_TILES tiles an SM, else 4 as its blocks of
// more rows and MoE groups take. Each tile row's fixed work (the inputs'
// loads, pointer steps, the loop) then serves 8 tiles (nvcc 13.5: 45.4
// instructions a tile for K=2, 50.4 for K=3, against 46.75 / 53.5) at 7
// blocks an SM instead of 10, so the grid fills a wave only where the op
// is large. H100, whole ops at one row, code from HBM (hip/bench
// ESCHA_BENCH_OPS, docs/PERFORMANCE.md), 8 against 4 tiles a warp: 5120 ->
// 17408 K=2 30.1-30.5 against 31.0 us, K=3 32.4-33.0 against 33.2-33.4,
// 17408 -> 5120 K=3 32.3-32.4 against 33.1; but 5120 -> 12288 24.0-24.2
// against 23.5-23.6 and 5120 -> 10240 21.8-21.9 against 20.5-20.7 (320 x
// 768 and 320 x 640 tiles on 132 SMs: 1,862 and 1,552 an SM; the 17408
// shapes have 2,638).
#define ESCHA_CUDA_HAS_GEMV_WIDE 1 // for hip/bench, which also builds older sources
static constexpr int     ESCHA_CUDA_GEMV_WIDE_NTW   = 8;
static constexpr int64_t ESCHA_CUDA_GEMV_WIDE_TILES = 2400;
static constexpr bool escha_cuda_gemv_wide(const int64_t kt, const int64_t nt, const int64_t nsm) {
    return kt * nt >= ESCHA_CUDA_GEMV_WIDE_TILES * nsm;
}
static_assert(escha_cuda_gemv_wide(320, 1088, 132) && escha_cuda_gemv_wide(1088, 320, 132) && !escha_cuda_gemv_wide(320, 768, 132) &&
                  !escha_cuda_gemv_wide(384, 320, 132),
              "the 27B's 17408-wide ops on an H100 or H200, not its 12288-wide or smaller ones");

// IC splits of a multiply at most, where a grid of two waves would take
// more: it then takes one wave.
static constexpr int64_t ESCHA_CUDA_MAX_SPLITS = 48;

// IC splits of a multiply of `blocks` blocks (output blocks x groups with
// rows) of which `resident` fit on the GPU at once: enough for two waves,
// or one where two would take more than ESCHA_CUDA_MAX_SPLITS (escha.cu's
// launcher says why), keeping at least 8 of the KT tile rows a split.
// rows32: dense 32-row GEMV blocks, whose every split adds 32 rows of
// partial sums in f32 atomics: one wave when it fills at least 85% of the
// resident blocks, else as above. On the H200 (hip/bench ESCHA_BENCH_MID,
// docs/PERFORMANCE.md): 32 rows of 5120 -> 17408 took 43.3 us at one wave
// (90% filled) against 50.3 at two; 64 rows (two groups) 83.5 at two
// waves against 90.6 at one (77% filled); 64 rows of 17408 -> 5120 82.0 at
// one wave (98%) against 86.2.
static constexpr int escha_cuda_ksplit(const int64_t resident, const int64_t blocks, const int KT, const bool rows32 = false) {
    const int64_t one  = resident / blocks;
    const int64_t two  = 2 * resident / blocks;
    const int64_t want = rows32 && one >= 1 && one * blocks * 100 >= 85 * resident ? one
                         : two > ESCHA_CUDA_MAX_SPLITS                              ? one
                                                                                    : two;
    const int64_t most = KT / 8;
    return (int) (want < 1 ? 1 : want < most ? want : most < 1 ? 1 : most);
}
static_assert(escha_cuda_ksplit(1056, 68, 320) == 31 && escha_cuda_ksplit(1056, 20, 1088) == 52 &&
                  escha_cuda_ksplit(1056, 20, 64) == 8 && escha_cuda_ksplit(100, 1000, 320) == 1 &&
                  escha_cuda_ksplit(1056, 68, 4) == 1,
              "two waves, one past the split cap, at least 8 tile rows a split, at least one split");
static_assert(escha_cuda_ksplit(528, 68, 320, true) == 7 && escha_cuda_ksplit(528, 136, 320, true) == 7 &&
                  escha_cuda_ksplit(528, 40, 1088, true) == 13 && escha_cuda_ksplit(528, 20, 1088, true) == 26 &&
                  escha_cuda_ksplit(528, 600, 320, true) == 1,
              "32-row blocks: one wave when it fills 85%, else two");

// Tile rows per IC split for about ksplit splits of KT tile rows (the
// grid's y is then ceil(KT / chunk)); fused: up to whole 128-blocks (8
// tile rows), and no more than the fused kernel's staging holds.
static constexpr int escha_cuda_kt_chunk(const int KT, const int ksplit, const bool fused) {
    const int c = (KT + ksplit - 1) / ksplit;
    return !fused ? c : (c + 7) / 8 * 8 < ESCHA_CUDA_FUSED_KT_MAX ? (c + 7) / 8 * 8 : ESCHA_CUDA_FUSED_KT_MAX;
}
static_assert(escha_cuda_kt_chunk(320, 30, false) == 11 && escha_cuda_kt_chunk(320, 30, true) == 16 &&
                  escha_cuda_kt_chunk(8, 1, true) == 8 && escha_cuda_kt_chunk(16, 1, true) == 16 &&
                  escha_cuda_kt_chunk(1088, 10, true) == 32,
              "whole 128-blocks, at most the staging");

// Dense ops of at least this many rows take the BLAS path (the crossover
// measured on the H200, docs/PERFORMANCE.md; GGML_ESCHA_BLAS_MIN_ROWS
// overrides it, 0 turns the path off).
static constexpr int64_t ESCHA_CUDA_BLAS_MIN_ROWS = 128;

struct escha_cuda_plan {
    int     family;
    int     mode;
    int     nb;      // GEMV: 8-row groups per block, 1, 2, 4 or 8
    int     rows;    // rows one block multiplies
    int     ntw;     // output tiles per warp
    int64_t n_x;     // blocks along the output tiles
    int64_t n_z;     // row groups in the grid
    int64_t z_busy;  // groups that have rows (the grid's useful size)
    int     mblocks; // GROUPED: row blocks per expert
    bool    fused;   // GEMV: the one-launch kernel (ESCHA_CUDA_FUSED_MAX_ROWS)
    bool    code_early; // GEMV, dense: first code loads before the wait for the input transform
};

// Plan p with the fused GEMV at ntw output tiles a warp (2 or 4), for nt
// output tiles and warps warps a block.
static constexpr escha_cuda_plan escha_cuda_fuse(escha_cuda_plan p, const int nt, const int warps, const int ntw) {
    p.fused = true;
    p.ntw   = ntw;
    p.n_x   = (nt + ntw * warps - 1) / (ntw * warps);
    return p;
}

// The grid of a given kernel family and grouping. per_group: rows that one
// weight serves, which size the blocks (dense: all rows; PER_SLOT: 1;
// GROUPED: escha_cuda_moe_block_rows); most: GROUPED, the rows one expert
// can get (the tokens), which the blocks per expert cover. nt: output
// tiles (OC / 16); warps: warps per block; gemv_wide: a large op
// (escha_cuda_gemv_wide), whose dense one-block GEMV takes 8 tiles a warp.
static constexpr escha_cuda_plan escha_cuda_plan_for(int family, int mode, int64_t n_rows, int64_t per_group, int64_t most,
                                                  int64_t n_expert, int nt, int warps, bool gemv_wide = false) {
    escha_cuda_plan p{};
    p.family = family;
    p.mode = mode;
    p.nb = per_group <= 8 ? 1 : per_group <= 16 ? 2 : ESCHA_CUDA_GEMV_BLOCK_MAX_ROWS / 8; // 8-row blocks
    p.rows = family == ESCHA_CUDA_SIMT ? 16 : family == ESCHA_CUDA_MMA ? 64 : p.nb * 8;
    // GEMV: 4 tile columns per warp, 8 for a large dense op's one 8-row block.
    p.ntw = family != ESCHA_CUDA_GEMV                             ? 2
            : gemv_wide && mode == ESCHA_CUDA_DENSE && p.nb == 1 ? ESCHA_CUDA_GEMV_WIDE_NTW
                                                                  : 4;
    p.n_x = (nt + p.ntw * warps - 1) / (p.ntw * warps);
    // A dense op's weights are not written by a kernel on the device (a
    // host copy of op offload is ordered before the op as a whole), so its
    // GEMV may load code before the input transform is done: 0.6-0.8 us an
    // op at one row on the H200 (docs/PERFORMANCE.md; escha.cu also checks
    // that the weights are graph leaves; GGML_ESCHA_EARLY=0 turns it off,
    // for measuring).
    p.code_early = family == ESCHA_CUDA_GEMV && mode == ESCHA_CUDA_DENSE;
    if (family == ESCHA_CUDA_BLAS) {
        p.rows = (int) n_rows; // one product for all rows, no grid of groups
        p.n_x = p.n_z = p.z_busy = 1;
    } else if (mode == ESCHA_CUDA_DENSE) {
        p.n_z = p.z_busy = (n_rows + p.rows - 1) / p.rows;
    } else if (mode == ESCHA_CUDA_PER_SLOT) {
        p.n_z = p.z_busy = n_rows;
    } else {
        p.mblocks = (int) ((most + p.rows - 1) / p.rows);
        p.n_z = n_expert * p.mblocks;
        p.z_busy = (n_expert < n_rows ? n_expert : n_rows) + n_rows / p.rows;
    }
    return p;
}

// The plan for n_rows op rows (dense rows, or MoE slots of n_tokens
// tokens). use_mma: the device has tensor cores the kernels use (sm_80+
// NVIDIA, not forced to SIMT). blas_min_rows: dense ops of at least this
// many rows take the BLAS path (0: never). fused_max_rows: groups of at
// most this many rows take the fused GEMV (0: never). moe_rows: GROUPED
// blocks sized for this many rows (0: escha_cuda_moe_block_rows).
// fused_dense: dense ops of at most fused_max_rows rows take the fused GEMV
// too (GGML_ESCHA_FUSED_DENSE, for measuring it inside a model).
static constexpr escha_cuda_plan escha_cuda_make_plan(bool moe, int64_t n_rows, int64_t n_tokens, int64_t n_expert, int nt,
                                                   int warps, bool use_mma, int64_t blas_min_rows, int64_t fused_max_rows,
                                                   int64_t moe_rows = 0, int fused_ntw = ESCHA_CUDA_FUSED_NTW,
                                                   bool fused_dense = false, bool gemv_wide = false) {
    const bool    direct    = moe && n_tokens <= ESCHA_CUDA_DIRECT_MAX_TOKENS;
    const int64_t grouped   = moe_rows > 0 ? moe_rows : escha_cuda_moe_block_rows(n_rows, n_expert);
    const int64_t per_group = !moe ? n_rows : (direct ? 1 : grouped);
    const int     mode      = !moe ? ESCHA_CUDA_DENSE : direct ? ESCHA_CUDA_PER_SLOT : ESCHA_CUDA_GROUPED;
    const bool    blas      = !moe && blas_min_rows > 0 && n_rows >= blas_min_rows;
    const int     family    = blas ? ESCHA_CUDA_BLAS : !use_mma ? ESCHA_CUDA_SIMT : per_group > ESCHA_CUDA_GEMV_MAX_ROWS ? ESCHA_CUDA_MMA : ESCHA_CUDA_GEMV;
    escha_cuda_plan p = escha_cuda_plan_for(family, mode, n_rows, per_group, n_tokens, n_expert, nt, warps, gemv_wide);
    // Measured on the H200 (docs/PERFORMANCE.md): the fused kernel wins for
    // MoE decode slots (10.2 against 11.8 us, 35B down) and loses on the
    // dense 27B shapes (35.8 against 33.5 us at one row, more at 2-4: its
    // per-warp xh comes before the decode), so dense ops keep three launches.
    const bool fused = family == ESCHA_CUDA_GEMV && (mode == ESCHA_CUDA_PER_SLOT || (fused_dense && mode == ESCHA_CUDA_DENSE)) &&
                       per_group <= fused_max_rows && nt % 8 == 0;
    return fused ? escha_cuda_fuse(p, nt, warps, fused_ntw) : p;
}

// The 27B's large dense ops (5120 -> 17408): one row and 8 on the GEMV at
// 8 tiles a warp (34 blocks of 4 warps along the outputs), 9 rows at 4.
static_assert(escha_cuda_make_plan(false, 1, 1, 0, 1088, 4, true, 128, 4, 0, 4, false, true).ntw == 8 &&
                  escha_cuda_make_plan(false, 8, 8, 0, 1088, 4, true, 128, 4, 0, 4, false, true).n_x == 34 &&
                  escha_cuda_make_plan(false, 9, 9, 0, 1088, 4, true, 128, 4, 0, 4, false, true).ntw == 4 &&
                  escha_cuda_make_plan(false, 1, 1, 0, 1088, 4, true, 128, 4).ntw == 4 &&
                  escha_cuda_make_plan(true, 8, 1, 256, 64, 4, true, 128, 0, 0, 4, false, true).ntw == 4,
              "the large dense one-block GEMV at 8 tiles a warp, the others at 4");

// The 35B-A3B's decode slots (8 a token; gate_up 1024 outputs): the fused
// GEMV, 4 tiles a warp, 4 blocks of 4 warps along the outputs of a slot
// (8 at 2 tiles a warp).
static constexpr escha_cuda_plan escha_cuda_plan_35b_1 = escha_cuda_make_plan(true, 8, 1, 256, 64, 4, true, 128, 4);
static_assert(escha_cuda_plan_35b_1.fused && escha_cuda_plan_35b_1.ntw == 4 && escha_cuda_plan_35b_1.n_x == 4 &&
                  escha_cuda_plan_35b_1.n_z == 8 && escha_cuda_make_plan(true, 8, 1, 256, 64, 4, true, 128, 4, 0, 2).n_x == 8,
              "decode slots: the fused GEMV at 4 tiles a warp (2 when asked)");

// The 35B-A3B's experts (256, 8 a token; gate_up 1024 outputs) in prefill:
// 32-row GEMV blocks at 512 and 4096 tokens, a row block list of each
// expert that covers every token; the tensor-core kernel only when asked.
static constexpr escha_cuda_plan escha_cuda_plan_35b_512  = escha_cuda_make_plan(true, 8 * 512, 512, 256, 64, 4, true, 128, 4);
static constexpr escha_cuda_plan escha_cuda_plan_35b_4096 = escha_cuda_make_plan(true, 8 * 4096, 4096, 256, 64, 4, true, 128, 4);
static_assert(escha_cuda_plan_35b_512.family == ESCHA_CUDA_GEMV && escha_cuda_plan_35b_512.nb == 4 &&
                  escha_cuda_plan_35b_512.mblocks == 16 && escha_cuda_plan_35b_4096.family == ESCHA_CUDA_GEMV &&
                  escha_cuda_plan_35b_4096.nb == 4 && escha_cuda_plan_35b_4096.mblocks == 128 &&
                  escha_cuda_make_plan(true, 8 * 512, 512, 256, 64, 4, true, 128, 4, 100).family == ESCHA_CUDA_MMA,
              "MoE prefill blocks sized for the average expert");
