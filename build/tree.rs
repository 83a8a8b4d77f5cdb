//! The pinned llama.cpp tree: the verified source distribution, a pristine
//! copy, and the working tree under OUT_DIR (pristine + `patches/` + this
//! crate's sources, placed by [`COPIES`]).

use crate::util::{fail, link_in_profile_dir, manifest_dir, out_dir, read, run, write_if_changed};
use sha2::{Digest, Sha256};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const SDIST_SPEC: &str = "llama-cpp-python==0.3.36";
const SDIST_NAME: &str = "llama-cpp-python";
const TREE_IN_SDIST: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp";
/// The parts of the tree the build needs.
const TREE_PARTS: [&str; 10] = ["ggml", "src", "include", "common", "tools", "vendor", "cmake", "scripts", "tests", "CMakeLists.txt"];
/// Upstream's Python converter, extracted next to the tree but not built:
/// `examples/convert_escha_hf_to_gguf.py` builds on its classes.
const CONVERT_PARTS: [&str; 3] = ["convert_hf_to_gguf.py", "conversion", "gguf-py"];

/// Which files of a source folder a copy takes (top level only).
enum Files {
    /// Every file.
    All,
    /// Files whose names end so.
    Ending(&'static [&'static str]),
    /// These names.
    Named(&'static [&'static str]),
}

/// One copy step: this crate's folder, the tree's folder, which files.
struct Copy {
    from: &'static str,
    to: &'static str,
    files: Files,
}

/// The headers every backend's glue and kernels include (format constants,
/// the op description).
const SHARED_HEADERS: Files = Files::Named(&["escha-format.h", "escha-op.h"]);

/// Where this crate's C/C++ sources go in the tree. ggml-escha keeps its
/// rooms under ggml/src/ggml-escha (patches 0001, 0002, 0004 name those
/// paths); the loader is libllama's, so it lives on llama's side (src/escha,
/// patch 0005); the CUDA/HIP and Metal sources join their backends' folders,
/// whose CMake globs or lists them (patches 0006, 0007), with the shared
/// headers beside them.
const COPIES: &[Copy] = &[
    Copy { from: "ggml-escha/include", to: "ggml/src/ggml-escha/include", files: Files::All },
    Copy { from: "ggml-escha/ref", to: "ggml/src/ggml-escha/ref", files: Files::All },
    Copy { from: "ggml-escha/ops", to: "ggml/src/ggml-escha/ops", files: Files::All },
    Copy { from: "ggml-escha/cpu", to: "ggml/src/ggml-escha/cpu", files: Files::All },
    Copy { from: "ggml-escha/test-backend-ops", to: "ggml/src/ggml-escha/test-backend-ops", files: Files::All },
    Copy { from: "ggml-escha/llama", to: "src/escha", files: Files::All },
    Copy { from: "ggml-escha/include", to: "src/escha", files: SHARED_HEADERS },
    Copy { from: "hip", to: "ggml/src/ggml-cuda", files: Files::Ending(&[".cu", ".cuh", ".h"]) },
    Copy { from: "ggml-escha/include", to: "ggml/src/ggml-cuda", files: SHARED_HEADERS },
    Copy {
        from: "metal",
        to: "ggml/src/ggml-metal",
        files: Files::Named(&["escha-metal-args.h", "escha-metal-plan.h", "ggml-metal-escha.h", "ggml-metal-escha.cpp"]),
    },
    Copy { from: "ggml-escha/include", to: "ggml/src/ggml-metal", files: SHARED_HEADERS },
];

/// ggml-metal compiles each kernel source on its own, without include
/// paths, so these headers are inlined into `kernels/escha.metal` in place
/// of their `#include` lines: (header, the folder it is in).
const METAL_INLINED: [(&str, &str); 2] = [("escha-format.h", "ggml-escha/include"), ("escha-metal-args.h", "metal")];

/// The working tree: pristine + patches + our sources, under OUT_DIR.
/// Only changed files are rewritten, so rebuilds stay incremental.
pub fn prepare() -> PathBuf {
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
    apply_patches(&pristine, &tree);
    for copy in COPIES {
        copy_sources(copy, &tree);
    }
    inline_metal_shader(&tree);
    // Scripts (hip/device-pack.sh, hip/hip-compile-check.sh) take the tree
    // of the latest build from here: builds with other features have other
    // OUT_DIRs, whose trees are as old as their last build.
    link_in_profile_dir("llama.cpp-tree", &tree);
    tree
}

fn copy_sources(copy: &Copy, tree: &Path) {
    let from = manifest_dir().join(copy.from);
    println!("cargo:rerun-if-changed={}", from.display());
    let entries = std::fs::read_dir(&from).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", from.display())));
    let mut copied = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let wanted = match copy.files {
            Files::All => true,
            Files::Ending(ends) => ends.iter().any(|e| name.ends_with(e)),
            Files::Named(names) => names.contains(&name.as_str()),
        };
        if path.is_file() && wanted {
            write_if_changed(&tree.join(copy.to).join(&name), &read(&path));
            copied += 1;
        }
    }
    if let Files::Named(names) = copy.files {
        if copied != names.len() {
            fail(&format!("{} must hold {names:?}", from.display()));
        }
    }
}

fn inline_metal_shader(tree: &Path) {
    let mut kernels = String::from_utf8(read(&manifest_dir().join("metal/escha.metal"))).unwrap();
    for (header, dir) in METAL_INLINED {
        let include = format!("#include \"{header}\"");
        if kernels.matches(&include).count() != 1 {
            fail(&format!("metal/escha.metal must contain the line {include} exactly once"));
        }
        let text = String::from_utf8(read(&manifest_dir().join(dir).join(header))).unwrap();
        kernels = kernels.replace(&include, &text);
    }
    write_if_changed(&tree.join("ggml/src/ggml-metal/kernels/escha.metal"), kernels.as_bytes());
}

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
            // Only this package as source: `:all:` would also build pip's metadata
            // helpers (CMake among them) from source, a quarter of an hour.
            .args(["-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME, SDIST_SPEC, "-d"])
            .arg(&cache)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok || !archive.exists() {
            fail(&format!(
                "the pinned llama.cpp tree is not available.\n\
                 escha-ggml builds llama.cpp commit 0c1e570 from the {SDIST_SPEC} source distribution on PyPI,\n\
                 and fetching it with `python3 -m pip download` failed (offline?). Either:\n  \
                 - fetch it once where PyPI is reachable: pip download --no-deps --no-binary {SDIST_NAME} {SDIST_SPEC} -d {}\n  \
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


/// Applies the patches to fresh copies of the files they touch, in a
/// staging directory, then moves the results into the tree.
fn apply_patches(pristine: &Path, tree: &Path) {
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
}
