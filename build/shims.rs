//! The test shims (feature `shims`, which the test command turns on): the
//! CUDA/HIP and Metal kernels compiled as C++ and run on the CPU by fiber
//! executors (`tests/cuda_shim.rs`, `tests/hip_shim.rs`,
//! `tests/metal_shim.rs`), and a syntax
//! check of the Metal host sources, which no Linux build compiles otherwise.

use crate::util::{manifest_dir, run};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn build(tree: &Path) {
    let ggml_metal = tree.join("ggml/src/ggml-metal");
    if !cfg!(feature = "metal") {
        check_metal_host_sources(&ggml_metal);
    }
    // The executors run GPU threads as fibers (glibc's ucontext and
    // _setjmp/_longjmp).
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        println!("cargo:warning=escha-ggml: the GPU kernel shims need Linux; tests/cuda_shim.rs, tests/hip_shim.rs and tests/metal_shim.rs are skipped");
        return;
    }
    build_shim_fibers();
    build_cuda_shim();
    // Not with the `metal` feature: a Mac runs the real backend (and
    // ggml-metal defines the functions the recorder stands in for).
    if !cfg!(feature = "metal") {
        build_metal_shim(&ggml_metal);
    }
}

/// The CUDA/HIP kernels (`hip/escha-kernels.cuh`) compiled as C++
/// through the shim header and run on the CPU by the executor: the kernel
/// logic is tested without a GPU. Twice, as the two compilers see the
/// source: as CUDA (`escha_cuda_shim_*`, `tests/cuda_shim.rs`) and with
/// `GGML_USE_HIP` (`escha_hip_shim_*`, `tests/hip_shim.rs`: the HIP
/// branches, which no other build runs), so both link into a test binary.
/// The wavefront width is a run-time setting of the HIP build, so one build
/// covers 32 and 64 lanes. One cfg, `escha_cuda_shim`, for both.
fn build_cuda_shim() {
    for f in ["hip/escha-kernels.cuh", "hip/escha-plan.h", "hip/shim/cuda-shim.h", "hip/shim/cuda-executor.cpp"] {
        println!("cargo:rerun-if-changed={}", manifest_dir().join(f).display());
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for (lib, hip) in [("escha_cuda_shim", false), ("escha_hip_shim", true)] {
        let mut b = cc::Build::new();
        if hip {
            // Its own folder: both builds compile the same source file.
            b.define("GGML_USE_HIP", None).out_dir(out.join("hip-shim"));
        }
        b.cpp(true)
            .file(manifest_dir().join("hip/shim/cuda-executor.cpp"))
            .include(manifest_dir().join("tests/shim"))
            .include(manifest_dir().join("ggml-escha/include"))
            .std("c++17")
            // __fmul_rn keeps nvcc from fusing; nothing may fuse here either.
            .flag_if_supported("-ffp-contract=off")
            .flag_if_supported("-Wno-unknown-pragmas")
            .warnings(true)
            .compile(lib);
    }
    println!("cargo:rustc-cfg=escha_cuda_shim");
}

/// The fiber runtime both shim executors run GPU threads on.
fn build_shim_fibers() {
    for f in ["tests/shim/fibers.h", "tests/shim/fibers.cpp"] {
        println!("cargo:rerun-if-changed={}", manifest_dir().join(f).display());
    }
    cc::Build::new()
        .cpp(true)
        .file(manifest_dir().join("tests/shim/fibers.cpp"))
        .std("c++17")
        .warnings(true)
        .compile("escha_shim_fibers");
}

/// The Metal kernels (`metal/escha.metal`) compiled as C++ through the
/// shim header, the executor that runs them on the CPU, and the
/// ggml-metal glue with a recording encoder (`tests/metal_shim.rs`).
fn build_metal_shim(ggml_metal: &Path) {
    for f in ["metal/shim/metal-shim.h", "metal/shim/executor.cpp", "metal/shim/ggml-metal-recorder.cpp"] {
        println!("cargo:rerun-if-changed={}", manifest_dir().join(f).display());
    }
    cc::Build::new()
        .cpp(true)
        .file(manifest_dir().join("metal/shim/executor.cpp"))
        .file(manifest_dir().join("metal/shim/ggml-metal-recorder.cpp"))
        .file(ggml_metal.join("ggml-metal-escha.cpp"))
        .include(ggml_metal)
        .include(ggml_metal.join(".."))
        .include(ggml_metal.join("../../include"))
        .include(manifest_dir().join("tests/shim"))
        .include(manifest_dir().join("ggml-escha/include"))
        .std("c++17")
        // Metal's `fp contract(off)` in escha.metal, mirrored.
        .flag_if_supported("-ffp-contract=off")
        // Metal attributes ([[buffer(0)]], ...) and loop pragmas mean nothing to a C++ compiler.
        .flag_if_supported("-Wno-attributes")
        .flag_if_supported("-Wno-unknown-pragmas")
        .warnings(true)
        .compile("escha_metal_shim");
    println!("cargo:rustc-cfg=escha_metal_shim");
}

/// Without a Mac nothing compiles ggml-metal; so that a Mac user's
/// first build is not the first compile of our C++, the glue and the
/// two patched C++ files of ggml-metal are compiled here (syntax only;
/// the Objective-C file and the Metal shaders need Apple's tools).
fn check_metal_host_sources(dir: &Path) {
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".into());
    let inc = |p: &str| format!("-I{}", dir.join(p).display());
    for file in ["ggml-metal-escha.cpp", "ggml-metal-ops.cpp", "ggml-metal.cpp"] {
        let mut cmd = Command::new(&cxx);
        // libc++ (Apple) includes <memory> through other headers; libstdc++ does not.
        cmd.args(["-std=c++17", "-fsyntax-only", "-include", "memory"]).arg(inc("../../include")).arg(inc("..")).arg(inc(".")).arg(dir.join(file));
        run(&mut cmd, &format!("checking that ggml-metal's {file} compiles (C++ syntax, no Metal)"));
    }
}
