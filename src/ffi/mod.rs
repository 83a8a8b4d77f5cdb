//! The crate's FFI surface, in one place:
//! - [`cpu_backend`]: the Rust CPU kernels exported to ggml-cpu;
//! - [`huge_pages`]: the request that backs an op's code in 2 MiB pages;
//! - `ggml_sys` (feature `ggml`): raw bindings to the patched ggml, wrapped
//!   safely by [`crate::ggml`];
//! - `llama_sys` (feature `llama`): raw bindings to the patched libllama,
//!   wrapped safely by [`crate::llama`].
pub mod cpu_backend;
pub mod huge_pages;
#[cfg(feature = "ggml")]
pub mod ggml_sys;
#[cfg(feature = "llama")]
pub mod llama_sys;
