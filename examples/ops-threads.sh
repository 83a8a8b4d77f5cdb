#!/usr/bin/env bash
# Escha's ops next to llama.cpp's Q4_K, Q2_K and IQ2_XXS on 1 and 2 CPU
# threads, batch 1 and 512, side by side in one run (docs/PERFORMANCE.md):
#   examples/ops-threads.sh            # threads 1 and 2, two rounds
#   OPS_THREADS="1 2 4" OPS_ROUNDS=1 examples/ops-threads.sh
# test-backend-ops gives the CPU backend half of what
# std::thread::hardware_concurrency() reports and has no option for it, so
# each run preloads a get_nprocs() that reports twice the threads wanted
# (libstdc++ asks glibc's get_nprocs()); no llama.cpp code is changed.
# Needs `cargo build --release --features tools` and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/llama.cpp-bin
[ -x "$bin/test-backend-ops" ] || { echo "no $bin/test-backend-ops: cargo build --release --features tools first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/nprocs.c" <<'C'
#include <stdlib.h>
int get_nprocs(void) { const char *v = getenv("ESCHA_FAKE_NPROCS"); return v ? atoi(v) : 1; }
int get_nprocs_conf(void) { return get_nprocs(); }
C
cc -shared -fPIC -O2 "$tmp/nprocs.c" -o "$tmp/nprocs.so"
quants='^type_a=(q4_K|q2_K|iq2_xxs),type_b=f32,m=(17408|5120),n=(1|512),k=(5120|17408),bs=\[1,1\],nr=\[1,1\]'
for r in $(seq "${OPS_ROUNDS:-2}"); do
    for t in ${OPS_THREADS:-1 2}; do
        echo "== round $r, $t thread(s)"
        run() { ESCHA_FAKE_NPROCS=$((2 * t)) LD_PRELOAD="$tmp/nprocs.so" LD_LIBRARY_PATH="$bin" "$bin/test-backend-ops" perf -b CPU "$@" | grep 'us/run'; }
        run -o ESCHA_LINEAR -p 'm=(1|512),'
        run -o MUL_MAT -p "$quants"
    done
done
