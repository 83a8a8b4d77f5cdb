#!/usr/bin/env bash
# A/B timing of escha.cu variants on a GPU machine (nvcc, sm_90): builds
# escha-mm-bench once per variant (ESCHA_SRC / -D flags), runs each, prints
# the SASS instruction mix of the batch-1 multiply kernel and, where Nsight
# Compute is installed and allowed, its pipe and stall figures.
# Usage: hip/bench/compare.sh NAME=FLAGS...   (FLAGS: nvcc -D options;
#        ESCHA_SRC=path picks another escha.cu, e.g. -DESCHA_SRC=\"/abs/old.cu\")
# ESCHA_BENCH_PROFILE=0 skips the SASS mix and Nsight (hip/bench/run.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
src=$(mktemp -d)
tar -C "$src" -xJf .device/llama.cpp.tar.xz ./ggml/include ./ggml/src/ggml-cuda ./ggml/src/ggml-impl.h ./ggml/src/ggml-common.h 2>/dev/null \
    || tar -C "$src" -xJf .device/llama.cpp.tar.xz
export PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-out}
mkdir -p "$out"
names=()
for v in "$@"; do
    name=${v%%=*}; flags=${v#*=}
    names+=("$name")
    # shellcheck disable=SC2086
    nvcc -std=c++17 -O3 -arch=sm_90 $flags -I"$src/ggml/src/ggml-cuda" -I"$src/ggml/src" -I"$src/ggml/include" \
        -Xlinker --unresolved-symbols=ignore-all -o "$src/bench-$name" hip/bench/escha-mm-bench.cu > "$out/nvcc-$name.log" 2>&1 &
done
wait
# status: 1 when a variant failed to build or a run failed (the timings
# that did run are still printed)
status=0
for name in "${names[@]}"; do
    rm -f "$out/bench-$name.txt"
    if [ -x "$src/bench-$name" ]; then
        rm -f "$out/nvcc-$name.log"
    else
        echo "=== $name: the build failed ($out/nvcc-$name.log)"; cat "$out/nvcc-$name.log"; status=1
    fi
done
# ESCHA_BENCH_ROUNDS=n: the variants n times in turn (drift between runs
# shows as spread within a variant); ESCHA_BENCH_WITH_MOE=1: each run also
# times the 35B's MoE decode slots (ESCHA_BENCH_MOE_SLOTS).
for round in $(seq "${ESCHA_BENCH_ROUNDS:-1}"); do
    for name in "${names[@]}"; do
        [ -x "$src/bench-$name" ] || continue
        echo "=== $name (round $round)"
        "$src/bench-$name" > "$out/bench-$name-run.txt" || { echo "$name: the run failed"; status=1; }
        if [ "${ESCHA_BENCH_WITH_MOE:-0}" = 1 ]; then
            ESCHA_BENCH_MOE_SLOTS=1 "$src/bench-$name" >> "$out/bench-$name-run.txt" || { echo "$name: the MoE run failed"; status=1; }
        fi
        cat "$out/bench-$name-run.txt" >> "$out/bench-$name.txt"
        grep -E "^K=|split|^op|^moe|CUDA error" "$out/bench-$name-run.txt" | sed -E 's/checksum/cs/; s/ +/ /g'
        rm -f "$out/bench-$name-run.txt"
    done
done
[ "${ESCHA_BENCH_PROFILE:-1}" = 1 ] || exit $status
for name in "${names[@]}"; do
    # instruction mix of the batch-1 GEMV kernels (K=2 and K=3; 4 tiles a
    # warp, and 8 as large dense ops take it)
    cuobjdump -sass "$src/bench-$name" > "$src/sass-$name.txt" 2>/dev/null
    for k in 2 3; do
        for n in 4 8; do
            # the batch-1 kernel's code (unfused), to count its loop
            awk "/Function : .*escha_gemv_kernelILi${k}ELi${n}ELi1ELb0E/{f=1;next} /Function :/{f=0} f" "$src/sass-$name.txt" \
                | grep -E '^\s+/\*[0-9a-f]+\*/' | sed -E 's@^\s+/\*([0-9a-f]+)\*/\s+@\1 @; s@\s*/\*.*@@; s@ +@ @g' > "$out/sass-gemv-k$k-n$n-$name.txt"
            echo "sass $name K=$k, $n tiles a warp: $(awk "/Function : .*escha_gemv_kernelILi${k}ELi${n}ELi1ELb0E/{f=1;next} /Function :/{f=0} f" "$src/sass-$name.txt" \
                | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -24 \
                | awk '{printf "%s %s, ", $2, $1}')"
        done
    done
done
if command -v ncu > /dev/null; then
    for name in "${names[@]}"; do
        for k in ${ESCHA_BENCH_PROFILE_K:-2}; do
            ESCHA_BENCH_GEMV_ONLY=$k timeout 120 ncu -k regex:escha_gemv_kernel -s 20 -c 1 \
                --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
                --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
                "$src/bench-$name" > "$out/ncu-$name-k$k.txt" 2>&1
            echo "=== ncu $name K=$k: $(grep -E 'Duration|Compute \(SM\) Throughput|Issue Slots Busy|highest-utilized|Warp Cycles Per Issued|Registers Per|Achieved Active Warps|Theoretical Active' "$out/ncu-$name-k$k.txt" \
                | sed -E 's/ +/ /g; s/based on elapsed.*//' | tr '\n' ';')"
        done
    done
fi
exit $status
