//! HF safetensors files: a reader over one or more files of a checkpoint
//! directory and a streaming writer (8-byte little-endian header length,
//! JSON header with `dtype`, `shape`, `data_offsets`, then the data).

use crate::validate::{Leaf, LeafDtype};
use half::{bf16, f16};
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// One tensor of a safetensors file.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    /// safetensors dtype name (`F16`, `BF16`, `F32`, `I16`, …).
    pub dtype: String,
    /// NumPy order (outermost first).
    pub shape: Vec<usize>,
    pub file: PathBuf,
    /// Absolute byte offset in `file`.
    pub offset: u64,
    pub size: usize,
}

/// Bytes of a tensor of `shape` with `elem`-byte elements, or None when the
/// product overflows (a header can claim any shape).
pub fn byte_size(elem: usize, shape: &[usize]) -> Option<u64> {
    shape.iter().try_fold(elem as u64, |n, &d| n.checked_mul(d as u64))
}

pub fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

fn bad(path: &Path, detail: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{}: {detail}", path.display())
}

/// Reads the header of one safetensors file and checks every tensor's
/// extent against the file.
///
/// # Errors
/// Fails when the file cannot be opened or read, when the header length
/// does not fit the file (or exceeds 100 MiB), when the header is not a JSON
/// object, or when a tensor lacks a string `dtype`, a `shape` or valid
/// `data_offsets`, has an unknown dtype, or has data outside the file or of
/// a size its shape does not give.
pub fn read_header(path: &Path) -> anyhow::Result<Vec<StTensor>> {
    let mut f = File::open(path).map_err(|e| bad(path, e))?;
    let len = f.metadata()?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| bad(path, "shorter than a safetensors header"))?;
    let n = u64::from_le_bytes(n);
    if n > len.saturating_sub(8) || n > 100 << 20 {
        return Err(bad(path, format!("header length {n} does not fit the file ({len} bytes)")));
    }
    let mut h = vec![0u8; n as usize];
    f.read_exact(&mut h)?;
    let v: Value = serde_json::from_slice(&h).map_err(|e| bad(path, format!("header is not JSON: {e}")))?;
    let Value::Object(m) = v else { return Err(bad(path, "header is not a JSON object")) };
    let base = 8 + n;
    let mut out = Vec::new();
    for (name, e) in m {
        if name == "__metadata__" {
            continue;
        }
        let field = |k: &str| e.get(k).ok_or_else(|| bad(path, format!("tensor {name}: no {k}")));
        let dtype = field("dtype")?.as_str().ok_or_else(|| bad(path, format!("tensor {name}: dtype not a string")))?.to_string();
        let shape: Vec<usize> = field("shape")?
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| bad(path, format!("tensor {name}: bad shape")))?;
        let offs: Vec<u64> = field("data_offsets")?
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect())
            .filter(|v: &Vec<u64>| v.len() == 2 && v[0] <= v[1])
            .ok_or_else(|| bad(path, format!("tensor {name}: bad data_offsets")))?;
        let es = dtype_size(&dtype).ok_or_else(|| bad(path, format!("tensor {name}: unknown dtype {dtype}")))?;
        let want = byte_size(es, &shape).ok_or_else(|| bad(path, format!("tensor {name}: shape {shape:?} of {dtype} is too large")))?;
        if base.checked_add(offs[1]).is_none_or(|end| end > len) {
            return Err(bad(path, format!("tensor {name}: data ends at {} but the file has {len} bytes (truncated?)", base as u128 + offs[1] as u128)));
        }
        let size = offs[1] - offs[0];
        if size != want {
            return Err(bad(path, format!("tensor {name}: {size} bytes for shape {shape:?} of {dtype}")));
        }
        let size = usize::try_from(size).map_err(|_| bad(path, format!("tensor {name}: {size} bytes do not fit in memory")))?;
        out.push(StTensor { name, dtype, shape, file: path.to_path_buf(), offset: base + offs[0], size });
    }
    out.sort_by_key(|t| t.offset);
    Ok(out)
}

impl StTensor {
    /// The tensor's raw bytes.
    ///
    /// # Errors
    /// Fails when its file cannot be opened, sought or read.
    pub fn read(&self) -> anyhow::Result<Vec<u8>> {
        let mut f = File::open(&self.file)?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut b = vec![0u8; self.size];
        f.read_exact(&mut b).map_err(|e| bad(&self.file, format!("tensor {}: {e}", self.name)))?;
        Ok(b)
    }

    /// What the leaf contract (`validate::validate_leaves`) needs of this
    /// tensor: dtype, shape and, for `escha_config`, its int32 values.
    ///
    /// # Errors
    /// Those of [`Self::read`] for an I32 `escha_config`.
    pub fn leaf(&self) -> anyhow::Result<Leaf> {
        let dtype = match self.dtype.as_str() {
            "I16" => LeafDtype::I16,
            "F16" => LeafDtype::F16,
            "F32" => LeafDtype::F32,
            "I32" => LeafDtype::I32,
            _ => LeafDtype::Other,
        };
        let ints = match dtype {
            LeafDtype::I32 if self.name.ends_with(".escha_config") => {
                Some(self.read()?.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect())
            }
            _ => None,
        };
        Ok(Leaf { dtype, shape: self.shape.iter().map(|&d| i64::try_from(d).unwrap_or(-1)).collect(), ints })
    }

    pub fn convertible(&self) -> bool {
        matches!(self.dtype.as_str(), "F32" | "F16" | "BF16")
    }

    /// The values widened to f32 (F32, F16 or BF16).
    ///
    /// # Errors
    /// Those of [`Self::read`], and a failure for any other dtype.
    pub fn read_f32(&self) -> anyhow::Result<Vec<f32>> {
        let b = self.read()?;
        Ok(match self.dtype.as_str() {
            "F32" => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            "F16" => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            "BF16" => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            d => anyhow::bail!("tensor {}: dtype {d} cannot be converted to f32", self.name),
        })
    }
}

/// Declares tensors, then streams their data in declaration order.
#[derive(Default)]
pub struct StWriter {
    entries: Vec<(String, String, Vec<usize>, usize)>,
    metadata: Map<String, Value>,
}

impl StWriter {
    /// Declares a tensor.
    ///
    /// # Errors
    /// Fails for an unknown dtype, a name declared before, or a shape whose
    /// byte size overflows.
    pub fn add(&mut self, name: &str, dtype: &str, shape: &[usize]) -> anyhow::Result<()> {
        let es = dtype_size(dtype).ok_or_else(|| anyhow::anyhow!("tensor {name}: unknown dtype {dtype}"))?;
        if self.entries.iter().any(|e| e.0 == name) {
            anyhow::bail!("tensor {name} declared twice");
        }
        let size = byte_size(es, shape).and_then(|n| usize::try_from(n).ok()).ok_or_else(|| anyhow::anyhow!("tensor {name}: shape {shape:?} of {dtype} is too large"))?;
        self.entries.push((name.into(), dtype.into(), shape.to_vec(), size));
        Ok(())
    }

    pub fn metadata(&mut self, key: &str, value: &str) {
        self.metadata.insert(key.into(), Value::String(value.into()));
    }

    /// Writes the header to `path`; the data follows through the returned
    /// stream, in declaration order.
    ///
    /// # Errors
    /// Fails when the data offsets overflow, or the file cannot be created
    /// or written.
    pub fn create(self, path: &Path) -> anyhow::Result<StStream> {
        let mut header = Map::new();
        if !self.metadata.is_empty() {
            header.insert("__metadata__".into(), Value::Object(self.metadata));
        }
        let mut off = 0usize;
        for (name, dtype, shape, size) in &self.entries {
            let end = off.checked_add(*size).ok_or_else(|| anyhow::anyhow!("{}: tensor {name} ends beyond any file size", path.display()))?;
            header.insert(name.clone(), json!({ "dtype": dtype, "shape": shape, "data_offsets": [off, end] }));
            off = end;
        }
        let mut h = serde_json::to_vec(&Value::Object(header))?;
        // Data starts 8-byte aligned; the format pads the header with spaces.
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path).map_err(|e| bad(path, e))?);
        out.write_all(&(h.len() as u64).to_le_bytes())?;
        out.write_all(&h)?;
        Ok(StStream { out, entries: self.entries.into_iter().map(|e| (e.0, e.3)).collect(), next: 0 })
    }
}

pub struct StStream {
    out: BufWriter<File>,
    entries: Vec<(String, usize)>,
    next: usize,
}

impl StStream {
    /// Writes the next declared tensor's bytes.
    ///
    /// # Errors
    /// Fails when `name` is not the next declared tensor or `bytes` is not
    /// its size, or when writing fails.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        match self.entries.get(self.next) {
            Some((n, s)) if n == name && *s == bytes.len() => {}
            other => anyhow::bail!("tensor {name} ({} bytes) written out of order; expected {other:?}", bytes.len()),
        }
        self.out.write_all(bytes)?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every declared tensor was written and flushes.
    ///
    /// # Errors
    /// Fails when a declared tensor was never written, or flushing fails.
    pub fn finish(mut self) -> anyhow::Result<()> {
        if let Some((n, _)) = self.entries.get(self.next) {
            anyhow::bail!("tensor {n} declared but never written");
        }
        self.out.flush()?;
        Ok(())
    }
}
