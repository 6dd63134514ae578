//! State beyond rows per token through everything that splits a sequence,
//! on the real fixtures: the hybrid families' recurrent state (Qwen3-Next,
//! Qwen3.5, the Kimi Delta Attention of Kimi Linear, Kimi K3 and GLM-5.3-Flash, the
//! latter's pooled indexer keys with their open pool), gpt-oss's
//! sliding-window ring (a window of 6, shorter than the prompt),
//! DeepSeek V4's ring of 4 beside its compressors' open windows, and
//! Inkling's rings and short-convolution states (attention's and the FFN's). A session
//! saved and reopened, a prefix reused after a cut, and chunked prefill give
//! the tokens of one uninterrupted greedy run, with an expert cache smaller
//! than one layer.

use std::ops::ControlFlow;
use std::path::Path;

use strata_engine::{Engine, EngineOptions, GenerateOptions, Session};
use strata_format::{ConvertOptions, QuantPreset};

const FAMILIES: [&str; 9] = [
    "qwen3_next",
    "qwen3_5_moe",
    "gpt_oss",
    "kimi_linear",
    "glm5_next",
    "deepseek_v4",
    "inkling",
    "qwen4_exp",
    "kimi_k3",
];
const PROMPT: [u32; 9] = [17, 44, 5, 230, 91, 12, 150, 7, 66];

fn engine(dir: &Path, family: &str, prefill_chunk_tokens: Option<usize>) -> Engine {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf");
    let model = dir.join("model");
    if !model.exists() {
        strata_format::convert(hf, &model, &ConvertOptions::new(QuantPreset::F32)).unwrap();
    }
    let options = EngineOptions {
        usage_file: Some(dir.join("usage.json")),
        prefill_chunk_tokens,
        expert_cache_bytes: Some(16 << 10),
        ..EngineOptions::default()
    };
    Engine::open(&model, &options).unwrap()
}

fn greedy(session: &mut Session<'_>, prompt: &[u32], n: usize) -> Vec<u32> {
    let options = GenerateOptions { max_new_tokens: n, ignore_eos: true, ..GenerateOptions::default() };
    session.generate(prompt, &options, |_| ControlFlow::Continue(())).unwrap().tokens
}

#[test]
fn a_session_with_state_saved_and_reopened_continues_as_one_run() {
    for family in FAMILIES {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path(), family, None);
        let whole = greedy(&mut engine.session(), &PROMPT, 12);
        let kv = dir.path().join("kv");
        let (mut session, _) = engine.open_session(&kv, "s").unwrap();
        let mut got = greedy(&mut session, &PROMPT, 6);
        drop(session);
        let (mut session, report) = engine.open_session(&kv, "s").unwrap();
        assert_eq!(report.rerun_tokens, 0, "{family}: reopening runs nothing again");
        got.extend(greedy(&mut session, &[], 6));
        assert_eq!(got, whole, "{family}");
    }
}

#[test]
fn a_session_with_state_cut_back_and_chunked_prefill_give_the_tokens_of_one_pass() {
    for family in FAMILIES {
        let dir = tempfile::tempdir().unwrap();
        let whole = greedy(&mut engine(dir.path(), family, None).session(), &PROMPT, 10);
        // Prefill in pieces of 2 tokens.
        let chunked = engine(dir.path(), family, Some(2));
        assert_eq!(greedy(&mut chunked.session(), &PROMPT, 10), whole, "{family}: chunked prefill");
        // Run ahead, cut back into the answer (no snapshot there: the gap is
        // run again), and continue.
        let mut session = chunked.session();
        greedy(&mut session, &PROMPT, 10);
        session.truncate(PROMPT.len() + 4).unwrap();
        assert_eq!(greedy(&mut session, &[], 6), whole[4..10], "{family}: after a cut");
    }
}
