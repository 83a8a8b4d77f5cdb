#!/usr/bin/env bash
# Compile-only check of the escha CUDA/HIP kernels for AMD targets with
# Debian's hipcc (HIP 5.x): hip/escha.cu goes through ggml-cuda's common
# header and HIP vendor header (vendors/hip.h) exactly as ggml-hip compiles
# it, for a wave32 (gfx1030, RDNA2) and a wave64 (gfx90a, CDNA2) target.
# hip/ci-compat stands in for what Debian lacks (hipBLAS, hip_bf16.h and a
# few newer device functions); nothing is linked or run.
# Needs the prepared llama.cpp tree of `cargo build` (ESCHA_TREE overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tree of the latest cargo build (build/tree.rs links it).
tree=${ESCHA_TREE:-$(readlink -f target/release/llama.cpp-tree 2>/dev/null || true)}
[ -f "$tree/ggml/src/ggml-cuda/common.cuh" ] || { echo "no prepared llama.cpp tree: build with cargo first" >&2; exit 1; }
cuda=$tree/ggml/src/ggml-cuda
compat=$PWD/hip/ci-compat
archs=${ESCHA_HIP_ARCHS:-gfx1030 gfx90a}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for f in hip/*.cu; do
    for a in $archs; do
        echo "hipcc --offload-arch=$a $f"
        # The source is compiled from this repository (not the tree's copy);
        # includes of ggml-cuda headers resolve in the tree.
        hipcc -x hip -std=c++17 -O2 -DGGML_USE_HIP -DNDEBUG --offload-arch="$a" -Werror=return-type \
            -I"$compat" -include "$compat/hip52-compat.h" \
            -I"$PWD/hip" -I"$cuda" -I"$tree/ggml/src" -I"$tree/ggml/include" \
            -c "$f" -o "$out/$(basename "$f").$a.o"
    done
done
echo "escha HIP kernels compile for: $archs"
