//! One function per parser of outside bytes, each taking any bytes and
//! returning nothing: a parser must answer with a value or an error, so a
//! panic, a hang or an allocation out of proportion to the input is a
//! finding. The AFL++ targets in `src/bin/` each call one of these.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use strata_engine::{ChatTemplate, Message, Tokenizer};
use strata_kv::{HASH_BYTES, KvCache, LayerLayout, SessionFile, SessionHeader, StatePart};

/// A directory private to this process for the parsers that read files;
/// each input overwrites the last one's file.
fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory")).path()
}

fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch().join(name);
    std::fs::write(&path, data).expect("write the input");
    path
}

/// config.json of any family.
pub fn config_json(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = strata_format::ModelArch::from_config_json(text);
    }
}

/// The header of a safetensors checkpoint file.
pub fn safetensors_header(data: &[u8]) {
    let _ = strata_format::checkpoint::read_safetensors_header(data, Path::new("model.safetensors"));
}

/// A container's manifest.json, as `Container::open` reads and validates
/// it. The files the demo's manifest (the seed) lists are there, at its
/// sizes and all zeros, so that a manifest near the seed passes the file
/// checks and reaches the tensor and layout checks behind them.
pub fn manifest(data: &[u8]) {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = scratch().join("container");
        let seed: serde_json::Value =
            serde_json::from_str(include_str!("../corpus/manifest/demo.json")).expect("the seed manifest");
        for file in seed["files"].as_array().expect("files") {
            let path = dir.join(file["path"].as_str().expect("path"));
            std::fs::create_dir_all(path.parent().expect("parent")).expect("container directory");
            let zeros = std::fs::File::create(&path).expect("create a data file");
            zeros.set_len(file["size_bytes"].as_u64().expect("size")).expect("size a data file");
        }
        dir
    });
    std::fs::write(dir.join("manifest.json"), data).expect("write the manifest");
    let _ = strata_format::Container::open(dir);
}

const KV_CAPACITY_TOKENS: usize = 64;

/// Every kind of part: a layer of two rows parts, a ring and token ids, and
/// one of a fixed state and a strided part (whose rows make record lengths
/// depend on the position), so state records are fuzzed too.
fn kv_layouts() -> Vec<LayerLayout> {
    vec![
        LayerLayout::new(vec![
            StatePart::Rows { dim: 4 },
            StatePart::Rows { dim: 3 },
            StatePart::Ring { dim: 2, window: 3 },
            StatePart::Tokens { n: 2 },
        ]),
        LayerLayout::new(vec![StatePart::Fixed { floats: 6 }, StatePart::Strided { dim: 2, every: 3 }]),
    ]
}

fn kv_header() -> SessionHeader {
    SessionHeader {
        content_hash: [0xab; HASH_BYTES],
        tokenizer_hash: Some([0x11; HASH_BYTES]),
        layouts: kv_layouts(),
        created_by: "strata-fuzz".to_owned(),
    }
}

/// A KV session file. The first byte chooses what the rest is: odd, the
/// whole file; even, the records after a valid header (so that the fuzzer
/// reaches the record scanner without first guessing a header and its
/// checksum).
pub fn kv_session(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let header = kv_header();
    // A valid header's bytes, written once by the real writer (it fsyncs,
    // too slow to repeat for every input).
    static HEADER: OnceLock<Vec<u8>> = OnceLock::new();
    let valid_header = HEADER.get_or_init(|| {
        let path = scratch().join("header.kv");
        drop(SessionFile::create(&path, &header).expect("a fresh session"));
        std::fs::read(&path).expect("read the fresh session")
    });
    let file = if mode % 2 == 1 { rest.to_vec() } else { [valid_header.as_slice(), rest].concat() };
    let path = scratch_file("session.kv", &file);
    let mut cache = KvCache::with_layers(kv_layouts(), KV_CAPACITY_TOKENS);
    let _ = SessionFile::open(&path, &header, &mut cache);
}

/// usage.json (learned expert usage).
pub fn usage_json(data: &[u8]) {
    let path = scratch_file("usage.json", data);
    // Eight layers of 64 experts: keys in and out of range both reachable.
    let _ = strata_tier::Usage::load(&path, "0123abcd", &[64; 8]);
}

/// A routing trace (JSON lines).
pub fn trace(data: &[u8]) {
    let path = scratch_file("trace.jsonl", data);
    let _ = strata_tier::read_trace(&path);
}

/// Messages (as the JSON list clients send) rendered by a real chat
/// template: Qwen3's, the most elaborate one in testdata/.
pub fn chat_template(data: &[u8]) {
    if let Ok(messages) = serde_json::from_slice::<Vec<Message>>(data) {
        let _ = qwen3_template().render(&messages, true);
    }
}

fn qwen3_template() -> &'static ChatTemplate {
    static TEMPLATE: OnceLock<ChatTemplate> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let source = include_str!("../../testdata/templates/qwen3.jinja");
        ChatTemplate::new(source, [("eos_token".to_owned(), "<|im_end|>".to_owned())].into()).expect("qwen3.jinja")
    })
}

/// An HTTP request body as `serve` decodes it: the first byte picks the
/// endpoint (even: OpenAI's chat completions, odd: Anthropic's Messages),
/// the rest is the body; a body that decodes is then templated, with its
/// tools, through Qwen3's template (the server's next step).
pub fn http_body(data: &[u8]) {
    let Some((&endpoint, body)) = data.split_first() else { return };
    let (conversation, tools) = if endpoint % 2 == 0 {
        match strata_serve::openai::parse_chat(body) {
            Ok(chat) => (chat.conversation, chat.structure.tools),
            Err(_) => return,
        }
    } else {
        match strata_serve::anthropic::parse_messages(body) {
            Ok(messages) => (messages.conversation, messages.structure.tools),
            Err(_) => return,
        }
    };
    let mut variables = serde_json::Map::new();
    variables.insert("tools".to_owned(), serde_json::Value::from(tools));
    let _ = qwen3_template().render_with(&conversation, true, &variables);
}

/// tokenizer.json, then a round trip through what it loaded.
pub fn tokenizer_json(data: &[u8]) {
    if let Ok(tokenizer) = Tokenizer::from_bytes(data, PathBuf::from("tokenizer.json")) {
        if let Ok(ids) = tokenizer.encode("Hello, world! Grüße, 你好 <|im_end|>", true) {
            let _ = tokenizer.decode(&ids, false);
        }
    }
}

/// A .npy array (the fixtures and `strata logits` output).
pub fn npy(data: &[u8]) {
    let _ = strata_format::npy::decode(data);
}
