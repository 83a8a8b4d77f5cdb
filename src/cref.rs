//! The C reference (`ggml-escha/ref/escha_ref.c`), linked into the crate so the
//! Rust code is continuously checked against an independent
//! transcription of the contract. The raw declarations are private; the
//! wrappers validate lengths so no caller can hand C a short buffer.

use crate::error::{EschaError, Result};
use crate::reference::{Linear, Moe, Routing};
use crate::validate::LinearShape;
use half::f16;

mod sys {
    use std::os::raw::c_int;
    extern "C" {
        pub fn escha_f16_to_f32(h: u16) -> f32;
        pub fn escha_f32_to_f16(f: f32) -> u16;
        pub fn escha_cb_half(state: u16) -> u16;
        pub fn escha_tile_state(tile: *const i16, k: c_int, t: c_int) -> u16;
        pub fn escha_tile_position(t: c_int, row: *mut c_int, col: *mut c_int);
        pub fn escha_reconstruct(code: *const i16, k: c_int, ic: i64, oc: i64, w: *mut u16) -> c_int;
        pub fn escha_h128(x: *mut f32, n: i64);
        pub fn escha_linear(
            code: *const i16, k: c_int, ic: i64, oc: i64, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
            s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut u16,
        ) -> c_int;
        pub fn escha_moe(
            code: *const i16, k: c_int, e: i64, ic: i64, oc: i64, x: *const f32, nx: i64, ids: *const i32, n_used: i64,
            t: i64, rin: *const u16, rout: *const u16, s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut u16,
        ) -> c_int;
        pub fn escha_swiglu(gu: *const u16, rows: i64, inter: i64, out: *mut u16);
    }
}

fn opt_ptr<T>(v: Option<&[T]>) -> *const T {
    v.map_or(std::ptr::null(), |v| v.as_ptr())
}

fn status(name: &str, code: i32) -> Result<()> {
    match code {
        0 => Ok(()),
        c => Err(EschaError::Shape { tensor: name.into(), detail: format!("C reference rejected the input (status {c})") }),
    }
}

pub fn f16_to_f32(h: u16) -> f32 {
    // SAFETY: a pure C function of its argument.
    unsafe { sys::escha_f16_to_f32(h) }
}

pub fn f32_to_f16(f: f32) -> u16 {
    // SAFETY: a pure C function of its argument.
    unsafe { sys::escha_f32_to_f16(f) }
}

pub fn cb_half(state: u16) -> f16 {
    // SAFETY: a pure C function of its argument.
    f16::from_bits(unsafe { sys::escha_cb_half(state) })
}

pub fn tile_state(tile: &[i16], k: usize, t: usize) -> u16 {
    assert!(tile.len() == 16 * k && (k == 2 || k == 3) && t < 256);
    // SAFETY: C reads the 16*K words of `tile` (asserted above).
    unsafe { sys::escha_tile_state(tile.as_ptr(), k as i32, t as i32) }
}

pub fn tile_position(t: usize) -> (usize, usize) {
    assert!(t < 256);
    let (mut r, mut c) = (0, 0);
    // SAFETY: C writes one int through each of two live locals.
    unsafe { sys::escha_tile_position(t as i32, &mut r, &mut c) };
    (r as usize, c as usize)
}

pub fn reconstruct(code: &[i16], s: LinearShape) -> Vec<f16> {
    assert_eq!(code.len(), s.code_len());
    let mut w = vec![0u16; s.ic * s.oc];
    // SAFETY: C reads `code_len` words of `code` (asserted) and writes
    // IC * OC halves into `w`.
    let st = unsafe { sys::escha_reconstruct(code.as_ptr(), s.k as i32, s.ic as i64, s.oc as i64, w.as_mut_ptr()) };
    assert_eq!(st, 0, "C reconstruct rejected a validated shape");
    w.into_iter().map(f16::from_bits).collect()
}

pub fn h128(x: &mut [f32]) {
    assert!(x.len().is_multiple_of(128));
    // SAFETY: C transforms the `x.len()` floats of `x` in place.
    unsafe { sys::escha_h128(x.as_mut_ptr(), x.len() as i64) }
}

/// The C reference dense linear: `x [M, IC]` -> `y [M, OC]` (f16).
///
/// # Errors
/// Those of [`Linear::validate`], [`EschaError::BadLength`] when `x` does
/// not hold `m * IC` values, and [`EschaError::Shape`] when the C reference
/// rejects the input.
pub fn linear(l: &Linear, x: &[f32], m: usize) -> Result<Vec<f16>> {
    l.validate()?;
    crate::validate::check_len(l.name, "x", x.len(), m * l.shape.ic)?;
    let s = l.shape;
    let mut y = vec![0u16; m * s.oc];
    // SAFETY: every length was validated above (`s_in`, `s_out`, `bias` null
    // or of their length) and `y` holds M * OC halves.
    let st = unsafe {
        sys::escha_linear(
            l.code.as_ptr(), s.k as i32, s.ic as i64, s.oc as i64, x.as_ptr(), m as i64,
            l.rin.as_ptr() as *const u16, l.rout.as_ptr() as *const u16,
            opt_ptr(l.s_in), opt_ptr(l.s_out), opt_ptr(l.bias), y.as_mut_ptr(),
        )
    };
    status(l.name, st)?;
    Ok(y.into_iter().map(f16::from_bits).collect())
}

/// The C MoE takes per-expert vectors only (`[E, n]`).
///
/// # Errors
/// Those of [`Moe::validate`] and [`Routing::validate`];
/// [`EschaError::BadLength`] when `x` does not hold `tokens * nx * IC`
/// values or `s_in`, `s_out` or `bias` is not `[E, n]`; and
/// [`EschaError::Shape`] when the C reference rejects the input.
pub fn moe(p: &Moe, x: &[f32], r: &Routing) -> Result<Vec<f16>> {
    p.validate()?;
    r.validate(p.name, p.shape.e)?;
    let s = p.shape;
    crate::validate::check_len(p.name, "x", x.len(), r.tokens * r.nx * s.ic)?;
    for (what, v, n) in [("s_in", p.s_in, s.ic), ("s_out", p.s_out, s.oc), ("bias", p.bias, s.oc)] {
        if let Some(v) = v {
            crate::validate::check_len(p.name, what, v.len(), s.e * n)?;
        }
    }
    let mut y = vec![0u16; r.tokens * r.n_used * s.oc];
    // SAFETY: every length and id was validated above (per-expert vectors
    // `[E, n]` or null) and `y` holds T * n_used * OC halves.
    let st = unsafe {
        sys::escha_moe(
            p.code.as_ptr(), s.k as i32, s.e as i64, s.ic as i64, s.oc as i64, x.as_ptr(), r.nx as i64, r.ids.as_ptr(),
            r.n_used as i64, r.tokens as i64, p.rin.as_ptr() as *const u16, p.rout.as_ptr() as *const u16,
            opt_ptr(p.s_in), opt_ptr(p.s_out), opt_ptr(p.bias), y.as_mut_ptr(),
        )
    };
    status(p.name, st)?;
    Ok(y.into_iter().map(f16::from_bits).collect())
}

pub fn swiglu(gate_up: &[f16], rows: usize, inter: usize) -> Vec<f16> {
    assert_eq!(gate_up.len(), rows * 2 * inter);
    let mut out = vec![0u16; rows * inter];
    // SAFETY: C reads rows * 2I halves (asserted) and writes rows * I.
    unsafe { sys::escha_swiglu(gate_up.as_ptr() as *const u16, rows as i64, inter as i64, out.as_mut_ptr()) };
    out.into_iter().map(f16::from_bits).collect()
}
