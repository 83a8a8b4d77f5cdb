# Included by ggml-cpu's CMakeLists inside ggml_add_cpu_backend_variant_impl
# (function scope, relative to ggml/src): the escha ops' CPU sources and the
# Rust kernels (a staticlib built by escha-ggml's build.rs, path in
# ESCHA_RUST_LIB). Without it the ops run the C reference.

list(APPEND GGML_CPU_SOURCES
    ggml-escha/cpu/ggml-cpu-escha.cpp
    ggml-escha/cpu/escha_ffi.h
    ggml-escha/include/escha-format.h
    ggml-escha/include/escha-op.h
    ggml-escha/ref/escha_ref.c
    ggml-escha/ref/escha_ref.h)

if (ESCHA_RUST_LIB)
    find_package(Threads REQUIRED)
    target_link_libraries(${GGML_CPU_NAME} PRIVATE ${ESCHA_RUST_LIB} Threads::Threads ${CMAKE_DL_LIBS} m)
    if (BUILD_SHARED_LIBS AND NOT APPLE AND NOT WIN32)
        # Keep the Rust runtime inside this library private.
        target_link_options(${GGML_CPU_NAME} PRIVATE "LINKER:--exclude-libs,ALL")
    endif()
else()
    message(WARNING "escha-ggml: ESCHA_RUST_LIB not set, escha ops use the C reference on CPU")
    target_compile_definitions(${GGML_CPU_NAME} PRIVATE GGML_ESCHA_NO_RUST)
endif()
# The reference sums a*b then adds; never let the compiler fuse it.
set_source_files_properties(ggml-escha/ref/escha_ref.c PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
