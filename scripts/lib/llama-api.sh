# Sourced by tests/qwen35-e2e.sh and examples/gemma-demo.sh: the Rust model
# API's tests (tests/llama_api.rs) on a coded model of the script.

# MODEL TWIN STEM DIR [moe]: runs tests/llama_api.rs with MODEL, its decoded
# TWIN, and MODEL without STEM.escha_rin (written to DIR, removed after) for
# the refusal test; with `moe` also the expert-bias test (MODEL must have
# coded experts), which the others skip. Prints the tests' result lines;
# fails when a test fails or none ran.
llama_api_tests() {
    local model=$1 twin=$2 stem=$3 dir=$4 moe=${5:-} env_moe=() skip=(--skip expert_biases) rc
    [ "$moe" = moe ] && { env_moe=(ESCHA_LLAMA_TEST_MOE="$model"); skip=(); }
    cargo build --release --features tools --example gguf_edit 2>&1 | tail -n 1
    target/release/examples/gguf_edit "$model" "$dir/bad-rin.gguf" --drop "$stem.escha_rin" >/dev/null || return 1
    env ESCHA_LLAMA_TEST_MODEL="$model" ESCHA_LLAMA_TEST_TWIN="$twin" ESCHA_LLAMA_BAD_MODEL="$dir/bad-rin.gguf" \
        ESCHA_LLAMA_BAD_TENSOR="$stem" "${env_moe[@]}" \
        cargo test --release --features tools --test llama_api -- --ignored --nocapture "${skip[@]}" >"$dir/llama_api.log" 2>&1
    rc=$?
    rm -f "$dir/bad-rin.gguf"
    grep -E "^test |test result|positions|refused|panicked|ESCHA_MOE nodes|observer:" "$dir/llama_api.log"
    [ $rc = 0 ] && grep -q "^test result: ok\. [1-9]" "$dir/llama_api.log"
}
