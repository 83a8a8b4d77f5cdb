//! Safe bindings to the patched ggml: build a graph with the escha ops from
//! Rust slices, compute it on a backend, read the result.
//!
//! ```no_run
//! use escha_ggml::ggml::{Backend, Graph};
//! # fn main() -> Result<(), escha_ggml::ggml::GgmlError> {
//! # let (code, rin, rout, x) = (vec![0i16; 16 * 8 * 32], vec![half::f16::ONE; 256], vec![half::f16::ONE; 128], vec![0f32; 256]);
//! let backend = Backend::cpu(2)?;
//! let g = Graph::new(&backend)?;
//! let code = g.tensor("code", &[32, 8, 16], &code)?; // ne = [16K, OC/16, IC/16]
//! let rin = g.tensor("rin", &[256], &rin)?;
//! let rout = g.tensor("rout", &[128], &rout)?;
//! let x = g.tensor("x", &[256, 1], &x)?;
//! let y = g.escha_linear(code, x, rin, rout, None, None, None)?;
//! let out: Vec<f32> = g.compute(y)?; // [OC, 1]
//! # Ok(()) }
//! ```
//!
//! Every resource (context, buffer, backend) is owned and freed in `Drop`.
//! Shapes are checked here, before ggml's constructors (which abort on bad
//! input), so misuse is an error value, never a crash.

use crate::ffi::ggml_sys as sys;
use crate::validate::LinearShape;
use half::f16;
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GgmlError {
    #[error("ggml backend {0} could not be initialised")]
    BackendInit(String),
    #[error("ggml context could not be created")]
    ContextInit,
    #[error("tensor {name}: {detail}")]
    Shape { name: String, detail: String },
    #[error("backend {backend} does not support {op} ({tensor})")]
    Unsupported { backend: String, op: String, tensor: String },
    #[error("could not allocate a backend buffer for the graph")]
    Alloc,
    #[error("graph compute failed with status {0}")]
    Compute(i32),
    #[error("graph was already computed; build a new one")]
    AlreadyComputed,
}

pub type Result<T> = std::result::Result<T, GgmlError>;

/// A ggml backend (owned, freed on drop).
pub struct Backend {
    ptr: sys::ggml_backend_t,
    name: String,
}

/// # Safety
/// 1. A ggml backend may be used from any one thread at a time; moving the
///    owning handle to another thread moves that one user with it.
/// 2. `Backend` is not `Sync` and every use goes through `&Backend` on the
///    owner's thread (graph building and computing), so two threads never
///    use it at once.
/// 3. The name is an owned `String`; nothing else refers to thread-local
///    state.
unsafe impl Send for Backend {}

impl Backend {
    /// ggml's CPU backend with `n_threads` threads (the Rust kernels).
    ///
    /// # Errors
    /// [`GgmlError::BackendInit`] when ggml cannot create the backend.
    pub fn cpu(n_threads: usize) -> Result<Self> {
        // SAFETY: plain constructor; a NULL result is handled.
        let ptr = unsafe { sys::ggml_backend_cpu_init() };
        if ptr.is_null() {
            return Err(GgmlError::BackendInit("CPU".into()));
        }
        unsafe { sys::ggml_backend_cpu_set_n_threads(ptr, n_threads.max(1) as i32) };
        Ok(Self::wrap(ptr))
    }

    /// The CPU backend's reference path (ggml's `use_ref`): the escha ops
    /// run the C reference of the format.
    ///
    /// # Errors
    /// [`GgmlError::BackendInit`] when ggml cannot create the backend.
    pub fn cpu_reference(n_threads: usize) -> Result<Self> {
        let b = Self::cpu(n_threads)?;
        unsafe { sys::ggml_backend_cpu_set_use_ref(b.ptr, true) };
        Ok(b)
    }

    /// A backend by ggml's registry name (e.g. "CUDA0").
    ///
    /// # Errors
    /// [`GgmlError::BackendInit`] when the name contains NUL, or no backend
    /// of that name exists or starts.
    pub fn by_name(name: &str) -> Result<Self> {
        let c = CString::new(name).map_err(|_| GgmlError::BackendInit(name.into()))?;
        let ptr = unsafe { sys::ggml_backend_init_by_name(c.as_ptr(), std::ptr::null()) };
        if ptr.is_null() {
            return Err(GgmlError::BackendInit(name.into()));
        }
        Ok(Self::wrap(ptr))
    }

    fn wrap(ptr: sys::ggml_backend_t) -> Self {
        let name = unsafe { CStr::from_ptr(sys::ggml_backend_name(ptr)) }.to_string_lossy().into_owned();
        Self { ptr, name }
    }

    /// ggml's name of the backend.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        unsafe { sys::ggml_backend_free(self.ptr) }
    }
}

/// Element types a tensor can be created from.
pub trait Element: Copy {
    const TYPE: sys::ggml_type;
}
impl Element for f32 {
    const TYPE: sys::ggml_type = sys::ggml_type::GGML_TYPE_F32;
}
impl Element for f16 {
    const TYPE: sys::ggml_type = sys::ggml_type::GGML_TYPE_F16;
}
impl Element for i16 {
    const TYPE: sys::ggml_type = sys::ggml_type::GGML_TYPE_I16;
}
impl Element for i32 {
    const TYPE: sys::ggml_type = sys::ggml_type::GGML_TYPE_I32;
}

/// A tensor of a [`Graph`] (valid while the graph lives).
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    ptr: *mut sys::ggml_tensor,
    _graph: PhantomData<&'g ()>,
}

impl Tensor<'_> {
    fn ne(&self) -> [i64; 4] {
        unsafe { (*self.ptr).ne }
    }
    fn ty(&self) -> sys::ggml_type {
        unsafe { (*self.ptr).type_ }
    }
    fn name(&self) -> String {
        unsafe { CStr::from_ptr((*self.ptr).name.as_ptr()) }.to_string_lossy().into_owned()
    }
}

/// One graph: a ggml context holding its tensors, the data to upload, and
/// after [`Graph::compute`] the backend buffer.
pub struct Graph<'b> {
    backend: &'b Backend,
    ctx: *mut sys::ggml_context,
    uploads: RefCell<Vec<(*mut sys::ggml_tensor, Vec<u8>)>>,
    buffer: Cell<sys::ggml_backend_buffer_t>,
}

const MAX_TENSORS: usize = 64;

impl<'b> Graph<'b> {
    /// An empty graph on `backend` (room for 64 tensors).
    ///
    /// # Errors
    /// [`GgmlError::ContextInit`] when ggml cannot create the context.
    pub fn new(backend: &'b Backend) -> Result<Self> {
        let mem = unsafe { sys::ggml_tensor_overhead() * MAX_TENSORS + sys::ggml_graph_overhead() };
        let params = sys::ggml_init_params { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: true };
        let ctx = unsafe { sys::ggml_init(params) };
        if ctx.is_null() {
            return Err(GgmlError::ContextInit);
        }
        Ok(Self { backend, ctx, uploads: RefCell::new(Vec::new()), buffer: Cell::new(std::ptr::null_mut()) })
    }

    /// A tensor of shape `ne` (ggml order, fastest first) holding `data`.
    ///
    /// # Errors
    /// [`GgmlError::Shape`] when `ne` has no or more than 4 dimensions, a
    /// dimension is not positive, `data` does not hold their product, or
    /// `name` contains NUL.
    pub fn tensor<T: Element>(&self, name: &str, ne: &[i64], data: &[T]) -> Result<Tensor<'_>> {
        let shape_err = |detail: String| GgmlError::Shape { name: name.into(), detail };
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&n| n <= 0) {
            return Err(shape_err(format!("shape {ne:?} must have 1-4 positive dimensions")));
        }
        let n: i64 = ne.iter().product();
        if n as usize != data.len() {
            return Err(shape_err(format!("shape {ne:?} holds {n} elements, data has {}", data.len())));
        }
        if !self.buffer.get().is_null() {
            return Err(GgmlError::AlreadyComputed);
        }
        if self.uploads.borrow().len() >= MAX_TENSORS - 8 {
            return Err(shape_err("too many tensors in one graph".into()));
        }
        let t = unsafe { sys::ggml_new_tensor(self.ctx, T::TYPE, ne.len() as i32, ne.as_ptr()) };
        let cname = CString::new(name).map_err(|_| shape_err("name contains NUL".into()))?;
        unsafe { sys::ggml_set_name(t, cname.as_ptr()) };
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) }.to_vec();
        self.uploads.borrow_mut().push((t, bytes));
        Ok(Tensor { ptr: t, _graph: PhantomData })
    }

    fn expect(&self, t: &Tensor, what: &str, ty: sys::ggml_type, ne: &[i64]) -> Result<()> {
        let got = t.ne();
        let want: Vec<i64> = (0..4).map(|i| ne.get(i).copied().unwrap_or(1)).collect();
        if t.ty() != ty || got[..] != want[..] {
            return Err(GgmlError::Shape {
                name: t.name(),
                detail: format!("{what} must be {ty:?} {:?}, got {:?} {:?}", &want[..ne.len()], t.ty(), got),
            });
        }
        Ok(())
    }

    /// Checks a code tensor by the crate's shape rule
    /// ([`LinearShape::from_code_dims`]), returns (K, IC, OC, E).
    fn code_dims(&self, code: &Tensor, moe: bool) -> Result<(i64, i64, i64, i64)> {
        let ne = code.ne();
        let name = code.name();
        let err = |d: String| GgmlError::Shape { name: name.clone(), detail: d };
        if code.ty() != sys::ggml_type::GGML_TYPE_I16 {
            return Err(err(format!("code must be I16, got {:?}", code.ty())));
        }
        if !moe && ne[3] != 1 {
            return Err(err("a dense code is 3-D [16K, OC/16, IC/16]".into()));
        }
        // ggml's ne is the checkpoint shape [IC/16, OC/16, 16K] reversed.
        let s = LinearShape::from_code_dims(&name, &[ne[2], ne[1], ne[0]]).map_err(|e| {
            let msg = e.to_string();
            err(msg.strip_prefix(&format!("{name}: ")).unwrap_or(&msg).to_string())
        })?;
        Ok((s.k as i64, s.ic as i64, s.oc as i64, ne[3]))
    }

    fn opt_vec(&self, t: Option<Tensor>, what: &str, n: i64, e: Option<i64>) -> Result<*mut sys::ggml_tensor> {
        let Some(t) = t else { return Ok(std::ptr::null_mut()) };
        let shared = t.ne()[1] == 1;
        match e {
            Some(e) if !shared => self.expect(&t, what, sys::ggml_type::GGML_TYPE_F32, &[n, e])?,
            _ => self.expect(&t, what, sys::ggml_type::GGML_TYPE_F32, &[n])?,
        }
        Ok(t.ptr)
    }

    /// Checks rin/rout (and the optional vectors) of a linear with `ic`
    /// inputs and `oc` outputs, per expert when `e` is given; returns the
    /// raw pointers in source order (rin, rout, s_in, s_out, bias).
    #[allow(clippy::too_many_arguments)]
    fn sidecars(
        &self,
        ic: i64,
        oc: i64,
        e: Option<i64>,
        rin: Tensor,
        rout: Tensor,
        s_in: Option<Tensor>,
        s_out: Option<Tensor>,
        bias: Option<Tensor>,
    ) -> Result<[*mut sys::ggml_tensor; 5]> {
        let dims = |n: i64| -> Vec<i64> { std::iter::once(n).chain(e).collect() };
        self.expect(&rin, "rin", sys::ggml_type::GGML_TYPE_F16, &dims(ic))?;
        self.expect(&rout, "rout", sys::ggml_type::GGML_TYPE_F16, &dims(oc))?;
        Ok([rin.ptr, rout.ptr, self.opt_vec(s_in, "s_in", ic, e)?, self.opt_vec(s_out, "s_out", oc, e)?, self.opt_vec(bias, "bias", oc, e)?])
    }

    /// `GGML_OP_ESCHA_LINEAR`: code `[16K, OC/16, IC/16]` I16, x `[IC, ...]`
    /// F32, rin `[IC]` / rout `[OC]` F16, optional s_in/s_out/bias F32.
    ///
    /// # Errors
    /// [`GgmlError::Shape`], naming the tensor, when an operand breaks the
    /// shape rule of a coded linear (`validate`) or has the wrong type.
    #[allow(clippy::too_many_arguments)]
    pub fn escha_linear<'g>(
        &'g self,
        code: Tensor<'g>,
        x: Tensor<'g>,
        rin: Tensor<'g>,
        rout: Tensor<'g>,
        s_in: Option<Tensor<'g>>,
        s_out: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
    ) -> Result<Tensor<'g>> {
        let (_, ic, oc, _) = self.code_dims(&code, false)?;
        let xn = x.ne();
        if x.ty() != sys::ggml_type::GGML_TYPE_F32 || xn[0] != ic {
            return Err(GgmlError::Shape { name: x.name(), detail: format!("x must be F32 [{ic}, ...], got {:?} {xn:?}", x.ty()) });
        }
        let [ri, ro, si, so, b] = self.sidecars(ic, oc, None, rin, rout, s_in, s_out, bias)?;
        let t = unsafe { sys::ggml_escha_linear(self.ctx, code.ptr, x.ptr, ri, ro, si, so, b) };
        Ok(Tensor { ptr: t, _graph: PhantomData })
    }

    /// `GGML_OP_ESCHA_MOE`: code `[16K, OC/16, IC/16, E]`, x `[IC, NX, T]`
    /// (NX 1 or n_used), ids `[n_used, T]` I32, rin `[IC, E]`, rout
    /// `[OC, E]`, optional s_in/s_out/bias `[n, E]` or shared `[n]`.
    ///
    /// # Errors
    /// [`GgmlError::Shape`], naming the tensor, when an operand breaks the
    /// shape rule or x and ids disagree on the tokens or slots.
    #[allow(clippy::too_many_arguments)]
    pub fn escha_moe<'g>(
        &'g self,
        code: Tensor<'g>,
        x: Tensor<'g>,
        ids: Tensor<'g>,
        rin: Tensor<'g>,
        rout: Tensor<'g>,
        s_in: Option<Tensor<'g>>,
        s_out: Option<Tensor<'g>>,
        bias: Option<Tensor<'g>>,
    ) -> Result<Tensor<'g>> {
        let (_, ic, oc, e) = self.code_dims(&code, true)?;
        let (xn, idn) = (x.ne(), ids.ne());
        if ids.ty() != sys::ggml_type::GGML_TYPE_I32 || idn[2] != 1 || idn[3] != 1 {
            return Err(GgmlError::Shape { name: ids.name(), detail: format!("ids must be I32 [n_used, T], got {:?} {idn:?}", ids.ty()) });
        }
        if x.ty() != sys::ggml_type::GGML_TYPE_F32 || xn[0] != ic || xn[2] != idn[1] || xn[3] != 1 || idn[0] % xn[1] != 0 {
            return Err(GgmlError::Shape {
                name: x.name(),
                detail: format!("x must be F32 [{ic}, 1 or n_used={}, T={}], got {:?} {xn:?}", idn[0], idn[1], x.ty()),
            });
        }
        let [ri, ro, si, so, b] = self.sidecars(ic, oc, Some(e), rin, rout, s_in, s_out, bias)?;
        let t = unsafe { sys::ggml_escha_moe(self.ctx, code.ptr, x.ptr, ids.ptr, ri, ro, si, so, b) };
        Ok(Tensor { ptr: t, _graph: PhantomData })
    }

    /// Sets the codebook id that an escha op's parameters carry (the
    /// constructors write [`crate::format::CODEBOOK_CBA`], the only one the
    /// format defines). A backend refuses an op whose codebook it does not
    /// implement, so [`Graph::compute`] then returns
    /// [`GgmlError::Unsupported`].
    ///
    /// # Errors
    /// [`GgmlError::Shape`] when `op` is not an escha op.
    pub fn set_codebook(&self, op: Tensor<'_>, id: i32) -> Result<()> {
        let name = unsafe { CStr::from_ptr(sys::ggml_op_name((*op.ptr).op)) }.to_string_lossy().into_owned();
        if name != "ESCHA_LINEAR" && name != "ESCHA_MOE" {
            return Err(GgmlError::Shape { name: op.name(), detail: format!("{name} is not an escha op") });
        }
        // SAFETY: op points to a live tensor of this graph's context (its
        // lifetime ties it to the graph), and op_params is plain i32 storage.
        unsafe { (*op.ptr).op_params[crate::format::OP_PARAM_CODEBOOK] = id };
        Ok(())
    }

    /// Allocates the tensors on the backend, uploads the data, computes the
    /// graph ending in `out` and returns `out`'s values.
    ///
    /// # Errors
    /// [`GgmlError::AlreadyComputed`] on a second call,
    /// [`GgmlError::Unsupported`] (naming the node) when the backend does not
    /// take a node, [`GgmlError::Alloc`] when the backend buffer cannot be
    /// allocated, [`GgmlError::Compute`] with ggml's status on failure.
    pub fn compute(&self, out: Tensor) -> Result<Vec<f32>> {
        if !self.buffer.get().is_null() {
            return Err(GgmlError::AlreadyComputed);
        }
        let gf = unsafe { sys::ggml_new_graph(self.ctx) };
        unsafe { sys::ggml_build_forward_expand(gf, out.ptr) };
        for i in 0..unsafe { sys::ggml_graph_n_nodes(gf) } {
            let node = unsafe { sys::ggml_graph_node(gf, i) };
            if !unsafe { sys::ggml_backend_supports_op(self.backend.ptr, node) } {
                let op = unsafe { CStr::from_ptr(sys::ggml_op_name((*node).op)) }.to_string_lossy().into_owned();
                let tensor = Tensor { ptr: node, _graph: PhantomData }.name();
                return Err(GgmlError::Unsupported { backend: self.backend.name.clone(), op, tensor });
            }
        }
        self.buffer.set(unsafe { sys::ggml_backend_alloc_ctx_tensors(self.ctx, self.backend.ptr) });
        if self.buffer.get().is_null() {
            return Err(GgmlError::Alloc);
        }
        for (t, data) in self.uploads.borrow().iter() {
            unsafe { sys::ggml_backend_tensor_set(*t, data.as_ptr().cast(), 0, data.len()) };
        }
        let st = unsafe { sys::ggml_backend_graph_compute(self.backend.ptr, gf) };
        if st != sys::ggml_status::GGML_STATUS_SUCCESS {
            return Err(GgmlError::Compute(st as i32));
        }
        let n = unsafe { sys::ggml_nbytes(out.ptr) } / 4;
        let mut v = vec![0f32; n];
        unsafe { sys::ggml_backend_tensor_get(out.ptr, v.as_mut_ptr().cast(), 0, n * 4) };
        Ok(v)
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        unsafe {
            if !self.buffer.get().is_null() {
                sys::ggml_backend_buffer_free(self.buffer.get());
            }
            sys::ggml_free(self.ctx);
        }
    }
}
