#!/usr/bin/env bash
# The project's test command: everything CI runs, in order, on this
# machine (install what it needs first: scripts/install-deps.sh).
#   1. cargo test with the tools and the GPU-kernel shims
#   2. ggml's own harness on both ops (Rust kernels vs the C reference)
#   3. the HIP compile check (skipped with a note without hipcc)
#   4. the llama.cpp tools start
#   5. Gemma-3-270M end to end (examples/gemma-demo.sh --quick --check)
#   6. Qwen3.5 dense and MoE end to end (tests/qwen35-e2e.sh), then the
#      synthetic models' blocks (tests/synthetic_twins.py) in its Python
#      environment
#   7. the kernels on aarch64 (NEON) under qemu (skipped with a note
#      without the target)
#   8. the mutants of tests/mutants.py's fast group: each bug the docs say
#      the tests catch, injected into a copy of HEAD, must fail its test
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

log "toolchain"
cargo --version
rustc --version

log "cargo test --release --features tools,shims (host: $(uname -m); builds the patched llama.cpp)"
cargo test --release --features tools,shims

bin=target/release/llama.cpp-bin
log "test-backend-ops -b CPU (Rust kernels vs the C reference inside ggml)"
# The harness passes 0 of 0 cases too: the case counts are part of the check.
source ggml-escha/test-backend-ops/case-counts.sh
harness() { # OP
    local out n
    n=$(escha_cases_of "$1")
    out=$("$bin/test-backend-ops" -b CPU -o "$1" 2>&1) || { printf '%s\n' "$out"; exit 1; }
    printf '%s\n' "$out" | tail -n 3
    grep -q "  $n/$n tests passed" <<<"$out" || { echo "test-backend-ops -o $1: expected $n cases to pass" >&2; exit 1; }
}
harness ESCHA_LINEAR
harness ESCHA_MOE

if command -v hipcc >/dev/null 2>&1; then
    log "HIP compile check of the escha CUDA/HIP kernels (hip/escha.cu for gfx1030 and gfx90a, compile only)"
    hip/hip-compile-check.sh
else
    log "hipcc not installed: HIP compile check skipped"
fi

log "llama.cpp tools built from the patched tree"
for t in llama-cli llama-server llama-bench llama-perplexity; do
    "$bin/$t" --version 2>&1 | sed -n 1,2p   # sed reads all: no SIGPIPE under pipefail
done
# llama-quantize has no --version; its usage text shows that it starts.
out=$("$bin/llama-quantize" --help 2>&1 || true)
grep -q "usage" <<< "$out" || { echo "llama-quantize did not start: $out"; exit 1; }
echo "llama-quantize: starts"

log "end to end on a real model: Gemma-3-270M, block 0 coded (examples/gemma-demo.sh --quick --check)"
examples/gemma-demo.sh --quick --check

log "Qwen3.5 dense and MoE: converter, loader, published 27B layout (tests/qwen35-e2e.sh)"
tests/qwen35-e2e.sh

log "the synthetic models' quantized blocks, read back by upstream's gguf-py (tests/synthetic_twins.py)"
# In the Python environment tests/qwen35-e2e.sh made (numpy).
PYTHONPATH="$(readlink -f target/release/llama.cpp-convert)/gguf-py" \
    "${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/qwen35/venv/bin/python" tests/synthetic_twins.py \
    "$bin/llama-quantize" "$(mktemp -d)"

if rustup target list --installed 2>/dev/null | grep -q aarch64-unknown-linux-gnu \
   || timeout 300 rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
    log "cargo test --release on aarch64 (NEON) under qemu"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    cargo test --release --no-default-features --target aarch64-unknown-linux-gnu --lib --test linear --test moe --test codec
    # qemu's default core has FP16 arithmetic (both NEON paths ran above); a
    # Cortex-A57 has none: the plain path alone, the FP16 one skipped with a note.
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu cortex-a57 -L /usr/aarch64-linux-gnu" \
        cargo test --release --no-default-features --target aarch64-unknown-linux-gnu --lib cpu:: -- --nocapture 2>&1 \
        | grep -E "decode stage|skipped|test result"
else
    log "aarch64 target unavailable: NEON path not tested in this run"
fi

log "mutants: every group's edits still apply to HEAD (tests/mutants.py --group all --list)"
python3 tests/mutants.py --group all --list > target/mutants-list.log 2>&1 \
    || { grep -E "STALE|stale" target/mutants-list.log; exit 1; }
log "mutants: every claimed bug caught (tests/mutants.py --group fast, on a copy of HEAD)"
python3 tests/mutants.py --group fast
