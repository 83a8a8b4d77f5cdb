//! Raw bindings (bindgen) to the ggml headers of the working tree: what the
//! safe API uses, nothing more.

use crate::util::{fail, out_dir};
use std::path::Path;

pub fn generate(tree: &Path) {
    let inc = tree.join("ggml/include");
    let b = bindgen::Builder::default()
        .header(inc.join("ggml.h").display().to_string())
        .header(inc.join("ggml-alloc.h").display().to_string())
        .header(inc.join("ggml-backend.h").display().to_string())
        .header(inc.join("ggml-cpu.h").display().to_string())
        .header(inc.join("gguf.h").display().to_string())
        .clang_arg(format!("-I{}", inc.display()))
        // What the safe API uses, nothing more.
        .allowlist_function("ggml_(init|free|new_tensor|set_name|nbytes|escha_linear|escha_moe|new_graph|build_forward_expand|graph_n_nodes|graph_node|tensor_overhead|graph_overhead|op_name|get_type_traits|type_name|row_size)")
        .allowlist_function("gguf_(init_empty|init_from_file|free|get_alignment|get_data_offset|get_n_kv|find_key|get_key|get_kv_type|get_val_u32|get_val_str|get_val_bool|get_arr_type|get_arr_n|get_arr_data|get_n_tensors|find_tensor|get_tensor_offset|get_tensor_name|get_tensor_ne|get_tensor_type|get_tensor_size|remove_key|set_val_u32|set_val_bool|set_val_str|set_kv|add_tensor|get_meta_size|get_meta_data|type_name)")
        .allowlist_function("ggml_backend_(cpu_init|cpu_set_n_threads|cpu_set_use_ref|free|name|graph_compute|alloc_ctx_tensors|buffer_free|tensor_set|tensor_get|supports_op|init_by_name)")
        .allowlist_type("ggml_(type|status|init_params|type_traits)")
        .allowlist_type("gguf_(type|init_params)")
        .allowlist_var("GGML_(MAX_DIMS|DEFAULT_GRAPH_SIZE)")
        .rustified_enum("ggml_type")
        .rustified_enum("ggml_status")
        .rustified_enum("gguf_type")
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen on ggml.h failed: {e} (is libclang installed?)")));
    b.write_to_file(out_dir().join("ggml_sys.rs")).unwrap();
}

/// Raw bindings to `llama.h` (feature `llama`): its functions and types,
/// for the safe model API ([`escha_ggml::llama`]).
#[cfg(feature = "llama")]
pub fn generate_llama(tree: &Path) {
    let b = bindgen::Builder::default()
        .header(tree.join("include/llama.h").display().to_string())
        .clang_arg(format!("-I{}", tree.join("ggml/include").display()))
        .allowlist_function("llama_.*")
        .allowlist_type("llama_.*")
        .allowlist_var("LLAMA_.*")
        .allowlist_type("ggml_log_(level|callback)")
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen on llama.h failed: {e} (is libclang installed?)")));
    b.write_to_file(out_dir().join("llama_sys.rs")).unwrap();
}
