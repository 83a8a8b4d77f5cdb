# Sourced by examples/gemma-demo.sh, tests/qwen35-e2e.sh and hip/device-bench.sh: two llama.cpp
# models compared through llama-perplexity's KL divergence on the same text.
# Needs $bin (the llama.cpp tools) and $threads.

ppl() { "$bin/llama-perplexity" -t "$threads" -c 128 --chunks 6 "$@" 2>&1; }

# MODEL BASE [ARGS]: "mean-KLD same-top-% PPL" of MODEL against the logits
# saved in BASE (by `ppl -m REFERENCE -f TEXT --kl-divergence-base BASE`).
# Each field is parsed by its name; one that llama-perplexity did not print
# comes out as "missing", one it printed more than once as "repeated"
# (never as another field's value), which below refuses.
kld() {
    local m=$1 base=$2
    shift 2
    ppl -m "$m" --kl-divergence-base "$base" --kl-divergence "$@" | kld_fields
}

# llama-perplexity's KLD report on stdin -> "mean-KLD same-top-% PPL".
# The lines, as llama-perplexity prints them:
#   Mean PPL(Q)                   :  12.345678 ±   0.123456
#   Mean    KLD:   0.000123 ±   0.000012
#   Same top p: 99.876 ± 0.123 %
# Each value is the field right after the label; a field whose label is
# missing or printed twice, or whose value is empty, does not come out as a
# value.
kld_fields() {
    awk '
        function put(name, v) { n[name]++; val[name] = v }
        function out(name) { return n[name] == 0 || val[name] == "" ? "missing" : n[name] > 1 ? "repeated" : val[name] }
        /^Mean PPL\(Q\) +: /  { put("ppl", $4) }
        /^Mean +KLD: /        { put("kld", $3) }
        /^Same top p: /       { put("top", $4) }
        END { print out("kld"), out("top"), out("ppl") }'
}

# llama-perplexity's output on stdin -> the PPL of its "Final estimate:
# PPL = X +/- Y" line (which its log may prefix with a time stamp),
# "missing" or "repeated" as in kld_fields.
ppl_final() {
    awk 'match($0, /Final estimate: PPL = [^ ]*/) { n++; v = substr($0, RSTART + 22, RLENGTH - 22) }
         END { print (n == 0 || v == "" ? "missing" : (n > 1 ? "repeated" : v)) }'
}

# Refuses (exit 2, naming it) anything but a plain finite decimal number:
# no nan, inf, hex, digit separators or surrounding text.
_number() {
    python3 - "$@" <<'PY'
import math, re, sys
for a in sys.argv[1:]:
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", a) or not math.isfinite(float(a)):
        sys.exit(f"not a finite number: {a!r}")
PY
}

# A B: true when the number A is below B; a value that is not a finite
# number fails, naming it.
below() {
    [ $# -eq 2 ] || { echo "below: want 2 numbers, got $#" >&2; return 2; }
    _number "$1" "$2" || return 2
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$1" "$2"
}

# A B REL: true when the positive numbers A and B are within a factor
# 1 + REL of each other; a value that is not a finite number fails.
near() {
    [ $# -eq 3 ] || { echo "near: want 3 numbers, got $#" >&2; return 2; }
    _number "$1" "$2" "$3" || return 2
    python3 -c '
import sys
a, b, r = map(float, sys.argv[1:])
sys.exit(0 if a > 0 and b > 0 and max(a, b) / min(a, b) < 1 + r else 1)' "$1" "$2" "$3"
}
