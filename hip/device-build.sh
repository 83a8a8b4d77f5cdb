#!/usr/bin/env bash
# Builds the patched llama.cpp with CUDA for the H200 (sm_90) from what
# hip/device-pack.sh put in .device/, on a machine with nvcc, CMake and ninja
# but no Rust and no network (about 3.5 minutes on 16 cores). The tree is
# unpacked again only when the pack changed and .device-build/ is reused if
# it is still there, but a GPU machine that starts from a fresh copy of the
# working tree has none: build and measure in the same call. Targets:
# test-backend-ops, llama-bench, llama-quantize (and more as arguments:
# llama-cli is one, which this tree builds with the server's code);
# DEVICE_CUDA=OFF builds the CPU backend alone (a minute or so, for the CPU
# steps); `device-build.sh configure` stops after CMake (device-bench.sh's
# mutant-objects step can then compile while the build runs).
set -euo pipefail
cd "$(dirname "$0")/.."
src=.device-build/llama.cpp
mkdir -p .device-build
if ! cmp -s .device/packed-id .device-build/packed-id; then
    rm -rf "$src" .device-build/mutants # mutant objects of another pack are stale
    mkdir -p "$src"
    tar -C "$src" -xJf .device/llama.cpp.tar.xz
    xz -dc .device/libescha_ggml_cpu.a.xz > .device-build/libescha_ggml_cpu.a
    cp .device/packed-id .device-build/packed-id
fi
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$src" -B .device-build/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
    -DGGML_CUDA="${DEVICE_CUDA:-ON}" -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DESCHA_RUST_LIB="$PWD/.device-build/libescha_ggml_cpu.a" > .device-build/cmake.log
[ "${1:-}" = configure ] && exit 0
ninja -C .device-build/build -j"$(nproc)" test-backend-ops llama-bench llama-quantize "$@"
