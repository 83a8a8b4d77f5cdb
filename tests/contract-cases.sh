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
fail() { echo "FAIL: $*" >&2; exit 1; }
tsv="$dir/cases.tsv"
[ -s "$tsv" ] || fail "contract_cases listed no case"
lines=$(grep -c "" "$tsv")
n=0 n_both=0 n_loader=0
declare -A seen=()
# Each line: ID <tab> NAMES <tab> both|loader; anything else is an error,
# never a case skipped or a check against an empty name.
while IFS= read -r row || [ -n "$row" ]; do
    IFS=$'\t' read -r -a f <<<"$row"
    [ ${#f[@]} -eq 3 ] || fail "cases.tsv: not 3 tab-separated fields: '$row'"
    id=${f[0]} names=${f[1]} who=${f[2]}
    [[ "$id" =~ ^[a-z0-9-]+$ ]] || fail "cases.tsv: bad id '$id'"
    [ -z "${seen[$id]:-}" ] || fail "cases.tsv: id $id listed twice"
    seen[$id]=1
    [ -n "$names" ] || fail "$id: nothing for the refusal to name"
    case "$who" in both) n_both=$((n_both + 1)) ;; loader) n_loader=$((n_loader + 1)) ;; *) fail "$id: reader '$who' is neither both nor loader" ;; esac
    [ -s "$dir/$id.gguf" ] || fail "$id: no $dir/$id.gguf"
    # llama.cpp: an ordinary error exit (not a signal) whose load error names NAMES.
    rc=0; out=$("$bin/llama-cli" -m "$dir/$id.gguf" -p hi -n 1 -st --temp 0 -t 2 </dev/null 2>&1) || rc=$?
    msg=$(grep -o "error loading model: .*" <<<"$out" | head -1 || true)
    [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF -- "$names" <<<"$msg" \
        || { tail -n 3 <<<"$out"; fail "$id: llama.cpp exited $rc without naming $names in its load error"; }
    line="$id: llama.cpp: ${msg#error loading model: }"
    if [ "$who" = both ]; then
        # escha decode: exit 1, its "error: " line names NAMES, no output left.
        rc=0; out=$("$escha" decode "$dir/$id.gguf" "$dir/out.gguf" 2>&1) || rc=$?
        emsg=$(grep "^error: " <<<"$out" || true)
        [ $rc -eq 1 ] && grep -qF -- "$names" <<<"$emsg" && [ ! -e "$dir/out.gguf" ] && [ ! -e "$dir/out.gguf.partial" ] \
            || { echo "$out"; fail "$id: escha decode exited $rc without naming $names in its error (or left an output)"; }
        line="$line | escha: ${emsg#error: }"
    fi
    echo "${line:0:240}"
    rm -f "$dir/$id.gguf"
    n=$((n + 1))
done <"$tsv"
[ "$n" -eq "$lines" ] && [ "$n" -eq $((n_both + n_loader)) ] || fail "walked $n cases of the $lines listed"
[ "$n_both" -gt 0 ] && [ "$n_loader" -gt 0 ] || fail "cases for both readers: $n_both, for the loader only: $n_loader (want some of each)"
echo "contract cases: $n refused by llama.cpp, naming the key or tensor; $n_both of them by escha decode too"
