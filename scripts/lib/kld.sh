# Sourced by examples/gemma-demo.sh and tests/qwen35-e2e.sh: two llama.cpp
# models compared through llama-perplexity's KL divergence on the same text.
# Needs $bin (the llama.cpp tools) and $threads.

ppl() { "$bin/llama-perplexity" -t "$threads" -c 128 --chunks 6 "$@" 2>&1; }

# MODEL BASE [ARGS]: "mean-KLD same-top-% PPL" of MODEL against the logits
# saved in BASE (by `ppl -m REFERENCE -f TEXT --kl-divergence-base BASE`).
kld() {
    local m=$1 base=$2
    shift 2
    ppl -m "$m" --kl-divergence-base "$base" --kl-divergence "$@" \
        | awk '/^Mean PPL\(Q\) /{p=$4} /Mean +KLD:/{k=$3} /^Same top p:/{t=$4} END{print k, t, p}'
}

# A B: true when the number A is below B.
below() { python3 -c "import sys; sys.exit(0 if float('$1') < float('$2') else 1)"; }
