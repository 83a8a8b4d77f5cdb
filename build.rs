//! Build script.
//!
//! Always: compiles the C reference (`ggml-escha/escha_ref.c`).
//!
//! With the `ggml` feature (default): obtains the pinned llama.cpp tree,
//! applies `patches/*.patch`, adds `ggml-escha/` to it, builds the Rust CPU
//! kernels as a static library for ggml-cpu, builds ggml (shared libraries)
//! and `test-backend-ops` with CMake, generates the raw bindings, and links
//! the crate against that ggml. The `tools` feature also builds llama-cli,
//! llama-server, llama-bench, llama-perplexity, llama-quantize and llama-imatrix.
//!
//! The tree comes from `ESCHA_LLAMA_CPP_DIR` (a checkout at the pinned
//! commit) or from the `llama-cpp-python==0.3.36` source distribution on
//! PyPI, fetched once with pip into a cache outside `target/`
//! (`ESCHA_CACHE_DIR`, default `~/.cache/escha-ggml`) and checked against
//! its SHA-256.

fn main() {
    build_c_reference();
    println!("cargo:rustc-check-cfg=cfg(escha_metal_shim)");
    println!("cargo:rustc-check-cfg=cfg(escha_cuda_shim)");
    #[cfg(feature = "ggml")]
    ggml::build();
}

fn build_c_reference() {
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

#[cfg(feature = "ggml")]
mod ggml {
    use sha2::{Digest, Sha256};
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn manifest_dir() -> PathBuf {
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
    }

    fn out_dir() -> PathBuf {
        PathBuf::from(env::var("OUT_DIR").unwrap())
    }

    /// Fails the build with one clear message.
    fn fail(msg: &str) -> ! {
        eprintln!("\nescha-ggml build error:\n{msg}\n");
        std::process::exit(1);
    }

    fn run(cmd: &mut std::process::Command, what: &str) {
        let status = cmd.status().unwrap_or_else(|e| fail(&format!("{what}: cannot start {:?}: {e}", cmd.get_program())));
        if !status.success() {
            fail(&format!("{what} failed ({status})"));
        }
    }

    /// Writes `data` to `path` only if it differs, so unchanged files keep their
    /// timestamps and CMake does not rebuild what they feed.
    fn write_if_changed(path: &Path, data: &[u8]) {
        if std::fs::read(path).ok().as_deref() == Some(data) {
            return;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, data).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", path.display())));
    }

    const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
    const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
    const SDIST_SPEC: &str = "llama-cpp-python==0.3.36";
    const TREE_IN_SDIST: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp";
    /// The parts of the tree the build needs.
    const TREE_PARTS: [&str; 10] = ["ggml", "src", "include", "common", "tools", "vendor", "cmake", "scripts", "tests", "CMakeLists.txt"];
    /// Upstream's Python converter, extracted next to the tree but not built:
    /// `examples/convert_escha_hf_to_gguf.py` builds on its classes.
    const CONVERT_PARTS: [&str; 3] = ["convert_hf_to_gguf.py", "conversion", "gguf-py"];
    const TOOLS: [&str; 6] = ["llama-cli", "llama-server", "llama-bench", "llama-perplexity", "llama-quantize", "llama-imatrix"];

    pub fn build() {
        for v in ["ESCHA_LLAMA_CPP_DIR", "ESCHA_CACHE_DIR"] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        let tree = prepare_tree();
        let staticlib = build_rust_kernels();
        let build_dir = cmake_build(&tree, &staticlib);
        link(&build_dir);
        bindings(&tree);
    }

    // ---- the pinned tree -------------------------------------------------

    fn cache_dir() -> PathBuf {
        if let Ok(d) = env::var("ESCHA_CACHE_DIR") {
            return PathBuf::from(d);
        }
        let home = env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|_| env::var("HOME").map(|h| Path::new(&h).join(".cache")))
            .unwrap_or_else(|_| fail("set ESCHA_CACHE_DIR (no HOME to put the llama.cpp source cache in)"));
        home.join("escha-ggml")
    }

    fn sha256_file(path: &Path) -> String {
        let data = std::fs::read(path).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())));
        Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The verified source distribution, fetched with pip when not cached.
    fn sdist() -> PathBuf {
        let cache = cache_dir();
        let archive = cache.join(SDIST);
        if !archive.exists() {
            std::fs::create_dir_all(&cache).unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", cache.display())));
            println!("cargo:warning=escha-ggml: fetching {SDIST_SPEC} (source distribution, ~77 MB) with pip into {}", cache.display());
            let ok = Command::new(env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
                .args(["-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST_SPEC, "-d"])
                .arg(&cache)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok || !archive.exists() {
                fail(&format!(
                    "the pinned llama.cpp tree is not available.\n\
                     escha-ggml builds llama.cpp commit 0c1e570 from the {SDIST_SPEC} source distribution on PyPI,\n\
                     and fetching it with `python3 -m pip download` failed (offline?). Either:\n  \
                     - fetch it once where PyPI is reachable: pip download --no-deps --no-binary :all: {SDIST_SPEC} -d {}\n  \
                     - or point ESCHA_LLAMA_CPP_DIR at a llama.cpp checkout of commit 0c1e570.",
                    cache.display()
                ));
            }
        }
        let got = sha256_file(&archive);
        if got != SDIST_SHA256 {
            fail(&format!("{} has SHA-256 {got}, expected {SDIST_SHA256}; delete it to fetch it again", archive.display()));
        }
        archive
    }

    /// A pristine copy of the tree under OUT_DIR (extracted once).
    fn pristine() -> PathBuf {
        if let Ok(dir) = env::var("ESCHA_LLAMA_CPP_DIR") {
            let dir = PathBuf::from(dir);
            if !dir.join("ggml/include/ggml.h").exists() {
                fail(&format!("ESCHA_LLAMA_CPP_DIR={} is not a llama.cpp tree (no ggml/include/ggml.h)", dir.display()));
            }
            return dir;
        }
        let dest = out_dir().join("llama.cpp-pristine");
        let stamp = dest.join(".escha-extracted");
        let id = format!("{SDIST_SHA256} {TREE_PARTS:?} {CONVERT_PARTS:?}");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(id.as_str()) {
            return dest;
        }
        let archive = sdist();
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir_all(&dest).unwrap();
        let mut tar = Command::new("tar");
        tar.arg("-xzf").arg(&archive).arg("-C").arg(&dest).arg("--strip-components=3");
        for part in TREE_PARTS.iter().chain(&CONVERT_PARTS) {
            tar.arg(format!("{TREE_IN_SDIST}/{part}"));
        }
        run(&mut tar, "extracting the llama.cpp tree");
        std::fs::write(&stamp, id).unwrap();
        dest
    }

    /// Copies `src` into `dst` (files only where they differ).
    fn sync_dir(src: &Path, dst: &Path) {
        for entry in std::fs::read_dir(src).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", src.display()))) {
            let entry = entry.unwrap();
            let (from, to) = (entry.path(), dst.join(entry.file_name()));
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                if entry.file_name() == ".git" {
                    continue;
                }
                sync_dir(&from, &to);
            } else if ft.is_file() {
                write_if_changed(&to, &std::fs::read(&from).unwrap());
            }
        }
    }

    fn patches() -> Vec<PathBuf> {
        let dir = manifest_dir().join("patches");
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "patch")).collect())
            .unwrap_or_default();
        v.sort();
        for p in &v {
            println!("cargo:rerun-if-changed={}", p.display());
        }
        v
    }

    /// Files a patch touches (its `+++ b/...` lines).
    fn patched_files(patch: &Path) -> Vec<String> {
        std::fs::read_to_string(patch)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("+++ b/"))
            .map(|s| s.trim().to_string())
            .collect()
    }

    /// The working tree: pristine + patches + our sources, under OUT_DIR.
    /// Only changed files are rewritten, so rebuilds stay incremental.
    fn prepare_tree() -> PathBuf {
        let pristine = pristine();
        link_in_profile_dir("llama.cpp-convert", &pristine);
        let tree = out_dir().join("llama.cpp");
        let stamp = tree.join(".escha-synced-from");
        let src_id = format!("{} {TREE_PARTS:?}", pristine.display());
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(&src_id) {
            for part in TREE_PARTS {
                let from = pristine.join(part);
                if from.is_dir() {
                    sync_dir(&from, &tree.join(part));
                } else if from.is_file() {
                    write_if_changed(&tree.join(part), &std::fs::read(&from).unwrap());
                }
            }
            std::fs::write(&stamp, &src_id).unwrap();
        }
        // Apply the patches to fresh copies of the files they touch, in a
        // staging directory, then move the results into the tree.
        let stage = out_dir().join("patch-stage");
        let _ = std::fs::remove_dir_all(&stage);
        let patches = patches();
        let mut touched: Vec<String> = patches.iter().flat_map(|p| patched_files(p)).collect();
        touched.sort();
        touched.dedup();
        for f in &touched {
            let from = pristine.join(f);
            let data = std::fs::read(&from).unwrap_or_else(|e| fail(&format!("patched file {f} missing from the tree: {e}")));
            write_if_changed(&stage.join(f), &data);
        }
        for p in &patches {
            let mut cmd = Command::new("git");
            // Stop git from finding an enclosing repository (OUT_DIR may lie
            // inside one): it would then apply paths relative to that repo.
            cmd.current_dir(&stage).env("GIT_CEILING_DIRECTORIES", out_dir()).args(["apply", "--whitespace=nowarn", "-p1"]).arg(p);
            run(&mut cmd, &format!("applying {} (is the tree at commit 0c1e570?)", p.display()));
        }
        for f in &touched {
            let patched = std::fs::read(stage.join(f)).unwrap();
            if patched == std::fs::read(pristine.join(f)).unwrap() {
                fail(&format!("the patches did not change {f}; were they applied?"));
            }
            write_if_changed(&tree.join(f), &patched);
        }
        // Our sources go to ggml/src/ggml-escha (CMake and includes expect them there).
        let ours = manifest_dir().join("ggml-escha");
        println!("cargo:rerun-if-changed={}", ours.display());
        for entry in std::fs::read_dir(&ours).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                println!("cargo:rerun-if-changed={}", path.display());
                write_if_changed(&tree.join("ggml/src/ggml-escha").join(path.file_name().unwrap()), &std::fs::read(&path).unwrap());
            }
        }
        // The CUDA/HIP kernels join ggml-cuda's sources (its CMake, and
        // ggml-hip's, glob ggml-cuda/*.cu; patch 0006 hooks them in).
        let gpu = manifest_dir().join("hip");
        println!("cargo:rerun-if-changed={}", gpu.display());
        for entry in std::fs::read_dir(&gpu).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_file() && (name.ends_with(".cu") || name.ends_with(".cuh")) {
                println!("cargo:rerun-if-changed={}", path.display());
                write_if_changed(&tree.join("ggml/src/ggml-cuda").join(&name), &std::fs::read(&path).unwrap());
            }
        }
        // The shim tests' executors run GPU threads as fibers (glibc's
        // ucontext and _setjmp/_longjmp).
        let shims = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
        if shims {
            build_shim_fibers();
            build_cuda_shim();
        }
        inject_metal(&tree, shims);
        tree
    }

    /// The CUDA/HIP kernels (`hip/escha-kernels.cuh`) compiled as C++
    /// through the shim header and run on the CPU by the executor
    /// (`tests/cuda_shim.rs`): the kernel logic is tested without a GPU.
    fn build_cuda_shim() {
        for f in ["hip/escha-kernels.cuh", "hip/shim/cuda-shim.h", "hip/shim/cuda-executor.cpp"] {
            println!("cargo:rerun-if-changed={}", manifest_dir().join(f).display());
        }
        cc::Build::new()
            .cpp(true)
            .file(manifest_dir().join("hip/shim/cuda-executor.cpp"))
            .include(manifest_dir().join("tests/shim"))
            .std("c++17")
            // __fmul_rn keeps nvcc from fusing; nothing may fuse here either.
            .flag_if_supported("-ffp-contract=off")
            .flag_if_supported("-Wno-unknown-pragmas")
            .warnings(true)
            .compile("escha_cuda_shim");
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

    /// The Metal kernels and their ggml-metal glue (`metal/`), where patch
    /// 0007 expects them. ggml-metal compiles each kernel source on its own,
    /// without include paths, so the shared args header is inlined into
    /// `kernels/escha.metal` in place of its `#include` line.
    fn inject_metal(tree: &Path, shim: bool) {
        let metal = manifest_dir().join("metal");
        let dst = tree.join("ggml/src/ggml-metal");
        let read = |name: &str| {
            let path = metal.join(name);
            println!("cargo:rerun-if-changed={}", path.display());
            std::fs::read_to_string(&path).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())))
        };
        for name in ["escha-metal-args.h", "escha-metal-plan.h", "ggml-metal-escha.h", "ggml-metal-escha.cpp"] {
            write_if_changed(&dst.join(name), read(name).as_bytes());
        }
        let include = "#include \"escha-metal-args.h\"";
        let kernels = read("escha.metal");
        if kernels.matches(include).count() != 1 {
            fail(&format!("metal/escha.metal must contain the line {include} exactly once"));
        }
        write_if_changed(&dst.join("kernels/escha.metal"), kernels.replace(include, &read("escha-metal-args.h")).as_bytes());
        if !cfg!(feature = "metal") {
            check_metal_host_sources(&dst);
            if shim {
                build_metal_shim(&dst);
            }
        }
    }

    /// The Metal kernels (`metal/escha.metal`) compiled as C++ through the
    /// shim header, the executor that runs them on the CPU, and the
    /// ggml-metal glue with a recording encoder (`tests/metal_shim.rs`).
    /// Not with the `metal` feature: a Mac runs the real backend (and
    /// ggml-metal defines the functions the recorder stands in for).
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

    // ---- the Rust kernels for ggml-cpu ----------------------------------

    /// Builds `ggml-escha/staticlib` (this crate's kernels without the
    /// `ggml` feature) with a nested cargo in its own target directory.
    fn build_rust_kernels() -> PathBuf {
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

    // ---- CMake -----------------------------------------------------------

    fn on_off(b: bool) -> &'static str {
        if b {
            "ON"
        } else {
            "OFF"
        }
    }

    fn cmake_build(tree: &Path, staticlib: &Path) -> PathBuf {
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
        // and no AMX code paths where AMX is reported but unusable).
        if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
            let f = |name: &str| env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default().split(',').any(|x| x == name);
            let host = |name: &str| host_has(name) || f(name);
            for (opt, feat) in [("GGML_AVX", "avx"), ("GGML_AVX2", "avx2"), ("GGML_FMA", "fma"), ("GGML_F16C", "f16c"), ("GGML_BMI2", "bmi2"), ("GGML_AVX512", "avx512f")] {
                cfg.define(opt, on_off(host(feat)));
            }
            for opt in ["GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"] {
                cfg.define(opt, "OFF");
            }
        }
        let mut targets = vec!["ggml", "test-backend-ops"];
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

    /// `<target>/<profile>/NAME` -> `to`, so scripts find build outputs at a fixed path.
    fn link_in_profile_dir(name: &str, to: &Path) -> PathBuf {
        // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
        let profile_dir = out_dir().ancestors().nth(3).map(Path::to_path_buf).unwrap_or_default();
        let link = profile_dir.join(name);
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        let _ = std::os::unix::fs::symlink(to, &link);
        link
    }

    fn link(build: &Path) {
        let bin = build.join("bin");
        println!("cargo:rustc-link-search=native={}", bin.display());
        for lib in ["ggml", "ggml-base", "ggml-cpu"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", bin.display());
        println!("cargo:rustc-env=ESCHA_GGML_BIN_DIR={}", bin.display());
    }

    // ---- bindings ----------------------------------------------------------

    fn bindings(tree: &Path) {
        let inc = tree.join("ggml/include");
        let b = bindgen::Builder::default()
            .header(inc.join("ggml.h").display().to_string())
            .header(inc.join("ggml-alloc.h").display().to_string())
            .header(inc.join("ggml-backend.h").display().to_string())
            .header(inc.join("ggml-cpu.h").display().to_string())
            .header(inc.join("gguf.h").display().to_string())
            .clang_arg(format!("-I{}", inc.display()))
            // What the safe API uses, nothing more.
            .allowlist_function("ggml_(init|free|new_tensor|set_name|nbytes|escha_linear|escha_moe|new_graph|build_forward_expand|graph_n_nodes|graph_node|tensor_overhead|graph_overhead|op_name|get_type_traits|type_name|row_size)")
            .allowlist_function("gguf_(init_empty|init_from_file|free|get_alignment|get_data_offset|get_n_kv|find_key|get_key|get_kv_type|get_val_u32|get_val_str|get_val_bool|get_arr_type|get_arr_n|get_arr_data|get_n_tensors|find_tensor|get_tensor_offset|get_tensor_name|get_tensor_ne|get_tensor_type|get_tensor_size|remove_key|set_val_u32|set_val_bool|set_val_str|set_kv|add_tensor|get_meta_size|get_meta_data|type_name)")
            .allowlist_function("ggml_backend_(cpu_init|cpu_set_n_threads|cpu_set_use_ref|free|name|graph_compute|alloc_ctx_tensors|buffer_free|tensor_set|tensor_get|supports_op|init_by_name)")
            .allowlist_type("ggml_(type|status|init_params|type_traits)")
            .allowlist_type("gguf_(type|init_params)")
            .allowlist_var("GGML_(MAX_DIMS|DEFAULT_GRAPH_SIZE)")
            .rustified_enum("ggml_type")
            .rustified_enum("ggml_status")
            .rustified_enum("gguf_type")
            .layout_tests(false)
            .generate()
            .unwrap_or_else(|e| fail(&format!("bindgen on ggml.h failed: {e} (is libclang installed?)")));
        b.write_to_file(out_dir().join("ggml_sys.rs")).unwrap();
    }
}
