//! Builds the C reference (`ggml-escha/escha_ref.c`) into the crate so the
//! Rust code can be checked against it. The patched llama.cpp build joins
//! here later.

fn main() {
    let src = "ggml-escha/escha_ref.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=ggml-escha/escha_ref.h");
    cc::Build::new()
        .file(src)
        .std("c99")
        // The reference sums a*b then adds: never let the compiler fuse it.
        .flag_if_supported("-ffp-contract=off")
        .warnings(true)
        .extra_warnings(true)
        .compile("escha_ref");
}
