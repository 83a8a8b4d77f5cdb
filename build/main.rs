//! Build script.
//!
//! Always: compiles the C reference (`ggml-escha/ref/escha_ref.c`).
//!
//! With the `ggml` feature (default): obtains the pinned llama.cpp tree,
//! applies `patches/*.patch` and copies this crate's C/C++ sources into it
//! ([`tree`]), builds the Rust CPU kernels as a static library for ggml-cpu
//! ([`kernels`]), builds ggml (shared libraries) and `test-backend-ops` with
//! CMake and links the crate against that ggml ([`cmake`]), and generates
//! the raw bindings ([`bindings`]). The `tools` feature also builds
//! llama-cli, llama-server, llama-bench, llama-perplexity, llama-quantize and
//! llama-imatrix; the `shims` feature (the test command's) builds the GPU
//! kernels for the CPU ([`shims`]).
//!
//! The tree comes from `ESCHA_LLAMA_CPP_DIR` (a checkout at the pinned
//! commit) or from the `llama-cpp-python==0.3.36` source distribution on
//! PyPI, fetched once with pip into a cache outside `target/`
//! (`ESCHA_CACHE_DIR`, default `~/.cache/escha-ggml`) and checked against
//! its SHA-256.

#[cfg(feature = "ggml")]
mod bindings;
#[cfg(feature = "ggml")]
mod cmake;
#[cfg(feature = "ggml")]
mod kernels;
#[cfg(feature = "ggml")]
mod shims;
#[cfg(feature = "ggml")]
mod tree;
#[cfg(feature = "ggml")]
mod util;

fn main() {
    build_c_reference();
    println!("cargo:rustc-check-cfg=cfg(escha_metal_shim)");
    println!("cargo:rustc-check-cfg=cfg(escha_cuda_shim)");
    #[cfg(feature = "ggml")]
    {
        for v in ["ESCHA_LLAMA_CPP_DIR", "ESCHA_CACHE_DIR", "ESCHA_GGML_CPU_ISA"] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        let tree = tree::prepare();
        if cfg!(feature = "shims") {
            shims::build(&tree);
        }
        let staticlib = kernels::build();
        let build_dir = cmake::build(&tree, &staticlib);
        cmake::link(&build_dir);
        bindings::generate(&tree);
        #[cfg(feature = "llama")]
        bindings::generate_llama(&tree);
    }
}

fn build_c_reference() {
    let src = "ggml-escha/ref/escha_ref.c";
    for f in [src, "ggml-escha/ref/escha_ref.h", "ggml-escha/include/escha-format.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .file(src)
        .std("c99")
        // The reference sums a*b then adds: never let the compiler fuse it.
        .flag_if_supported("-ffp-contract=off")
        .warnings(true)
        .extra_warnings(true)
        .compile("escha_ref");
}
