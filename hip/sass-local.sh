#!/usr/bin/env bash
# The SASS of escha's CUDA kernels on a machine without a GPU: nvcc and its
# disassembler from NVIDIA's pip wheels (no driver, no CUDA install), the
# kernels of hip/bench/escha-mm-bench.cu compiled to an sm_90 cubin, and for
# each kernel named its instruction count, its mix and its integer
# divisions (the SASS itself is written out). The batch-1 GEMV is issue-bound
# (docs/PERFORMANCE.md), so its instructions a tile rank decode changes
# before any device time is spent on them. Counts are nvcc 13.5's; the GPU
# machines' nvcc 13 may differ by a few instructions a kernel.
#
# Usage: hip/sass-local.sh [NAME=NVCC_FLAGS ...]
#   default: one variant, the tree as it is ("shipped="); each NAME gets
#   its own cubin, e.g. hip/sass-local.sh shipped= noring=-DESCHA_FUSED_RING_KS=0
# ESCHA_SASS_KERNELS: kernel name patterns (default: the batch-1 GEMV at
#   K=2 and K=3 at 4 and 8 tiles a warp, and the fused one-launch kernel of
#   the MoE decode slots)
# ESCHA_SASS_OUT: where each kernel's SASS is written (default: target/sass)
# Needs: cargo build --release --features tools once (the prepared
# llama.cpp tree, for ggml's headers), python3 with pip, g++ and the network once:
# the wheels (about 580 MB to fetch, 360 MB kept) go to
# ${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/cuda-sass.
set -euo pipefail
cd "$(dirname "$0")/.."

# ggml's headers come from the tree of the latest cargo build (build/tree.rs
# links it); escha's own sources from this checkout (the harness includes
# ../escha.cu, whose includes resolve beside it), so no rebuild is needed
# after editing them.
tree=${ESCHA_TREE:-$(readlink -f target/release/llama.cpp-tree 2>/dev/null || true)}
[ -f "$tree/ggml/src/ggml-cuda/common.cuh" ] || { echo "no prepared llama.cpp tree: run cargo build --release --features tools first" >&2; exit 1; }

cache=${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/cuda-sass
cuda=$cache/cuda
# One toolkit version for every count: nvcc, its front end and NVVM, the
# runtime's and cuBLAS's headers (ggml-cuda's common.cuh includes
# cublas_v2.h), and the disassembler.
wheels=(nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37
        nvidia-cuda-cccl==13.3.5.0.6 nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 nvidia-cublas==13.10.0.20)
if [ ! -x "$cuda/bin/nvcc" ] || [ ! -f "$cuda/.complete" ]; then
    rm -rf "$cache"
    mkdir -p "$cache/wheels"
    python3 -m pip download --quiet --no-deps -d "$cache/wheels" "${wheels[@]}"
    # Each wheel holds nvidia/cu13/...; cuBLAS gives its headers only.
    python3 - "$cache/wheels" "$cache/unpacked" <<'EOF'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(src)):
    with zipfile.ZipFile(os.path.join(src, name)) as z:
        for m in z.infolist():
            if not m.filename.startswith("nvidia/cu13/"):
                continue
            if name.startswith("nvidia_cublas") and not m.filename.startswith("nvidia/cu13/include/"):
                continue
            out = z.extract(m, dst)
            if m.filename.startswith(("nvidia/cu13/bin/", "nvidia/cu13/nvvm/bin/")) and not m.is_dir():
                os.chmod(out, 0o755)
EOF
    mv "$cache/unpacked/nvidia/cu13" "$cuda"
    rm -rf "$cache/wheels" "$cache/unpacked"
    touch "$cuda/.complete"
fi
export PATH=$cuda/bin:$PATH

# The decode loop's length in instructions: the innermost backward branch
# whose span holds the tensor-core products (HMMA). nvcc moves
# instructions into or out of it with unrelated source changes, and the
# batch-1 GEMV is issue-bound, so this is the count to watch.
row_loop() {
    python3 - "$1" <<'PY'
import re, sys
ins = [l.split(None, 1) for l in open(sys.argv[1]) if l.strip()]
addr = [int(a, 16) for a, _ in ins]
best = 0
for i, (a, t) in enumerate(ins):
    m = re.search(r"BRA 0x([0-9a-f]+)", t)
    if m and int(m.group(1), 16) <= addr[i]:
        body = [x for j, x in enumerate(ins[: i + 1]) if addr[j] >= int(m.group(1), 16)]
        if any("HMMA" in x[1] for x in body) and (best == 0 or len(body) < best):
            best = len(body)
print(f"{best} instructions" if best else "none found")
PY
}

[ $# -gt 0 ] || set -- shipped=
read -ra kernels <<<"${ESCHA_SASS_KERNELS:-escha_gemv_kernelILi2ELi4ELi1ELb0E escha_gemv_kernelILi3ELi4ELi1ELb0E escha_gemv_kernelILi2ELi8ELi1ELb0E escha_gemv_kernelILi3ELi8ELi1ELb0E escha_gemv_kernelILi2ELi4ELi1ELb1E escha_gemv_kernelILi3ELi4ELi1ELb1E}"
out=${ESCHA_SASS_OUT:-target/sass}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for v in "$@"; do
    name=${v%%=*} flags=${v#*=}
    # shellcheck disable=SC2086
    nvcc -std=c++17 -O3 -arch=sm_90 -cubin $flags -I"$tree/ggml/src/ggml-cuda" -I"$tree/ggml/src" -I"$tree/ggml/include" \
        -o "$work/$name.cubin" hip/bench/escha-mm-bench.cu > "$work/$name.log" 2>&1 \
        || { grep -E "error" "$work/$name.log" | head -n 20; echo "$name: nvcc failed" >&2; exit 1; }
    cuobjdump -sass "$work/$name.cubin" > "$work/$name.sass"
    for k in "${kernels[@]}"; do
        # One instruction a line: its address and text, without encodings.
        awk -v k="$k" '/Function : /{f = index($0, k) > 0; next} f && /^[ \t]+\/\*[0-9a-f]+\*\//{
            sub(/^[ \t]+\/\*/, ""); sub(/\*\/[ \t]+/, " "); sub(/[ \t]*\/\*.*/, ""); print}' "$work/$name.sass" > "$out/$name-$k.sass"
        n=$(wc -l < "$out/$name-$k.sass")
        [ "$n" -gt 0 ] || { echo "$name: no kernel matches $k" >&2; exit 1; }
        # 64-bit divisions call a subroutine; 32-bit ones (nvcc's fast path
        # where both operands fit) take a reciprocal each.
        echo "$name $k: $n instructions; divisions: $(grep -c 'CALL.REL' "$out/$name-$k.sass") 64-bit calls, $(grep -c 'MUFU.RCP' "$out/$name-$k.sass") reciprocals"
        echo "  mix: $(awk '{print $2 == "" ? "?" : ($2 ~ /^@/ ? $3 : $2)}' "$out/$name-$k.sass" | sed 's/\..*//' | sort | uniq -c | sort -rn | head -n 16 \
            | awk '{printf "%s %s, ", $2, $1}')"
        echo "  row loop: $(row_loop "$out/$name-$k.sass"); registers: $(cuobjdump -res-usage "$work/$name.cubin" 2>/dev/null \
            | grep -A1 "$k" | grep -o 'REG:[0-9]*' | head -n 1 | cut -d: -f2)"
    done
done
echo "SASS per kernel in $out"
