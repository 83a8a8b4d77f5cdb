# Sourced by examples/gemma-demo.sh and tests/qwen35-e2e.sh: two llama.cpp
# models compared through llama-perplexity's KL divergence on the same text.
# Needs $bin (the llama.cpp tools) and $threads.

ppl() { "$bin/llama-perplexity" -t "$threads" -c 128 --chunks 6 "$@" 2>&1; }

# MODEL BASE [ARGS]: "mean-KLD same-top-% PPL" of MODEL against the logits
# saved in BASE (by `ppl -m REFERENCE -f TEXT --kl-divergence-base BASE`).
# Each field is parsed by its name; one that llama-perplexity did not print
# comes out as "missing" (never as the next field's value), which below
# refuses.
kld() {
    local m=$1 base=$2
    shift 2
    ppl -m "$m" --kl-divergence-base "$base" --kl-divergence "$@" | kld_fields
}

# llama-perplexity's KLD report on stdin -> "mean-KLD same-top-% PPL".
kld_fields() {
    awk '/^Mean PPL\(Q\) /{p=$4} /Mean +KLD:/{k=$3} /^Same top p:/{t=$4}
         END{print (k == "" ? "missing" : k), (t == "" ? "missing" : t), (p == "" ? "missing" : p)}'
}

# A B: true when the number A is below B; a value that is not a number
# fails, naming it.
below() {
    python3 - "$1" "$2" <<'PY'
import math, sys
try:
    a, b = float(sys.argv[1]), float(sys.argv[2])
except ValueError:
    sys.exit(f"below: not a number: {sys.argv[1]!r} or {sys.argv[2]!r}")
sys.exit(0 if math.isfinite(a) and math.isfinite(b) and a < b else 1)
PY
}
