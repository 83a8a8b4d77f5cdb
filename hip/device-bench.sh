#!/usr/bin/env bash
# The H200 measurements of docs/PERFORMANCE.md, in steps that each fit one
# device call (run hip/device-build.sh first; results go to $OUT or ./out):
#   parity   test-backend-ops ESCHA_LINEAR / ESCHA_MOE against the CPU, on the
#            tensor-core path and on the SIMT path (the one HIP runs), dense
#            also in the one-launch kernel (GGML_ESCHA_FUSED_DENSE=1), MoE
#            also with its tensor-core prefill kernel (GGML_ESCHA_MOE_ROWS=100)
#            and its decode slots in three launches (GGML_ESCHA_FUSED=0)
#   broken   parity with a deliberately wrong decode (each lane's state
#            offset one bit off) must fail every case: patches the build
#            tree's escha-kernels.cuh, rebuilds test-backend-ops, runs,
#            restores it and rebuilds. parity and broken stop the script
#            with a message when a run, a build or a case count is wrong.
#   offload  logits of small synthetic escha models (dense and MoE, 4 layers,
#            widths / 4, F16 plain matrices) on CUDA at -ngl 99 and at a
#            partial -ngl 2 (with and without op offload), and on the CPU,
#            each against their decoded twin (`escha decode`, packed by
#            device-pack.sh) in the same placement: mean KLD < 1e-4 and the same top
#            token for >= 99%. Needs llama-perplexity (device-build.sh
#            llama-perplexity). broken runs it too and it must fail there.
#   mutants  each GPU mutant of tests/mutants.py (packed as patches by
#            device-pack.sh; MUTANTS="id ..." picks some, in that order):
#            its escha.cu object linked into the build in place of the real
#            one and its check run: every one must make the check fail; the
#            real object is linked back at the end
#   mutant-objects  compiles the mutants' objects (all at once) on a
#            configured build, e.g. while the build runs:
#     bash hip/device-build.sh configure && { bash hip/device-bench.sh mutant-objects & bash hip/device-build.sh; wait; } && bash hip/device-bench.sh mutants
#   ab       a model A/B of this tree's escha.cu against another version's
#            in one build: AB_HIP names a folder with that version's
#            escha.cu, escha.cuh, escha-kernels.cuh and escha-plan.h (e.g.
#            `git show OLD:hip/escha.cu` and so on, carried untracked); its
#            object (compiled by ab-objects, or here) is linked into a copy
#            of the build's bin/; then AB_ROUNDS (3) rounds of llama-bench
#            tg128 -r 5 of AB_MODELS ("dense-escha moe-escha-q4rest", those
#            present) on both, and their Q4_K_M twins on this tree's, with
#            each round's ratios. The build is left as this tree's; an
#            object already compiled is kept (remove .device-build/ab for
#            another AB_HIP).
#   ab-objects  compiles that object on a configured build, e.g. while the
#            build runs (as mutant-objects)
#   moe-perf test-backend-ops perf of the MoE ops at 1-2048 tokens, at
#            each grouped block size, and MUL_MAT_ID with Q4_K and IQ2_XXS
#   decode   the decode-once kernel (the dense BLAS path) against the C
#            reference bit for bit on this GPU, and its time (needs only nvcc)
#   mtp      the dense 27B shape with an always-agreeing MTP head, escha
#            and Q4_K_M: tg128, pp2-pp5 (verify windows) and llama-cli
#            greedy generation with and without --spec-type draft-mtp
#            (MTP_WEIGHTS: escha, escha-coded, escha-q4rest, q4km)
#   mtp-gen  the mtp step's escha and escha-coded models (no build: run it while
#            building, DENSE_LAYERS as for mtp)
#   ops      whole ops of the 27B's shapes at one row, their three kernels
#            launched as escha.cu launches them (dependent launches) and their
#            code cold beyond L2 (hip/bench, ESCHA_BENCH_OPS and _COLD: the
#            harness figures that ranked grid changes as the model did),
#            OPS_ROUNDS times (2); OPS_VARIANTS="name=-DFLAG ..." (one flag a
#            name) builds more than the shipped kernels (needs only nvcc)
#   decode-variants  store-pattern variants of that kernel (hip/bench/
#            escha-decode-variants.cu) timed against it and the write
#            roofline, each bit for bit equal to it (needs only nvcc)
#   perf     test-backend-ops perf: escha ops (shipped plan, dependent
#            launch off, fused kernel off, early weight loads off, BLAS path
#            off, BLAS path always; PERF_VARIANTS="tag:ENV=1 ..." picks some)
#            and MUL_MAT with Q4_K, Q2_K, IQ2_XXS and F16 weights of the
#            same shapes (PERF_QUANTS=0 skips them)
#   gen      shape-exact synthetic 27B (dense) and 35B-A3B (MoE) escha
#            GGUFs with DENSE_LAYERS / MOE_LAYERS layers (needs no build: run
#            it in the background while building; 64 dense layers is the
#            whole model)
#   q4km     their Q4_K_M twins: every tensor in the type llama-quantize
#            gives it, random blocks, no full-size f16 file (quantized_twin);
#            and the escha models with every uncoded matrix in those types
#            (dense-/moe-escha-q4rest.gguf, like with like)
#   models   gen + q4km
#   iq2      the same for IQ2_XXS (llama-quantize of the small twin with a
#            uniform importance matrix)
#   bench    llama-bench pp512 / tg128, -ngl 99, every model present
#   kernels  GPU time of token generation by kernel family (escha's GEMV
#            and transforms, upstream's quantized GEMVs, attention, norms),
#            per token, for every model present: `llama-bench -p 0 -n
#            KERNELS_TOKENS` under Nsight Systems (or Nsight Compute where
#            nsys is missing), summed by hip/bench/kernel-times.py
#   graphs   llama-bench tg128 / pp512 with CUDA graphs and with
#            GGML_CUDA_DISABLE_GRAPHS=1, escha, Q4_K_M, IQ2_XXS models present
#   fused-dense  the same as shipped and with GGML_ESCHA_FUSED_DENSE=1
#            (dense ops of 1-4 rows in the one-launch kernel)
#   escha-fusion  the same with escha's graph fusion (a gate and up pair
#            with their SWIGLU, an op with its residual ADD) and with
#            GGML_ESCHA_GRAPH_FUSION=0
#   ahead    dense escha pp4 / tg128 with later ops' input transforms run
#            ahead, without (GGML_ESCHA_AHEAD=0), without escha's graph
#            fusion, and Q4_K_M, three alternating rounds; ncu counts of
#            input transform launches with and without
#   norm-fusion  the same with a norm's launch running the input
#            transforms of the ops after it and without
#            (GGML_ESCHA_NORM_FUSION=0)
#   fusion   the same with upstream's CUDA fusions and with
#            GGML_CUDA_DISABLE_FUSION=1
#   pdl      the same with programmatic dependent launch and with
#            GGML_CUDA_PDL=0
#   early    the same with dense ops' early loads and with GGML_ESCHA_EARLY=0
#   batched  llama-batched-bench at 1, 4, 16, 32, 64 sequences (BATCHED_NPL),
#            every model present (device-build.sh llama-batched-bench)
#   cpu      this machine's CPU (an Intel Xeon with AVX-512 FP16 on the
#            H200 machines): its model and AVX-512 flags, then
#            examples/ops-threads.sh on this build, batch 1, 1 and 2
#            threads, escha's avx512fp16, avx512vbmi and avx2 paths against
#            Q4_K, Q2_K and IQ2_XXS (the CPU-speed issue's batch-1 goal on
#            FP16 machines; OPS_ROWS="1|512" adds batch 512)
#   gemma    Gemma-3-270M on this machine's CPU, llama-bench -t 2 (two CPUs
#            of different cores), escha against its IQ2_XXS and Q4_K_M
#            twins: tg128 in GEMMA_ROUNDS (6) rounds, the order reversed
#            every other round, escha's avx512vbmi path last in each; then pp512 in
#            two rounds. The models rebuilt from the skeletons device-pack.sh
#            packs (hip/gguf-skeleton.py: the same layout, random contents),
#            as they are too large to carry. A CPU-only build is enough:
#            DEVICE_CUDA=OFF bash hip/device-build.sh
# MODELS (default "dense moe") limits gen / q4km / iq2 / bench to those
# models: each call to a GPU machine starts from a fresh tree and may run 10
# minutes, and build + one model's twins + bench fit one call:
#   MODELS=dense bash -c 'bash hip/device-bench.sh gen & bash hip/device-build.sh; wait; bash hip/device-bench.sh q4km iq2 bench'
set -uo pipefail
cd "$(dirname "$0")/.."
B=.device-build/build/bin
M=.device-models
S=hip/synthetic-qwen35.py
out=${OUT:-out}
mkdir -p "$out" "$M"
DENSE_LAYERS=${DENSE_LAYERS:-16}
MOE_LAYERS=${MOE_LAYERS:-4}
MODELS=${MODELS:-dense moe}
MTP_WEIGHTS=${MTP_WEIGHTS:-escha q4km}
BATCHED_NPL=${BATCHED_NPL:-1,4,16,32,64}
MOE_ROWS_TRIED=${MOE_ROWS_TRIED-8 16 32 64 100}
PERF_VARIANTS=${PERF_VARIANTS:-shipped: nopdl:GGML_CUDA_PDL=0 unfused:GGML_ESCHA_FUSED=0 late:GGML_ESCHA_EARLY=0 noblas:GGML_ESCHA_BLAS_MIN_ROWS=0 blas:GGML_ESCHA_BLAS_MIN_ROWS=1}
has() { [[ " $MODELS " == *" $1 "* ]]; }
die() { echo "device-bench: $*" >&2; exit 1; }
# synth DST LOG OPTIONS: synthetic-qwen35.py writes DST through DST.tmp, so
# that a failed or cut-off run leaves no model a later step would take for
# whole; its output goes to LOG, which the failure names.
synth() {
    local dst=$1 log=$2
    shift 2
    python3 $S "$@" -o "$dst.tmp" > "$log" 2>&1 || die "$dst: writing the model failed ($log)"
    mv "$dst.tmp" "$dst"
}
# The escha cases test-backend-ops registers: escha_cases_of OP.
source ggml-escha/test-backend-ops/case-counts.sh
# The CPU scripts' llama-perplexity helpers (ppl, kld, below) on this build.
bin=$B threads=$(nproc)
source scripts/lib/kld.sh
text=.device-build/llama.cpp/ggml/include/ggml.h
# Logits of the small synthetic models on CUDA (full and partial offload) and
# on the CPU against their decoded twins; EXPECT is "pass" or "fail".
offload() {
    local expect=$1 bad=0
    xz -dc .device/escha.xz > .device-build/escha && chmod +x .device-build/escha
    for m in dense27b moe35b; do
        local f=$M/check-$m.gguf
        if [ ! -f "$f" ]; then
            synth "$f" "$out/gen-check-$m.log" --model $m --layers 4 --shrink 4 --weights escha --plain f16 --rout 0.01
            LD_LIBRARY_PATH=$B .device-build/escha decode "$f" "$M/check-$m-twin.gguf" >/dev/null || die "escha decode $f failed"
            ppl -m "$M/check-$m-twin.gguf" -f "$text" -ngl 0 --no-op-offload --kl-divergence-base "$M/check-$m.kld" \
                > "$out/kld-base-$m.log" || die "$m: the twin's perplexity run failed"
        fi
        # Full offload; layers 0-1 on the host (their weights copied to the
        # GPU per op for large batches, as llama.cpp does by default; then
        # without that, on the CPU kernels); everything on the CPU.
        # The twin runs in the same placement (upstream's CUDA matmuls round
        # differently from its CPU ones); its distance from itself on the CPU
        # is printed as that floor.
        for place in "-ngl 99" "-ngl 2" "-ngl 2 --no-op-offload" "-ngl 0 --no-op-offload"; do
            local tag base
            tag=$(printf '%s' "$place" | tr -c 'a-z0-9-' '_')
            base=$M/check-$m-twin$tag.kld
            if [ ! -f "$base" ]; then
                ppl -m "$M/check-$m-twin.gguf" -f "$text" $place --kl-divergence-base "$base" \
                    > "$out/kld-base-$m$tag.log" || die "$m $place: the twin's perplexity run failed"
            fi
            read -r floor floor_top _ <<<"$(kld "$M/check-$m-twin.gguf" "$M/check-$m.kld" $place)"
            read -r k top _ <<<"$(kld "$f" "$base" $place)"
            if below "$k" 1e-4 && below 99 "$top"; then r=pass; else r=fail; bad=1; fi
            echo "offload $m $place: escha vs its decoded twin in the same placement: mean KLD $k, same top $top %: $r" \
                "(the twin there vs on the CPU: $floor, $floor_top %)"
        done
    done
    if [ "$expect" = pass ] && [ $bad = 1 ]; then die "offload: escha logits differ from the decoded twin"; fi
    if [ "$expect" = fail ] && [ $bad = 0 ]; then die "offload: the broken decode matched the twin"; fi
}
# The path stem of quantized_twin's small models for its twin $1.
twin_small() { echo "$M/small-$(basename "$1" .gguf)"; }
# A twin in llama.cpp's own quantization, without its full-size f16 file
# (54 GB for the whole dense 27B): llama-quantize makes the twin of a model
# whose widths are divided by $shrink (every width still a multiple of 256,
# so each tensor gets the type it would at full size; layers and options as
# the full one), and synthetic-qwen35.py writes the full-size model with
# random blocks of those types. Usage: quantized_twin MODEL LAYERS FTYPE OUT
# [synthetic-qwen35.py options]; needs the build's llama-quantize. The small
# quantized model stays ($M/small-NAME-q.gguf, NAME the twin's) for
# escha models whose other matrices take its types.
quantized_twin() {
    local model=$1 layers=$2 ftype=$3 dst=$4 shrink small im log
    shift 4
    [ -f "$dst" ] && return 0
    case $model in dense27b) shrink=4 ;; moe35b) shrink=2 ;; esac   # the MoE experts' 512 allow only 2
    small=$(twin_small "$dst")
    log=$out/twin-$(basename "$dst" .gguf).log
    python3 $S --model $model --layers "$layers" --shrink $shrink --weights f16 "$@" -o "$small-f16.gguf" \
        --imatrix "$small.imatrix" > "$log" 2>&1 || die "$dst: writing the small f16 twin failed ($log)"
    case $ftype in IQ*) im="--imatrix $small.imatrix" ;; *) im= ;; esac
    $B/llama-quantize $im "$small-f16.gguf" "$small-q.gguf" $ftype "$(nproc)" >> "$log" 2>&1 \
        || die "$dst: llama-quantize $ftype of the small twin failed ($log)"
    python3 $S --model $model --layers "$layers" --weights like --like "$small-q.gguf" "$@" -o "$dst.tmp" >> "$log" 2>&1 \
        || die "$dst: writing the twin like $small-q.gguf failed ($log)"
    rm -f "$small-f16.gguf" "$small.imatrix"
    mv "$dst.tmp" "$dst"
}
# Like with like: an escha model whose every matrix escha does not code is
# in the type quantized_twin's small model of TWIN gives it. Usage:
# escha_like TWIN OUT synthetic-qwen35.py options (model, layers, ...).
escha_like() {
    local twin=$1 dst=$2
    shift 2
    [ -f "$dst" ] && return 0
    synth "$dst" "$out/gen-$(basename "$dst" .gguf).log" "$@" --weights escha --like "$(twin_small "$twin")-q.gguf"
}
# The mtp step's escha models (no build needed: run it while building):
# the head in f16 as the export ships it, and coded (escha-coded).
mtp_gen() {
    local w
    for w in escha escha-coded; do
        [[ " $MTP_WEIGHTS " == *" $w "* ]] || continue
        [ -f "$(mtp_model $w)" ] && continue
        synth "$(mtp_model $w)" "$out/mtp-gen-$w.log" --model dense27b --layers "$DENSE_LAYERS" --weights escha --mtp --agree \
            $([ $w = escha-coded ] && echo --mtp-coded)
    done
}
# The mtp step's model of weights $1, for DENSE_LAYERS layers.
mtp_model() { echo "$M/mtp-$1-L$DENSE_LAYERS.gguf"; }
# The models of MODEL (dense or moe) that gen / q4km / iq2 wrote, in the
# order the tables list them; a missing one is named on stderr (the
# like-with-like models are optional).
model_files() {
    local f
    for f in $M/$1-escha.gguf $M/$1-escha-q4rest.gguf $M/$1-q4km.gguf $M/$1-iq2xxs.gguf; do
        if [ -f "$f" ]; then echo "$f"; elif [[ $f != *-q4rest.gguf ]]; then echo "missing $f" >&2; fi
    done
}
# llama-bench tg128 / pp512 of the escha, Q4_K_M and IQ2_XXS models present, with
# the default settings ("on") and with the environment setting $2 ("off");
# logs named after $1.
bench_on_off() {
    local tag=$1 setting=$2 m f g
    for m in $MODELS; do
        for f in $(model_files $m); do
            for g in on off; do
                env $([ $g = off ] && echo "$setting") $B/llama-bench -m "$f" -ngl 99 -p 512 -n 128 -r 3 -o md \
                    > "$out/$tag-$(basename "$f" .gguf)-$g.md" 2>&1 || die "$tag: llama-bench $f ($g) failed"
                echo "== $(basename "$f"), $tag $g"
                grep -E "pp512|tg128" "$out/$tag-$(basename "$f" .gguf)-$g.md"
            done
        done
    done
}
# tg128 and one verify window (pp4) of the dense escha model in
# TRANSFORM_ROUNDS (3) alternating rounds of each variant: shipped, an
# ENV=VALUE setting, or q4km (the Q4_K_M twin, when written); then, under
# ncu with CUDA graphs off, the input transform launches (escha_xh_kernel,
# and escha_norm_xh_kernel of a fused norm) of one token as shipped and
# with the first setting.
transform_rounds() { # STEP VARIANT...
    local step=$1 f g round v e first=
    shift
    f=$M/dense-escha.gguf
    [ -f "$f" ] || die "$step: no $f (gen)"
    for round in $(seq "${TRANSFORM_ROUNDS:-3}"); do
        for v in "$@"; do
            g=$f e=()
            case $v in q4km) g=$M/dense-q4km.gguf; [ -f "$g" ] || continue ;; shipped) ;; *) e=("$v") ;; esac
            env "${e[@]}" $B/llama-bench -m "$g" -ngl 99 -p 4 -n 128 -r 5 -o md > "$out/$step-$round-$v.md" 2>&1 \
                || die "$step: llama-bench $v failed ($out/$step-$round-$v.md)"
            echo "== round $round, $v"
            grep -E "pp4|tg128" "$out/$step-$round-$v.md"
        done
    done
    for v in "$@"; do case $v in shipped|q4km) ;; *) first=${first:-$v} ;; esac; done
    command -v ncu > /dev/null || return 0
    for v in shipped $first; do
        e=(); [ $v = shipped ] || e=("$v")
        env "${e[@]}" GGML_CUDA_DISABLE_GRAPHS=1 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            --kernel-name regex:escha_.*xh_kernel $B/llama-bench -m "$f" -ngl 99 -p 0 -n 1 -r 1 > "$out/$step-xh-$v.csv" \
            2> "$out/$step-xh-$v.log" || die "$step: ncu $v failed ($out/$step-xh-$v.log)"
        echo "$v, 2 tokens: $(grep '"gpu__time_duration.sum"' "$out/$step-xh-$v.csv" | grep -c 'escha_xh_kernel') input transform launches," \
            "$(grep '"gpu__time_duration.sum"' "$out/$step-xh-$v.csv" | grep -c 'escha_norm_xh_kernel') fused norm launches"
    done
}
# GPU mutants (tests/mutants.py's, packed as patches by device-pack.sh):
# MUTANTS="id ..." picks some, in that order.
bd=.device-build/build
obj=ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/escha.cu.o
mdir=$PWD/.device-build/mutants
mutant_ids() {
    if [ -n "${MUTANTS:-}" ]; then
        for id in $MUTANTS; do [ -f .device/gpu-mutants/$id.patch ] || die "mutant $id: not packed"; echo "$id"; done
    else
        for p in .device/gpu-mutants/*.patch; do basename "$p" .patch; done
    fi
}
# Compiles each selected mutant's escha.cu with the build's own compile line,
# all at once, each in a patched copy of ggml-cuda/ beside the real one (so
# its relative includes resolve); needs a configured build (device-build.sh
# configure). Objects already there are kept.
mutant_objects() {
    local cuda=.device-build/llama.cpp/ggml/src/ggml-cuda cmd id c pids=()
    [ -f $bd/build.ninja ] || die "mutants: no configured build (bash hip/device-build.sh configure)"
    mkdir -p "$mdir"
    cmd=$(ninja -C $bd -t commands $obj | tail -n 1)
    [[ "$cmd" == *"-o $obj"* && "$cmd" == *"/ggml-cuda/escha.cu "* ]] || die "mutants: no compile line for $obj: $cmd"
    for id in $(mutant_ids); do
        [ -f "$mdir/$id.o" ] && continue
        rm -rf "$cuda-m-$id"
        cp -r "$cuda" "$cuda-m-$id"
        # The patches name repository paths (hip/X); the tree has them in ggml-cuda/.
        patch -s -d "$cuda-m-$id" -p2 < .device/gpu-mutants/$id.patch || die "mutant $id: does not apply to the build tree"
        c=${cmd//"/ggml-cuda/escha.cu "/"/ggml-cuda-m-$id/escha.cu "}
        c=${c//"$obj"/"$mdir/$id.o.tmp"}
        ( cd $bd && eval "$c" && mv "$mdir/$id.o.tmp" "$mdir/$id.o" ) > "$out/mutant-$id-compile.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
}
# Puts an escha.cu object in the build with the original's mtime (ninja's
# deps log would otherwise call it stale and recompile it), removes the CUDA
# library so ninja relinks it, and checks that the object was not rebuilt.
# install_object OBJECT LOG [ORIGINAL [TARGET...]]: the original's copy
# (default the mutants' saved one) gives the mtime; the targets relinked
# default to test-backend-ops.
install_object() {
    local src=$1 log=$2 ref=${3:-$mdir/orig.o}
    shift 2; [ $# -gt 0 ] && shift
    # Copied, dated and moved in place in one step: a run cut short in
    # between never leaves a mutant's object with a fresh mtime (which the
    # mutants step would take for a rebuilt real one).
    cp "$src" $bd/$obj.tmp
    touch -r "$ref" $bd/$obj.tmp
    mv $bd/$obj.tmp $bd/$obj
    rm -f "$lib"
    ninja -C $bd "${@:-test-backend-ops}" > "$log" 2>&1 || die "relinking with $src failed ($log)"
    cmp -s "$src" $bd/$obj || die "ninja rebuilt $obj instead of linking $src"
    [ -f "$lib" ] || die "ninja did not relink $lib"
}
# The other version's escha.cu object of the ab step (AB_HIP), compiled
# with the build's own compile line in a copy of ggml-cuda/ beside the real
# one (its relative includes then resolve); needs a configured build.
abdir=$PWD/.device-build/ab
ab_object() {
    local cuda=.device-build/llama.cpp/ggml/src/ggml-cuda cmd c
    [ -n "${AB_HIP:-}" ] && [ -f "$AB_HIP/escha.cu" ] || die "ab: AB_HIP must name a folder with escha.cu and its headers"
    [ -f $bd/build.ninja ] || die "ab: no configured build (bash hip/device-build.sh configure)"
    mkdir -p "$abdir"
    rm -rf "$cuda-ab"
    cp -r "$cuda" "$cuda-ab"
    cp "$AB_HIP"/escha* "$cuda-ab/"
    cmd=$(ninja -C $bd -t commands $obj | tail -n 1)
    [[ "$cmd" == *"-o $obj"* && "$cmd" == *"/ggml-cuda/escha.cu "* ]] || die "ab: no compile line for $obj: $cmd"
    c=${cmd//"/ggml-cuda/escha.cu "/"/ggml-cuda-ab/escha.cu "}
    c=${c//"$obj"/"$abdir/old.o.tmp"}
    ( cd $bd && eval "$c" && mv "$abdir/old.o.tmp" "$abdir/old.o" ) > "$out/ab-compile.log" 2>&1 \
        || die "ab: compiling $AB_HIP/escha.cu failed ($out/ab-compile.log)"
}
# tg128 of model file $2 on the ab step's build $1 (new or old).
ab_tg() {
    LD_LIBRARY_PATH=$abdir/bin-$1 $abdir/bin-$1/llama-bench -m "$2" -ngl 99 -p 0 -n 128 -r 5 -o md > "$out/ab-$r-$1-$(basename "$2" .gguf).md" 2>&1 \
        || die "ab: llama-bench $2 on $1 failed ($out/ab-$r-$1-$(basename "$2" .gguf).md)"
    grep tg128 "$out/ab-$r-$1-$(basename "$2" .gguf).md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'
}
ab_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }
# A mutants run marks the build while a mutant is linked in; every other
# step refuses such a build (a run cut short leaves it so: run mutants
# again, which links the real object back at its end).
linked_marker=$mdir/mutant-linked
for step in "$@"; do
    case $step in mutants|mutant-objects|decode|decode-variants|gen|mtp-gen|models|q4km|iq2) ;;
    *) [ -f "$linked_marker" ] && die "$step: a mutant is still linked into the build (a mutants run was cut short): run the mutants step again" ;;
    esac
done
for step in "$@"; do
    case $step in
    parity)
        # Each run must exit 0 and pass every case: the harness also
        # reports success on 0 of 0 cases. Paths: the shipped plan, SIMT
        # (the one HIP runs); MoE also through the tensor-core prefill
        # kernel, which the plan leaves to GGML_ESCHA_MOE_ROWS above 64, and
        # its decode slots in three launches (GGML_ESCHA_FUSED=0). All runs
        # at once (each is mostly its CPU reference), then checked.
        runs=()
        for op in ESCHA_LINEAR ESCHA_MOE; do
            for path in tensor-cores simt $([ $op = ESCHA_MOE ] && echo moe-mma unfused) $([ $op = ESCHA_LINEAR ] && echo fused-dense); do
                case $path in
                    simt) env=(GGML_ESCHA_SIMT=1) ;; unfused) env=(GGML_ESCHA_FUSED=0) ;; fused-dense) env=(GGML_ESCHA_FUSED_DENSE=1) ;;
                    moe-mma) env=(GGML_ESCHA_MOE_ROWS=100) ;; *) env=() ;;
                esac
                env "${env[@]}" $B/test-backend-ops -b CUDA0 -o $op > "$out/parity-$path-$op.log" 2>&1 &
                runs+=("$!:$op:$path")
            done
        done
        # Every run ends before any verdict, so none is left on the GPU.
        bad=
        for r in "${runs[@]}"; do
            IFS=: read -r pid op path <<<"$r"
            wait "$pid" || bad="$bad $op:$path"
        done
        for r in "${runs[@]}"; do
            IFS=: read -r pid op path <<<"$r"
            log=$out/parity-$path-$op.log want=$(escha_cases_of $op)
            [[ " $bad " == *" $op:$path "* ]] && die "$op $path: test-backend-ops exited with an error ($log)"
            grep -q "  $want/$want tests passed" "$log" || die "$op $path: not $want/$want cases passed ($log)"
            echo "$op $path: $want/$want tests passed"
        done ;;
    broken)
        # The same parity with a deliberately wrong decode (each lane's
        # state offset one bit off) must fail every case.
        f=.device-build/llama.cpp/ggml/src/ggml-cuda/escha-kernels.cuh
        cp "$f" "$out/kernels.orig"
        sed -i 's/const int p0 = ((8 \* lane + 1) \* K - 16 + NB) % NB;/const int p0 = ((8 * lane + 1) * K - 15 + NB) % NB;/' "$f"
        if cmp -s "$f" "$out/kernels.orig"; then
            die "broken: the line to break is not in $f"
        fi
        if ! ninja -C .device-build/build test-backend-ops > "$out/broken-build.log" 2>&1; then
            cp "$out/kernels.orig" "$f"
            tail -n 20 "$out/broken-build.log"
            die "broken: the broken build failed, nothing was tested"
        fi
        for op in ESCHA_LINEAR ESCHA_MOE; do
            want=$(escha_cases_of $op)
            $B/test-backend-ops -b CUDA0 -o $op > "$out/broken-$op.log" 2>&1 && die "$op: the broken decode passed"
            grep -q "  0/$want tests passed" "$out/broken-$op.log" || die "$op: the broken decode did not fail all $want cases"
            echo "$op, decode broken on purpose: 0/$want tests passed, $(grep -c FAIL "$out/broken-$op.log") FAIL lines"
        done
        if [ -x $B/llama-perplexity ]; then
            ninja -C .device-build/build llama-perplexity > "$out/broken-build-ppl.log" 2>&1 || die "broken: building llama-perplexity failed"
            offload fail
        fi
        cp "$out/kernels.orig" "$f"
        rm -f "$out/kernels.orig"
        # Rebuild from the restored source, so later steps measure the real kernels.
        ninja -C .device-build/build test-backend-ops $([ -x $B/llama-perplexity ] && echo llama-perplexity) > "$out/restore-build.log" 2>&1 \
            || die "broken: rebuilding the restored kernels failed" ;;
    offload)
        [ -x $B/llama-perplexity ] || die "offload: no llama-perplexity (bash hip/device-build.sh llama-perplexity)"
        offload pass ;;
    mutant-objects)
        mutant_objects ;;
    mtp-gen)
        mtp_gen ;;
    mutants)
        # Each mutant's escha.cu object (compiled in parallel unless the
        # mutant-objects step did it during the build) takes the real one's
        # place with the real one's mtime (ninja then keeps it), the CUDA
        # library is relinked, and the mutant's check runs.
        mutant_objects
        o=$bd/$obj
        lib=$(readlink -f $bd/bin/libggml-cuda.so)
        [ -f "$lib" ] || die "mutants: no $bd/bin/libggml-cuda.so"
        # The real object, unless a run cut short left a mutant's in the
        # build: that one carries the saved original's mtime, a rebuilt
        # real one is newer.
        if [ ! -f "$mdir/orig.o" ] || [ "$o" -nt "$mdir/orig.o" ]; then
            cp -p "$o" "$mdir/orig.o"
        fi
        survived=0 n=0
        for id in $(mutant_ids); do
            p=.device/gpu-mutants/$id.patch
            check=$(sed -n 's/^# check: //p' "$p")
            [ -n "$check" ] || die "mutant $id: no check line in $p"
            if [ -f "$mdir/$id.o" ]; then
                touch "$linked_marker"
                install_object "$mdir/$id.o" "$out/mutant-$id-build.log"
                if TBO=$B/test-backend-ops bash -c "$check" > "$out/mutant-$id.log" 2>&1; then r=SURVIVED; survived=$((survived + 1)); else r=caught; fi
            else
                # Every mutant is written to compile: one that does not is a
                # broken mutant (or compile line), not a caught one.
                r="NOT BUILT ($(tail -n 1 "$out/mutant-$id-compile.log"))"; survived=$((survived + 1))
            fi
            n=$((n + 1))
            echo "gpu mutant $id: $r ($(grep -c FAIL "$out/mutant-$id.log" 2>/dev/null || echo 0) FAIL lines, at ${SECONDS} s) - $(sed -n 's/^# [a-z0-9-]*: //p' "$p" | head -n 1)"
        done
        # The real object relinked the same way must pass (the control).
        install_object "$mdir/orig.o" "$out/mutants-restore.log"
        rm -f "$linked_marker"
        $B/test-backend-ops -b CUDA0 -o ESCHA_LINEAR > "$out/mutants-control.log" 2>&1 || die "mutants: the relinked real object fails ($out/mutants-control.log)"
        echo "control: the real object relinked the same way passes ESCHA_LINEAR ($(grep -o '[0-9]*/[0-9]* tests passed' "$out/mutants-control.log"))"
        [ $n -gt 0 ] || die "mutants: none selected"
        [ $survived -eq 0 ] || die "mutants: $survived of $n survived or did not build" ;;
    perf)
        # The shipped plan, then dependent launches off (GGML_CUDA_PDL=0),
        # the fused token-generation kernel off (three launches an op), dense
        # ops' weight loads after the wait (GGML_ESCHA_EARLY=0), the dense BLAS
        # path forced off and on (the crossover of ESCHA_CUDA_BLAS_MIN_ROWS)
        # (PERF_VARIANTS picks some), then llama.cpp's quants and f16
        # (cuBLAS) at the same shapes (PERF_QUANTS=0 skips them).
        for v in $PERF_VARIANTS; do
            tag=${v%%:*} setting=${v#*:}
            env $setting $B/test-backend-ops perf -b CUDA0 -o ESCHA_LINEAR,ESCHA_MOE \
                > "$out/perf-escha-$tag.log" 2>&1 || die "perf: escha ops ($tag) failed"
            echo "== escha, $tag"
            grep -h "us/run" "$out/perf-escha-$tag.log" | sed 's/,per=.*pad=0)/)/'
        done
        [ "${PERF_QUANTS:-1}" = 0 ] && continue # PERF_QUANTS=0: the escha ops only
        $B/test-backend-ops perf -b CUDA0 -o MUL_MAT \
            -p 'type_a=(q4_K|q2_K|iq2_xxs|f16),type_b=f32,m=(17408|5120),n=(1|2|4|8|16|32|64|128|512),k=(5120|17408),bs=\[1,1\]' \
            > "$out/perf-mulmat.log" 2>&1 || die "perf: MUL_MAT failed"
        echo "== MUL_MAT"
        grep -h "us/run" "$out/perf-mulmat.log" | sed 's/,per=.*pad=0)/)/' ;;
    ab-objects)
        ab_object ;;
    ab)
        lib=$(readlink -f $bd/bin/libggml-cuda.so)
        [ -f "$lib" ] || die "ab: no $bd/bin/libggml-cuda.so (bash hip/device-build.sh)"
        [ -f "$abdir/old.o" ] || ab_object
        # This tree's object (its copy dates every relink), its bin/, the
        # other's relinked and copied, and this tree's linked back.
        cp -p $bd/$obj "$abdir/new.o"
        rm -rf "$abdir/bin-new" "$abdir/bin-old"
        cp -a $bd/bin "$abdir/bin-new"
        install_object "$abdir/old.o" "$out/ab-link-old.log" "$abdir/new.o" llama-bench
        cp -a $bd/bin "$abdir/bin-old"
        install_object "$abdir/new.o" "$out/ab-link-new.log" "$abdir/new.o" llama-bench test-backend-ops
        cmp -s "$abdir/bin-old/$(basename "$lib")" "$abdir/bin-new/$(basename "$lib")" && die "ab: both versions give the same library"
        for r in $(seq "${AB_ROUNDS:-3}"); do
            for m in ${AB_MODELS:-dense-escha moe-escha-q4rest}; do
                f=$M/$m.gguf
                [ -f "$f" ] || { echo "ab: no $f, skipped" >&2; continue; }
                q=$M/${m%%-*}-q4km.gguf
                a=$(ab_tg new "$f") b=$(ab_tg old "$f") c=
                [ -f "$q" ] && c=$(ab_tg new "$q")
                [ -n "$a" ] && [ -n "$b" ] && { [ ! -f "$q" ] || [ -n "$c" ]; } || die "ab: a run of round $r failed (above)"
                line="round $r, $m tg128: new $a, old $b (new/old $(ab_ratio "$a" "$b"))"
                [ -z "$c" ] || line+="; $(basename "$q" .gguf) $c (new $(ab_ratio "$a" "$c")x, old $(ab_ratio "$b" "$c")x)"
                echo "$line"
            done
        done ;;
    moe-perf)
        # The MoE ops' block sizes against each other (GGML_ESCHA_MOE_ROWS
        # for each of MOE_ROWS_TRIED: GEMV blocks of 8-64 rows, 100 the
        # tensor-core kernel), the shipped plan first, then MUL_MAT_ID with
        # Q4_K and IQ2_XXS at the same shapes.
        for v in shipped: $(for r in $MOE_ROWS_TRIED; do echo r$r:GGML_ESCHA_MOE_ROWS=$r; done); do
            tag=${v%%:*} setting=${v#*:}
            env $setting $B/test-backend-ops perf -b CUDA0 -o ESCHA_MOE > "$out/moe-perf-$tag.log" 2>&1 \
                || die "moe-perf: escha ops ($tag) failed"
            echo "== escha MoE, $tag"
            grep -h "us/run" "$out/moe-perf-$tag.log" | sed 's/,scales=.*)/)/'
        done
        # One run per type, Q4_K first: making each case's random experts
        # (256 of them, quantized on the host) takes most of the time.
        for type in q4_K iq2_xxs; do
            $B/test-backend-ops perf -b CUDA0 -o MUL_MAT_ID -p "type_a=$type,type_b=f32,n_mats=256,n_used=8" \
                > "$out/moe-perf-mulmatid-$type.log" 2>&1 || die "moe-perf: MUL_MAT_ID $type failed"
            echo "== MUL_MAT_ID $type"
            grep -h "us/run" "$out/moe-perf-mulmatid-$type.log" | sed 's/,amax=.*)/)/'
        done ;;
    decode)
        # The decode-once kernel on this GPU against the C reference, bit for bit, and its time.
        export PATH=/usr/local/cuda/bin:$PATH
        mkdir -p .device-build
        nvcc -std=c++17 -O3 -arch=sm_90 -Iggml-escha/include -Iggml-escha/ref -o .device-build/escha-decode-check \
            hip/bench/escha-decode-check.cu ggml-escha/ref/escha_ref.c > "$out/decode-check-build.log" 2>&1 \
            || { tail -n 20 "$out/decode-check-build.log"; die "decode: building the check failed"; }
        .device-build/escha-decode-check | tee "$out/decode-check.log"
        [ "${PIPESTATUS[0]}" = 0 ] || die "decode: weights differ from the C reference" ;;
    ops)
        # OPS_VARIANTS: words NAME=-DFLAG, one flag each (compare.sh's form).
        read -ra variants <<<"${OPS_VARIANTS:-}"
        rounds=${OPS_ROUNDS:-2}
        ESCHA_BENCH_OPS=1 ESCHA_BENCH_COLD=1 ESCHA_BENCH_PROFILE=0 ESCHA_BENCH_ROUNDS=$rounds OUT=$out \
            bash hip/bench/compare.sh shipped= "${variants[@]}" | tee "$out/ops.log"
        [ "${PIPESTATUS[0]}" = 0 ] || die "ops: a build or run failed ($out/ops.log)"
        # 7 ops a run (escha-mm-bench's ESCHA_BENCH_OPS list)
        want=$((7 * rounds * (1 + ${#variants[@]})))
        [ "$(grep -c '^op K=' "$out/ops.log")" = $want ] || die "ops: not $want op lines ($out/ops.log)" ;;
    decode-variants)
        # Store-pattern variants of the decode-once kernel (16-byte stores
        # after a quad transpose, warp and block tile orders, a shared-memory
        # staged row writer) against the shipped kernel, bit for bit, with
        # cudaMemset and a plain store loop as the write roofline.
        export PATH=/usr/local/cuda/bin:$PATH
        mkdir -p .device-build
        nvcc -std=c++17 -O3 -arch=sm_90 -Iggml-escha/include -o .device-build/escha-decode-variants \
            hip/bench/escha-decode-variants.cu > "$out/decode-variants-build.log" 2>&1 \
            || { tail -n 20 "$out/decode-variants-build.log"; die "decode-variants: building failed"; }
        .device-build/escha-decode-variants | tee "$out/decode-variants.log"
        [ "${PIPESTATUS[0]}" = 0 ] || die "decode-variants: a variant differs from the shipped kernel" ;;
    mtp)
        # The MTP head: the dense 27B shape (DENSE_LAYERS layers) with a head
        # whose drafts always agree (synthetic-qwen35.py --mtp --agree: the
        # best case), escha and its Q4_K_M twin (head included, in the types
        # llama-quantize gives it: quantized_twin): plain decoding (tg128, pp512), verify windows of 2-5
        # tokens (pp2-pp5), and greedy llama-cli generation without and with
        # --spec-type draft-mtp (t/s, acceptance, mean accepted length).
        # Needs llama-cli (bash hip/device-build.sh llama-cli); MTP_WEIGHTS
        # (default "escha q4km"; escha-coded: the head's projections coded;
        # escha-q4rest: every matrix escha does not code, the head's
        # included, in the Q4_K_M twin's types) picks the models; MTP_BENCH=0
        # skips llama-bench (llama-cli alone, for more rounds in a call).
        [ -x $B/llama-cli ] || die "mtp: no llama-cli (bash hip/device-build.sh llama-cli)"
        mtp_gen
        if [[ " $MTP_WEIGHTS " == *" q4km "* || " $MTP_WEIGHTS " == *" escha-q4rest "* ]]; then
            quantized_twin dense27b "$DENSE_LAYERS" Q4_K_M "$(mtp_model q4km)" --mtp --agree
        fi
        # Like with like: the head's matrices too, which escha does not code.
        if [[ " $MTP_WEIGHTS " == *" escha-q4rest "* ]]; then
            escha_like "$(mtp_model q4km)" "$(mtp_model escha-q4rest)" --model dense27b --layers "$DENSE_LAYERS" --mtp --agree
        fi
        echo "mtp: models written at ${SECONDS} s"
        for m in $MTP_WEIGHTS; do
            if [ "${MTP_BENCH:-1}" = 1 ]; then
                $B/llama-bench -m "$(mtp_model $m)" -ngl 99 -p 2,3,4,5,512 -n 128 -r 3 -o md > "$out/mtp-bench-$m.md" 2>&1 \
                    || die "mtp: llama-bench $m failed ($out/mtp-bench-$m.md)"
                grep -E "pp[0-9]|tg128" "$out/mtp-bench-$m.md"
            fi
            for spec in plain draft-mtp; do
                log=$out/mtp-cli-$m-$spec
                $B/llama-cli -m "$(mtp_model $m)" -ngl 99 -p "t5 t6 t7" -n 256 -st --temp 0 --reasoning off \
                    $([ $spec = draft-mtp ] && echo --spec-type draft-mtp) -lv 3 </dev/null > "$log.txt" 2> "$log.err" \
                    || die "mtp: llama-cli $m $spec failed ($log.err)"
                gen=$(grep -o "Generation: [0-9.]* t/s" "$log.txt" | tail -n 1)
                [ -n "$gen" ] || die "mtp: llama-cli $m $spec printed no generation speed ($log.txt)"
                acc=$(grep -o "draft acceptance = .*" "$log.err" | tail -n 1 || true)
                [ $spec = plain ] || [ -n "$acc" ] || die "mtp: llama-cli $m drafted nothing ($log.err)"
                echo "$m $spec: $gen${acc:+; $acc}"
            done
        done ;;
    gen|models)
        has dense && synth $M/dense-escha.gguf "$out/gen-dense-escha.log" --model dense27b --layers "$DENSE_LAYERS" --weights escha
        has moe && synth $M/moe-escha.gguf "$out/gen-moe-escha.log" --model moe35b --layers "$MOE_LAYERS" --weights escha
        ls -la $M/
        if [ "$step" = models ]; then bash "$0" q4km; fi ;;
    q4km|iq2)
        # The twins in llama.cpp's types (quantized_twin: no full-size f16 file).
        [ $step = q4km ] && ftype=Q4_K_M tag=q4km || ftype=IQ2_XXS tag=iq2xxs
        has dense && quantized_twin dense27b "$DENSE_LAYERS" $ftype $M/dense-$tag.gguf
        has moe && quantized_twin moe35b "$MOE_LAYERS" $ftype $M/moe-$tag.gguf
        # Like with like: escha's coded matrices, every other one (output,
        # embedding, the small DeltaNet and router matrices) in Q4_K_M's
        # types; the escha models keep them Q8_0, as the exports do.
        if [ $step = q4km ]; then
            has dense && escha_like $M/dense-q4km.gguf $M/dense-escha-q4rest.gguf --model dense27b --layers "$DENSE_LAYERS"
            has moe && escha_like $M/moe-q4km.gguf $M/moe-escha-q4rest.gguf --model moe35b --layers "$MOE_LAYERS"
        fi
        ls -la $M/ ;;
    bench)
        for m in $MODELS; do
            for f in $(model_files $m); do
                $B/llama-bench -m "$f" -ngl 99 -p 512 -n 128 -r 3 -o md 2>&1 | tee -a "$out/bench.md" | grep -E "pp512|tg128|error"
            done
        done ;;
    kernels)
        # Token generation only (-p 0); the warm-up generates one token,
        # so a run covers n + 1 tokens plus the model's load (no kernels).
        # ncu serialises every launch: fewer tokens, no graphs.
        if command -v nsys > /dev/null; then prof=nsys n=${KERNELS_TOKENS:-32}; else prof=ncu n=${KERNELS_TOKENS:-4}; fi
        for m in $MODELS; do
            for f in $(model_files $m); do
                b=$(basename "$f" .gguf)
                if [ $prof = nsys ]; then
                    nsys profile -t cuda --cuda-graph-trace=node -o "$out/prof-$b" --force-overwrite true \
                        $B/llama-bench -m "$f" -ngl 99 -p 0 -n "$n" -r 1 > "$out/kernels-$b.log" 2>&1 \
                        || die "kernels: nsys on $f failed ($out/kernels-$b.log)"
                    nsys stats -q -r cuda_gpu_kern_sum -f csv "$out/prof-$b.nsys-rep" > "$out/kern-$b.csv" 2>> "$out/kernels-$b.log"
                    rm -f "$out/prof-$b.nsys-rep" "$out/prof-$b.sqlite"
                else
                    GGML_CUDA_DISABLE_GRAPHS=1 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
                        $B/llama-bench -m "$f" -ngl 99 -p 0 -n "$n" -r 1 > "$out/kern-$b.csv" 2> "$out/kernels-$b.log" \
                        || die "kernels: ncu on $f failed ($out/kernels-$b.log)"
                fi
                echo "== $b, $((n + 1)) tokens"
                python3 hip/bench/kernel-times.py "$out/kern-$b.csv" $((n + 1)) | tee "$out/kernels-$b.txt" | head -n 14
            done
        done ;;
    graphs)
        # CUDA graphs (llama.cpp captures every graph whose properties stay
        # the same from one call to the next): with capture and without.
        bench_on_off graphs GGML_CUDA_DISABLE_GRAPHS=1 ;;
    fused-dense)
        # Dense ops of 1-4 rows in the one-launch kernel (MoE decode
        # slots' kernel): as shipped ("on", three launches) and with
        # GGML_ESCHA_FUSED_DENSE=1 ("off" in the logs' names).
        bench_on_off fused-dense GGML_ESCHA_FUSED_DENSE=1 ;;
    ahead)
        # Input transforms run ahead (escha.cu's escha_plan_ahead): as
        # shipped, without them (GGML_ESCHA_AHEAD=0), without any escha
        # graph fusion (GGML_ESCHA_GRAPH_FUSION=0), and Q4_K_M.
        transform_rounds ahead shipped GGML_ESCHA_AHEAD=0 GGML_ESCHA_GRAPH_FUSION=0 q4km ;;
    norm-fusion)
        # A norm's launch running the input transforms of the ops after it
        # (escha.cu's escha_try_fuse_norm): as shipped, without it
        # (GGML_ESCHA_NORM_FUSION=0), and Q4_K_M.
        transform_rounds norm-fusion shipped GGML_ESCHA_NORM_FUSION=0 q4km ;;
    escha-fusion)
        # escha's own graph fusion (ggml_cuda_escha_try_fuse: a gate and up
        # op pair with their SWIGLU, an op with its residual ADD, each as one
        # input transform, multiply and output transform): on, and off with
        # GGML_ESCHA_GRAPH_FUSION=0; the quantized models are the control.
        bench_on_off escha-fusion GGML_ESCHA_GRAPH_FUSION=0 ;;
    fusion)
        # Upstream's CUDA fusions (a gate and an up matrix with their GLU
        # in one quantized GEMV, a GEMV with the add after it), which
        # quantized weights take and escha's ops do not: with them and with
        # GGML_CUDA_DISABLE_FUSION=1.
        bench_on_off fusion GGML_CUDA_DISABLE_FUSION=1 ;;
    pdl)
        # Programmatic dependent launch (escha's kernels and upstream's):
        # with it and with GGML_CUDA_PDL=0.
        bench_on_off pdl GGML_CUDA_PDL=0 ;;
    early)
        # Dense ops' loads of what no kernel writes (code, per-channel
        # vectors) before the wait for the kernel before them: with them and
        # with GGML_ESCHA_EARLY=0.
        bench_on_off early GGML_ESCHA_EARLY=0 ;;
    cpu)
        grep -m1 'model name' /proc/cpuinfo
        grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx)' | tr '\n' ' '
        echo
        OPS_BIN=$B OPS_ROWS=${OPS_ROWS:-1} OPS_ISAS=${OPS_ISAS:-amx avx512fp16 avx512vbmi avx2} OPS_ROUNDS=${OPS_ROUNDS:-2} \
            bash examples/ops-threads.sh 2>&1 | sed 's/,per=.*pad=0)/)/' | tee "$out/cpu.log" ;;
    gemma)
        # The CPU-speed issue's model goal on its machine type: the models
        # as examples/gemma-speed.sh makes them here, rebuilt from their
        # headers; CUDA hidden, so every op runs on the CPU.
        [ -d .device/gemma ] || die "gemma: no .device/gemma (device-pack.sh packs it once examples/gemma-speed.sh has made the models)"
        grep -m1 'model name' /proc/cpuinfo
        grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx)' | tr '\n' ' '
        echo
        # Rebuilt every time (about a second each): a model left from an
        # earlier pack would be measured in place of this one's.
        for k in escha iq2_xxs q4_k_m; do
            f=$M/gemma-$k.gguf
            xz -dc .device/gemma/$k.skel.xz > "$M/gemma-$k.skel" || die "gemma: unpacking .device/gemma/$k.skel.xz failed"
            python3 hip/gguf-skeleton.py fill "$M/gemma-$k.skel" "$f" > "$out/gemma-fill-$k.log" 2>&1 \
                || die "$f: rebuilding the model failed ($out/gemma-fill-$k.log)"
        done
        # Two CPUs on different cores (the VM's vCPUs may be SMT siblings),
        # the last of the list: this VM's speed drifts, so the models also
        # alternate their order round by round (a drift then falls on both).
        pin=$(lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#' | sort -t, -k2,2n -u | tail -n 2 | cut -d, -f1 | paste -sd,)
        echo "llama-bench pinned to CPUs ${pin:-(none: no lscpu)}"
        gbench() {
            CUDA_VISIBLE_DEVICES= ${pin:+taskset -c "$pin"} "$B/llama-bench" -ngl 0 -t 2 -r 3 -o md "$@" 2>> "$out/gemma.err" \
                | grep -E 'pp512|tg128'
        }
        # ground R LLAMA-BENCH-OPTIONS: round R of the three models, in
        # order for odd R and reversed for even R.
        ground() {
            local r=$1 k models="escha iq2_xxs q4_k_m"
            shift
            [ $((r % 2)) = 1 ] || models="q4_k_m iq2_xxs escha"
            for k in $models; do
                gbench -m "$M/gemma-$k.gguf" "$@" || die "gemma: llama-bench of gemma-$k failed ($out/gemma.err)"
            done
        }
        {
            for r in $(seq "${GEMMA_ROUNDS:-6}"); do
                echo "== round $r, tg128"
                ground "$r" -p 0 -n 128
                echo "escha on avx512vbmi:"
                ESCHA_CPU_ISA=avx512vbmi gbench -m "$M/gemma-escha.gguf" -p 0 -n 128 \
                    || die "gemma: llama-bench of gemma-escha on avx512vbmi failed ($out/gemma.err)"
            done
            for r in 1 2; do
                echo "== round $r, pp512"
                ground "$r" -p 512 -n 0
                # The batched product without AMX tiles (where the default is amx).
                echo "escha on avx512fp16:"
                ESCHA_CPU_ISA=avx512fp16 gbench -m "$M/gemma-escha.gguf" -p 512 -n 0 \
                    || die "gemma: llama-bench of gemma-escha on avx512fp16 failed ($out/gemma.err)"
            done
        } | tee "$out/gemma.log"
        [ "${PIPESTATUS[0]}" = 0 ] || die "gemma: a run failed (above; $out/gemma.err)" ;;
    batched)
        # Parallel sequences (llama-server's case): prompt 128, 64 generated each.
        [ -x $B/llama-batched-bench ] || die "batched: no llama-batched-bench (bash hip/device-build.sh llama-batched-bench)"
        for m in $MODELS; do
            for f in $(model_files $m); do
                echo "== $f"
                $B/llama-batched-bench -m "$f" -ngl 99 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl "$BATCHED_NPL" \
                    > "$out/batched-$(basename "$f" .gguf).log" 2>&1 || die "batched: $f failed"
                grep -E "^\|" "$out/batched-$(basename "$f" .gguf).log" | tail -n "$(tr , "\n" <<<"$BATCHED_NPL" | wc -l)"
            done
        done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
