//! The safe model API (`escha_ggml::llama`) on a real Escha GGUF. The
//! models are made by tests/qwen35-e2e.sh (the small Qwen3.5 dense and MoE
//! models) and examples/gemma-demo.sh --check (Gemma-3-270M, block 0
//! coded), which run these tests with `--ignored` and the paths in the
//! environment:
//!   ESCHA_LLAMA_TEST_MODEL  an Escha GGUF
//!   ESCHA_LLAMA_TEST_TWIN   its decoded twin (`escha decode`)
//!   ESCHA_LLAMA_BAD_MODEL   the model without one escha tensor's rin
//!   ESCHA_LLAMA_BAD_TENSOR  that tensor's stem (`blk.0.ffn_up`)
//!   ESCHA_LLAMA_TEST_MOE    an Escha GGUF with coded experts (the MoE run;
//!                           the others skip `expert_biases`)
//! Run without them (`--ignored` on its own), each test fails naming the
//! variable it lacks.
#![cfg(feature = "llama")]

mod common;

use common::{assert_within, order_bound};
use escha_ggml::contract::{coded_weights, CodedData, CodedGguf};
use escha_ggml::cref;
use escha_ggml::gguf::{GgmlType, GgufFile, GgufWriter};
use escha_ggml::llama::{Backend, Context, ContextParams, KvOverride, LlamaError, Model, ModelParams, Observer, Sampler, Stage, Tensor};
use escha_ggml::reference::{Moe, Routing};
use escha_ggml::rng::Rng;
use escha_ggml::validate::MoeShape;
use half::f16;
use std::sync::{Arc, Mutex};

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

/// One ESCHA_MOE node as llama.cpp computed it.
struct MoeNode {
    stem: String,
    x: Vec<f32>,
    x_ne: [i64; 4],
    ids: Vec<i32>,
    ids_ne: [i64; 4],
    y: Vec<f32>,
}

/// Keeps every ESCHA_MOE node's input, routing and output.
struct MoeNodes(Arc<Mutex<Vec<MoeNode>>>);

impl Observer for MoeNodes {
    fn wants(&mut self, _name: &str, op: &str) -> bool {
        op == "ESCHA_MOE"
    }
    fn observe(&mut self, t: &Tensor<'_>) {
        let (code, x, ids) = (t.src(0).unwrap(), t.src(1).unwrap(), t.src(2).unwrap());
        self.0.lock().unwrap().push(MoeNode {
            stem: code.name().strip_suffix(".escha_code").unwrap_or_else(|| panic!("code source named {}", code.name())).into(),
            x: x.to_f32().unwrap(),
            x_ne: x.ne(),
            ids: ids.to_i32().unwrap(),
            ids_ne: ids.ne(),
            y: t.to_f32().unwrap(),
        });
    }
}

/// Expert biases end to end: ESCHA_LLAMA_TEST_MOE's coded expert weights
/// are given random per-expert biases (`<stem>.bias`, [OC, E]: the
/// architecture has none, so the escha loader makes them the op's), and
/// every ESCHA_MOE node llama.cpp computes must equal the C reference on that
/// node's own input and routing with the file's weights, scales and biases
/// (within the summation-order bound). The same reference without the
/// biases, or with expert 0's for every expert, must not match.
#[test]
#[ignore = "needs the MoE model of tests/qwen35-e2e.sh"]
fn expert_biases_reach_the_escha_moe_op() {
    let src = path("ESCHA_LLAMA_TEST_MOE");
    let f = GgufFile::open(&src).unwrap();
    // Each coded expert weight (the checked reader of the contract), its
    // data, and the bias it gets.
    let mut rng = Rng::new(20);
    let experts: Vec<(MoeShape, CodedGguf, CodedData, Vec<f32>)> = coded_weights(&f)
        .unwrap()
        .into_iter()
        .filter(|c| c.experts > 1)
        .map(|c| {
            assert!(c.bias.is_none(), "{src} already has {}.bias", c.stem);
            let shape = MoeShape { k: c.shape.k, e: c.experts, ic: c.shape.ic, oc: c.shape.oc };
            let data = c.read(&f).unwrap();
            // f16-representable, as a checkpoint's bias widened to F32
            let bias = rng.f32s(shape.e * shape.oc, 0.0, 0.5).into_iter().map(|v| f16::from_f32(v).to_f32()).collect();
            (shape, c, data, bias)
        })
        .collect();
    assert!(!experts.is_empty(), "{src}: no coded expert weights");
    let dir = std::env::temp_dir().join(format!("escha-llama-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_bias = dir.join("moe-expert-bias.gguf");
    let mut w = GgufWriter::new();
    w.copy_kv(&f);
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims()]).unwrap();
    }
    for (s, c, ..) in &experts {
        w.add_tensor(&format!("{}.bias", c.stem), GgmlType::GGML_TYPE_F32, &[s.oc as i64, s.e as i64]).unwrap();
    }
    let mut out = w.create(&with_bias).unwrap();
    for t in f.tensors() {
        out.write_tensor(&t.name, &f.read(t).unwrap()).unwrap();
    }
    for (_, c, _, bias) in &experts {
        out.write_tensor(&format!("{}.bias", c.stem), bytemuck::cast_slice(bias)).unwrap();
    }
    out.finish().unwrap();

    let model = Model::load(&Backend::init(), with_bias.to_str().unwrap(), &ModelParams::default()).unwrap();
    let nodes = Arc::new(Mutex::new(Vec::new()));
    let params = ContextParams { n_ctx: 256, n_threads: 2, ..ContextParams::default() };
    let mut ctx = Context::with_observer(&model, &params, MoeNodes(nodes.clone())).unwrap();
    ctx.eval(&model.tokenize("Experts with biases of their own, routed per token.", true).unwrap(), 0, 0).unwrap();
    drop(ctx);
    std::fs::remove_dir_all(&dir).unwrap();

    let nodes = nodes.lock().unwrap();
    let seen: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.stem.as_str()).collect();
    assert_eq!(seen.len(), experts.len(), "ESCHA_MOE nodes seen for {seen:?}, coded expert weights {}", experts.len());
    let (mut slots, mut total, mut off_without, mut off_expert0, mut outputs) = (0, 0, 0, 0, 0);
    for n in nodes.iter() {
        let (s, _, d, bias) = experts.iter().find(|(_, c, ..)| c.stem == n.stem).unwrap();
        let expert0: Vec<f32> = (0..s.e).flat_map(|_| bias[..s.oc].to_vec()).collect();
        let (n_used, tokens, nx) = (n.ids_ne[0] as usize, n.ids_ne[1] as usize, n.x_ne[1] as usize);
        assert_eq!((n.x_ne[0] as usize, n.x_ne[2] as usize), (s.ic, tokens), "{}: x is [{:?}]", n.stem, n.x_ne);
        let routing = Routing { ids: &n.ids, n_used, tokens, nx };
        let moe = |bias| Moe {
            name: &n.stem,
            shape: *s,
            code: &d.code,
            rin: &d.rin,
            rout: &d.rout,
            s_in: d.s_in.as_deref(),
            s_out: d.s_out.as_deref(),
            bias,
        };
        let want = cref::moe(&moe(Some(bias)), &n.x, &routing).unwrap();
        let without = cref::moe(&moe(None), &n.x, &routing).unwrap();
        let wrong = cref::moe(&moe(Some(&expert0)), &n.x, &routing).unwrap();
        for t in 0..tokens {
            for u in 0..n_used {
                let ex = n.ids[t * n_used + u] as usize;
                let xr = t * nx + if nx == 1 { 0 } else { u };
                let bound = order_bound(&moe(Some(bias)).expert(ex), &n.x[xr * s.ic..(xr + 1) * s.ic], 1);
                let o = (t * n_used + u) * s.oc;
                let got = &n.y[o..o + s.oc];
                assert_within(&format!("{} token {t} slot {u} (expert {ex})", n.stem), got, &want[o..o + s.oc], &bound);
                let off = |r: &[f16]| (0..s.oc).filter(|&c| (got[c] as f64 - r[o + c].to_f64()).abs() > bound[c]).count();
                off_without += off(&without);
                if ex != 0 {
                    off_expert0 += off(&wrong);
                    outputs += s.oc;
                }
                slots += 1;
                total += s.oc;
            }
        }
    }
    eprintln!(
        "{} ESCHA_MOE nodes, {slots} slots: all within the bound of the reference with the file's expert biases; \
         without them {off_without} outputs, with expert 0's for every expert {off_expert0} of {outputs} (other experts' slots) fall outside",
        nodes.len()
    );
    assert!(off_without * 2 > total, "the biases hardly move the outputs: {off_without} of {total} outside without them");
    assert!(outputs > 0 && off_expert0 * 2 > outputs, "expert 0's biases pass for other experts: {off_expert0} of {outputs}");
}

/// Counts the escha nodes it sees, and panics at the `panic_at`-th.
struct EschaNodes(Arc<Mutex<usize>>, usize);

impl Observer for EschaNodes {
    fn wants(&mut self, _name: &str, op: &str) -> bool {
        op.starts_with("ESCHA_")
    }
    fn observe(&mut self, t: &Tensor<'_>) {
        assert!(t.to_f32().unwrap().iter().all(|v| v.is_finite()), "{}", t.name());
        let n = {
            let mut n = self.0.lock().unwrap();
            *n += 1;
            *n
        };
        assert!(n != self.1, "deliberately, at {}", t.name());
    }
}

/// An observer sees the escha ops of the graph; one that panics makes the
/// evaluation fail with its message (nothing unwinds into C), and the
/// context stays usable.
#[test]
#[ignore = "needs the models of tests/qwen35-e2e.sh"]
fn an_observer_sees_the_escha_ops_and_its_panic_fails_the_evaluation() {
    let m = load("ESCHA_LLAMA_TEST_MODEL");
    let tokens = m.tokenize(PROMPT, true).unwrap();
    let params = ContextParams { n_ctx: 256, n_threads: 2, ..ContextParams::default() };
    let seen = Arc::new(Mutex::new(0));
    let mut ctx = Context::with_observer(&m, &params, EschaNodes(seen.clone(), 0)).unwrap();
    ctx.eval(&tokens, 0, 0).unwrap();
    let all = *seen.lock().unwrap();
    assert!(all > 0, "no ESCHA_ node in the graph of a coded model");
    drop(ctx);
    let seen2 = Arc::new(Mutex::new(0));
    let mut ctx = Context::with_observer(&m, &params, EschaNodes(seen2.clone(), 2)).unwrap();
    match ctx.eval(&tokens, 0, 0) {
        Err(LlamaError::Decode { message, .. }) => assert!(message.contains("deliberately"), "{message}"),
        other => panic!("a panicking observer gave {other:?}"),
    }
    assert_eq!(*seen2.lock().unwrap(), 2, "nodes observed after the panic");
    ctx.clear();
    eprintln!("observer: {all} escha nodes in one evaluation of {} tokens; a panic at the 2nd fails the evaluation", tokens.len());
}
