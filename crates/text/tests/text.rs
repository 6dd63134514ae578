//! Text in, text out, against Hugging Face's own code: fixtures written by
//! `xtask/fixtures/templates.py` with the pinned transformers/tokenizers.
//!
//! - chat templates (published models' and our own feature template, plus
//!   model directories read with `ChatTemplate::from_dir`) render exactly as
//!   transformers' `apply_chat_template(..., tokenize=False)`, or fail where
//!   it raises; with `tools=`, assistant tool calls and tool results for the
//!   families that have tool templates (Qwen3, Qwen3.5, DeepSeek-V3.1, Kimi
//!   K2, GLM-4.6, Mistral);
//! - tokenizers encode and decode as the Python `tokenizers` library;
//! - streaming detokenization hands out whole characters only, and its
//!   pieces add up to the full decode, however the ids are chunked;
//! - stop strings are found across chunk boundaries, and nothing that could
//!   begin one is let through early.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;
use strata_text::{ChatTemplate, Message, StopStrings, Tokenizer, eos_ids_from_dir};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The tokenizers with fixtures: two tiny ones of testdata/tokenizer/ and
/// the demo model's (its expectations in testdata/tokenizer/demo/).
const TOKENIZERS: [&str; 3] = ["bpe", "spm", "demo"];

fn tokenizer_dir(name: &str) -> PathBuf {
    match name {
        "demo" => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo"),
        _ => testdata().join("tokenizer").join(name),
    }
}

/// Loaded once per test binary: the property tests use them in every case.
fn tokenizer(name: &str) -> Tokenizer {
    static LOADED: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        TOKENIZERS.iter().map(|n| Tokenizer::from_dir(&tokenizer_dir(n)).unwrap().expect("tokenizer.json")).collect()
    });
    loaded[TOKENIZERS.iter().position(|n| *n == name).expect("a tokenizer with fixtures")].clone()
}

fn tokenizer_expected(name: &str) -> Value {
    read_json(&testdata().join("tokenizer").join(name).join("expected.json"))
}

fn messages(case: &Value) -> Vec<Message> {
    serde_json::from_value(case["messages"].clone()).unwrap()
}

// ------------------------------------------------------------------------------------------ templates

#[test]
fn templates_render_as_transformers() {
    let expected = read_json(&testdata().join("templates/expected.json"));
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 70, "{} cases", cases.len());
    let mut checked = BTreeMap::<String, usize>::new();
    for case in cases {
        let (label, template) = if let Some(name) = case["template"].as_str() {
            let source = std::fs::read_to_string(testdata().join("templates").join(name)).unwrap();
            let tokens: BTreeMap<String, String> = serde_json::from_value(case["special_tokens"].clone()).unwrap();
            (name.to_owned(), ChatTemplate::new(source, tokens).unwrap())
        } else {
            let dir = case["dir"].as_str().unwrap();
            let template = ChatTemplate::from_dir(&testdata().join(dir)).unwrap().expect("a chat template");
            (dir.to_owned(), template)
        };
        let what =
            format!("{label} / {} / add_generation_prompt={}", case["conversation"], case["add_generation_prompt"]);
        let variables = case["variables"].as_object().unwrap();
        let got = template.render_with(&messages(case), case["add_generation_prompt"].as_bool().unwrap(), variables);
        match (case.get("output").and_then(Value::as_str), case.get("error").and_then(Value::as_str)) {
            (Some(want), None) => {
                let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got, want, "{what}");
            }
            (None, Some(message)) => {
                let err = got.expect_err(&what).to_string();
                assert!(err.contains(message), "{what}: {err:?} does not carry {message:?}");
            }
            _ => panic!("{what}: case has neither output nor error"),
        }
        *checked.entry(label).or_default() += 1;
        if let Some(calls) = case["messages"].as_array().and_then(|m| m.iter().find_map(|m| m.get("tool_calls"))) {
            // The fixture passed arguments as the template reads them; the
            // template's probe must have found the same form.
            let as_mapping = calls[0]["function"]["arguments"].is_object();
            assert_eq!(template.arguments_as_mapping(), as_mapping, "{what}");
        }
    }
    for must in [
        "qwen3.jinja",
        "mixtral-instruct.jinja",
        "mistral-nemo-instruct.jinja",
        "features.jinja",
        "qwen3.5.jinja",
        "deepseek-v3.1.jinja",
        "kimi-k2.jinja",
        "glm-4.6.jinja",
        "tokenizer/bpe",
        "tokenizer/spm",
        "tokenizer/jinja",
        "../models/demo",
    ] {
        assert!(checked.contains_key(must), "no cases for {must}: {checked:?}");
    }
}

#[test]
fn directory_templates_read_tokens_and_named_lists() {
    // bpe: the demo model's template, bos_token as an AddedToken object.
    let bpe = ChatTemplate::from_dir(&testdata().join("tokenizer/bpe")).unwrap().unwrap();
    assert_eq!(bpe.special_tokens().get("bos_token").map(String::as_str), Some("<|endoftext|>"));
    assert_eq!(bpe.special_tokens().get("eos_token").map(String::as_str), Some("<|end|>"));
    assert!(!bpe.special_tokens().contains_key("unk_token"), "null is no token");
    // spm: a list of named templates; "default" is used.
    let spm = ChatTemplate::from_dir(&testdata().join("tokenizer/spm")).unwrap().unwrap();
    assert!(spm.source().contains("[INST]"));
    assert_eq!(spm.special_tokens().get("eos_token").map(String::as_str), Some("</s>"));
    // jinja: chat_template.jinja wins over tokenizer_config.json.
    let jinja = ChatTemplate::from_dir(&testdata().join("tokenizer/jinja")).unwrap().unwrap();
    assert!(jinja.path().ends_with("chat_template.jinja"));
    // A directory without any template.
    let empty = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_dir(empty.path()).unwrap().is_none());
}

#[test]
fn rendered_prompt_encodes_its_special_tokens_as_single_ids() {
    let dir = testdata().join("tokenizer/bpe");
    let template = ChatTemplate::from_dir(&dir).unwrap().unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap().unwrap();
    let prompt = template.render(&[Message::user("Hi 🤖")], true).unwrap();
    let ids = tok.encode(&prompt, false).unwrap();
    let user = tok.token_to_id("<|user|>").unwrap();
    let end = tok.token_to_id("<|end|>").unwrap();
    let assistant = tok.token_to_id("<|assistant|>").unwrap();
    assert_eq!(ids[0], user);
    assert!(ids.contains(&end) && ids.contains(&assistant), "{ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
}

// ----------------------------------------------------------------------------------------- tokenizers

#[test]
fn tokenizers_encode_and_decode_as_python() {
    for name in TOKENIZERS {
        let tok = tokenizer(name);
        let expected = tokenizer_expected(name);
        assert_eq!(tok.vocab_size() as u64, expected["vocab_size"].as_u64().unwrap(), "{name}");
        for case in expected["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let add = case["add_special_tokens"].as_bool().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let what = format!("{name} {text:?} add_special_tokens={add}");
            assert_eq!(tok.encode(text, add).unwrap(), want, "{what}");
            assert_eq!(tok.decode(&want, false).unwrap(), case["decoded"].as_str().unwrap(), "{what}");
            assert_eq!(tok.decode(&want, true).unwrap(), case["decoded_skip_special"].as_str().unwrap(), "{what}");
        }
    }
}

#[test]
fn eos_ids_join_config_and_generation_config() {
    let tok = tokenizer("bpe");
    let end = tok.token_to_id("<|end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    // As the demo model: config.json lists the same two, in the same order.
    assert_eq!(eos_ids_from_dir(&testdata().join("tokenizer/bpe"), &[end, eot]).unwrap(), vec![end, eot]);
    assert_eq!(eos_ids_from_dir(&testdata().join("tokenizer/bpe"), &[eot]).unwrap(), vec![eot, end]);
    // spm: generation_config.json has a single int.
    let eos = tokenizer("spm").token_to_id("</s>").unwrap();
    assert_eq!(eos_ids_from_dir(&testdata().join("tokenizer/spm"), &[]).unwrap(), vec![eos]);
    // The demo model: end of turn, then end of text.
    let demo = tokenizer("demo");
    let want = vec![demo.token_to_id("<|end|>").unwrap(), demo.token_to_id("<|endoftext|>").unwrap()];
    assert_eq!(eos_ids_from_dir(&tokenizer_dir("demo"), &[]).unwrap(), want);
}

// ------------------------------------------------------------------------------------ detokenization

/// Streams `ids` in the chunks `cuts` marks, checking that every piece is
/// whole characters (no U+FFFD where the full decode has none) and that the
/// text so far is always a beginning of the full decode; returns the
/// concatenation.
fn stream(tok: &Tokenizer, ids: &[u32], cuts: &[usize], skip_special: bool) -> String {
    let full = tok.decode(ids, skip_special).unwrap();
    let mut detok = tok.detokenizer(skip_special);
    let mut text = String::new();
    let mut start = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(ids.len())).collect();
    bounds.sort_unstable();
    bounds.push(ids.len());
    for end in bounds {
        if end < start {
            continue;
        }
        let piece = detok.push_many(&ids[start..end]).unwrap();
        if !full.contains('\u{FFFD}') {
            assert!(!piece.contains('\u{FFFD}'), "piece {piece:?} of {full:?}");
        }
        text.push_str(&piece);
        assert!(full.starts_with(&text), "{text:?} is not a beginning of {full:?}");
        start = end;
    }
    text.push_str(&detok.finish().unwrap());
    text
}

fn one_by_one(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let cuts: Vec<usize> = (1..ids.len()).collect();
    stream(tok, ids, &cuts, skip_special)
}

#[test]
fn detokenizer_pieces_add_up_to_the_fixture_decodings() {
    for name in TOKENIZERS {
        let tok = tokenizer(name);
        let expected = tokenizer_expected(name);
        for case in expected["cases"].as_array().unwrap() {
            let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            assert_eq!(one_by_one(&tok, &ids, false), case["decoded"].as_str().unwrap(), "{name} {ids:?}");
            assert_eq!(one_by_one(&tok, &ids, true), case["decoded_skip_special"].as_str().unwrap(), "{name} {ids:?}");
        }
    }
}

#[test]
fn detokenizer_holds_a_split_character_until_complete() {
    for name in TOKENIZERS {
        let tok = tokenizer(name);
        // The crab is in no vocabulary: it comes in byte pieces.
        let ids = tok.encode("a🦀b", false).unwrap();
        let mut detok = tok.detokenizer(false);
        let pieces: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
        assert!(pieces.len() >= 4, "{name}: {ids:?}");
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{name}: {pieces:?}");
        assert!(pieces.contains(&"🦀".to_owned()) || pieces.iter().any(|p| p.contains('🦀')), "{name}: {pieces:?}");
        assert_eq!(pieces.concat() + &detok.finish().unwrap(), "a🦀b");
        // A stream cut inside the character ends with what a full decode
        // makes of the incomplete bytes.
        let cut = &ids[..ids.len() - 2];
        assert_eq!(one_by_one(&tok, cut, false), tok.decode(cut, false).unwrap(), "{name}");
    }
}

/// Text made of the pieces that trouble detokenizers: multi-byte characters
/// in and out of the vocabulary, ZWJ sequences, spaces at word starts.
fn text_strategy() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "the",
        " quick",
        " fox",
        "Hello",
        " world",
        "!",
        " ",
        "  ",
        "\n",
        "\t",
        "é",
        "Café",
        " naïve",
        "ß",
        "—",
        "東京",
        "は",
        "日本",
        "首都",
        "。",
        "你好",
        "한국어",
        "😀",
        "🤖",
        "🎉",
        "👍🏽",
        "❤️",
        "🇯🇵",
        "👨‍👩‍👧‍👦",
        "🦀",
        "𝔘",
        "ψ",
        "∑",
        "<|end|>",
        "<s>",
        "a",
        "1",
        "42",
    ]);
    prop::collection::vec(pieces, 0..24).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn detokenized_stream_equals_full_decode(
        text in text_strategy(),
        cuts in prop::collection::vec(0usize..64, 0..16),
        add_special in any::<bool>(),
        skip_special in any::<bool>(),
    ) {
        for name in TOKENIZERS {
            let tok = tokenizer(name);
            let ids = tok.encode(&text, add_special).unwrap();
            let full = tok.decode(&ids, skip_special).unwrap();
            prop_assert_eq!(stream(&tok, &ids, &cuts, skip_special), full.clone(), "{} chunked", name);
            prop_assert_eq!(one_by_one(&tok, &ids, skip_special), full, "{} one by one", name);
        }
    }

    /// Byte-level BPE decodes any id sequence, even bytes that are no UTF-8
    /// at all: the stream still adds up to the full decode.
    #[test]
    fn detokenized_random_byte_level_ids_equal_full_decode(
        ids in prop::collection::vec(0u32..420, 0..40),
        cuts in prop::collection::vec(0usize..40, 0..8),
    ) {
        let tok = tokenizer("bpe");
        let full = tok.decode(&ids, false).unwrap();
        prop_assert_eq!(stream(&tok, &ids, &cuts, false), full);
    }
}

// ---------------------------------------------------------------------------------------- stop strings

/// Stops fed chunk by chunk; returns (text let through, stop index).
fn run_stops(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
    let mut watcher = StopStrings::new(stops.iter().copied());
    let mut out = String::new();
    for chunk in chunks {
        let step = watcher.push(chunk);
        out.push_str(&step.text);
        if step.stopped.is_some() {
            return (out, step.stopped);
        }
    }
    out.push_str(&watcher.finish());
    (out, None)
}

#[test]
fn stop_strings_match_across_chunks() {
    assert_eq!(run_stops(&["<|end|>"], &["Hello <|", "en", "d|> more"]), ("Hello ".to_owned(), Some(0)));
    assert_eq!(run_stops(&["\n\nUser:"], &["A\n", "\n", "Us", "er: hi"]), ("A".to_owned(), Some(0)));
    // A false start is let through once it cannot be a stop string.
    let mut watcher = StopStrings::new(["STOP"]);
    assert_eq!(watcher.push("ST").text, "");
    assert_eq!(watcher.push("OP").stopped, Some(0));
    let mut watcher = StopStrings::new(["STOP"]);
    assert_eq!(watcher.push("abST").text, "ab");
    assert_eq!(watcher.push("Ox").text, "STOx");
    assert_eq!(watcher.finish(), "");
    // Held text comes out at the end of a stream that never stops.
    assert_eq!(run_stops(&["STOP"], &["go ST"]), ("go ST".to_owned(), None));
    // The stop string that ends first wins; at the same end, the longer.
    assert_eq!(run_stops(&["abcd", "c"], &["abcd"]), ("ab".to_owned(), Some(1)));
    assert_eq!(run_stops(&["bc", "abc"], &["xabc"]), ("x".to_owned(), Some(1)));
    // Multi-byte characters split across chunks.
    assert_eq!(run_stops(&["東京"], &["こんにちは東", "京です"]), ("こんにちは".to_owned(), Some(0)));
    // After a stop everything is swallowed.
    let mut watcher = StopStrings::new(["x"]);
    assert_eq!(watcher.push("axb").text, "a");
    assert_eq!(watcher.push("more").text, "");
    assert_eq!(watcher.stopped(), Some(0));
}

/// The first stop by end position when text arrives one character at a
/// time: (text before it, stop index), or the whole text.
fn reference_stop(stops: &[String], text: &str) -> (String, Option<usize>) {
    for end in text.char_indices().map(|(i, c)| i + c.len_utf8()) {
        let seen = &text[..end];
        let hit = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty() && seen.ends_with(s.as_str()))
            .max_by_key(|(i, s)| (s.len(), std::cmp::Reverse(*i)));
        if let Some((index, stop)) = hit {
            return (seen[..end - stop.len()].to_owned(), Some(index));
        }
    }
    (text.to_owned(), None)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn stop_strings_agree_with_char_by_char_matching(
        text in "[ab東é\n]{0,30}",
        stops in prop::collection::vec("[ab東é\n]{0,4}", 1..4),
        cuts in prop::collection::vec(0usize..40, 0..10),
    ) {
        // Cut at char boundaries only: chunks are text.
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(text.len())).filter(|&c| text.is_char_boundary(c)).collect();
        bounds.sort_unstable();
        bounds.push(text.len());
        let mut chunks = Vec::new();
        let mut start = 0;
        for end in bounds {
            chunks.push(&text[start..end.max(start)]);
            start = end.max(start);
        }
        let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
        prop_assert_eq!(run_stops(&stop_refs, &chunks), reference_stop(&stops, &text));
    }
}
