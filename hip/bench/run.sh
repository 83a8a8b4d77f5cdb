#!/usr/bin/env bash
# Builds and runs escha-mm-bench on a GPU machine with nvcc (sm_90), from the
# headers in the pack of hip/device-pack.sh (.device/llama.cpp.tar.xz): no
# ggml build needed, about half a minute. The shipped kernels only, no
# profiling: hip/bench/compare.sh with one variant.
ESCHA_BENCH_PROFILE=0 exec "$(dirname "$0")/compare.sh" shipped=
