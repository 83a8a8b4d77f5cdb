//! Loads an Escha GGUF and streams an answer, then prints tok/s.
//!
//!     cargo run --release --features llama --example generate -- MODEL.gguf "The capital of France is" [-n 64] [--temp 0.7 --seed 1] [--chat] [-t 4]
//!
//! Greedy unless --temp is given; --chat wraps the prompt in the model's
//! chat template. The answer goes to stdout, timings to stderr.
use escha_ggml::llama::{Backend, Context, ContextParams, Model, ModelParams, Sampler, Stage};
use std::io::Write;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(mut prompt)) = (args.next(), args.next()) else {
        return Err("usage: generate MODEL.gguf PROMPT [-n N] [--temp T] [--seed S] [--chat] [-t THREADS]".into());
    };
    let (mut n, mut temp, mut seed, mut chat, mut threads) = (64usize, None, 1u32, false, 0i32);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-n" => n = value()?.parse()?,
            "--temp" => temp = Some(value()?.parse::<f32>()?),
            "--seed" => seed = value()?.parse()?,
            "-t" => threads = value()?.parse()?,
            "--chat" => chat = true,
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let backend = Backend::init();
    let model = Model::load(&backend, &path, &ModelParams::default())?;
    eprintln!("{}: {}, {} parameters", path, model.desc(), model.n_params());
    if chat {
        prompt = model.apply_chat_template(&[("user", &prompt)])?;
    }
    let mut ctx = Context::new(&model, &ContextParams { n_threads: threads, ..ContextParams::default() })?;
    let mut sampler = match temp {
        Some(t) => Sampler::chain(&model, &[Stage::TopK(40), Stage::TopP(0.95), Stage::Temperature(t), Stage::Dist(seed)])?,
        None => Sampler::greedy(),
    };
    let tokens = model.tokenize(&prompt, true)?;
    let start = Instant::now();
    let mut generation = ctx.generate(&tokens, &mut sampler, n)?;
    let first = Instant::now();
    let mut out = std::io::stdout().lock();
    for piece in generation.by_ref() {
        out.write_all(piece?.as_bytes())?;
        out.flush()?;
    }
    let n_gen = generation.tokens.len();
    let secs = first.elapsed().as_secs_f64();
    eprintln!(
        "\nprompt {} tokens in {:.2} s; {} tokens generated at {:.1} tok/s",
        tokens.len(),
        (first - start).as_secs_f64(),
        n_gen,
        n_gen as f64 / secs.max(1e-9)
    );
    Ok(())
}
