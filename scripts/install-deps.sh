#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks for scripts/test-all.sh,
# with apt-get, so it expects root. Elsewhere install the same by hand (the
# README's Quick start lists them). Installs nothing that is present.
set -euo pipefail

log() { printf '\n== %s\n' "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
# The patched llama.cpp build: CMake, Ninja, ccache; bindgen needs libclang.
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v ccache >/dev/null 2>&1 || need_apt+=(ccache)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need_apt+=(libclang-dev)
# NEON path: cross-compiled and run under user-mode emulation.
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need_apt+=(qemu-user)
# Compile-only check of the CUDA/HIP kernels for AMD targets (no AMD GPU here).
command -v hipcc >/dev/null 2>&1 || need_apt+=(hipcc rocm-device-libs) # optional: the HIP compile check
# The end-to-end model check talks to llama-server over HTTP.
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# pip fetches the pinned llama.cpp source once; the model checks make venvs.
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    log "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "no Rust toolchain: install one (1.89 or newer) with rustup, https://rustup.rs" >&2
    exit 1
fi
