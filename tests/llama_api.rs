//! The safe model API (`escha_ggml::llama`) on a real Escha GGUF. The
//! models are made by tests/qwen35-e2e.sh (the small Qwen3.5 dense and MoE
//! models) and examples/gemma-demo.sh --check (Gemma-3-270M, block 0
//! coded), which run these tests with `--ignored` and the paths in the
//! environment:
//!   ESCHA_LLAMA_TEST_MODEL  an Escha GGUF
//!   ESCHA_LLAMA_TEST_TWIN   its decoded twin (`escha decode`)
//!   ESCHA_LLAMA_BAD_MODEL   the model without one escha tensor's rin
//!   ESCHA_LLAMA_BAD_TENSOR  that tensor's stem (`blk.0.ffn_up`)
//! Run without them (`--ignored` on its own), each test fails naming the
//! variable it lacks.
#![cfg(feature = "llama")]

use escha_ggml::llama::{Backend, Context, ContextParams, KvOverride, LlamaError, Model, ModelParams, Sampler, Stage};

fn path(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("set {var} (tests/qwen35-e2e.sh runs these tests with it)"))
}

fn load(var: &str) -> Model {
    Model::load(&Backend::init(), path(var), &ModelParams::default()).unwrap_or_else(|e| panic!("{e}"))
}

const PROMPT: &str = "The three primary colours are";

fn greedy(model: &Model, n: usize) -> (String, Vec<i32>) {
    let mut ctx = Context::new(model, &ContextParams { n_ctx: 512, n_threads: 1, ..ContextParams::default() }).unwrap();
    let mut s = Sampler::greedy();
    let mut g = ctx.generate(&model.tokenize(PROMPT, true).unwrap(), &mut s, n).unwrap();
    let text: String = g.by_ref().map(|p| p.unwrap()).collect();
    (text, g.tokens.clone())
}

#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn model_facts_and_tokenizer() {
    let m = load("ESCHA_LLAMA_TEST_MODEL");
    let twin = load("ESCHA_LLAMA_TEST_TWIN");
    assert!(!m.architecture().is_empty() && m.architecture() == twin.architecture(), "{} / {}", m.architecture(), twin.architecture());
    assert!(m.desc().contains("Escha-W2 + "), "{}", m.desc());
    assert!(!twin.desc().contains("Escha"), "{}", twin.desc());
    assert_eq!(m.n_params(), twin.n_params(), "a coded weight counts as its twin's weights");
    assert_eq!(m.n_vocab(), twin.n_vocab());
    let text = "Escha codes weights in 2 and 3 bits.";
    let tokens = m.tokenize(text, false).unwrap();
    assert!(tokens.len() > 4, "{tokens:?}");
    // (a tokenizer may put a space in front of the first word)
    let back = m.detokenize(&tokens);
    assert_eq!(back.trim_start(), text, "{back:?}");
    assert_eq!(m.tokenize(text, false).unwrap(), twin.tokenize(text, false).unwrap());
}

/// Logits of every prompt position against the decoded twin: the mean KLD
/// bound of the end-to-end checks.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn logits_match_the_decoded_twin() {
    let (m, twin) = (load("ESCHA_LLAMA_TEST_MODEL"), load("ESCHA_LLAMA_TEST_TWIN"));
    let text = "Every coded linear of an Escha model is a trellis code of 16 by 16 tiles, rotated on both sides by Hadamard matrices.";
    let tokens = m.tokenize(text, true).unwrap();
    let all = |model: &Model| -> Vec<Vec<f64>> {
        let mut ctx = Context::new(model, &ContextParams { n_ctx: 512, n_threads: 2, ..ContextParams::default() }).unwrap();
        let entries: Vec<_> = tokens.iter().enumerate().map(|(i, &t)| (t, i as i32, 0, true)).collect();
        ctx.decode(&entries).unwrap();
        (0..tokens.len() as i32)
            .map(|i| {
                let l = ctx.logits(i).unwrap();
                let max = l.iter().cloned().fold(f32::MIN, f32::max) as f64;
                let z: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
                l.iter().map(|&v| (v as f64 - max) - z.ln()).collect() // log-probabilities
            })
            .collect()
    };
    let (a, b) = (all(&m), all(&twin));
    let mut kld = 0.0;
    let mut same = 0;
    for (p, q) in b.iter().zip(&a) {
        kld += p.iter().zip(q).map(|(lp, lq)| lp.exp() * (lp - lq)).sum::<f64>();
        let arg = |v: &Vec<f64>| v.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
        same += (arg(p) == arg(q)) as usize;
    }
    kld /= tokens.len() as f64;
    eprintln!("{} positions: mean KLD(twin || escha) {kld:.3e}, same top token {same}", tokens.len());
    assert!(kld < 1e-4, "mean KLD {kld:e}");
}

#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn a_refused_escha_tensor_is_a_typed_error_naming_it() {
    let (bad, stem) = (path("ESCHA_LLAMA_BAD_MODEL"), path("ESCHA_LLAMA_BAD_TENSOR"));
    match Model::load(&Backend::init(), &bad, &ModelParams::default()) {
        Err(LlamaError::Load { path, message }) => {
            assert_eq!(path, bad);
            assert!(message.contains(&format!("{stem}.escha_rin")), "the message does not name {stem}.escha_rin: {message}");
            eprintln!("refused: {message}");
        }
        Err(e) => panic!("wrong error kind: {e}"),
        Ok(_) => panic!("{bad} loaded"),
    }
    let missing = Model::load(&Backend::init(), "/nonexistent/model.gguf", &ModelParams::default());
    assert!(matches!(missing, Err(LlamaError::Load { ref message, .. }) if message == "no such file"), "{:?}", missing.err());
    // An override the loader reads: accepted, and one of a wrong type refused by llama.cpp.
    let params = ModelParams { kv_overrides: vec![("escha.apply_bias".into(), KvOverride::Bool(false))], ..ModelParams::default() };
    Model::load(&Backend::init(), path("ESCHA_LLAMA_TEST_MODEL"), &params).unwrap();
}

/// Streaming stops at a stop string, which is not yielded: the text is the
/// greedy text up to the string's first occurrence.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn generation_stops_at_a_stop_string() {
    let m = load("ESCHA_LLAMA_TEST_MODEL");
    let (full, tokens) = greedy(&m, 32);
    assert!(tokens.len() >= 8 && full.chars().count() >= 8, "too short a text to cut: {full:?}");
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let want = &full[..full.find(&stop).unwrap()];
    let mut ctx = Context::new(&m, &ContextParams { n_ctx: 512, n_threads: 1, ..ContextParams::default() }).unwrap();
    let mut s = Sampler::greedy();
    let got: String = ctx.generate(&m.tokenize(PROMPT, true).unwrap(), &mut s, 32).unwrap().stop_at(&[&stop]).map(|p| p.unwrap()).collect();
    assert_eq!(got, want, "stop string {stop:?}");
}

/// One model, two contexts on two threads: the same greedy tokens as one
/// context alone.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn two_contexts_on_two_threads_give_the_same_tokens() {
    let m = load("ESCHA_LLAMA_TEST_MODEL");
    let (_, alone) = greedy(&m, 24);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| greedy(&m, 24).1);
        let b = s.spawn(|| greedy(&m, 24).1);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, alone);
    assert_eq!(b, alone);
}

/// The progress callback sees the load climb to 1; returning false cancels it.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn load_progress_and_cancel() {
    let (b, p) = (Backend::init(), path("ESCHA_LLAMA_TEST_MODEL"));
    let mut seen = Vec::new();
    Model::load_with_progress(&b, &p, &ModelParams::default(), &mut |f| {
        seen.push(f);
        true
    })
    .unwrap();
    assert!(!seen.is_empty() && seen.windows(2).all(|w| w[0] <= w[1]) && *seen.last().unwrap() == 1.0, "{seen:?}");
    let cancelled = Model::load_with_progress(&b, &p, &ModelParams::default(), &mut |_| false);
    assert!(matches!(cancelled, Err(LlamaError::Load { ref message, .. }) if message.contains("cancelled")), "{:?}", cancelled.err());
}

/// A seeded sampler chain is deterministic, and its seed matters; several
/// sequences in one batch give each sequence's own logits.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn seeded_sampling_and_batched_sequences() {
    let m = load("ESCHA_LLAMA_TEST_MODEL");
    let prompt = m.tokenize(PROMPT, true).unwrap();
    let run = |seed: u32| -> Vec<i32> {
        let mut ctx = Context::new(&m, &ContextParams { n_ctx: 512, n_threads: 1, ..ContextParams::default() }).unwrap();
        let chain = [Stage::Penalties { last_n: 16, repeat: 1.1, freq: 0.0, present: 0.0 }, Stage::TopK(50), Stage::TopP(0.95), Stage::Temperature(1.5), Stage::Dist(seed)];
        let mut s = Sampler::chain(&m, &chain).unwrap();
        let mut g = ctx.generate(&prompt, &mut s, 24).unwrap();
        g.by_ref().for_each(|p| drop(p.unwrap()));
        g.tokens.clone()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8), "two seeds gave the same 24 tokens");
    assert!(Sampler::chain(&m, &[Stage::TopK(5)]).is_err(), "a chain must end by picking a token");
    // Two sequences side by side in one batch, against each alone.
    let other = m.tokenize("A different prompt, longer than the first one", true).unwrap();
    let last = |ctx: &Context, i: i32| -> usize {
        let l = ctx.logits(i).unwrap();
        (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap()
    };
    let alone: Vec<usize> = [&prompt, &other]
        .iter()
        .map(|t| {
            let mut ctx = Context::new(&m, &ContextParams { n_ctx: 512, n_threads: 1, ..ContextParams::default() }).unwrap();
            ctx.eval(t, 0, 0).unwrap();
            last(&ctx, -1)
        })
        .collect();
    let mut ctx = Context::new(&m, &ContextParams { n_ctx: 512, n_threads: 1, n_seq_max: 2, ..ContextParams::default() }).unwrap();
    let mut entries: Vec<_> = prompt.iter().enumerate().map(|(i, &t)| (t, i as i32, 0, i + 1 == prompt.len())).collect();
    entries.extend(other.iter().enumerate().map(|(i, &t)| (t, i as i32, 1, i + 1 == other.len())));
    ctx.decode(&entries).unwrap();
    let (i0, i1) = (prompt.len() as i32 - 1, entries.len() as i32 - 1); // batch indices of the kept tokens
    assert_eq!(vec![last(&ctx, i0), last(&ctx, i1)], alone, "each sequence's next token, batched vs alone");
}
