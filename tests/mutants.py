#!/usr/bin/env python3
"""Mutation check: every bug the READMEs say the tests catch, injected and run.

Each mutant edits one file of a copy of the repository (one or more `old` ->
`new` replacements, each `old` found exactly once), runs the check that
should catch it and restores the file byte for byte. A mutant whose check
still passes has SURVIVED: the tests do not catch the bug it models.

The copy is a `git clone --shared` of this repository's committed HEAD
(uncommitted changes are not seen), checked out in a temporary directory
(default: <tmpdir>/escha-mutants, or $ESCHA_MUTANTS_DIR) with its own cargo
target directory inside it, so a build in the repository itself is never
touched. Before any mutant runs, every check the selected mutants use must
pass on the unmutated copy (a check that already fails proves nothing).

Exit status: 0 if every mutant was caught; 1 if one survived, was stale
(its `old` text no longer occurs exactly once), broke the build instead of
failing a test, or a baseline check failed.

Group `gpu` holds the CUDA kernel and host-plan mutants for a run on a GPU
machine (test-backend-ops must not report every case passing); it is not
run here: `--emit-patches DIR` writes one unified diff per mutant (any
group) for `patch -p1`.
"""

import argparse
import difflib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = ".escha-mutants-copy"

# ---- checks ------------------------------------------------------------------

# Pure-Rust checks build without the `ggml` feature (no llama.cpp tree);
# the shim checks need `shims` (which pulls in `ggml`: a CMake build of the
# patched llama.cpp on the first run, incremental afterwards). Every
# ggml-dependent check uses the same feature set, so one tree serves all.
RUST = ["cargo", "test", "--release", "--no-default-features"]
SHIMS = ["cargo", "test", "--release", "--features", "shims"]

CHECKS = {
    "stage_tests": RUST + ["--lib", "stage_tests"],
    "huge_pages": RUST + ["--lib", "huge_pages"],
    "codec": RUST + ["--test", "codec"],
    "transforms": RUST + ["--test", "transforms"],
    "linear": RUST + ["--test", "linear"],
    "moe": RUST + ["--test", "moe"],
    "quantize": SHIMS + ["--test", "quantize"],
    "ggml_ops": SHIMS + ["--test", "ggml_ops"],
    "cuda_shim": SHIMS + ["--test", "cuda_shim"],
    "hip_shim": SHIMS + ["--test", "hip_shim"],
    "hip_shim_wave64": SHIMS + ["--test", "hip_shim", "wave64"],
    "metal_shim": SHIMS + ["--test", "metal_shim"],
    "metal_glue_moe": SHIMS + ["--test", "metal_shim", "ggml_glue_moe"],
    # The whole end-to-end script, with a short mutation guard.
    "qwen35_e2e": ["env", "ESCHA_MUTANTS=20", "tests/qwen35-e2e.sh"],
    # The benchmarks' synthetic blocks through upstream's gguf-py, in the
    # Python environment tests/qwen35-e2e.sh makes, with this repository's
    # built llama-quantize (the copy's scripts are the ones checked).
    "synthetic_twins": ["env", "PYTHONPATH=" + os.path.join(ROOT, "target", "release", "llama.cpp-convert", "gguf-py"),
                        os.path.join(os.environ.get("ESCHA_CACHE_DIR") or os.path.expanduser("~/.cache/escha-ggml"),
                                     "qwen35", "venv", "bin", "python"),
                        "tests/synthetic_twins.py", os.path.join(ROOT, "target", "release", "llama.cpp-bin", "llama-quantize"),
                        os.path.join(tempfile.gettempdir(), "escha-synthetic-twins")],
}

# Run on the GPU machine by the device script (not here): test-backend-ops of
# the patched tree, $TBO, against the CPU reference; the mutant is caught when
# a case fails. GGML_ESCHA_SIMT=1 also gates the SIMT kernel HIP runs.
DEVICE_CHECKS = {
    "device_tbo": 'for simt in 0 1; do for op in ESCHA_LINEAR ESCHA_MOE; do '
                  'GGML_ESCHA_SIMT=$simt "${TBO:-test-backend-ops}" -b CUDA0 -o $op || exit 1; done; done',
}


def check_text(name):
    if name in CHECKS:
        return " ".join(CHECKS[name])
    return DEVICE_CHECKS[name]


# ---- mutants -----------------------------------------------------------------


class Mutant:
    def __init__(self, id, group, file, edits, check, claim, needs=None):
        self.id, self.group, self.file, self.edits = id, group, file, edits
        self.check, self.claim, self.needs = check, claim, needs


def M(id, group, file, old, new, check, claim, needs=None):
    """A mutant of one replacement."""
    return Mutant(id, group, file, [(old, new)], check, claim, needs)


CUH = "hip/escha-kernels.cuh"
METAL = "metal/escha.metal"

# The CUDA kernel mutants (checked by the CUDA shim here, by test-backend-ops
# on a GPU in group gpu).
CUDA_KERNEL = [
    Mutant("cuda-afrag-swap", "fast", CUH,
           [("const uint32_t A[4] = { b[0], b[2], b[1], b[3] };", "const uint32_t A[4] = { b[0], b[1], b[2], b[3] };")],
           "cuda_shim", "GEMV: two A-fragment registers swapped"),
    M("cuda-lane-offset", "fast", CUH, "off = p0 % 32;", "off = (p0 + 1) % 32;",
      "cuda_shim", "lane bit offset shifted by one bit"),
    M("cuda-drop-shuffle", "fast", CUH,
      "                s += __shfl_xor_sync(0xFFFFFFFF, s, 2, ESCHA_LANES);\n", "",
      "cuda_shim", "SIMT: one reduction shuffle dropped"),
    M("cuda-prefill-row", "fast", CUH,
      "rhi[mt] = g.row(mt * 16 + lane / 4 + 8);", "rhi[mt] = g.row(mt * 16 + lane / 4 + 9);",
      "cuda_shim", "prefill: the upper fragment row shifted by one"),
    M("cuda-butterfly-sign", "fast", CUH,
      "v[q] = (lane & m) ? p - v[q] : v[q] + p;", "v[q] = (lane & m) ? v[q] - p : v[q] + p;",
      "cuda_shim", "H128: a butterfly with the wrong sign"),
    Mutant("cuda-cb-ulp", "fast", CUH, [
        ("    uint32_t r[8];\n", "    uint32_t r[8], st[8];\n"),
        ("        r[j] = ((s * ESCHA_CBA_MUL) & mask) ^ xr;\n",
         "        r[j] = ((s * ESCHA_CBA_MUL) & mask) ^ xr;\n        st[j] = s;\n"),
        ("b[q] = __byte_perm(ua, ub, 0x7610);",
         "b[q] = __byte_perm(ua ^ (uint32_t) ((st[2 * q] & 255) == 90), "
         "ub ^ ((uint32_t) ((st[2 * q + 1] & 255) == 90) << 16), 0x7610);"),
    ], "cuda_shim", "codebook one f16 ulp off for 1/256 of the states ((s & 255) == 90)"),
    M("cuda-decode-once-skip", "fast", CUH,
      "g < units; g += warps) {", "g < units - 1; g += warps) {",
      "cuda_shim", "the decode-once kernel (BLAS path) leaves a weight's last 8 tiles unwritten"),
    Mutant("cuda-decode-once-rows", "fast", CUH, [
        ("= b[1]; // k kq+8, kq+9\n", "= b[2];\n"),
        ("= b[2]; // the same of output n + 8\n", "= b[1];\n"),
    ], "cuda_shim", "the decode-once kernel swaps a lane's k+8 pair of output n with the k pair of output n+8"),
    M("cuda-fused-ring-row-again", "fast", CUH,
      "            ring_words(kt + 1, cw); // past kt_end", "            ring_words(kt, cw); // past kt_end",
      "cuda_shim", "fused kernel's code ring: each row's words taken from the row just decoded, not the next"),
    M("cuda-xh-trunc", "fast", CUH,
      "h[q] = __float2half_rn(__fmul_rn(u[q], ESCHA_RS_F));",
      "float t = __fmul_rn(u[q], ESCHA_RS_F); uint32_t tb; memcpy(&tb, &t, 4); tb &= ~0x1FFFu; memcpy(&t, &tb, 4);\n"
      "        h[q] = __float2half_rn(t);",
      "cuda_shim", "xh converted to f16 by truncation, not rounded to nearest"),
    Mutant("cuda-y-unrounded", "fast", CUH, [
        ("half h = __float2half_rn(__fmul_rn(__fmul_rn(m[q], ESCHA_RS_F), ro[q]));",
         "float h = __fmul_rn(__fmul_rn(m[q], ESCHA_RS_F), ro[q]);"),
        ("h = __float2half_rn(__half2float(h) + b[q]);",
         "h = h + b[q];"),
        (": __half2float(h);", ": h;"),
    ], "cuda_shim", "output transform: y (and y + bias) not rounded to f16"),
    Mutant("cuda-cb-trunc", "fast", CUH, [
        ("// REG_LOP: mask and xr from the parameters",
         "static __device__ __forceinline__ half2 escha_mut_trunc_add(const half2 h) {\n"
         "    float s = __half2float(h.x) + __half2float(h.y);\n"
         "    uint32_t u; memcpy(&u, &s, 4); u &= ~0x1FFFu; memcpy(&s, &u, 4);\n"
         "    half2 r; r.x = __float2half_rn(s); r.y = r.x; return r;\n"
         "}\n\n"
         "// REG_LOP: mask and xr from the parameters"),
        ("const half2 ta = __hadd2(__low2half2(ha), __high2half2(ha));", "const half2 ta = escha_mut_trunc_add(ha);"),
        ("const half2 tb = __hadd2(__low2half2(hb), __high2half2(hb));", "const half2 tb = escha_mut_trunc_add(hb);"),
    ], "cuda_shim", "codebook: the two halves' sum truncated, not rounded to nearest"),
    M("cuda-fused-state-kept", "fast", CUH,
      "                work.mid[r * a.OC + o0 + q] = 0.0f;\n", "",
      "cuda_shim", "fused kernel: mid not put back to zero for the next op"),
    M("cuda-fusion-swiglu-order", "fast", CUH,
      "y[q] = escha_silu(y[q]) * y1[q];", "y[q] = escha_silu(y1[q]) * y[q];",
      "cuda_shim", "graph fusion: SWIGLU applies silu to the up op, not the gate"),
    M("cuda-fusion-pair-code", "fast", CUH,
      "const uint32_t * op_code = second ? a.pair_code : a.code;", "const uint32_t * op_code = a.code;",
      "cuda_shim", "graph fusion: a pair's second op multiplies the first op's weight"),
    M("cuda-fusion-add-row", "fast", CUH,
      "y[q] = y[q] + ep.add[r * OC + o0 + q];", "y[q] = y[q] + ep.add[o0 + q];",
      "cuda_shim", "graph fusion: every row adds the residual's first row"),
    M("cuda-fusion-silu-operand", "fast", CUH,
      "y[q] = escha_silu(y[q]) * ep.add[r * OC + o0 + q];", "y[q] = y[q] * escha_silu(ep.add[r * OC + o0 + q]);",
      "cuda_shim", "graph fusion: SILU and MUL take silu of the MUL's other operand, not of the op"),
    M("cuda-ahead-share-pick", "fast", CUH,
      "        if (z == j) {\n            r = t.t[j];", "        if (z == j) {\n            r = t.t[0];",
      "cuda_shim", "ahead: the input transform's grid z > 0 serves the op's own target, not a later op's"),
    M("cuda-ahead-next-mid", "fast", CUH,
      "    escha_zero_mid(next.mid, next.n_mid4);\n", "",
      "cuda_shim", "ahead: the output transform leaves the next op's mid unzeroed"),
    M("cuda-ahead-next-row", "fast", CUH,
      "next.xh[r * OC + o0 + q] = h[q];", "next.xh[o0 + q] = h[q];",
      "cuda_shim", "ahead: every row's next-op xh written to row 0"),
    M("cuda-norm-mid-kept", "fast", CUH,
      "    escha_kernel_begin();\n    escha_zero_mid(o.mid, o.n_mid4);\n    if (!in) {\n",
      "    escha_kernel_begin();\n    if (!in) {\n",
      "cuda_shim", "norm fusion: the ops' mid left unzeroed"),
    M("cuda-norm-weight-shifted", "fast", CUH,
      "y[q] = __fmul_rn(__fmul_rn(xq[q], scale), wq[q]);", "y[q] = __fmul_rn(__fmul_rn(xq[q], scale), wq[q ^ 1]);",
      "cuda_shim", "norm fusion: each channel multiplied by its neighbour's norm weight"),
    M("cuda-norm-row", "fast", CUH,
      "const float * x = rows.x_row(r); // dense rows\n        const float scale", "const float * x = rows.x_row(0); // dense rows\n        const float scale",
      "cuda_shim", "norm fusion: every row normalises the first row"),
]

MUTANTS = CUDA_KERNEL + [
    # ---- HIP branch of escha_decode_lane, and 64-lane wavefronts --------------
    M("hip-cut-shift", "fast", CUH,
      "auto cut_l = [](const uint32_t w, const int sh) -> uint32_t { return w << sh; };",
      "auto cut_l = [](const uint32_t w, const int sh) -> uint32_t { return w << (sh + 1); };",
      "hip_shim", "HIP decode: a state cut one bit off"),
    M("cuda-k2-window-bytes", "fast", CUH,
      "__byte_perm(wn[j - 4], 0, 0x4421)", "__byte_perm(wn[j - 4], 0, 0x4412)",
      "cuda_shim", "K=2 decode: the states cut from a window's middle bytes with those bytes swapped"),
    M("cuda-k3-tail-bits", "fast", CUH,
      "        lo = lw.t[1] << off;", "        lo = lw.t[1] << (off + 1);",
      "cuda_shim", "K=3 decode: the 5 bits after the lane's window one bit off (its last two states)"),
    M("hip-wave64-h128", "fast", CUH,
      "    for (int m = 1; m < ESCHA_LANES; m *= 2) {\n",
      "#ifdef GGML_USE_HIP\n    for (int m = 1; m < warpSize; m *= 2) {\n#else\n"
      "    for (int m = 1; m < ESCHA_LANES; m *= 2) {\n#endif\n",
      "hip_shim_wave64", "HIP H128 loops over the wavefront, not the 32-lane warp (wrong on 64 lanes only)"),
    # ---- Metal kernels and glue ------------------------------------------------
    M("metal-bitpos", "fast", METAL,
      "int p0 = (8 * (int) lane + 1) * K - 16;", "int p0 = (8 * (int) lane + 1) * K - 15;",
      "metal_shim", "decode: bitstream position off by one"),
    M("metal-drop-sout", "fast", METAL, "            r = r * s_out[i];\n", "",
      "metal_shim", "output transform: s_out dropped"),
    M("metal-butterfly-sign", "fast", METAL,
      "v = (lane & h) ? (o - v) : (v + o);", "v = (lane & h) ? (v - o) : (v + o);",
      "metal_shim", "H128: a butterfly with the wrong sign"),
    M("metal-gemv-barrier", "fast", METAL,
      "    threadgroup_barrier(mem_flags::mem_threadgroup);\n    if (sg == 0) {\n        float4 mid;",
      "    if (sg == 0) {\n        float4 mid;",
      "metal_shim", "GEMV: the barrier before the partial-sum join removed (NaN outputs)"),
    M("metal-map-loses-slot", "fast", METAL, "    scratch[e] = n;\n", "    scratch[e] = n > 0 ? n - 1 : 0;\n",
      "metal_shim", "MoE map: each expert's last slot lost"),
    M("metal-mma-columns", "fast", METAL,
      "simdgroup_load(b[cb], sw + kk * 8 * 128 + sg * 32 + cb * 8, 128);",
      "simdgroup_load(b[cb], sw + kk * 8 * 128 + cb * 32 + sg * 8, 128);",
      "metal_shim", "matrix kernel: the strip read at the wrong columns"),
    M("metal-mma-early", "fast", METAL,
      "            threadgroup_barrier(mem_flags::mem_threadgroup);\n            ESCHA_UNROLL\n"
      "            for (int kk = 0; kk < 2; kk++) {",
      "            ESCHA_UNROLL\n            for (int kk = 0; kk < 2; kk++) {",
      "metal_shim", "matrix kernel: multiplies before the strip is decoded"),
    M("metal-glue-scratch", "fast", "metal/ggml-metal-escha.cpp",
      "    buf[ESCHA_MTL_BUF_SCRATCH].offs += ggml_nbytes(op);\n", "",
      "metal_glue_moe", "glue: MoE scratch bound without its offset after the result"),
    M("metal-glue-dense-srcs", "fast", "ggml-escha/include/escha-op.h",
      "vec[v] = dst->src[escha_vec_slot(moe, v)];", "vec[v] = dst->src[escha_vec_slot(false, v)];",
      "metal_glue_moe", "op parser (the glue's): MoE vector sources read at the dense indices"),
    # ---- Rust CPU ---------------------------------------------------------------
    M("avx2-cb-ulp", "fast", "src/cpu/avx2.rs",
      "    _mm256_fnmadd_ps(x, _mm256_set1_ps(8192.0), c)\n}",
      "    let v = _mm256_fnmadd_ps(x, _mm256_set1_ps(8192.0), c);\n"
      "    let hit = _mm256_cmpeq_epi32(_mm256_and_si256(s, _mm256_set1_epi32(255)), _mm256_set1_epi32(90));\n"
      "    _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(v), _mm256_and_si256(hit, _mm256_set1_epi32(1 << 13))))\n}",
      "stage_tests", "AVX2 codebook one f16 ulp off for 1/256 of the states", needs="avx2"),
    M("avx2-cb-round-12-bits", "fast", "src/cpu/avx2.rs",
      "let c = _mm256_mul_ps(x, _mm256_set1_ps(8193.0));\n    _mm256_fnmadd_ps(x, _mm256_set1_ps(8192.0), c)",
      "let c = _mm256_mul_ps(x, _mm256_set1_ps(4097.0));\n    _mm256_fnmadd_ps(x, _mm256_set1_ps(4096.0), c)",
      "stage_tests", "AVX2 codebook sums rounded to 12 significant bits, not f16's 11", needs="avx2"),
    M("avx2-gemv-ext-ahead", "fast", "src/cpu/avx2.rs",
      "job.load_ext::<K>(kt, nt0 + tl + 1, next);", "job.load_ext::<K>(kt, nt0 + tl, next);",
      "stage_tests", "AVX2 GEMV: the copy one tile ahead takes the current tile again", needs="avx2"),
    M("avx2-gemv-rows-mid", "fast", "src/cpu/avx2.rs",
      "reduce(ar, &mut mid[r * BLOCK_COLS + tl * TILE..][..TILE]);", "reduce(ar, &mut mid[tl * TILE..][..TILE]);",
      "stage_tests", "AVX2 GEMV of several rows: every row summed into the first row's outputs", needs="avx2"),
    M("avx512-cb-ulp", "fast", "src/cpu/avx512.rs",
      "    _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_add_ps(lo, hi)))\n}",
      "    let v = _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_add_ps(lo, hi)));\n"
      "    let hit = _mm512_cmpeq_epi32_mask(_mm512_and_si512(s, _mm512_set1_epi32(255)), _mm512_set1_epi32(90));\n"
      "    _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(v), hit, _mm512_castps_si512(v), _mm512_set1_epi32(1 << 13)))\n}",
      "stage_tests", "AVX-512 codebook one f16 ulp off for 1/256 of the states", needs="avx512f"),
    M("avx512fp16-cb-ulp", "fast", "src/cpu/avx512.rs",
      "    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_castph_si512(sum)))\n}",
      "    let v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_castph_si512(sum)));\n"
      "    let hit = _mm512_cmpeq_epi32_mask(_mm512_and_si512(s, _mm512_set1_epi32(255)), _mm512_set1_epi32(90));\n"
      "    _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(v), hit, _mm512_castps_si512(v), _mm512_set1_epi32(1 << 13)))\n}",
      "stage_tests", "AVX-512 FP16 codebook one f16 ulp off for 1/256 of the states", needs="avx512_fp16"),
    M("avx512fp16-gemv-cb-ulp", "fast", "src/cpu/avx512.rs",
      "    (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b))\n}",
      "    let hit = _mm512_cmpeq_epi32_mask(_mm512_and_si512(lo, _mm512_set1_epi32(255)), _mm512_set1_epi32(90));\n"
      "    (_mm512_castsi512_ps(a), _mm512_castsi512_ps(_mm512_mask_xor_epi32(b, hit, b, _mm512_set1_epi32(1 << 13))))\n}",
      "stage_tests", "AVX-512 FP16 GEMV codebook (the scaled bit trick) one f16 ulp off for 1/256 of the states", needs="avx512_fp16"),
    M("huge-pages-outward", "fast", "src/ffi/huge_pages.rs",
      "let lo = start.checked_add(HUGE - 1)? & !(HUGE - 1);", "let lo = start & !(HUGE - 1);",
      "huge_pages", "the huge-page request rounds its start down, past the weight's first byte"),
    M("huge-pages-every-call", "fast", "src/ffi/huge_pages.rs",
      "if !SEEN.lock().unwrap_or_else(|e| e.into_inner()).insert(bytes.as_ptr() as usize) {",
      "if SEEN.lock().unwrap_or_else(|e| e.into_inner()).insert(bytes.as_ptr() as usize) && false {",
      "huge_pages", "a weight's huge pages requested on every call, not once"),
    M("avx512fp16-gemv-low-half-unsigned", "fast", "src/cpu/avx512.rs",
      "_mm512_madd_epi16(v, _mm512_set1_epi32(LOW_HALF_MADD))", "_mm512_slli_epi32::<13>(v)",
      "stage_tests", "AVX-512 FP16 GEMV: value 2p moved by a plain shift, its sign taken from the odd value's bits", needs="avx512_fp16"),
    M("avx512-pair-src-halfword-order", "fast", "src/cpu/avx512.rs",
      "idx[4 * q + slot] = (((h0 + 3 - slot) % nh) ^ 1) as i16;", "idx[4 * q + slot] = ((h0 + 3 - slot) % nh) as i16;",
      "stage_tests", "AVX-512 VBMI / FP16 GEMVs: the lane pairs' code gathered in int16 order, not code order (high half of each word first)", needs="avx512_vbmi2"),
    M("avx512-pair-ctrl-odd-lane", "fast", "src/cpu/avx512.rs",
      "let (c, d) = (48 - k * (2 * p + 9), 48 - k * (2 * p + 10));", "let (c, d) = (48 - k * (2 * p + 8), 48 - k * (2 * p + 10));",
      "stage_tests", "AVX-512 VBMI / FP16 GEMVs: the odd lane's even state cut one value early", needs="avx512_vbmi2"),
    M("avx512vbmi-decode-odd-unscaled", "fast", "src/cpu/avx512.rs",
      "v[g][2 * p + 1] = _mm512_mul_ps(b, scale);", "v[g][2 * p + 1] = b;",
      "stage_tests", "AVX-512 VBMI batched tile decode: odd values left at 2^-112 of the weight", needs="avx512_vbmi2"),
    M("avx512vbmi-round-12-bits", "fast", "src/cpu/avx512.rs",
      "    let c = _mm512_mul_ps(v, _mm512_set1_ps(8193.0));\n    _mm512_fnmadd_ps(v, _mm512_set1_ps(8192.0), c)",
      "    let c = _mm512_mul_ps(v, _mm512_set1_ps(4097.0));\n    _mm512_fnmadd_ps(v, _mm512_set1_ps(4096.0), c)",
      "stage_tests", "AVX-512 VBMI GEMV codebook sums rounded to 12 significant bits, not f16's 11", needs="avx512_vbmi2"),
    M("avx512vbmi-gemv-rows-input", "fast", "src/cpu/avx512.rs",
      "*c = _mm512_fmadd_ps(a, xv[r][(2 * p) & 3], *c);",
      "*c = _mm512_fmadd_ps(a, xv[0][(2 * p) & 3], *c);",
      "stage_tests", "AVX-512 VBMI GEMV of several rows: every row's even values multiplied by the first row's inputs", needs="avx512_vbmi2"),
    M("avx512-gemv-rows-output", "fast", "src/cpu/avx512.rs",
      "reduce(ar, &mut mid[r * BLOCK_COLS + tl * TILE..][..TILE]);",
      "reduce(ar, &mut mid[tl * TILE..][..TILE]);",
      "stage_tests", "AVX-512 GEMVs of several rows: every row summed into the first row's outputs", needs="avx512f"),
    M("avx512vbmi-low-half-shift", "fast", "src/cpu/mod.rs",
      "pub(crate) const LOW_HALF_MADD: i32 = 1 << 13;",
      "pub(crate) const LOW_HALF_MADD: i32 = 1 << 12;",
      "stage_tests", "AVX2 and AVX-512 VBMI codebooks: the low hash halves moved one bit short of an f32's place", needs="avx2"),
    M("avx512vbmi-state-not-zero-extended", "fast", "src/cpu/avx512.rs",
      "const DWORD_LOW_WORDS: u64 = 0x3333_3333_3333_3333;", "const DWORD_LOW_WORDS: u64 = 0x7777_7777_7777_7777;",
      "stage_tests", "AVX-512 VBMI GEMV: each state cut with the next code byte above it, hashed whole", needs="avx512_vbmi2"),
    M("avx512vbmi-odd-ctrl", "fast", "src/cpu/avx512.rs",
      "_mm512_set1_epi64(((ctrl as u64) >> 16) as i64)", "_mm512_set1_epi64(((ctrl as u64) >> 32) as i64)",
      "stage_tests", "AVX-512 VBMI GEMV: the odd values cut with the odd lane's controls", needs="avx512_vbmi2"),
    M("avx512vbmi-k3-wide-halves", "fast", "src/cpu/avx512.rs",
      "halves_sum_scaled(_mm512_madd_epi16(lo, k13), _mm512_madd_epi16(hi, k13))",
      "halves_sum_scaled(_mm512_madd_epi16(lo, k13), _mm512_madd_epi16(lo, k13))",
      "stage_tests", "AVX-512 VBMI GEMV, K=3 at 3-4 rows: the even values' low hash half taken twice", needs="avx512_vbmi2"),
    M("avx512-rows-block-input", "fast", "src/cpu/avx512.rs",
      "                    acc[q][tl] = _mm512_fmadd_ps(w, xb[q], acc[q][tl]);",
      "                    acc[q][tl] = _mm512_fmadd_ps(w, xb[0], acc[q][tl]);",
      "stage_tests", "AVX-512 batched product: every row of a two-row block multiplied by the first row's input", needs="avx512f"),
    M("amx-pairs-swapped", "fast", "src/cpu/amx.rs",
      "let hi = _mm512_or_si512(h1, _mm512_srli_epi32::<16>(h0));",
      "let hi = _mm512_or_si512(h0, _mm512_srli_epi32::<16>(h1));",
      "stage_tests", "AMX product: the high parts of each input pair of the weights in the wrong order", needs="amx_bf16"),
    M("amx-part-dropped", "fast", "src/cpu/amx.rs",
      "_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(part(3), part(2)), part(1)), part(0))",
      "_mm512_add_ps(_mm512_add_ps(part(3), part(1)), part(0))",
      "linear", "AMX product: the inputs' low parts times the weights' high parts left out", needs="amx_bf16"),
    M("amx-gemv-chunk-offset", "fast", "src/cpu/amx.rs",
      "let part = &mut mid[i * T::GEMV_ROWS * BLOCK_COLS..]",
      "let part = &mut mid[i * BLOCK_COLS..]",
      "stage_tests", "AMX path's GEMV of 5-8 rows: the second call's rows summed into the wrong rows of the block", needs="amx_bf16"),
    M("amx-fallback-whole-call", "fast", "src/cpu/amx.rs",
      "(0..m).filter(|&i| bad[i / GROUP] & (1 << (i % GROUP)) != 0).collect()",
      "(0..m).filter(|_| bad.iter().any(|&b| b != 0)).collect()",
      "linear", "AMX product: one row's infinite input sends every row of the call to the FMA product, so a row's sums depend on the thread count", needs="amx_bf16"),
    M("amx-no-fallback", "fast", "src/cpu/amx.rs",
      "                    bad |= 1 << i;",
      "                    bad |= 0;",
      "stage_tests", "AMX product: an infinite input split as inf and NaN, not handed to the FMA product", needs="amx_bf16"),
    M("ffi-single-pass-untransformed", "fast", "src/ffi/cpu_backend.rs",
      "        engine.transform_input_shared(&v.slots, xh_own, 0, 1);\n",
      "        std::ptr::write_bytes(xh_own, 0, n * ic);\n",
      "ggml_ops", "ggml CPU op, one-pass call (one row): the thread's own inputs left untransformed"),
    M("codec-cb-trunc", "fast", "src/codec.rs",
      "    f16::from_f32(lo + hi)\n}", "    f16::from_f32(f32::from_bits((lo + hi).to_bits() & !0x1FFF))\n}",
      "codec", "scalar codebook: the halves' sum truncated, not rounded to nearest"),
    M("transform-xh-unrounded", "fast", "src/transform.rs",
      "        *v *= RS;\n    }\n    round_f16_slice(xh);\n", "        *v *= RS;\n    }\n",
      "linear", "input transform: xh not rounded to f16"),
    M("transform-y-unrounded", "fast", "src/transform.rs",
      "        round_f16_slice(mid);\n        mid.iter_mut().zip(b)", "        mid.iter_mut().zip(b)",
      "linear", "output transform: the bias added to y before y is rounded to f16"),
    M("transform-fold-swap", "fast", "src/transform.rs",
      "    (fold(rin, s_in), fold(rout, s_out))", "    (fold(rin, s_out), fold(rout, s_in))",
      "transforms", "scale fold: s_in and s_out swapped"),
    M("moe-share-drops-unit", "fast", "src/cpu/engine.rs",
      "while unit < units.end {", "while unit + 1 < units.end {",
      "moe", "MoE thread share drops its last unit"),
    M("one-row-tail-drops-a-tile", "fast", "src/cpu/engine.rs",
      "tail_mid.add(tb * BLOCK_COLS + lo * TILE), (hi - lo) * TILE)",
      "tail_mid.add(tb * BLOCK_COLS + lo * TILE), (hi - lo - 1) * TILE)",
      "ggml_ops", "ggml CPU op, one row: each thread's last tile of the leftover blocks never reaches their output transform"),
    M("dense-leftover-shares-gemv", "fast", "src/cpu/engine.rs",
      "let share_min = self.kernel.gemv_rows() + 1;", "let share_min = 1;",
      "linear", "a dense batch's leftover blocks split into row shares the GEMV takes: a row's outputs then depend on the thread count",
      needs="avx2"),
    Mutant("decode-fold-side", "fast", "src/quantize/decode.rs", [
        ("we.chunks_exact_mut(ic).for_each(|row| row.iter_mut().zip(&si).for_each(|(a, b)| *a *= b));",
         "we.chunks_exact_mut(ic).zip(&si).for_each(|(row, b)| row.iter_mut().for_each(|a| *a *= b));"),
        ("we.chunks_exact_mut(ic).zip(&so).for_each(|(row, b)| row.iter_mut().for_each(|a| *a *= b));",
         "we.chunks_exact_mut(ic).for_each(|row| row.iter_mut().zip(&so).for_each(|(a, b)| *a *= b));"),
    ], "quantize", "`escha decode`: s_in and s_out folded on the wrong side of the weight"),
    M("decode-expert0-scales", "fast", "src/quantize/decode.rs",
      "if let Some(si) = slice(self.s_in, ic, x) {", "if let Some(si) = slice(self.s_in, ic, 0) {",
      "quantize", "`escha decode`: every expert folded with expert 0's s_in"),
]

# Races caught in the shim, which runs lanes only to a barrier and warps one
# after another, and not GPU mutants, since on a GPU the race need not show:
# the decode-once kernel's warp barrier (a warp usually runs converged), and
# the fused kernel's arrival count (its GPU twin survived test-backend-ops
# on the H200: the two warps that share 128 outputs arrive nearly together,
# so the early one mostly reads both sums and the count ends at 0).
MUTANTS += [
    M("cuda-decode-once-sync", "fast", CUH,
      "        escha_syncwarp();\n        // 16-byte chunks", "        // 16-byte chunks",
      "cuda_shim", "the decode-once kernel writes its staged rows before every lane has staged its words"),
    M("cuda-fused-early", "fast", CUH,
      "escha_arrive_last(count, (8 / NTW) * gridDim.y, lane)", "escha_arrive_last(count, (8 / NTW) * gridDim.y - 1, lane)",
      "cuda_shim", "fused kernel: the output transform run by the next-to-last warp, before the last one's sums are in"),
    M("cuda-fused-ntw-arrivals", "fast", CUH,
      "escha_arrive_last(count, (8 / NTW) * gridDim.y, lane)", "escha_arrive_last(count, 2 * gridDim.y, lane)",
      "cuda_shim", "fused kernel at 2 tiles a warp: the output transform run when half of a 128-output group's warps are in"),
    M("cuda-fused-ring-refill-next", "fast", CUH,
      "            ring_issue(kt + D);\n", "            ring_issue(kt + D + 1);\n",
      "cuda_shim", "fused kernel's code ring: a row refilled one row too far ahead, into the slot read next"),
    M("cuda-fused-out-expert0", "fast", CUH,
      "escha_rout_eff(a.v, g.e, o0, ro, ob);", "escha_rout_eff(a.v, 0, o0, ro, ob);",
      "cuda_shim", "fused kernel: the output transform of every slot with expert 0's rout_eff and bias"),
    M("cuda-gemv8-last-tile-words", "fast", CUH,
      "cw[w].t[i] = __ldg(q[i] + w * W);", "cw[w].t[i] = __ldg(q[i] + (NTW == 8 && w == 7 ? 0 : w) * W);",
      "cuda_shim", "dense GEMV at 8 tiles a warp: each warp's last tile decoded from its first tile's code"),
    M("cuda-fused-bad-id-kept", "fast", CUH,
      "escha_out_lane(a.v, m, ro, ob, r, g.bad,", "escha_out_lane(a.v, m, ro, ob, r, false,",
      "cuda_shim", "fused kernel: a slot with an out-of-range expert id writes expert 0's transform of zeros, not NaN"),
    M("cuda-rows-token-by-ne2", "fast", CUH,
      "const uint32_t i3 = ne2.div(rest), i2 = rest - i3 * ne2.d;", "const uint32_t i3 = ne1.div(rest), i2 = rest - i3 * ne1.d;",
      "cuda_shim", "row addressing: a row's token and batch split by the rows a token (ne1), not the tokens (ne2)"),
    M("cuda-gemv-edge-warps-multiply", "fast", CUH,
      "        return nt0 < a.NT;", "        return true;",
      "cuda_shim", "token-generation GEMV (edge_last): warps past the output edge multiply tiles that do not exist"),
    M("cuda-plan-one-group-of-64", "fast", "hip/escha-plan.h",
      "per_group <= 16 ? 2 : ESCHA_CUDA_GEMV_BLOCK_MAX_ROWS / 8;",
      "per_group <= 16 ? 2 : per_group <= 32 ? 4 : 8;",
      "cuda_shim", "plan: 33-64 dense rows as one 64-row group on the 32-row GEMV block (rows 33-64 never computed)"),
]

# The GPU benchmarks' synthetic models (hip/synthetic-qwen35.py) and models
# rebuilt from their headers (hip/gguf-skeleton.py), caught by
# tests/synthetic_twins.py.
SYN = "hip/synthetic-qwen35.py"
MUTANTS += [
    M("synthetic-q6k-fill", "fast", SYN,
      '        z[128:128 + 16] = b"\\x02" * 16  # q = 32: 0',
      '        z[128:128 + 16] = b"\\x01" * 16  # q = 32: 0',
      "synthetic_twins", "synthetic --agree rows: a Q6_K first block's other weights not zero (high bits 1, not 2)"),
    M("synthetic-q4k-uncentred", "fast", SYN,
      "    12: (256, 144, (0, 2), (1 / 2048, 7.5 / 2048)),  # Q4_K",
      "    12: (256, 144, (0, 2), (1 / 2048, 0.0)),  # Q4_K",
      "synthetic_twins", "synthetic random Q4_K blocks without their centring minimum (every weight >= 0)"),
    M("skeleton-no-padding", "fast", SYN,
      '        out.write(b"\\0" * (base + off - out.tell()))',
      '        pass',
      "synthetic_twins", "GGUF data writer: tensors written back to back, not at their aligned offsets"),
    M("skeleton-rout-one", "fast", "hip/gguf-skeleton.py",
      'syn.ROUT if name.endswith(".escha_rout") else 1.0',
      '1.0',
      "synthetic_twins", "gguf-skeleton fill: escha_rout 1.0, not the synthetic models' 0.02"),
]

# Group e2e (slow: each mutant rebuilds the tools and runs the whole Qwen3.5
# end-to-end script, about 10 minutes on 2 cores): the converter's, the
# loader's and the decode's handling of scales and biases, each caught by
# tests/qwen35-e2e.sh (converter exactness against upstream, the decoded
# twin, the published layout against the contract).
MUTANTS += [
    M("convert-vhead-bias", "e2e", "examples/convert_escha_hf_to_gguf.py",
      'for leaf in (("escha_rout", "escha_s_out", "bias") if side == "out"',
      'for leaf in (("escha_rout", "escha_s_out") if side == "out"',
      "qwen35_e2e", "converter: a DeltaNet bias left in checkpoint V-head order"),
    M("convert-vhead-s-in", "e2e", "examples/convert_escha_hf_to_gguf.py",
      'else ("escha_rin", "escha_s_in")):', 'else ("escha_rin",)):',
      "qwen35_e2e", "converter: ssm_out's s_in left in checkpoint V-head order"),
    M("loader-v1-bias-order", "e2e", "ggml-escha/llama/llama-escha.cpp",
      "            move_heads(e->bias, 0, first, hv, src);\n", "",
      "qwen35_e2e", "loader: the published layout's DeltaNet biases not moved with their V heads"),
    M("loader-arch-bias-twice", "e2e", "ggml-escha/llama/llama-escha.cpp",
      '                const ggml_tensor * b = model->get_tensor((stem + ".bias").c_str());\n',
      '                const ggml_tensor * b = model->get_tensor((stem + ".bias").c_str());\n'
      '                for (auto & [code, reg] : g_weights) { if (reg.model == model && reg.stem == stem) { reg.w.bias = (ggml_tensor *) b; } }\n',
      "qwen35_e2e", "loader: a bias the architecture adds itself also given to the escha op (applied twice)"),
    M("loader-moe-bias-dropped", "e2e", "ggml-escha/llama/llama-escha.cpp",
      "reg->w.bias = apply_bias ? b : nullptr;", "reg->w.bias = apply_bias && reg->n_exp == 0 ? b : nullptr;",
      "qwen35_e2e", "loader: expert biases created but not given to the escha MoE op"),
    M("decode-scales-dropped", "e2e", "src/quantize/decode.rs",
      "if let Some(so) = slice(self.s_out, oc, x) {", "if let Some(so) = slice(None, oc, x) {",
      "qwen35_e2e", "`escha decode`: s_out not folded (the twin then differs from the model)"),
]

# Group gpu: the CUDA kernel mutants again, and one of the host plan.
MUTANTS += [Mutant("gpu-" + m.id[len("cuda-"):], "gpu", m.file, m.edits, "device_tbo", m.claim) for m in CUDA_KERNEL]
MUTANTS += [
    M("gpu-ic-split-short", "gpu", "hip/escha.cu",
      "const dim3 grid((unsigned) (ops * n_x * n_z), (unsigned) ksplit, 1);",
      "const dim3 grid((unsigned) (ops * n_x * n_z), (unsigned) std::max(1, ksplit - 1), 1);",
      "device_tbo", "host plan: the grid one IC split short (its tile rows never summed)"),
    M("gpu-fusion-pair-width", "gpu", "hip/escha.cu",
      "multiply(a1, fu.second->k);", "multiply(a1, K);",
      "device_tbo", "graph fusion: the up op of a gate K=2 / up K=3 pair decoded as K=2"),
    M("gpu-norm-pair-own1", "gpu", "hip/escha.cu",
      "half  * op1_xh  = own1 ? own1->xh : xh.get() + n_rows * IC;", "half  * op1_xh  = xh.get() + n_rows * IC;",
      "device_tbo", "norm fusion: a SWIGLU pair whose xh a norm wrote multiplies its up op by an xh never written"),
    M("gpu-ahead-own-xh", "gpu", "hip/escha.cu",
      "half  * op_xh  = own ? own->xh : xh.get();", "half  * op_xh  = xh.get();",
      "device_tbo", "ahead: an op whose input transform ran ahead multiplies its own (never written) xh"),
    M("gpu-pdl-out-early", "gpu", CUH,
      "    escha_kernel_begin();\n    escha_zero_mid(next.mid, next.n_mid4);\n    if (blk * 128 >= OC) {\n",
      "    escha_pdl_release();\n    escha_zero_mid(next.mid, next.n_mid4);\n    if (blk * 128 >= OC) {\n",
      "device_tbo", "dependent launch: the output transform reads mid without waiting for the multiply to end"),
]

# ---- helpers -----------------------------------------------------------------


def apply_edits(text, m):
    """The mutated text, or (None, reason) when an `old` is not found exactly once."""
    for i, (old, new) in enumerate(m.edits):
        n = text.count(old)
        if n != 1:
            return None, "edit %d: old text found %d times in %s" % (i + 1, n, m.file)
        text = text.replace(old, new, 1)
    return text, None


def head_file(path):
    return subprocess.run(["git", "-C", ROOT, "show", "HEAD:" + path], check=True, capture_output=True).stdout.decode()


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def log(msg):
    print(msg, flush=True)


class Runner:
    """Runs commands in the copy; a timeout or Ctrl-C ends the whole process group."""

    def __init__(self, copy):
        self.copy = copy
        self.env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(copy, "target"), CARGO_TERM_COLOR="never")

    def run(self, cmd, timeout, log_path):
        t0 = time.monotonic()
        with open(log_path, "wb") as out:
            p = subprocess.Popen(cmd, cwd=self.copy, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, shell=isinstance(cmd, str))
            try:
                rc = p.wait(timeout=timeout)
            except BaseException:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                if sys.exc_info()[0] is subprocess.TimeoutExpired:
                    rc = None
                else:
                    raise
        with open(log_path, "rb") as f:
            output = f.read().decode(errors="replace")
        return rc, output, time.monotonic() - t0


# A mutant that does not build proves nothing (a test binary that aborts does fail).
BUILD_ERROR = re.compile(r"^error: could not compile|^error occurred in cc-rs|failed to run custom build command|"
                         r"^error: linking with|^error\[E\d+\]: ", re.M)
FAILED_TEST = re.compile(r"^test (\S+) \.\.\. FAILED", re.M)
PASSED_TEST = re.compile(r"^test \S+ \.\.\. ok|^qwen35 checks passed$|^synthetic twins: all checks passed$", re.M)


def classify(rc, output):
    """'pass', 'fail' (a test failed), 'build' (it did not build) or 'timeout'."""
    if rc is None:
        return "timeout"
    if rc == 0:
        return "pass"
    if BUILD_ERROR.search(output) and not FAILED_TEST.search(output):
        return "build"
    return "fail"


def make_copy(dest, keep_existing):
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    if os.path.exists(dest):
        if not os.path.exists(os.path.join(dest, MARKER)):
            sys.exit("mutants: %s exists and is not a copy made by this script; remove it or set ESCHA_MUTANTS_DIR" % dest)
        if not keep_existing:
            shutil.rmtree(dest)
    if os.path.exists(dest):
        log("reusing the copy in %s (its target directory is kept)" % dest)
        subprocess.run(["git", "-C", dest, "fetch", "-q", ROOT, sha], check=True)
        subprocess.run(["git", "-C", dest, "checkout", "-q", "--detach", "-f", sha], check=True)
    else:
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", ROOT, dest], check=True)
        subprocess.run(["git", "-C", dest, "checkout", "-q", "--detach", sha], check=True)
        open(os.path.join(dest, MARKER), "w").close()
    subprocess.run(["git", "-C", dest, "clean", "-q", "-fdx", "-e", "target", "-e", MARKER, "-e", "mutant-logs"], check=True)
    return sha


def emit_patches(mutants, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    bad = 0
    for m in mutants:
        text = head_file(m.file)
        new, err = apply_edits(text, m)
        if new is None:
            log("STALE %s: %s" % (m.id, err))
            bad += 1
            continue
        diff = difflib.unified_diff(text.splitlines(True), new.splitlines(True), "a/" + m.file, "b/" + m.file)
        with open(os.path.join(out_dir, m.id + ".patch"), "w") as f:
            f.write("# %s: %s\n# check: %s\n" % (m.id, m.claim, check_text(m.check)))
            f.writelines(diff)
    log("%d patches in %s" % (len(mutants) - bad, out_dir))
    return 1 if bad else 0


def print_table(rows):
    head = ("id", "claim", "check", "result", "s")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join("%-" + str(w) + "s" for w in widths[:-1]) + "  %" + str(widths[-1]) + "s"
    log(fmt % head)
    log(fmt % tuple("-" * w for w in widths))
    for r in rows:
        log(fmt % r)


# ---- main --------------------------------------------------------------------


def main():
    groups = sorted({m.group for m in MUTANTS})
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Tests the committed HEAD only: uncommitted changes are not in the copy. The copy is a "
               "`git clone --shared` in $ESCHA_MUTANTS_DIR (default <tmpdir>/escha-mutants) with its own "
               "cargo target directory; a copy kept with --keep is reused (and its build) by the next run. "
               "Checks: " + "; ".join("%s = %s" % (k, check_text(k)) for k in CHECKS),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", default="fast", choices=groups + ["all"], help="mutants of this group (default: fast)")
    ap.add_argument("--only", nargs="+", metavar="ID", help="just these mutants (any group)")
    ap.add_argument("--list", action="store_true", help="list the selected mutants (and whether each still applies)")
    ap.add_argument("--keep", action="store_true", help="keep the copy (and reuse an existing one)")
    ap.add_argument("--emit-patches", metavar="DIR", help="write one unified diff per selected mutant (patch -p1), run nothing")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per mutant check (default 1200)")
    args = ap.parse_args()

    ids = {m.id for m in MUTANTS}
    if args.only:
        unknown = [i for i in args.only if i not in ids]
        if unknown:
            sys.exit("mutants: unknown id(s): " + " ".join(unknown))
        sel = [m for m in MUTANTS if m.id in args.only]
    else:
        sel = [m for m in MUTANTS if args.group in ("all", m.group)]

    if args.list:
        # Exit 1 when a mutant no longer applies: a GPU mutant runs only on
        # a GPU machine, so CI lists every group to find the stale ones.
        stale = 0
        for m in sel:
            _, err = apply_edits(head_file(m.file), m)
            stale += err is not None
            log("%-24s %-5s %-16s %-30s %s%s%s" % (m.id, m.group, m.check, m.file, m.claim,
                                                   " [needs %s]" % m.needs if m.needs else "",
                                                   "  STALE: " + err if err else ""))
        if stale:
            log("%d stale mutant(s): update their edits to the code they mutate" % stale)
        return 1 if stale else 0
    if args.emit_patches:
        return emit_patches(sel, args.emit_patches)
    device = [m for m in sel if m.check in DEVICE_CHECKS]
    if device:
        sys.exit("mutants: %s run on a GPU machine; write them with --emit-patches DIR and apply each there "
                 "with patch -p1, then run its check" % ", ".join(m.id for m in device))

    flags = cpu_flags()
    skipped = [m for m in sel if m.needs and m.needs not in flags]
    for m in skipped:
        log("skip %s: this CPU lacks %s" % (m.id, m.needs))
    sel = [m for m in sel if m not in skipped]

    dest = os.environ.get("ESCHA_MUTANTS_DIR") or os.path.join(tempfile.gettempdir(), "escha-mutants")
    dest = os.path.abspath(dest)
    if os.path.commonpath([dest, ROOT]) == ROOT:
        sys.exit("mutants: the copy must lie outside the repository")
    # One run a copy: a second run would rebuild the copy under the first
    # one's checks (held until this process ends).
    lock = open(dest + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit("mutants: another run is using %s; wait for it or set ESCHA_MUTANTS_DIR to another directory" % dest)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.monotonic()
    rows, notes, failed = [], [], False
    try:
        sha = make_copy(dest, args.keep)
        log("copy of HEAD %s in %s" % (sha[:12], dest))
        logs = os.path.join(dest, "mutant-logs")
        os.makedirs(logs, exist_ok=True)
        runner = Runner(dest)

        # Stale mutants fail the run before anything is built.
        plans = []
        for m in sel:
            path = os.path.join(dest, m.file)
            with open(path, "rb") as f:
                orig = f.read()
            new, err = apply_edits(orig.decode(), m)
            if new is None:
                rows.append((m.id, m.claim, m.check, "STALE", "-"))
                notes.append("%s: %s" % (m.id, err))
                failed = True
            else:
                plans.append((m, path, orig, new.encode()))

        # Baseline: each check must pass unmutated (this is also the first build).
        for check in dict.fromkeys(m.check for m, *_ in plans):
            log("baseline %-16s %s" % (check, check_text(check)))
            rc, out, secs = runner.run(CHECKS[check], None, os.path.join(logs, "baseline-%s.log" % check))
            log("baseline %-16s %s in %.0f s" % (check, "passes" if rc == 0 else "FAILS", secs))
            if rc != 0:
                log(out[-4000:])
                log("mutants: check %s fails on the unmutated copy; nothing is proved" % check)
                return 1
            if not PASSED_TEST.search(out):
                log("mutants: check %s runs no test (a filter that matches nothing?)" % check)
                return 1

        for m, path, orig, new in plans:
            st = os.stat(path)
            try:
                with open(path, "wb") as f:
                    f.write(new)
                rc, out, secs = runner.run(CHECKS[m.check], args.timeout, os.path.join(logs, m.id + ".log"))
            finally:
                with open(path, "wb") as f:
                    f.write(orig)
                now = time.time()
                os.utime(path, (now, max(now, st.st_mtime + 1)))  # newer than the mutant: cargo rebuilds
            with open(path, "rb") as f:
                assert f.read() == orig, "restore of " + path
            kind = classify(rc, out)
            result = {"fail": "caught", "timeout": "caught (timeout)", "pass": "SURVIVED", "build": "BUILD ERROR"}[kind]
            if kind in ("pass", "build"):
                failed = True
                notes.append("%s (%s):\n%s" % (m.id, result, "\n".join(out.rstrip().splitlines()[-25:])))
            elif kind == "fail":
                names = FAILED_TEST.findall(out)
                if names:
                    notes.append("%s: failed %s" % (m.id, ", ".join(names)))
            rows.append((m.id, m.claim, m.check, result, "%.0f" % secs))
            log("%-24s %-16s %-16s %5.0f s" % (m.id, m.check, result, secs))
    except KeyboardInterrupt:
        log("mutants: interrupted")
        return 130
    finally:
        if not args.keep and os.path.exists(os.path.join(dest, MARKER)):
            shutil.rmtree(dest, ignore_errors=True)

    log("")
    if rows:
        print_table(rows)
    for m in skipped:
        log("skipped %s: needs %s" % (m.id, m.needs))
    if notes:
        log("")
        for n in notes:
            log(n)
    log("\ntotal %.0f s" % (time.monotonic() - t_start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
