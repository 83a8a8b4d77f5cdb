#!/usr/bin/env bash
# Walks the list of files that break one rule of the Escha GGUF contract
# each (escha_ggml::contract::cases, written by examples/contract_cases.rs
# from a valid Escha GGUF of a real architecture) through both readers:
# `escha decode` and llama.cpp's loader (llama-cli) must each refuse every
# case, naming the same key or tensor; the cases only an architecture can
# reveal (a layer the model does not have) are the loader's alone.
#     tests/contract-cases.sh MODEL-ESCHA.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: tests/contract-cases.sh MODEL-ESCHA.gguf}
bin=target/release/llama.cpp-bin
escha=target/release/escha
cargo build --release --features tools --bins --example contract_cases >/dev/null 2>&1 \
    || cargo build --release --features tools --bins --example contract_cases
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/release/examples/contract_cases "$model" "$dir"
n=0
while IFS=$'\t' read -r id names who; do
    rc=0; out=$("$bin/llama-cli" -m "$dir/$id.gguf" -p hi -n 1 -st --temp 0 -t 2 </dev/null 2>&1) || rc=$?
    msg=$(grep -o "error loading model: .*" <<<"$out" | head -1 || true)
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF -- "$names" <<<"$msg" \
        || { tail -n 3 <<<"$out"; echo "FAIL: $id: llama.cpp exited $rc without naming $names" >&2; exit 1; }
    line="$id: llama.cpp: ${msg#error loading model: }"
    if [ "$who" = both ]; then
        rc=0; out=$("$escha" decode "$dir/$id.gguf" "$dir/out.gguf" 2>&1) || rc=$?
        [ $rc -eq 1 ] && grep -qF -- "$names" <<<"$out" && [ ! -e "$dir/out.gguf" ] && [ ! -e "$dir/out.gguf.partial" ] \
            || { echo "$out"; echo "FAIL: $id: escha decode exited $rc without naming $names (or left an output)" >&2; exit 1; }
        line="$line | escha: ${out#error: }"
    fi
    echo "${line:0:240}"
    rm -f "$dir/$id.gguf"
    n=$((n + 1))
done < "$dir/cases.tsv"
echo "contract cases: $n refused by llama.cpp, naming the key or tensor; $(grep -c $'\tboth$' "$dir/cases.tsv") of them by escha decode too"
