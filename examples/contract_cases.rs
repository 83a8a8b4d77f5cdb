//! Writes one copy of an Escha GGUF per rule of the tensor contract that it
//! breaks (`escha_ggml::contract::cases`), with `cases.tsv` listing each
//! file, the key or tensor its refusal must name, and whether only
//! llama.cpp's loader can see it. `tests/qwen35-e2e.sh` feeds them to
//! `escha decode` and to llama.cpp.
//!
//! ```sh
//! cargo run --release --example contract_cases -- model-escha.gguf cases/
//! ```
use escha_ggml::contract::cases;
use escha_ggml::gguf::GgufFile;
use std::io::Write;
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() == 2, "usage: contract_cases IN.gguf OUT_DIR");
    let src = GgufFile::open(&args[0])?;
    let stem = cases::first_stem(&src).ok_or_else(|| anyhow::anyhow!("{}: no coded weight", args[0]))?;
    let dir = Path::new(&args[1]);
    std::fs::create_dir_all(dir)?;
    let mut tsv = std::fs::File::create(dir.join("cases.tsv"))?;
    for c in cases::all(&stem) {
        cases::write(&src, &stem, &c, &dir.join(format!("{}.gguf", c.id)))?;
        writeln!(tsv, "{}\t{}\t{}", c.id, c.names, if c.loader_only { "loader" } else { "both" })?;
    }
    Ok(())
}
