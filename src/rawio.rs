//! Raw little-endian arrays, the vendor's golden-file convention: `.i16`
//! codes, `.f16` vectors/activations/outputs, `.f32` scales or activations.

use anyhow::{bail, Context, Result};
use half::f16;
use std::path::Path;

fn read_bytes(path: &Path, elem: usize) -> Result<Vec<u8>> {
    let b = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if b.len() % elem != 0 {
        bail!("{}: {} bytes is not a whole number of {elem}-byte elements (truncated?)", path.display(), b.len());
    }
    Ok(b)
}

/// Reads a `.i16` file (little-endian int16).
///
/// # Errors
/// Fails when the file cannot be read or its length is not a whole number
/// of elements.
pub fn read_i16(path: &Path) -> Result<Vec<i16>> {
    Ok(read_bytes(path, 2)?.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect())
}

/// Reads a `.f16` file (little-endian f16).
///
/// # Errors
/// Fails when the file cannot be read or its length is not a whole number
/// of elements.
pub fn read_f16(path: &Path) -> Result<Vec<f16>> {
    Ok(read_bytes(path, 2)?.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect())
}

/// Reads a `.f32` file (little-endian f32).
///
/// # Errors
/// Fails when the file cannot be read or its length is not a whole number
/// of elements.
pub fn read_f32(path: &Path) -> Result<Vec<f32>> {
    Ok(read_bytes(path, 4)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Reads `.f16` or `.f32` by extension, widened to f32.
///
/// # Errors
/// Fails when the extension is neither `f16` nor `f32`, and as
/// [`read_f16`] / [`read_f32`].
pub fn read_float(path: &Path) -> Result<Vec<f32>> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("f16") => Ok(read_f16(path)?.into_iter().map(f16::to_f32).collect()),
        Some("f32") => read_f32(path),
        _ => bail!("{}: expected a .f16 or .f32 file", path.display()),
    }
}

/// Writes `v` as a `.f16` file.
///
/// # Errors
/// Fails when the file cannot be written.
pub fn write_f16(path: &Path, v: &[f16]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `v` as a `.i16` file.
///
/// # Errors
/// Fails when the file cannot be written.
pub fn write_i16(path: &Path, v: &[i16]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `v` as a `.f32` file.
///
/// # Errors
/// Fails when the file cannot be written.
pub fn write_f32(path: &Path, v: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
