//! One function per parser of outside bytes, each taking any bytes and
//! returning nothing: a parser must answer with a value or an error, so a
//! panic, a hang or an allocation out of proportion to the input is a
//! finding. The AFL++ targets in `src/bin/` each call one of these.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use strata_engine::Constraint;
use strata_grammar::{Error, Grammar, GrammarCompiler};
use strata_hub::{self as hub, HubHeaders, ModelName};
use strata_text::{ChatTemplate, Message, RENDER_OUTPUT_BYTES_MAX, Tokenizer, ToolSyntax};
use strata_kv::{HASH_BYTES, SequenceState, LayerLayout, SessionFile, SessionHeader, StatePart};

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
    let mut cache = SequenceState::with_layers(kv_layouts(), KV_CAPACITY_TOKENS);
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

/// The demo model's tokenizer (byte-level BPE, as every supported family's).
fn demo_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::from_bytes(include_bytes!("../../models/demo/tokenizer.json"), PathBuf::from("demo/tokenizer.json"))
            .expect("the demo's tokenizer")
    })
}

/// The committed SentencePiece-style tokenizer (Metaspace, byte fallback),
/// the other kind a model may bring.
fn spm_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::from_bytes(include_bytes!("../../testdata/tokenizer/spm/tokenizer.json"), PathBuf::from("spm"))
            .expect("testdata's spm tokenizer")
    })
}

/// Steps of decoding a compiled grammar is driven through.
const GRAMMAR_STEPS: usize = 16;
/// The longest refusal a client may get back (one line, never a dump).
const REFUSAL_BYTES_MAX: usize = 4096;

/// A JSON schema or a tool list as a request carries them, compiled as
/// `serve` does (`GrammarCompiler::json_schema`, `::tool_call`) over the
/// demo's vocabulary, then decoded for a few steps. The first byte picks
/// the kind: its low three bits 0, a `response_format` schema (bit 3 set:
/// `strict: true`, undeclared keys closed); 1 to 7, a tool list forced in
/// that syntax, bit 3 set naming the first tool (`tool_choice: {"function":
/// ...}`) rather than any (`"required"`).
pub fn grammar(data: &[u8]) {
    static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
    let compiler = COMPILER.get_or_init(|| {
        let tokenizer = demo_tokenizer();
        let eos = tokenizer.token_to_id("<|end|>").expect("the demo's end of turn");
        GrammarCompiler::new(tokenizer, &[eos]).expect("the demo's grammar compiler")
    });
    let Some((&kind, json)) = data.split_first() else { return };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return };
    let compiled = match usize::from(kind & 7) {
        0 => compiler.json_schema(&value, kind & 8 != 0),
        syntax => {
            let Some(tools) = value.as_array() else { return };
            let first_name = tools.first().and_then(|tool| tool["function"]["name"].as_str());
            let name = if kind & 8 != 0 { first_name } else { None };
            compiler.tool_call(ToolSyntax::ALL[syntax - 1], tools, name)
        }
    };
    match compiled {
        Ok(grammar) => drive(grammar, demo_tokenizer().vocab_size()),
        // serve answers 400 with this text: the request's fault, one line.
        Err(Error::InvalidRequest(reason)) => {
            assert!(
                !reason.contains('\n') && reason.len() <= REFUSAL_BYTES_MAX,
                "a refusal not one short line: {reason}"
            )
        }
        // serve answers 500: only for the server's own faults.
        Err(other) => panic!("a request's grammar failed as the server's fault: {other}"),
    }
}

/// Decodes a few steps under `grammar`, choosing a different allowed token
/// each step: a token the mask allowed must be accepted.
fn drive(mut grammar: Grammar, vocab_size: usize) {
    let mut logits = vec![0.0f32; vocab_size];
    for step in 0..GRAMMAR_STEPS {
        if grammar.is_finished() {
            return;
        }
        logits.fill(0.0);
        if grammar.mask(&mut logits).is_err() {
            return;
        }
        let allowed: Vec<u32> = (0..vocab_size).filter(|&id| logits[id].is_finite()).map(|id| id as u32).collect();
        assert!(!allowed.is_empty(), "a mask that succeeded allows no token");
        let token = allowed[step.wrapping_mul(7919) % allowed.len()];
        if let Err(e) = grammar.accept(token) {
            panic!("token {token}, which the mask allowed, was refused: {e}");
        }
    }
}

/// A chat template's source, rendered: the bytes up to the first NUL are
/// the template (as `tokenizer_config.json` or `chat_template.jinja` brings
/// it), the rest the messages JSON (a short conversation when that does not
/// parse). Loading checks the template on a sample conversation within its
/// fuel; a render stays within its fuel and output cap.
pub fn template_source(data: &[u8]) {
    let (source, messages) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let Ok(source) = std::str::from_utf8(source) else { return };
    let special_tokens = [("bos_token", "<s>"), ("eos_token", "<|im_end|>")]
        .map(|(name, token)| (name.to_owned(), token.to_owned()))
        .into();
    let Ok(template) = ChatTemplate::new(source, special_tokens) else { return };
    let messages = serde_json::from_slice::<Vec<Message>>(messages)
        .unwrap_or_else(|_| vec![Message::system("Be brief."), Message::user("Hello"), Message::assistant("Hi")]);
    if let Ok(prompt) = template.render(&messages, true) {
        assert!(prompt.len() <= RENDER_OUTPUT_BYTES_MAX, "a render of {} bytes", prompt.len());
    }
}

/// Bytes one tokenizer may take to encode one byte of text: byte fallback
/// writes a character's bytes as one token each, plus what a pre-tokenizer
/// adds (Metaspace's `▁`).
const IDS_PER_TEXT_BYTE_MAX: usize = 2;
/// What `add_special_tokens` may add around any text.
const SPECIAL_IDS_MAX: usize = 8;

/// Arbitrary text tokenized by a model's tokenizer, as a prompt is: the
/// first byte picks the tokenizer (bit 0: the demo's byte-level BPE, else
/// testdata's SentencePiece-style one) and whether special tokens are added
/// (bit 1); the rest is the text (invalid UTF-8 replaced, as a client's
/// text never holds it). The ids are in the vocabulary and bounded by the
/// text's length, and decode, whole or streamed, to the same text.
pub fn tokenize_text(data: &[u8]) {
    let Some((&mode, text)) = data.split_first() else { return };
    let tokenizer = if mode & 1 == 0 { demo_tokenizer() } else { spm_tokenizer() };
    let add_special_tokens = mode & 2 != 0;
    let text = String::from_utf8_lossy(text);
    let Ok(ids) = tokenizer.encode(&text, add_special_tokens) else { return };
    let ids_max = text.len().saturating_mul(IDS_PER_TEXT_BYTE_MAX).saturating_add(SPECIAL_IDS_MAX);
    assert!(ids.len() <= ids_max, "{} ids for {} bytes of text", ids.len(), text.len());
    let vocab_size = tokenizer.vocab_size();
    assert!(ids.iter().all(|&id| (id as usize) < vocab_size), "an id past the vocabulary of {vocab_size}");
    let skip_special_tokens = mode & 4 != 0;
    let whole = tokenizer.decode(&ids, skip_special_tokens).expect("the ids of a text decode");
    let mut detokenizer = tokenizer.detokenizer(skip_special_tokens);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&detokenizer.push(id).expect("an id of a text streams"));
    }
    streamed.push_str(&detokenizer.finish().expect("a stream of a text's ids ends"));
    assert_eq!(streamed, whole, "streamed pieces differ from the whole decode");
}

/// Header values in a `hub_answers` input: `X-Repo-Commit`, the ETag,
/// `X-Linked-Size`.
const HEADER_VALUE_FIELDS: usize = 3;

/// The hub's answers as a pull checks them: NUL-separated, the listing's
/// JSON (`/api/models/ORG/NAME/revision/REV?blobs=true`), `X-Repo-Commit`,
/// the ETag, `X-Linked-Size` (each absent when empty), then the checkpoint's
/// `model.safetensors.index.json` (absent when missing). Whatever passes
/// must be safe to build paths from: a commit of 40 hex digits, listed
/// names and weight files with no `..`, absolute or empty component.
pub fn hub_answers(data: &[u8]) {
    let mut fields = data.splitn(HEADER_VALUE_FIELDS + 2, |&b| b == 0);
    let listing = fields.next().unwrap_or_default();
    let mut header =
        || fields.next().filter(|v| !v.is_empty()).map(|value| String::from_utf8_lossy(value).into_owned());
    let headers = HubHeaders { commit: header(), etag: header(), linked_size: header() };
    let index = fields.next();
    let name = ModelName::parse("org/model").expect("a model name");
    let Ok(weight_files) = hub::check_hub_answers(&name, listing, &headers, index) else { return };
    let listing: Listing = serde_json::from_slice(listing).expect("a listing that passed parses");
    assert!(is_hex(&listing.sha, 40), "commit {:?} passed", listing.sha);
    for file in &listing.siblings {
        assert!(is_plain_relative(&file.rfilename), "listed file {:?} passed", file.rfilename);
    }
    for file in &weight_files {
        assert!(is_plain_relative(file) && !file.contains('/'), "weight file {file:?} passed");
    }
    // The headers are checked against each file the listing gives a digest.
    let digest_listed = listing.siblings.iter().any(|file| match &file.lfs {
        Some(lfs) => is_hex(&lfs.sha256, 64),
        None => file.blob_id.as_deref().is_some_and(|hex| is_hex(hex, 40)) && file.size.is_some(),
    });
    if let Some(etag) = headers.etag.as_deref().filter(|_| digest_listed) {
        let digest = etag.trim().trim_start_matches("W/").trim_matches('"');
        assert!(is_hex(digest, 40) || is_hex(digest, 64), "ETag {etag:?} passed");
    }
}

/// What `hub_answers` checks of a listing that passed, typed as the pull
/// reads it: a `serde_json::Value` would refuse what the pull skips (a lone
/// surrogate, a number past f64, in a field it ignores).
#[derive(serde::Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<ListedFile>,
}

#[derive(serde::Deserialize)]
struct ListedFile {
    rfilename: String,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    size: Option<u64>,
    lfs: Option<ListedLfs>,
}

#[derive(serde::Deserialize)]
struct ListedLfs {
    sha256: String,
}

fn is_hex(text: &str, digits: usize) -> bool {
    text.len() == digits && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A relative path that stays below where it is joined.
fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains(['\\', '\0'])
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}
