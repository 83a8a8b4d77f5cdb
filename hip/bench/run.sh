#!/usr/bin/env bash
# Builds and runs escha-mm-bench on a GPU machine with nvcc (sm_90), from the
# headers in the pack of hip/device-pack.sh (.device/llama.cpp.tar.xz): no
# ggml build needed, about half a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$(mktemp -d)
tar -C "$src" -xJf .device/llama.cpp.tar.xz ./ggml/include ./ggml/src/ggml-cuda ./ggml/src/ggml-impl.h ./ggml/src/ggml-common.h 2>/dev/null \
    || tar -C "$src" -xJf .device/llama.cpp.tar.xz
export PATH=/usr/local/cuda/bin:$PATH
nvcc -std=c++17 -O3 -arch=sm_90 -I"$src/ggml/src/ggml-cuda" -I"$src/ggml/src" -I"$src/ggml/include" \
    -Xlinker --unresolved-symbols=ignore-all -o "$src/escha-mm-bench" hip/bench/escha-mm-bench.cu
"$src/escha-mm-bench"
