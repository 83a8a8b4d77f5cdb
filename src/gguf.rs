//! GGUF files through ggml's own GGUF API (`gguf.h`): a reader that maps
//! tensor infos and reads (and dequantizes) one tensor at a time, and a
//! streaming writer that writes ggml's metadata block and then each
//! tensor's bytes in order, so a model is never held in memory whole.
//!
//! ```no_run
//! use escha_ggml::gguf::{GgufFile, GgufWriter};
//! # fn main() -> Result<(), escha_ggml::gguf::GgufError> {
//! let src = GgufFile::open("in.gguf")?;
//! let mut w = GgufWriter::new();
//! w.copy_kv(&src);
//! for t in src.tensors() {
//!     w.add_tensor(&t.name, t.ty, &t.ne)?;
//! }
//! let mut out = w.create("out.gguf")?;
//! for t in src.tensors() {
//!     out.write_tensor(&t.name, &src.read(t)?)?;
//! }
//! out.finish()?;
//! # Ok(()) }
//! ```

use crate::ffi::ggml_sys as sys;
pub use crate::ffi::ggml_sys::ggml_type as GgmlType;
use half::f16;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a readable GGUF file (ggml's parser rejected it; see its message above)")]
    Parse { path: String },
    #[error("{path}: tensor {tensor} needs bytes up to {needed} but the file has {len} (truncated?)")]
    Truncated { path: String, tensor: String, needed: u64, len: u64 },
    #[error("tensor {tensor}: type {ty} cannot be converted to f32")]
    Unsupported { tensor: String, ty: String },
    #[error("tensor {tensor}: {detail}")]
    Tensor { tensor: String, detail: String },
    #[error("key {key}: {detail}")]
    Key { key: String, detail: String },
}

pub type Result<T> = std::result::Result<T, GgufError>;

/// ggml's name of a tensor type (`f16`, `q4_K`, …).
pub fn type_name(ty: GgmlType) -> String {
    // SAFETY: returns a static string for every valid type.
    unsafe { CStr::from_ptr(sys::ggml_type_name(ty)) }.to_string_lossy().into_owned()
}

/// Bytes of `n` elements of `ty` in one row (None if `n` is not a whole
/// number of the type's blocks).
pub fn row_bytes(ty: GgmlType, n: i64) -> Option<usize> {
    // SAFETY: the traits table covers every valid type.
    let tr = unsafe { &*sys::ggml_get_type_traits(ty) };
    if tr.blck_size <= 0 || n < 0 || n % tr.blck_size != 0 {
        return None;
    }
    ((n / tr.blck_size) as usize).checked_mul(tr.type_size)
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `ne[0]` is the contiguous dimension; unused dims are 1.
    pub ne: [i64; 4],
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub size: usize,
}

impl TensorInfo {
    pub fn n_dims(&self) -> usize {
        self.ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1)
    }
    pub fn n_elements(&self) -> usize {
        // ggml's parser rejects shapes whose product overflows int64.
        self.ne.iter().map(|&n| n.max(0) as usize).fold(1usize, usize::saturating_mul)
    }
    pub fn type_name(&self) -> String {
        type_name(self.ty)
    }
}

/// A GGUF file opened for reading: ggml's parsed metadata plus the file.
pub struct GgufFile {
    ctx: *mut sys::gguf_context,
    path: PathBuf,
    file: File,
    tensors: Vec<TensorInfo>,
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: ctx came from gguf_init_from_file and is freed once.
        unsafe { sys::gguf_free(self.ctx) };
    }
}

fn cstring(what: &str) -> CString {
    CString::new(what.replace('\0', "")).expect("NUL removed")
}

impl GgufFile {
    /// Parses the metadata (ggml's parser) and checks that every tensor's
    /// data lies inside the file.
    ///
    /// # Errors
    /// [`GgufError::Io`] when the file cannot be opened,
    /// [`GgufError::Parse`] when ggml's parser rejects it, [`GgufError::Key`]
    /// for an empty or repeated key, [`GgufError::Truncated`] when a tensor's
    /// data extends past the end of the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let io = |source| GgufError::Io { path: shown.clone(), source };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let c = cstring(&shown);
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        // SAFETY: valid C string; with no_alloc and a NULL ctx only metadata is read.
        let ctx = unsafe { sys::gguf_init_from_file(c.as_ptr(), params) };
        if ctx.is_null() {
            return Err(GgufError::Parse { path: shown });
        }
        let mut f = Self { ctx, path, file, tensors: Vec::new() };
        // SAFETY: ids in [0, n) of a live context.
        unsafe {
            // ggml's parser accepts an empty key, but copying it
            // (gguf_set_kv) aborts: refuse the file here instead.
            let mut keys = std::collections::HashSet::new();
            for id in 0..sys::gguf_get_n_kv(ctx) {
                let key = CStr::from_ptr(sys::gguf_get_key(ctx, id)).to_bytes();
                if key.is_empty() || !keys.insert(key) {
                    let what = if key.is_empty() { "an empty" } else { "a repeated" };
                    return Err(GgufError::Key { key: String::from_utf8_lossy(key).into_owned(), detail: format!("{shown}: key {id} is {what} key") });
                }
            }
            let base = sys::gguf_get_data_offset(ctx) as u64;
            for id in 0..sys::gguf_get_n_tensors(ctx) {
                let name = CStr::from_ptr(sys::gguf_get_tensor_name(ctx, id)).to_string_lossy().into_owned();
                let ne = std::slice::from_raw_parts(sys::gguf_get_tensor_ne(ctx, id), 4);
                let t = TensorInfo {
                    ty: sys::gguf_get_tensor_type(ctx, id),
                    ne: [ne[0], ne[1], ne[2], ne[3]],
                    offset: base.saturating_add(sys::gguf_get_tensor_offset(ctx, id) as u64),
                    size: sys::gguf_get_tensor_size(ctx, id),
                    name,
                };
                // ggml's parser bounds each size; the sum is checked here.
                let needed = t.offset.saturating_add(t.size as u64);
                if needed > len {
                    return Err(GgufError::Truncated { path: shown, tensor: t.name, needed, len });
                }
                f.tensors.push(t);
            }
        }
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn key_id(&self, key: &str) -> Option<i64> {
        let c = cstring(key);
        // SAFETY: live context, valid C string.
        let id = unsafe { sys::gguf_find_key(self.ctx, c.as_ptr()) };
        (id >= 0).then_some(id)
    }

    fn kv_type(&self, id: i64) -> sys::gguf_type {
        // SAFETY: id from gguf_find_key.
        unsafe { sys::gguf_get_kv_type(self.ctx, id) }
    }

    /// A string value (None if absent); a value of another type is an error.
    ///
    /// # Errors
    /// [`GgufError::Key`] when the key holds a value of another type.
    pub fn get_str(&self, key: &str) -> Result<Option<String>> {
        let Some(id) = self.key_id(key) else { return Ok(None) };
        if self.kv_type(id) != sys::gguf_type::GGUF_TYPE_STRING {
            return Err(GgufError::Key { key: key.into(), detail: "is not a string".into() });
        }
        // SAFETY: the type was checked (gguf asserts it otherwise).
        Ok(Some(unsafe { CStr::from_ptr(sys::gguf_get_val_str(self.ctx, id)) }.to_string_lossy().into_owned()))
    }

    /// A u32 value (None if absent).
    ///
    /// # Errors
    /// [`GgufError::Key`] when the key holds a value of another type.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        let Some(id) = self.key_id(key) else { return Ok(None) };
        if self.kv_type(id) != sys::gguf_type::GGUF_TYPE_UINT32 {
            return Err(GgufError::Key { key: key.into(), detail: "is not a u32".into() });
        }
        // SAFETY: type checked.
        Ok(Some(unsafe { sys::gguf_get_val_u32(self.ctx, id) }))
    }

    /// A bool value (None if absent).
    ///
    /// # Errors
    /// [`GgufError::Key`] when the key holds a value of another type.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(id) = self.key_id(key) else { return Ok(None) };
        if self.kv_type(id) != sys::gguf_type::GGUF_TYPE_BOOL {
            return Err(GgufError::Key { key: key.into(), detail: "is not a bool".into() });
        }
        // SAFETY: type checked.
        Ok(Some(unsafe { sys::gguf_get_val_bool(self.ctx, id) }))
    }

    /// The raw bytes of one tensor.
    ///
    /// # Errors
    /// [`GgufError::Io`] when seeking or reading fails.
    pub fn read(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let io = |source| GgufError::Io { path: format!("{} (tensor {})", self.path.display(), t.name), source };
        let mut buf = vec![0u8; t.size];
        let mut f = &self.file;
        f.seek(SeekFrom::Start(t.offset)).map_err(io)?;
        f.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }

    /// One tensor as f32 (float types widened, quantized types dequantized
    /// by ggml's own `to_float`).
    ///
    /// # Errors
    /// Those of [`Self::read`] and [`to_f32`].
    pub fn read_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let bytes = self.read(t)?;
        to_f32(&t.name, t.ty, &bytes, t.n_elements())
    }
}

/// `n` values of type `ty` as f32, via ggml's type traits.
///
/// # Errors
/// [`GgufError::Tensor`] when `bytes` does not hold exactly `n` values of
/// `ty`, [`GgufError::Unsupported`] when ggml cannot convert `ty` to f32.
pub fn to_f32(name: &str, ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let bad = |detail: String| GgufError::Tensor { tensor: name.into(), detail };
    if row_bytes(ty, n as i64) != Some(bytes.len()) {
        return Err(bad(format!("{} bytes do not hold {n} {} values", bytes.len(), type_name(ty))));
    }
    match ty {
        GgmlType::GGML_TYPE_F32 => Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        GgmlType::GGML_TYPE_F16 => Ok(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
        _ => {
            // SAFETY: the traits table covers every valid type.
            let tr = unsafe { &*sys::ggml_get_type_traits(ty) };
            let Some(conv) = tr.to_float else {
                return Err(GgufError::Unsupported { tensor: name.into(), ty: type_name(ty) });
            };
            let mut out = vec![0f32; n];
            // SAFETY: the length check above matches ggml's row size for n values.
            unsafe { conv(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
            Ok(out)
        }
    }
}

struct TensorSpec {
    name: String,
    ty: GgmlType,
    ne: [i64; 4],
    n_dims: usize,
    size: usize,
}

/// Collects metadata and tensor declarations, then streams the file.
pub struct GgufWriter {
    ctx: *mut sys::gguf_context,
    specs: Vec<TensorSpec>,
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        // SAFETY: ctx came from gguf_init_empty and is freed once.
        unsafe { sys::gguf_free(self.ctx) };
    }
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        // SAFETY: plain constructor.
        Self { ctx: unsafe { sys::gguf_init_empty() }, specs: Vec::new() }
    }

    /// Copies every key-value pair of `src` (ggml's `gguf_set_kv`).
    pub fn copy_kv(&mut self, src: &GgufFile) {
        // SAFETY: both contexts are live.
        unsafe { sys::gguf_set_kv(self.ctx, src.ctx) };
    }

    /// Removes a key (copied from a source) if present.
    pub fn remove_key(&mut self, key: &str) {
        let c = cstring(key);
        // SAFETY: live context, valid C string.
        unsafe { sys::gguf_remove_key(self.ctx, c.as_ptr()) };
    }

    pub fn set_u32(&mut self, key: &str, v: u32) {
        let c = cstring(key);
        // SAFETY: live context, valid C string (gguf replaces an existing key).
        unsafe { sys::gguf_set_val_u32(self.ctx, c.as_ptr(), v) };
    }

    pub fn set_bool(&mut self, key: &str, v: bool) {
        let c = cstring(key);
        // SAFETY: as above.
        unsafe { sys::gguf_set_val_bool(self.ctx, c.as_ptr(), v) };
    }

    pub fn set_str(&mut self, key: &str, v: &str) {
        let (c, cv) = (cstring(key), cstring(v));
        // SAFETY: as above.
        unsafe { sys::gguf_set_val_str(self.ctx, c.as_ptr(), cv.as_ptr()) };
    }

    /// Declares a tensor (`ne` in ggml order, 1 to 4 dims).
    ///
    /// # Errors
    /// [`GgufError::Tensor`] for a name that is empty, 64 bytes or longer,
    /// holds a NUL or was declared before; for a shape that is empty, has
    /// more than 4 dims or a dim below 1; when `ne[0]` is not a whole number
    /// of the type's blocks; or when the byte size overflows.
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, ne: &[i64]) -> Result<()> {
        let bad = |detail: String| GgufError::Tensor { tensor: name.into(), detail };
        // GGML_MAX_NAME is 64 including the terminator.
        if name.is_empty() || name.len() >= 64 || name.contains('\0') {
            return Err(bad("name must be 1 to 63 bytes".into()));
        }
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&n| n < 1) {
            return Err(bad(format!("bad shape {ne:?}")));
        }
        if self.specs.iter().any(|s| s.name == name) {
            return Err(bad("declared twice".into()));
        }
        let row = row_bytes(ty, ne[0]).ok_or_else(|| bad(format!("ne[0] = {} is not a whole number of {} blocks", ne[0], type_name(ty))))?;
        let mut full = [1i64; 4];
        full[..ne.len()].copy_from_slice(ne);
        let size = full[1..]
            .iter()
            .try_fold(row, |n, &d| n.checked_mul(d as usize))
            .ok_or_else(|| bad(format!("shape {ne:?} of {} is too large", type_name(ty))))?;
        self.specs.push(TensorSpec { name: name.into(), ty, ne: full, n_dims: ne.len(), size });
        Ok(())
    }

    /// Writes the metadata block to `path`; the tensors follow through the
    /// returned stream, in declaration order.
    ///
    /// # Errors
    /// [`GgufError::Tensor`] when ggml cannot make the metadata context,
    /// [`GgufError::Io`] when the file cannot be created or written.
    pub fn create(mut self, path: impl AsRef<Path>) -> Result<GgufStream> {
        let shown = path.as_ref().display().to_string();
        // Tensor structs for gguf_add_tensor (metadata only, no data).
        // SAFETY: a no_alloc context sized for the declared tensors.
        unsafe {
            let params = sys::ggml_init_params {
                mem_size: (self.specs.len() + 1) * sys::ggml_tensor_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            let tctx = sys::ggml_init(params);
            if tctx.is_null() {
                return Err(GgufError::Tensor { tensor: "(all)".into(), detail: "could not create a ggml context".into() });
            }
            for s in &self.specs {
                let t = sys::ggml_new_tensor(tctx, s.ty, s.n_dims as i32, s.ne.as_ptr());
                let c = cstring(&s.name);
                sys::ggml_set_name(t, c.as_ptr());
                sys::gguf_add_tensor(self.ctx, t);
            }
            sys::ggml_free(tctx);
        }
        // SAFETY: live context; the buffer has the size gguf reports.
        let (meta, alignment) = unsafe {
            let n = sys::gguf_get_meta_size(self.ctx);
            let mut meta = vec![0u8; n];
            sys::gguf_get_meta_data(self.ctx, meta.as_mut_ptr().cast());
            (meta, sys::gguf_get_alignment(self.ctx))
        };
        let file = File::create(path.as_ref()).map_err(|source| GgufError::Io { path: shown.clone(), source })?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&meta).map_err(|source| GgufError::Io { path: shown.clone(), source })?;
        let specs = std::mem::take(&mut self.specs).into_iter().map(|s| (s.name, s.size)).collect();
        Ok(GgufStream { out, path: shown, specs, next: 0, alignment })
    }
}

/// The data section of a GGUF being written.
pub struct GgufStream {
    out: BufWriter<File>,
    path: String,
    specs: Vec<(String, usize)>,
    next: usize,
    alignment: usize,
}

impl GgufStream {
    /// Writes the next declared tensor's bytes (name and size must match).
    ///
    /// # Errors
    /// [`GgufError::Tensor`] when every declared tensor was written already,
    /// or `name` is not the next one or `bytes` not its size;
    /// [`GgufError::Io`] when writing fails.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some((want, size)) = self.specs.get(self.next) else {
            return Err(GgufError::Tensor { tensor: name.into(), detail: "written but never declared".into() });
        };
        if want != name || *size != bytes.len() {
            return Err(GgufError::Tensor {
                tensor: name.into(),
                detail: format!("out of order or wrong size: expected {want} with {size} bytes, got {} bytes", bytes.len()),
            });
        }
        let pad = bytes.len().next_multiple_of(self.alignment) - bytes.len();
        let io = |source| GgufError::Io { path: self.path.clone(), source };
        self.out.write_all(bytes).map_err(io)?;
        self.out.write_all(&vec![0u8; pad]).map_err(io)?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every declared tensor was written and flushes.
    ///
    /// # Errors
    /// [`GgufError::Tensor`] naming the first declared tensor not written,
    /// [`GgufError::Io`] when flushing fails.
    pub fn finish(mut self) -> Result<()> {
        if let Some((name, _)) = self.specs.get(self.next) {
            return Err(GgufError::Tensor { tensor: name.clone(), detail: "declared but never written".into() });
        }
        self.out.flush().map_err(|source| GgufError::Io { path: self.path.clone(), source })
    }
}

/// Whether [`to_f32`] can convert tensors of this type.
pub fn can_convert(ty: GgmlType) -> bool {
    // SAFETY: the traits table covers every valid type.
    matches!(ty, GgmlType::GGML_TYPE_F32 | GgmlType::GGML_TYPE_F16) || unsafe { (*sys::ggml_get_type_traits(ty)).to_float.is_some() }
}
