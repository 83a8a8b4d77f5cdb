#!/usr/bin/env bash
# Escha's ops next to llama.cpp's Q4_K, Q2_K and IQ2_XXS on 1 and 2 CPU
# threads, batch 1 and 512, side by side in one run (docs/PERFORMANCE.md):
#   examples/ops-threads.sh            # threads 1 and 2, two rounds
#   OPS_THREADS="1 2 4" OPS_ROUNDS=1 OPS_ROWS=1 examples/ops-threads.sh
#   OPS_ISAS="amx avx512fp16 avx512vbmi avx2" examples/ops-threads.sh   # escha's paths in turn (ESCHA_CPU_ISA)
# OPS_BIN is the folder of test-backend-ops (default: cargo's build;
# hip/device-bench.sh's cpu step passes the GPU machine's).
# test-backend-ops gives the CPU backend half of what
# std::thread::hardware_concurrency() reports and has no option for it, so
# each run preloads a get_nprocs() that reports twice the threads wanted
# (libstdc++ asks glibc's get_nprocs()); no llama.cpp code is changed.
# Needs `cargo build --release --features tools` (or OPS_BIN) and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${OPS_BIN:-target/release/llama.cpp-bin}
rows=${OPS_ROWS:-1|512}
[ -x "$bin/test-backend-ops" ] || { echo "no $bin/test-backend-ops: cargo build --release --features tools first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/nprocs.c" <<'C'
#include <stdlib.h>
int get_nprocs(void) { const char *v = getenv("ESCHA_FAKE_NPROCS"); return v ? atoi(v) : 1; }
int get_nprocs_conf(void) { return get_nprocs(); }
C
cc -shared -fPIC -O2 "$tmp/nprocs.c" -o "$tmp/nprocs.so"
# ESCHA_CPU_ISA falls back to the best path when the CPU lacks the one named.
has_isa() {
    local flags
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    case $1 in
        best | scalar) return 0 ;;
        avx2) [[ $flags == *" avx2 "* ]] ;;
        avx512) [[ $flags == *" avx512f "* ]] ;;
        avx512vbmi) [[ $flags == *" avx512vbmi "* && $flags == *" avx512_vbmi2 "* ]] ;;
        avx512fp16) [[ $flags == *" avx512_fp16 "* ]] ;;
        amx) [[ $flags == *" avx512_fp16 "* && $flags == *" amx_bf16 "* ]] ;; # and the OS's grant, which the kernels check
        *) echo "OPS_ISAS: unknown path $1 (best, scalar, avx2, avx512, avx512vbmi, avx512fp16, amx)" >&2; exit 2 ;;
    esac
}
isas=()
for isa in ${OPS_ISAS:-best}; do
    if has_isa "$isa"; then
        isas+=("$isa")
    else
        echo "== escha path $isa: this CPU lacks it, skipped"
    fi
done
quants="^type_a=(q4_K|q2_K|iq2_xxs),type_b=f32,m=(17408|5120),n=($rows),k=(5120|17408),bs=\[1,1\],nr=\[1,1\]"
# test-backend-ops on $t threads (the loop's), only its timing lines.
run() { ESCHA_FAKE_NPROCS=$((2 * t)) LD_PRELOAD="$tmp/nprocs.so" LD_LIBRARY_PATH="$bin" "$bin/test-backend-ops" perf -b CPU "$@" | grep 'us/run'; }
for r in $(seq "${OPS_ROUNDS:-2}"); do
    for t in ${OPS_THREADS:-1 2}; do
        for isa in "${isas[@]}"; do
            echo "== round $r, $t thread(s), escha path $isa"
            if [ "$isa" = best ]; then
                run -o ESCHA_LINEAR -p "m=($rows),"
            else
                ESCHA_CPU_ISA=$isa run -o ESCHA_LINEAR -p "m=($rows),"
            fi
        done
        echo "== round $r, $t thread(s), llama.cpp's quants"
        run -o MUL_MAT -p "$quants"
    done
done
