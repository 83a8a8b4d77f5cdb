//! ggml, test-backend-ops and (feature `tools`) llama.cpp's tools, built
//! from the working tree with CMake; the crate links that ggml.

use crate::util::{link_in_profile_dir, out_dir};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TOOLS: [&str; 6] = ["llama-cli", "llama-server", "llama-bench", "llama-perplexity", "llama-quantize", "llama-imatrix"];

fn on_off(b: bool) -> &'static str {
    if b {
        "ON"
    } else {
        "OFF"
    }
}

pub fn build(tree: &Path, staticlib: &Path) -> PathBuf {
    let tools = cfg!(feature = "tools");
    let mut cfg = cmake::Config::new(tree);
    if Command::new("ninja").arg("--version").output().is_ok() {
        cfg.generator("Ninja");
    }
    // Share ccache hits between builds in different OUT_DIRs.
    cfg.env("CCACHE_BASEDIR", out_dir()).env("CCACHE_NOHASHDIR", "1");
    // llama.cpp's build info asks git for the commit; OUT_DIR may lie in
    // this crate's repository, whose commit is not llama.cpp's.
    cfg.env("GIT_CEILING_DIRECTORIES", out_dir());
    cfg.profile("Release")
        .define("BUILD_SHARED_LIBS", "ON")
        .define("GGML_BACKEND_DL", "OFF")
        .define("GGML_NATIVE", "OFF")
        .define("LLAMA_BUILD_TESTS", "ON")
        .define("LLAMA_BUILD_EXAMPLES", "OFF")
        .define("LLAMA_BUILD_SERVER", on_off(tools))
        .define("LLAMA_BUILD_TOOLS", on_off(tools))
        .define("LLAMA_BUILD_APP", "OFF")
        .define("LLAMA_USE_PREBUILT_UI", "OFF")
        .define("LLAMA_BUILD_UI", "OFF")
        .define("LLAMA_OPENSSL", "OFF")
        .define("LLAMA_CURL", "OFF")
        .define("GGML_OPENMP", "OFF")
        .define("ESCHA_RUST_LIB", staticlib)
        .define("GGML_CUDA", on_off(cfg!(feature = "cuda")))
        .define("GGML_HIP", on_off(cfg!(feature = "hip")))
        .define("GGML_METAL", on_off(cfg!(feature = "metal")));
    // Explicit ISA options instead of -march=native (portable binaries,
    // and no AMX code paths where AMX is reported but unusable): every
    // extension ggml's CPU backend has a path for that the build host (or
    // the target's features) has, so llama.cpp's own quants run at their
    // best next to the escha kernels. GGML_AVX512 compiles with AVX-512
    // F, CD, VL, DQ and BW, so it needs all five.
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        let f = |name: &str| env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default().split(',').any(|x| x == name);
        // (cpuinfo flag, rustc target feature)
        let host = |feats: &[(&str, &str)]| feats.iter().all(|&(flag, feat)| host_has(flag) || f(feat));
        let avx512 = [("avx512f", "avx512f"), ("avx512cd", "avx512cd"), ("avx512vl", "avx512vl"), ("avx512dq", "avx512dq"), ("avx512bw", "avx512bw")];
        let options: [(&str, &[(&str, &str)]); 10] = [
            ("GGML_AVX", &[("avx", "avx")]),
            ("GGML_AVX2", &[("avx2", "avx2")]),
            ("GGML_FMA", &[("fma", "fma")]),
            ("GGML_F16C", &[("f16c", "f16c")]),
            ("GGML_BMI2", &[("bmi2", "bmi2")]),
            ("GGML_AVX_VNNI", &[("avx_vnni", "avxvnni")]),
            ("GGML_AVX512", &avx512),
            ("GGML_AVX512_VBMI", &[("avx512vbmi", "avx512vbmi")]),
            ("GGML_AVX512_VNNI", &[("avx512_vnni", "avx512vnni")]),
            ("GGML_AVX512_BF16", &[("avx512_bf16", "avx512bf16")]),
        ];
        let cap = isa_cap().map_or(options.len(), |last| options.iter().position(|(o, _)| *o == last).expect("a listed option") + 1);
        let mut on = Vec::new();
        for (i, (opt, feats)) in options.into_iter().enumerate() {
            // The AVX-512 extensions only count on top of GGML_AVX512.
            let yes = i < cap && host(feats) && (!opt.starts_with("GGML_AVX512_") || host(&avx512));
            cfg.define(opt, on_off(yes));
            if yes {
                on.push(opt);
            }
        }
        println!("cargo:warning=escha-ggml: llama.cpp's CPU backend built with {}", on.join(" "));
        for opt in ["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"] {
            cfg.define(opt, "OFF");
        }
    }
    let mut targets = vec!["ggml", "test-backend-ops"];
    if cfg!(feature = "llama") {
        targets.push("llama");
    }
    if tools {
        targets.extend(TOOLS);
    }
    let mut dst = PathBuf::new();
    for t in targets {
        dst = cfg.build_target(t).build();
    }
    let build = dst.join("build");
    if tools {
        announce_tools(&build);
    }
    build
}

/// The last of the ISA options (in their order in `build`) the build may
/// turn on: all (`None`), or with `ESCHA_GGML_CPU_ISA=avx2` those up to
/// BMI2, so llama.cpp's own quants run as on a machine with AVX2 and no
/// AVX-512 or AVX-VNNI (the baseline next to escha's `ESCHA_CPU_ISA=avx2`
/// path). Any other value stops the build with the accepted ones named.
fn isa_cap() -> Option<&'static str> {
    match env::var("ESCHA_GGML_CPU_ISA").as_deref() {
        Err(_) | Ok("") | Ok("native") => None,
        Ok("avx2") => Some("GGML_BMI2"),
        Ok(other) => panic!("ESCHA_GGML_CPU_ISA={other}: expected avx2 or native (the default: every extension the host has)"),
    }
}

/// The build host's CPU features (the build targets the machine it runs
/// on unless cross-compiling).
fn host_has(feature: &str) -> bool {
    env::var("HOST").ok() == env::var("TARGET").ok()
        && std::fs::read_to_string("/proc/cpuinfo").map(|s| s.split_whitespace().any(|w| w == feature)).unwrap_or(false)
}

/// Links the tools' directory next to the crate's outputs and says where.
fn announce_tools(build: &Path) {
    let link = link_in_profile_dir("llama.cpp-bin", &build.join("bin"));
    println!("cargo:warning=escha-ggml: llama.cpp tools ({}) and test-backend-ops are in {}", TOOLS.join(", "), link.display());
}

pub fn link(build: &Path) {
    let bin = build.join("bin");
    println!("cargo:rustc-link-search=native={}", bin.display());
    for lib in ["ggml", "ggml-base", "ggml-cpu"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    if cfg!(feature = "llama") {
        println!("cargo:rustc-link-lib=dylib=llama");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", bin.display());
    println!("cargo:rustc-env=ESCHA_GGML_BIN_DIR={}", bin.display());
}
