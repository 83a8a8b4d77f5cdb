#!/usr/bin/env bash
# Packs what a CUDA build of the patched llama.cpp needs on a GPU machine that
# has nvcc, CMake and ninja but no Rust toolchain and no network:
#   .device/llama.cpp.tar.xz       the patched tree as `cargo build` prepared it
#                                  (patches/*.patch applied, ggml-escha/ and
#                                  hip/ copied in), minus unused backends
#   .device/libescha_ggml_cpu.a.xz the Rust CPU kernels (the CPU side of
#                                  test-backend-ops)
#   .device/escha.xz               the escha tool (decoded twins for the offload
#                                  check; it loads the build's libggml-base)
#   .device/gpu-mutants/           tests/mutants.py's GPU mutants as patches
#   .device/gemma/*.skel.xz        Gemma-3-270M's escha model and twins as headers
#                                  (hip/gguf-skeleton.py), when they are here
#   .device/packed-id              what was packed (tree and library hashes)
# Run `cargo build --release --features tools` first; then carry `.device`
# and run hip/device-build.sh there. Keeps .device under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tree of the latest build is the one holding the newest copy of hip/escha.cu.
# The tree of the latest cargo build (build/tree.rs links it).
tree=${ESCHA_TREE:-$(readlink -f target/release/llama.cpp-tree 2>/dev/null || true)}
lib=${ESCHA_RUST_LIB:-$(ls "${tree%/llama.cpp}"/kernels-target/*/release/libescha_ggml_cpu.a 2>/dev/null | head -n 1)}
[ -d "$tree" ] || { echo "no prepared llama.cpp tree: run cargo build --release --features tools first" >&2; exit 1; }
[ -f "$lib" ] || { echo "no libescha_ggml_cpu.a: run cargo build --release --features tools first" >&2; exit 1; }
for f in hip/*.cu hip/*.cuh hip/*.h; do
    cmp -s "$f" "$tree/ggml/src/ggml-cuda/$(basename "$f")" \
        || { echo "$tree lacks the current $f: run cargo build --release --features tools first" >&2; exit 1; }
done

mkdir -p .device
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
grep -qx '/.device-build/' .git/info/exclude 2>/dev/null || echo '/.device-build/' >> .git/info/exclude

excl=()
for b in vulkan sycl cann opencl metal musa kompute webgpu zdnn hexagon openvino rpc virtgpu zendnn blas; do
    excl+=(--exclude="./ggml/src/ggml-$b")
done
tar -C "$tree" "${excl[@]}" --exclude='./.escha-synced-from' --exclude='*.gguf' -cf - . | xz -T2 -6 > .device/llama.cpp.tar.xz
xz -T2 -6 -c "$lib" > .device/libescha_ggml_cpu.a.xz
[ -x target/release/escha ] || { echo "no target/release/escha: run cargo build --release --features tools first" >&2; exit 1; }
xz -T2 -6 -c target/release/escha > .device/escha.xz
# Gemma-3-270M's models (examples/gemma-speed.sh, for this escha build), as
# headers for device-bench.sh's gemma step to rebuild: the models are too
# large to carry.
rm -rf .device/gemma
cache=${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/gemma3-270m escha=target/release/escha
. scripts/lib/gemma.sh
gemma_speed_models
if [ -f "$speed" ] && [ -f "$iq2" ] && [ -f "$q4" ]; then
    mkdir -p .device/gemma
    for name_model in escha:"$speed" iq2_xxs:"$iq2" q4_k_m:"$q4"; do
        name=${name_model%%:*}
        python3 hip/gguf-skeleton.py strip "${name_model#*:}" ".device/gemma/$name.skel" >/dev/null
        xz -T2 -6 -f ".device/gemma/$name.skel"
    done
else
    echo "no Gemma-3-270M models of this escha build in $cache (examples/gemma-speed.sh makes them):" \
        "device-bench.sh's gemma step will not run" >&2
fi
rm -rf .device/gpu-mutants
python3 tests/mutants.py --group gpu --emit-patches .device/gpu-mutants >/dev/null
{ sha256sum .device/llama.cpp.tar.xz | cut -c1-16; sha256sum "$lib" | cut -c1-16; } > .device/packed-id
du -sh .device/*
