//! What every step of the build script shares: paths, failing with one
//! message, running commands, writing files only when they change.

use std::env;
use std::path::{Path, PathBuf};

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
}

pub fn out_dir() -> PathBuf {
    PathBuf::from(env::var("OUT_DIR").unwrap())
}

/// Fails the build with one clear message.
pub fn fail(msg: &str) -> ! {
    eprintln!("\nescha-ggml build error:\n{msg}\n");
    std::process::exit(1);
}

pub fn run(cmd: &mut std::process::Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| fail(&format!("{what}: cannot start {:?}: {e}", cmd.get_program())));
    if !status.success() {
        fail(&format!("{what} failed ({status})"));
    }
}

/// Writes `data` to `path` only if it differs, so unchanged files keep their
/// timestamps and CMake does not rebuild what they feed.
pub fn write_if_changed(path: &Path, data: &[u8]) {
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, data).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", path.display())));
}

pub fn read(path: &Path) -> Vec<u8> {
    println!("cargo:rerun-if-changed={}", path.display());
    std::fs::read(path).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())))
}

/// `<target>/<profile>/NAME` -> `to`, so scripts find build outputs at a fixed path.
pub fn link_in_profile_dir(name: &str, to: &Path) -> PathBuf {
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    let profile_dir = out_dir().ancestors().nth(3).map(Path::to_path_buf).unwrap_or_default();
    let link = profile_dir.join(name);
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    let _ = std::os::unix::fs::symlink(to, &link);
    link
}
