//! The Rust CPU kernels for ggml-cpu: this crate without the `ggml` feature,
//! built as a static library by a nested cargo.

use crate::util::{fail, manifest_dir, out_dir, run};
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Builds `ggml-escha/staticlib` (this crate's kernels without the
/// `ggml` feature) with a nested cargo in its own target directory.
pub fn build() -> PathBuf {
    let manifest = manifest_dir().join("ggml-escha/staticlib/Cargo.toml");
    for d in ["src", "ggml-escha/staticlib/lib.rs", "ggml-escha/staticlib/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", manifest_dir().join(d).display());
    }
    let target = env::var("TARGET").unwrap();
    let target_dir = out_dir().join("kernels-target");
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // A clean environment: the outer build's variables (OUT_DIR, TARGET,
    // CARGO_FEATURE_*, ...) would mislead the inner build scripts.
    cmd.env_clear();
    for (k, v) in env::vars() {
        let keep = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "CC", "CXX", "AR", "TMPDIR", "LANG"]
            .contains(&k.as_str())
            || k.ends_with("_proxy")
            || k.ends_with("_PROXY")
            || k.starts_with("CARGO_REGISTRIES_")
            || k.starts_with("CARGO_NET_")
            || k.starts_with("CARGO_HTTP_");
        if keep {
            cmd.env(k, v);
        }
    }
    cmd.args(["build", "--release", "--manifest-path"]).arg(&manifest).arg("--target").arg(&target).arg("--target-dir").arg(&target_dir);
    run(&mut cmd, "building the Rust CPU kernels for ggml-cpu (ggml-escha/staticlib)");
    let lib = target_dir.join(&target).join("release/libescha_ggml_cpu.a");
    if !lib.exists() {
        fail(&format!("{} was not produced", lib.display()));
    }
    lib
}
