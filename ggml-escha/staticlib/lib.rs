//! Re-exports the ggml-cpu entry points of escha-ggml so they land in this
//! static library (declared in `ggml-escha/cpu/escha_ffi.h`).
pub use escha_ggml::ffi::cpu_backend::{escha_rs_forward, escha_rs_work_size};
