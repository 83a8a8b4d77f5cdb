//! Where a command writes: every output goes to `OUT.partial` beside `OUT`
//! and is renamed into place only when complete, so an error at any point
//! (bad input, full disk) leaves neither a partial `OUT` nor the
//! `.partial`, and a file that was there before is replaced only by a
//! complete result.
//!
//! The checks run before any work:
//! - the output (or its `.partial`) is none of the inputs: same device and
//!   inode, so a symbolic or hard link to an input is caught too;
//! - a file output is a regular file or does not exist yet; a directory, a
//!   device (`/dev/null`, `/dev/full`), a FIFO or a socket is refused, since
//!   a rename would replace the node itself. A symbolic link is followed:
//!   its target is replaced, the link stays;
//! - a directory output does not exist yet;
//! - the directory that will hold it exists.

use anyhow::{bail, Context, Result};
use std::fs::Metadata;
use std::path::{Path, PathBuf};

/// A file or directory being written; removed on drop unless committed.
#[derive(Debug)]
pub struct Output {
    target: PathBuf,
    partial: PathBuf,
    dir: bool,
    committed: bool,
}

/// `path` with `.partial` appended to its file name.
fn partial_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    p.into()
}

fn kind(m: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    match () {
        _ if t.is_dir() => "a directory",
        _ if t.is_char_device() => "a character device",
        _ if t.is_block_device() => "a block device",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_socket() => "a socket",
        _ if t.is_symlink() => "a symbolic link",
        _ if t.is_file() => "a regular file",
        _ => "not a regular file",
    }
}

fn same_node(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Errors if `path` exists and is one of `inputs` (through any link).
fn not_an_input(what: &str, path: &Path, inputs: &[&Path]) -> Result<()> {
    let Ok(m) = std::fs::metadata(path) else { return Ok(()) };
    for input in inputs {
        if std::fs::metadata(input).is_ok_and(|i| same_node(&i, &m)) {
            bail!("{what} {} is the input {} (refusing to overwrite an input)", path.display(), input.display());
        }
    }
    Ok(())
}

/// The directory that will hold `path`, which must exist.
fn parent_exists(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!("output {}: directory {} does not exist", path.display(), parent.display());
    }
    Ok(())
}

impl Output {
    /// A file output; see the module docs for what is refused.
    ///
    /// # Errors
    /// Fails when the output or its `.partial` is one of `inputs`, when the
    /// output is a symbolic link to nothing or exists and is not a regular
    /// file, when its `.partial` exists and is not a regular file, or when
    /// its directory does not exist.
    pub fn file(output: &Path, inputs: &[&Path]) -> Result<Self> {
        let target = match std::fs::symlink_metadata(output) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::canonicalize(output).with_context(|| format!("output {} is a symbolic link to nothing", output.display()))?
            }
            _ => output.to_path_buf(),
        };
        not_an_input("output", &target, inputs)?;
        if let Ok(m) = std::fs::metadata(&target) {
            if !m.is_file() {
                bail!(
                    "output {} is {}, not a regular file (outputs are written beside it and renamed into place; give a file path)",
                    output.display(),
                    kind(&m)
                );
            }
        }
        parent_exists(&target)?;
        let partial = partial_path(&target);
        not_an_input("output's temporary file", &partial, inputs)?;
        if let Ok(m) = std::fs::symlink_metadata(&partial) {
            if !m.is_file() {
                bail!("{} is {}: remove it (it stands where the output is written until complete)", partial.display(), kind(&m));
            }
        }
        Ok(Self { target, partial, dir: false, committed: false })
    }

    /// A directory output, which must not exist yet.
    ///
    /// # Errors
    /// Fails when the output exists (saying so if it is one of `inputs`),
    /// when its directory does not exist, when its `.partial` is an input or
    /// exists, or when the `.partial` directory cannot be created.
    pub fn dir(output: &Path, inputs: &[&Path]) -> Result<Self> {
        if let Ok(m) = std::fs::symlink_metadata(output) {
            not_an_input("output", output, inputs)?;
            bail!("output {} already exists ({}); give a new directory", output.display(), kind(&m));
        }
        parent_exists(output)?;
        let partial = partial_path(output);
        not_an_input("output's temporary directory", &partial, inputs)?;
        if let Ok(m) = std::fs::symlink_metadata(&partial) {
            bail!(
                "{} already exists ({}; left by an interrupted run?): remove it first",
                partial.display(),
                kind(&m)
            );
        }
        std::fs::create_dir(&partial).with_context(|| format!("creating {}", partial.display()))?;
        Ok(Self { target: output.to_path_buf(), partial, dir: true, committed: false })
    }

    /// Where to write until the output is complete.
    pub fn path(&self) -> &Path {
        &self.partial
    }

    /// Moves the complete output into place.
    ///
    /// # Errors
    /// Fails when the rename fails; the `.partial` is then removed.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.partial, &self.target).with_context(|| format!("renaming {} to {}", self.partial.display(), self.target.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.committed {
            let _ = if self.dir { std::fs::remove_dir_all(&self.partial) } else { std::fs::remove_file(&self.partial) };
        }
    }
}
