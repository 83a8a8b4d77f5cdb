#!/usr/bin/env bash
# CPU speed of Gemma-3-270M with every projection Escha-coded, against its
# IQ2_XXS and Q4_K_M twins, side by side in one run (docs/PERFORMANCE.md):
#   examples/gemma-speed.sh              # llama-bench -t 2 -p 512 -n 128 -r 3
#   GEMMA_SPEED_ROUNDS=3 examples/gemma-speed.sh   # the models interleaved 3 times
# The escha model is `escha quantize --random-codes` of the F16 model (the
# real layout, random code words: coding 100 M weights takes about 40
# minutes on two cores, and the kernels' speed does not depend on the
# codes), every other tensor requantized to Q4_K_M like the twin's; the
# IQ2_XXS twin is quantized from F16 with an importance matrix computed on
# docs/FORMAT.md. Models are cached per escha build.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '\n== %s\n' "$*"; }
cache="${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/gemma3-270m"
mkdir -p "$cache"
bin=target/release/llama.cpp-bin
escha=target/release/escha
threads=$(nproc)
rounds=${GEMMA_SPEED_ROUNDS:-1}

log "building escha and the patched llama.cpp tools (a no-op when up to date)"
cargo build --release --features tools --bins
. scripts/lib/gemma.sh
gemma_fetch

gemma_speed_models
if [ ! -f "$speed" ]; then
    rm -f "$cache"/gemma-3-270m-escha-random-*.gguf
    log "escha twin: every projection coded with random codes, the rest Q4_K_M"
    "$escha" quantize "$f16" "$rand" --random-codes --no-progress
    "$bin/llama-quantize" --allow-requantize "$rand" "$speed.tmp" Q4_K_M "$threads" >"$cache/speed-q4rest.log" 2>&1 \
        || { tail -n 20 "$cache/speed-q4rest.log" >&2; exit 1; }
    mv "$speed.tmp" "$speed"
    rm -f "$rand"
fi
if [ ! -f "$iq2" ]; then
    log "IQ2_XXS twin (importance matrix on docs/FORMAT.md)"
    "$bin/llama-imatrix" -m "$f16" -f docs/FORMAT.md -c 512 -t "$threads" -o "$cache/imatrix.gguf" >"$cache/imatrix.log" 2>&1 \
        || { tail -n 20 "$cache/imatrix.log" >&2; exit 1; }
    "$bin/llama-quantize" --imatrix "$cache/imatrix.gguf" "$f16" "$iq2.tmp" IQ2_XXS "$threads" >"$cache/iq2.log" 2>&1 \
        || { tail -n 20 "$cache/iq2.log" >&2; exit 1; }
    mv "$iq2.tmp" "$iq2"
fi

log "llama-bench -t 2 -p 512 -n 128 -r 3: escha, IQ2_XXS, Q4_K_M ($rounds round(s))"
for r in $(seq "$rounds"); do
    for m in "$speed" "$iq2" "$q4"; do
        "$bin/llama-bench" -m "$m" -t 2 -p 512 -n 128 -r 3 -o md | grep -E "pp512|tg128"
    done
done
