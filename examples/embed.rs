//! Mean-pooled embeddings of texts through an Escha GGUF, and their cosine
//! similarities.
//!
//!     cargo run --release --features llama --example embed -- MODEL.gguf "first text" "second text" ...
use escha_ggml::llama::{Backend, Context, ContextParams, Model, ModelParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: embed MODEL.gguf TEXT...")?;
    let texts: Vec<String> = args.collect();
    if texts.is_empty() {
        return Err("give at least one text".into());
    }
    let backend = Backend::init();
    let model = Model::load(&backend, &path, &ModelParams::default())?;
    let mut ctx = Context::new(&model, &ContextParams { embeddings: true, ..ContextParams::default() })?;
    let mut all = Vec::new();
    for t in &texts {
        let tokens = model.tokenize(t, true)?;
        ctx.clear();
        // Every token's output kept, then averaged (models without their own pooling).
        let entries: Vec<_> = tokens.iter().enumerate().map(|(i, &tok)| (tok, i as i32, 0, true)).collect();
        ctx.decode(&entries)?;
        let mut mean = vec![0f32; model.n_embd()];
        for i in 0..tokens.len() {
            for (m, e) in mean.iter_mut().zip(ctx.embeddings(i as i32)?) {
                *m += e / tokens.len() as f32;
            }
        }
        let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        mean.iter_mut().for_each(|x| *x /= norm);
        println!("{t:?}: {} dims, first {:?}", mean.len(), &mean[..4.min(mean.len())]);
        all.push(mean);
    }
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            let cos: f32 = all[i].iter().zip(&all[j]).map(|(a, b)| a * b).sum();
            println!("cosine({i}, {j}) = {cos:.4}");
        }
    }
    Ok(())
}
