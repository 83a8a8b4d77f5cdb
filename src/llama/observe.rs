//! Watching the graph as llama.cpp computes it (its scheduler's eval
//! callback): an [`Observer`] picks tensors by name and op, and reads the
//! values of each one it picked, and of that tensor's sources, once computed.

use super::LlamaError;
use crate::ffi::ggml_sys as gsys;
use crate::ffi::llama_sys as sys;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a context calls during `eval` / `decode` (`Context::with_observer`).
/// A panic in either method is caught: the rest of that evaluation is not
/// computed and the `eval` / `decode` call fails with the panic's message.
pub trait Observer: Send {
    /// Whether to see this tensor once it is computed (llama.cpp then runs
    /// the graph up to it and stops there to call [`Observer::observe`]).
    fn wants(&mut self, name: &str, op: &str) -> bool;
    /// The tensor, computed.
    fn observe(&mut self, t: &Tensor<'_>);
}

/// A context's observer and the first panic it raised in an evaluation.
pub(super) struct ObserverSlot {
    observer: Box<dyn Observer>,
    panicked: Option<String>,
}

impl ObserverSlot {
    pub(super) fn new(observer: Box<dyn Observer>) -> Self {
        Self { observer, panicked: None }
    }

    /// The panic message of the evaluation that just ran, if any (cleared).
    pub(super) fn take_panic(&mut self) -> Option<String> {
        self.panicked.take()
    }
}

/// A tensor of the graph being computed, valid during the observer's call.
pub struct Tensor<'a> {
    t: &'a sys::ggml_tensor,
}

fn c_str(p: *const std::os::raw::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: ggml's op and type names are static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

impl<'a> Tensor<'a> {
    pub fn name(&self) -> &'a str {
        // SAFETY: ggml keeps `name` NUL-terminated within its array.
        unsafe { CStr::from_ptr(self.t.name.as_ptr()) }.to_str().unwrap_or("")
    }

    /// ggml's name of the op that made it (`ESCHA_MOE`, `MUL_MAT`; `NONE` for a weight).
    pub fn op(&self) -> &'static str {
        // SAFETY: a lookup in ggml's static table, indexed by an op of a live tensor.
        c_str(unsafe { gsys::ggml_op_name(self.t.op as _) })
    }

    /// ggml's type, as one of the types this API reads.
    fn elem_type(&self) -> Option<gsys::ggml_type> {
        use gsys::ggml_type::*;
        [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32].into_iter().find(|&ty| ty as u32 == self.t.type_ as u32)
    }

    /// Elements along each dimension (ggml order: ne[0] is the row).
    pub fn ne(&self) -> [i64; 4] {
        self.t.ne
    }

    /// The op's i-th source, if it has one.
    pub fn src(&self, i: usize) -> Option<Tensor<'a>> {
        let p = *self.t.src.get(i)?;
        // SAFETY: a source of a tensor being computed is alive for the whole
        // graph computation, which outlives this call.
        (!p.is_null()).then(|| Tensor { t: unsafe { &*p } })
    }

    fn n_elements(&self) -> usize {
        self.t.ne.iter().product::<i64>() as usize
    }

    /// The raw values, row by row (views with strides included), as
    /// `elem`-byte elements.
    fn read(&self, elem: usize) -> Result<Vec<u8>, LlamaError> {
        if self.t.buffer.is_null() || self.t.nb[0] != elem {
            return Err(LlamaError::Context(format!("{}: no data to read, or not rows of {elem}-byte values", self.name())));
        }
        let [n0, n1, n2, n3] = self.t.ne.map(|v| v as usize);
        let row = n0 * elem;
        let mut out = vec![0u8; self.n_elements() * elem];
        let mut dst = 0;
        for i3 in 0..n3 {
            for i2 in 0..n2 {
                for i1 in 0..n1 {
                    let off = i1 * self.t.nb[1] + i2 * self.t.nb[2] + i3 * self.t.nb[3];
                    // SAFETY: the tensor has a buffer (checked), the row lies
                    // inside it (its strides and sizes come from ggml) and the
                    // destination holds `row` bytes from `dst`; the two
                    // `ggml_tensor` bindings are the same C struct.
                    unsafe {
                        gsys::ggml_backend_tensor_get(
                            self.t as *const sys::ggml_tensor as *const gsys::ggml_tensor,
                            out[dst..].as_mut_ptr() as *mut c_void,
                            off,
                            row,
                        )
                    };
                    dst += row;
                }
            }
        }
        Ok(out)
    }

    /// The values as f32 (an F32 or F16 tensor).
    pub fn to_f32(&self) -> Result<Vec<f32>, LlamaError> {
        let (ty, size) = match self.elem_type() {
            Some(ty @ gsys::ggml_type::GGML_TYPE_F32) => (ty, 4),
            Some(ty @ gsys::ggml_type::GGML_TYPE_F16) => (ty, 2),
            _ => return Err(LlamaError::Context(format!("{}: type {}, not f32 or f16", self.name(), self.t.type_ as u32))),
        };
        crate::gguf::to_f32(self.name(), ty, &self.read(size)?, self.n_elements()).map_err(|e| LlamaError::Context(e.to_string()))
    }

    /// The values of an I32 tensor.
    pub fn to_i32(&self) -> Result<Vec<i32>, LlamaError> {
        match self.elem_type() {
            Some(gsys::ggml_type::GGML_TYPE_I32) => Ok(self.read(4)?.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()),
            _ => Err(LlamaError::Context(format!("{}: type {}, not i32", self.name(), self.t.type_ as u32))),
        }
    }
}

/// The scheduler's eval callback: `user_data` is the context's observer slot.
///
/// # Safety
/// Called by libllama only, with `t` a live tensor of the graph being
/// computed and `user_data` the `ObserverSlot` the context registered
/// (alive, at a fixed address, until the context is freed).
pub(super) unsafe extern "C" fn eval_callback(t: *mut sys::ggml_tensor, ask: bool, user_data: *mut c_void) -> bool {
    // SAFETY: see the function's contract; the context is used by one
    // thread at a time (not Sync), so this is the only reference.
    let (slot, t) = unsafe { (&mut *(user_data as *mut ObserverSlot), Tensor { t: &*t }) };
    if slot.panicked.is_some() {
        return false; // after a panic: nothing more is observed (or computed)
    }
    let obs = &mut slot.observer;
    // A panic must not unwind into C. false from the computed-tensor call
    // makes ggml skip the rest of the graph; decode then reports the panic.
    match catch_unwind(AssertUnwindSafe(|| if ask { obs.wants(t.name(), t.op()) } else { obs.observe(&t); true })) {
        Ok(v) => v,
        Err(e) => {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            slot.panicked = Some(format!("observer panicked at {}: {}", t.name(), msg.unwrap_or_else(|| "(no message)".into())));
            false
        }
    }
}
