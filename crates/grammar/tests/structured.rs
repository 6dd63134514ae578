//! Structured outputs on the demo model, sampled (not greedy) as a client's
//! request would be: under a JSON schema, 50 seeded generations all parse
//! and validate; forced tool calls in every syntax parse, with the model's
//! own parser, to a call of the named function with valid arguments. Prints
//! the grammar's mask time per token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use strata_engine::{Constraint, Engine, EngineOptions, Sampler, SamplingOptions};
use strata_format::{ConvertOptions, QuantPreset};
use strata_grammar::{Grammar, GrammarCompiler};
use strata_text::{Message, TextModel, ToolCallParser, ToolEvent, ToolSyntax};

const DEMO_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo");
const SEEDS: u64 = 50;
const MAX_NEW_TOKENS: usize = 200;

fn container(dir: &tempfile::TempDir) -> PathBuf {
    let out = dir.path().join("demo-f32");
    strata_format::convert(DEMO_MODEL_DIR, &out, &ConvertOptions::new(QuantPreset::F32)).unwrap();
    out
}

/// The answer to `prompt` sampled with `seed` under `grammar`: the text up
/// to the end-of-sequence token or the grammar's end, and whether it got
/// there within [`MAX_NEW_TOKENS`].
fn generate_until(
    engine: &Engine,
    text: &TextModel,
    prompt: &[u32],
    grammar: &mut Grammar,
    seed: u64,
) -> (String, bool) {
    let mut session = engine.session();
    let mut sampler = Sampler::new(SamplingOptions { temperature: 1.0, top_k: 0, top_p: 1.0, seed });
    let mut logits = session.feed(prompt).unwrap();
    let mut answer = Vec::new();
    let mut finished = false;
    for _ in 0..MAX_NEW_TOKENS {
        grammar.mask(&mut logits).unwrap();
        let token = session.push_sampled(&mut sampler, &logits);
        grammar.accept(token).unwrap();
        if text.eos_token_ids.contains(&token) {
            finished = true;
            break;
        }
        answer.push(token);
        if grammar.is_finished() {
            finished = true;
            break;
        }
        logits = session.feed(&[]).unwrap();
    }
    (text.tokenizer.decode(&answer, false).unwrap(), finished)
}

/// [`generate_until`] that must finish: the grammars under test bound every
/// string, so the model cannot run past the token limit inside one.
fn generate(engine: &Engine, text: &TextModel, prompt: &[u32], grammar: &mut Grammar, seed: u64) -> String {
    let (answer, finished) = generate_until(engine, text, prompt, grammar, seed);
    assert!(finished, "seed {seed}: no end within {MAX_NEW_TOKENS} tokens: {answer:?}");
    answer
}

fn prompt(text: &TextModel, request: &str) -> Vec<u32> {
    let template = text.template.as_ref().expect("the demo model has a chat template");
    let rendered = template.render(&[Message::user(request)], true).unwrap();
    text.tokenizer.encode(&rendered, false).unwrap()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["happy", "sad", "calm"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}
        },
        "required": ["name", "age", "mood"],
        "additionalProperties": false
    })
}

/// `value` against [`schema`], keyword by keyword (no validator crate for
/// one schema).
fn validate(value: &Value) -> Result<(), String> {
    let object = value.as_object().ok_or("not an object")?;
    for key in object.keys() {
        if !["name", "age", "mood", "tags"].contains(&key.as_str()) {
            return Err(format!("unexpected property {key}"));
        }
    }
    let name = object.get("name").and_then(Value::as_str).ok_or("name is not a string")?;
    if name.chars().count() > 12 {
        return Err(format!("name {name:?} is longer than 12"));
    }
    let age = object.get("age").and_then(Value::as_i64).ok_or("age is not an integer")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age} is out of range"));
    }
    let mood = object.get("mood").and_then(Value::as_str).ok_or("mood is not a string")?;
    if !["happy", "sad", "calm"].contains(&mood) {
        return Err(format!("mood {mood:?} is not in the enum"));
    }
    if let Some(tags) = object.get("tags") {
        let tags = tags.as_array().ok_or("tags is not an array")?;
        if tags.len() > 3 || tags.iter().any(|t| t.as_str().is_none_or(|t| t.chars().count() > 8)) {
            return Err(format!("tags {tags:?} break the schema"));
        }
    }
    Ok(())
}

fn per_token(total: Duration, masks: u64) -> Duration {
    total / u32::try_from(masks.max(1)).unwrap()
}

#[test]
fn schema_constrained_sampling_always_validates() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let engine = Engine::open(&container(&dir), &options).unwrap();
    let text = TextModel::load(&engine).unwrap();
    let compiler = GrammarCompiler::new(&text.tokenizer, &text.eos_token_ids).unwrap();
    let prompt = prompt(&text, "Describe a person as JSON.");
    let (mut mask_time, mut masks) = (Duration::ZERO, 0);
    for seed in 0..SEEDS {
        let mut grammar = compiler.json_schema(&schema(), false).unwrap();
        let answer = generate(&engine, &text, &prompt, &mut grammar, seed);
        let value: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("seed {seed}: {answer:?}: {e}"));
        validate(&value).unwrap_or_else(|e| panic!("seed {seed}: {answer}: {e}"));
        let (time, count) = grammar.mask_stats();
        (mask_time, masks) = (mask_time + time, masks + count);
    }
    eprintln!(
        "json_schema: {masks} masks over {} tokens of vocabulary, {:?} per token",
        text.tokenizer.vocab_size(),
        per_token(mask_time, masks)
    );

    // Any JSON object: unbounded, so the demo model may ramble in a string
    // past the token limit; what ends is an object.
    let mut ended = 0;
    for seed in 0..10 {
        let mut grammar = compiler.json_object().unwrap();
        let (answer, finished) = generate_until(&engine, &text, &prompt, &mut grammar, seed);
        assert!(answer.starts_with('{'), "seed {seed}: {answer:?}");
        if finished {
            let value: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("seed {seed}: {answer:?}: {e}"));
            assert!(value.is_object(), "seed {seed}: {answer}");
            ended += 1;
        }
    }
    eprintln!("json_object: {ended} of 10 ended within {MAX_NEW_TOKENS} tokens");
}

#[test]
fn forced_tool_calls_parse_in_every_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let engine = Engine::open(&container(&dir), &options).unwrap();
    let text = TextModel::load(&engine).unwrap();
    let compiler = GrammarCompiler::new(&text.tokenizer, &text.eos_token_ids).unwrap();
    let tools: Vec<Value> = vec![
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 16},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "units": {"type": "string", "enum": ["metric", "imperial"]}},
            "required": ["city", "days"], "additionalProperties": false}}}),
        json!({"type": "function", "function": {"name": "noop",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}),
    ];
    let prompt = prompt(&text, "What is the weather in Paris?");
    let syntaxes = [
        (ToolSyntax::JsonTags, SEEDS),
        (ToolSyntax::XmlFunction, 10),
        (ToolSyntax::GlmArgs, 10),
        (ToolSyntax::DeepSeek, 10),
        (ToolSyntax::DeepSeekFenced, 10),
        (ToolSyntax::Kimi, 10),
        (ToolSyntax::Mistral, 10),
    ];
    for (syntax, seeds) in syntaxes {
        let (mut mask_time, mut masks) = (Duration::ZERO, 0);
        for seed in 0..seeds {
            let mut grammar = compiler.tool_call(syntax, &tools, Some("get_weather")).unwrap();
            let answer = generate(&engine, &text, &prompt, &mut grammar, seed);
            let mut parser = ToolCallParser::new(syntax, &tools);
            let mut events = parser.push(&answer);
            events.extend(parser.finish());
            let [ToolEvent::Call(call)] = events.as_slice() else {
                panic!("{syntax:?} seed {seed}: {answer:?} parsed to {events:?}");
            };
            assert_eq!(call.name, "get_weather", "{syntax:?} seed {seed}: {answer:?}");
            let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
            let city = arguments["city"].as_str().unwrap_or_else(|| panic!("{syntax:?} seed {seed}: {answer:?}"));
            assert!(city.chars().count() <= 16, "{syntax:?} seed {seed}: {answer:?}");
            let days = arguments["days"].as_i64().unwrap_or_else(|| panic!("{syntax:?} seed {seed}: {answer:?}"));
            assert!((1..=7).contains(&days), "{syntax:?} seed {seed}: {answer:?}");
            if let Some(units) = arguments.get("units") {
                assert!(units == "metric" || units == "imperial", "{syntax:?} seed {seed}: {answer:?}");
            }
            let (time, count) = grammar.mask_stats();
            (mask_time, masks) = (mask_time + time, masks + count);
        }
        eprintln!("tool call {syntax:?}: {masks} masks, {:?} per token", per_token(mask_time, masks));
    }
    // `tool_choice: "required"`: any of the tools.
    for seed in 0..10 {
        let mut grammar = compiler.tool_call(ToolSyntax::JsonTags, &tools, None).unwrap();
        let answer = generate(&engine, &text, &prompt, &mut grammar, seed);
        let mut parser = ToolCallParser::new(ToolSyntax::JsonTags, &tools);
        let mut events = parser.push(&answer);
        events.extend(parser.finish());
        assert!(matches!(events.as_slice(), [ToolEvent::Call(_)]), "seed {seed}: {answer:?} → {events:?}");
    }
}

#[test]
fn an_unsatisfiable_or_malformed_schema_is_the_requests_error() {
    let tokenizer = strata_text::Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    let eos = tokenizer.token_to_id("<|end|>").unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, &[eos]).unwrap();
    for schema in [json!("not a schema"), json!({"type": "nonsense"})] {
        let err = compiler.json_schema(&schema, false).unwrap_err();
        assert!(matches!(err, strata_grammar::Error::InvalidRequest(_)), "{schema}: {err}");
    }
}

fn demo_compiler() -> GrammarCompiler {
    let tokenizer = strata_text::Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    let eos = tokenizer.token_to_id("<|end|>").unwrap();
    GrammarCompiler::new(&tokenizer, &[eos]).unwrap()
}

/// The request's error, as one line of text (it goes to the client).
fn one_line_refusal(result: strata_grammar::Result<Grammar>) -> String {
    let err = result.unwrap_err();
    assert!(matches!(err, strata_grammar::Error::InvalidRequest(_)), "{err}");
    let message = err.to_string();
    assert!(!message.contains('\n') && message.len() < 300, "{message}");
    message
}

/// A `$ref` to itself compiles, then has no first token: found when the
/// grammar is built, not at the first step of a running generation.
#[test]
fn a_self_referential_ref_is_refused_when_the_grammar_is_built() {
    let schema = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
    one_line_refusal(demo_compiler().json_schema(&schema, false));
}

#[test]
fn too_many_forced_tools_are_refused_naming_the_limit() {
    let tool = |i: usize| {
        json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object",
            "properties": {"a": {"type": "string", "pattern": "^[a-z]{8}$"}}}}})
    };
    let tools: Vec<Value> = (0..4000).map(tool).collect();
    let message = one_line_refusal(demo_compiler().tool_call(ToolSyntax::JsonTags, &tools, None));
    assert!(message.contains(&strata_grammar::GRAMMAR_TOOLS_MAX.to_string()), "{message}");
}

#[test]
fn a_schema_past_the_byte_limit_is_refused_naming_it() {
    let properties: serde_json::Map<String, Value> =
        (0..20_000).map(|i| (format!("property_{i}"), json!({"type": "integer"}))).collect();
    let schema = json!({"type": "object", "properties": properties});
    let message = one_line_refusal(demo_compiler().json_schema(&schema, false));
    assert!(message.contains(&strata_grammar::GRAMMAR_SCHEMA_BYTES_MAX.to_string()), "{message}");
}

/// Whether `grammar` allows `text`, fed token by token as sampling would:
/// each token must survive the step's mask.
fn allows(grammar: &mut Grammar, tokenizer: &strata_text::Tokenizer, text: &str) -> bool {
    for token in tokenizer.encode(text, false).unwrap() {
        let mut logits = vec![0.0; tokenizer.vocab_size()];
        grammar.mask(&mut logits).unwrap();
        if logits[token as usize] == f32::NEG_INFINITY {
            return false;
        }
        grammar.accept(token).unwrap();
    }
    true
}

/// Published tools rarely write `additionalProperties: false`; without it
/// a forced call (or a strict schema) must still end where the declared
/// keys do, not run on into keys nobody declared.
#[test]
fn a_schema_without_additional_properties_allows_no_undeclared_key_when_strict_or_forced() {
    let tokenizer = strata_text::Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    let compiler = demo_compiler();
    let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let (declared, undeclared) = (r#"{"city": "Paris"}"#, r#"{"city": "Paris", "x": 1}"#);
    let strict = || compiler.json_schema(&parameters, true).unwrap();
    assert!(allows(&mut strict(), &tokenizer, declared));
    assert!(!allows(&mut strict(), &tokenizer, undeclared));
    // Not strict: JSON Schema's own reading, extra keys allowed.
    assert!(allows(&mut compiler.json_schema(&parameters, false).unwrap(), &tokenizer, undeclared));

    let tools = [json!({"type": "function", "function": {"name": "get_weather", "parameters": parameters}})];
    let call = |arguments: &str| {
        format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {arguments}}}\n</tool_call>")
    };
    let forced = || compiler.tool_call(ToolSyntax::JsonTags, &tools, None).unwrap();
    assert!(allows(&mut forced(), &tokenizer, &call(declared)));
    assert!(!allows(&mut forced(), &tokenizer, &call(undeclared)));
}

/// A whole reply of `syntax` calling `get_weather` with `arguments`, as the
/// model writes it.
fn call_text(syntax: ToolSyntax, arguments: &str) -> String {
    match syntax {
        ToolSyntax::JsonTags => {
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {arguments}}}\n</tool_call>")
        }
        ToolSyntax::DeepSeek => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ToolSyntax::DeepSeekFenced => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{arguments}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ToolSyntax::Kimi => format!(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{arguments}<|tool_call_end|><|tool_calls_section_end|>"
        ),
        ToolSyntax::Mistral => format!("[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {arguments}}}]"),
        ToolSyntax::XmlFunction | ToolSyntax::GlmArgs => unreachable!("arguments as XML"),
    }
}

/// `tokens[..cut]` accepted by a fresh grammar, then its way out: the reply
/// it completes to (decoded), after checking that the way out is within the
/// bound, leaves the grammar finished, and is the same asked one token
/// ahead.
fn completed_at(
    tokenizer: &strata_text::Tokenizer,
    new_grammar: &dyn Fn() -> Grammar,
    tokens: &[u32],
    cut: usize,
) -> String {
    let mut grammar = new_grammar();
    for &token in &tokens[..cut] {
        grammar.accept(token).unwrap();
    }
    let way_out = grammar.closing(&[]).unwrap().unwrap_or_else(|| panic!("no way out after {cut} tokens"));
    assert!(way_out.len() <= strata_engine::CLOSING_TOKENS_MAX, "{cut}: {way_out:?}");
    if let Some(&next) = tokens.get(cut) {
        let ahead = grammar.closing(&[next]).unwrap();
        let mut stepped = new_grammar();
        for &token in &tokens[..=cut] {
            stepped
                .accept(token)
                .unwrap_or_else(|e| panic!("{cut}: {:?}: {e}", tokenizer.decode(&tokens[..=cut], false)));
        }
        assert_eq!(ahead, stepped.closing(&[]).unwrap(), "{cut}: one token ahead");
    }
    for &token in &way_out {
        grammar.accept(token).unwrap();
    }
    assert!(grammar.is_finished(), "{cut}: {way_out:?}");
    let reply: Vec<u32> = tokens[..cut].iter().chain(&way_out).copied().collect();
    tokenizer.decode(&reply, false).unwrap()
}

/// Near the length limit the engine forces a grammar's way out: a reply cut
/// after any token, inside a string, an escape, a multi-byte character, a
/// key or an array, completes to one that parses, for a forced call in
/// every syntax that writes JSON arguments and for a strict JSON reply.
#[test]
fn a_reply_cut_after_any_token_completes_to_one_that_parses() {
    let tokenizer = strata_text::Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    let compiler = demo_compiler();
    let parameters = json!({"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}
    }, "required": ["city", "tags"]});
    let is_valid = |arguments: &Value| {
        let object = arguments.as_object().expect("an object");
        object["city"].is_string()
            && object["tags"].as_array().is_some_and(|tags| !tags.is_empty() && tags.iter().all(Value::is_string))
            && object.keys().all(|k| ["city", "unit", "tags"].contains(&k.as_str()))
    };
    let arguments = r#"{"city": "Z\nrich \"Z\\ürich\" 東京", "unit": "fahrenheit", "tags": ["a b", "c"]}"#;
    let tools = [json!({"type": "function", "function": {"name": "get_weather", "parameters": parameters}})];
    // DeepSeek's fenced form is left out: the demo spells its five markers
    // byte by byte, and its shortest call passes `CLOSING_TOKENS_MAX` (a
    // DeepSeek vocabulary has each as one token).
    let json_syntaxes = [ToolSyntax::JsonTags, ToolSyntax::DeepSeek, ToolSyntax::Kimi, ToolSyntax::Mistral];
    for syntax in json_syntaxes {
        let tokens = tokenizer.encode(&call_text(syntax, arguments), false).unwrap();
        let new_grammar = || compiler.tool_call(syntax, &tools, Some("get_weather")).unwrap();
        for cut in 0..=tokens.len() {
            let reply = completed_at(&tokenizer, &new_grammar, &tokens, cut);
            let mut parser = ToolCallParser::new(syntax, &tools);
            let mut events = parser.push(&reply);
            events.extend(parser.finish());
            let [ToolEvent::Call(call)] = events.as_slice() else {
                panic!("{syntax:?} cut at {cut}: {reply:?} parsed to {events:?}");
            };
            let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
            assert!(call.name == "get_weather" && is_valid(&arguments), "{syntax:?} cut at {cut}: {reply:?}");
        }
        let shortest = new_grammar().closing(&[]).unwrap().unwrap();
        eprintln!("{syntax:?}: the shortest call takes {} tokens", shortest.len());
    }
    let tokens = tokenizer.encode(arguments, false).unwrap();
    let new_grammar = || compiler.json_schema(&parameters, true).unwrap();
    for cut in 0..=tokens.len() {
        let reply = completed_at(&tokenizer, &new_grammar, &tokens, cut);
        let value: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("cut at {cut}: {reply:?}: {e}"));
        assert!(is_valid(&value), "cut at {cut}: {reply}");
    }
}

/// A forced call of any of several tools, cut before its name is whole,
/// completes to a call of the first tool its name so far fits.
#[test]
fn a_required_call_cut_inside_its_name_completes_to_a_tool_that_fits() {
    let tokenizer = strata_text::Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    let compiler = demo_compiler();
    let tool = |name: &str| {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object",
        "properties": {"q": {"type": "string"}}, "required": ["q"]}}})
    };
    let tools = [tool("search"), tool("get_weather"), tool("get_time")];
    let text = "<tool_call>\n{\"name\": \"get_t";
    let mut grammar = compiler.tool_call(ToolSyntax::JsonTags, &tools, None).unwrap();
    let mut tokens = tokenizer.encode(text, false).unwrap();
    for &token in &tokens {
        grammar.accept(token).unwrap();
    }
    tokens.extend(grammar.closing(&[]).unwrap().expect("a way out"));
    let reply = tokenizer.decode(&tokens, false).unwrap();
    assert_eq!(reply, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"q\": \"\"}}\n</tool_call>");
}
