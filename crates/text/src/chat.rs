//! Conversations in text: the chat template renders the messages, the
//! tokenizer turns them into ids, the session feeds only what it does not
//! already hold, and generated ids stream back as text with stop strings
//! applied. `chat` and `serve` both stand on this.

use std::fs::File;
use std::io::Write;
use std::ops::{ControlFlow, Range};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use strata_engine::{
    Engine, Finish, GenerateOptions, RunStats, SESSION_FILE_EXTENSION, SamplingOptions, Session, validate_session_name,
};

use crate::{
    ChatTemplate, Error, Message, ReasoningSplitter, Result, Split, StopStrings, ThinkingStart, Tokenizer,
    eos_ids_from_dir, template_thinks,
};

/// The suffix of a saved conversation's record: `<kv_dir>/NAME.chat.json`.
const SAVED_CHAT_SUFFIX: &str = ".chat.json";

/// A saved conversation, `NAME.chat.json`: its messages and the KV file
/// file that holds their tokens. Writing this file (by rename) is the one
/// step that makes a save happen, so messages and KV are replaced together
/// or not at all.
#[derive(Debug, Serialize, Deserialize)]
struct SavedChat {
    /// The KV file, `NAME.<stamp>.kvs` beside this file: a new file per
    /// save, so the one this record names is never being rewritten.
    kv_file: String,
    /// Tokens in the saved KV cache, checked when it is read back.
    tokens: usize,
    messages: Vec<Message>,
}

/// What [`Chat::save`] wrote or [`Chat::load`] read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveCounts {
    pub messages: usize,
    /// Tokens of the KV cache saved or restored (restored ones are not
    /// computed again).
    pub tokens: usize,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

/// Hex digits of a save's stamp: a fixed length, so that no session of
/// another name (`NAME.b.kvs` of `strata generate --session NAME.b`) is
/// taken for a KV file of NAME.
const STAMP_HEX_DIGITS: usize = 32;

/// Whether `file` is the saved KV cache of conversation `name`: `NAME.<stamp>.kvs`.
fn is_save_of(name: &str, file: &str) -> bool {
    file.strip_prefix(name)
        .and_then(|f| f.strip_prefix('.'))
        .and_then(|f| f.strip_suffix(SESSION_FILE_EXTENSION))
        .and_then(|f| f.strip_suffix('.'))
        .is_some_and(|stamp| stamp.len() == STAMP_HEX_DIGITS && stamp.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or
/// the new one: a temporary file of this call's own (never shared with
/// another writer), fsynced, renamed over it, and the directory fsynced so
/// the rename itself is durable. A failure before the rename removes the
/// temporary file; after it, `path` holds `bytes` whatever is returned.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let (tmp, mut file) = create_temporary(path)?;
    let renamed = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io_error(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(io_error(path)));
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// How many names [`create_temporary`] tries before giving up.
const TEMPORARY_NAME_ATTEMPTS: u32 = 100;

/// A new file beside `path`, `NAME.tmp-PID-N`, created exclusively so that
/// two writers (processes or threads) never share one.
fn create_temporary(path: &Path) -> Result<(PathBuf, File)> {
    let mut last_error = None;
    for attempt in 0..TEMPORARY_NAME_ATTEMPTS {
        let tmp = path.with_extension(format!("tmp-{}-{attempt}", std::process::id()));
        match File::options().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_error = Some((tmp, e)),
            Err(e) => return Err(io_error(&tmp)(e)),
        }
    }
    let (tmp, e) = last_error.expect("at least one attempt was made");
    Err(io_error(&tmp)(e))
}

/// The KV file the record at `record_path` names, if it names one of
/// `name`: the one file a new save of `name` replaces.
fn save_named_by(record_path: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(record_path).ok()?;
    let saved: SavedChat = serde_json::from_str(&text).ok()?;
    is_save_of(name, &saved.kv_file).then_some(saved.kv_file)
}

/// A model's text side: tokenizer, chat template, end-of-sequence ids.
#[derive(Debug)]
pub struct TextModel {
    pub tokenizer: Tokenizer,
    /// `None`: the model has no chat template; turns are joined plainly.
    pub template: Option<ChatTemplate>,
    /// Every id that ends generation (config.json and generation_config.json).
    pub eos_token_ids: Vec<u32>,
}

impl TextModel {
    /// Reads the tokenizer files the container carries.
    pub fn load(engine: &Engine) -> Result<Self> {
        Self::from_dir(engine, engine.container().dir())
    }

    /// Reads tokenizer.json and the chat template from `dir` (e.g. the
    /// checkpoint a `strata synth` container copies the shapes of).
    pub fn from_dir(engine: &Engine, dir: &Path) -> Result<Self> {
        let tokenizer = Tokenizer::from_dir(dir)?.ok_or_else(|| {
            Error::InvalidRequest(format!(
                "{} has no tokenizer.json: this model takes token ids only (--tokenizer DIR takes one from elsewhere)",
                dir.display()
            ))
        })?;
        let template = ChatTemplate::from_dir(dir)?;
        let eos_token_ids = eos_ids_from_dir(dir, &engine.core().eos_token_ids)?;
        Ok(Self { tokenizer, template, eos_token_ids })
    }

    /// Whether the chat template marks thinking (`<think>…</think>`).
    pub fn thinks(&self) -> bool {
        self.template.as_ref().is_some_and(|t| template_thinks(t.source()))
    }

    /// The prompt text for `messages`, ending where the assistant speaks
    /// next; `thinking` sets the template's `enable_thinking` (`None`:
    /// the template's default).
    pub fn render(&self, messages: &[Message], thinking: Option<bool>) -> Result<String> {
        match &self.template {
            Some(template) => {
                let variables = thinking.map(|on| ("enable_thinking".to_owned(), on.into())).into_iter().collect();
                template.render_with(messages, true, &variables)
            }
            None => {
                let mut text: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
                text.push_str("assistant:");
                Ok(text)
            }
        }
    }
}

/// The share of the context kept free for the answer when older turns must
/// be dropped: a quarter (64 tokens of the demo's 256).
const ANSWER_RESERVE_DIVISOR: usize = 4;

/// The oldest turn of `messages` that may be dropped to fit the context:
/// from the first message after the leading system messages up to the next
/// user (or system) message. A question goes with its answer and that turn's
/// tool messages, so what is left still begins with a user message, as
/// templates that require alternating roles (Mixtral's, Mistral's) demand;
/// the page does the same. `None` when that turn is the newest one, which
/// is never dropped.
fn oldest_turn(messages: &[Message]) -> Option<Range<usize>> {
    let start = messages.iter().position(|m| m.role != "system")?;
    let after_start = messages[start + 1..].iter().position(|m| m.role == "user" || m.role == "system")?;
    Some(start..start + 1 + after_start)
}

/// How to answer.
#[derive(Debug, Clone, Default)]
pub struct ReplyOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingOptions,
    /// Strings that end the answer (not included in it).
    pub stop: Vec<String>,
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub text: String,
    /// The thinking before it, where the template marks thinking.
    pub reasoning: String,
    pub finish: Finish,
    /// The oldest messages dropped so the conversation fits the context:
    /// whole turns, a question with its answer.
    pub dropped_messages: usize,
    pub stats: RunStats,
}

/// A conversation with a model.
pub struct Chat<'e> {
    text: TextModel,
    session: Session<'e>,
    messages: Vec<Message>,
    /// The template's `enable_thinking` (`None`: its default).
    thinking: Option<bool>,
}

impl<'e> Chat<'e> {
    /// A new conversation in `text` (usually [`TextModel::load`]),
    /// optionally opened by a system message.
    pub fn new(engine: &'e Engine, text: TextModel, system: Option<&str>) -> Self {
        let messages = system.map(|s| vec![Message::system(s)]).unwrap_or_default();
        Self { text, session: engine.session(), messages, thinking: None }
    }

    /// Whether the model's template marks thinking.
    pub fn thinks(&self) -> bool {
        self.text.thinks()
    }

    /// Turns the model's thinking on or off (the template's
    /// `enable_thinking`; `None`: its default) for the next answers.
    pub fn set_thinking(&mut self, thinking: Option<bool>) {
        self.thinking = thinking;
    }

    /// The messages so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The underlying session (its tokens and KV cache).
    pub fn session(&self) -> &Session<'e> {
        &self.session
    }

    /// Warnings since the last call, e.g. that learned expert usage or the
    /// session file could not be saved; the answers went on.
    pub fn take_warnings(&mut self) -> Vec<String> {
        self.session.take_warnings()
    }

    /// Forgets everything but the system message.
    pub fn reset(&mut self) {
        self.messages.retain(|m| m.role == "system");
        self.session.reset();
    }

    /// Saves a KV file of the conversation as `name` under `kv_dir`: its
    /// messages and its KV cache, together and atomically (a crash leaves
    /// the previous save of `name` or this one, never a mix). Nothing done
    /// later (more turns, [`Self::reset`], another conversation) changes
    /// it; save again to keep those.
    pub fn save(&self, kv_dir: &Path, name: &str) -> Result<SaveCounts> {
        validate_session_name(name)?;
        std::fs::create_dir_all(kv_dir).map_err(io_error(kv_dir))?;
        // Saves in this directory take turns (across processes), so that
        // the KV file read as the previous one below is still the one
        // the record names when this save replaces it.
        let dir_lock = File::open(kv_dir).map_err(io_error(kv_dir))?;
        dir_lock.lock().map_err(io_error(kv_dir))?;
        let record_path = kv_dir.join(format!("{name}{SAVED_CHAT_SUFFIX}"));
        let previous = save_named_by(&record_path, name);
        // Unique per save, so the KV file the record names now is never
        // the file being written.
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let kv_file = format!("{name}.{stamp:0width$x}.{SESSION_FILE_EXTENSION}", width = STAMP_HEX_DIGITS);
        let kv_path = kv_dir.join(&kv_file);
        let tokens = self.session.write_copy(&kv_path)?;
        let saved = SavedChat { kv_file: kv_file.clone(), tokens, messages: self.messages.clone() };
        let json = serde_json::to_vec_pretty(&saved)
            .map_err(|e| Error::InvalidRequest(format!("encoding the conversation: {e}")))?;
        // The commit point: from this rename on, `name` is this KV file.
        if let Err(e) = write_atomically(&record_path, &json) {
            // Not committed unless the record names it (a failed directory
            // sync comes after the rename): then it is the save.
            if save_named_by(&record_path, name).as_deref() != Some(kv_file.as_str()) {
                let _ = std::fs::remove_file(&kv_path);
            }
            return Err(e);
        }
        // Only the KV file this save replaced is deleted: other files of
        // the same shape may be a session of `strata generate` or another
        // save's.
        if let Some(previous) = previous.filter(|p| *p != kv_file) {
            let _ = std::fs::remove_file(kv_dir.join(previous));
        }
        Ok(SaveCounts { messages: saved.messages.len(), tokens })
    }

    /// Replaces the conversation with the one saved as `name`: exactly its
    /// messages, and its KV cache read back rather than recomputed.
    pub fn load(&mut self, engine: &'e Engine, kv_dir: &Path, name: &str) -> Result<SaveCounts> {
        validate_session_name(name)?;
        let path = kv_dir.join(format!("{name}{SAVED_CHAT_SUFFIX}"));
        let text = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::InvalidRequest(format!("no conversation saved as {name} in {}", kv_dir.display())));
            }
            other => other.map_err(io_error(&path))?,
        };
        let saved: SavedChat = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidRequest(format!("{}: not a saved conversation: {e}", path.display())))?;
        if !is_save_of(name, &saved.kv_file) {
            return Err(Error::InvalidRequest(format!(
                "{}: names {:?}, not a KV file of {name}",
                path.display(),
                saved.kv_file
            )));
        }
        let (session, report) = engine.read_session_copy(&kv_dir.join(&saved.kv_file))?;
        if report.reopened_tokens != saved.tokens || report.cut.is_some() {
            return Err(Error::InvalidRequest(format!(
                "{}: the KV file holds {} of the {} tokens saved; not loaded",
                report.path.display(),
                report.reopened_tokens,
                saved.tokens
            )));
        }
        self.session = session;
        self.messages = saved.messages;
        Ok(SaveCounts { messages: self.messages.len(), tokens: saved.tokens })
    }

    /// The prompt's ids after dropping the oldest turns (see [`oldest_turn`];
    /// never a system message or the newest turn) until the prompt leaves
    /// room for `reserve_tokens` of answer, how many messages were dropped,
    /// and where the prompt leaves the answer as to thinking.
    fn fit_context(&mut self, reserve_tokens: usize) -> Result<(Vec<u32>, usize, ThinkingStart)> {
        let context = self.session.context_tokens();
        let mut dropped = 0;
        loop {
            let text = self.text.render(&self.messages, self.thinking)?;
            let ids = self.text.tokenizer.encode(&text, false)?;
            let start = ThinkingStart::of_prompt(&text);
            if ids.len() + reserve_tokens <= context {
                return Ok((ids, dropped, start));
            }
            let Some(turn) = oldest_turn(&self.messages) else { return Ok((ids, dropped, start)) };
            dropped += turn.len();
            self.messages.drain(turn);
        }
    }

    /// Adds `user_text` and streams the answer to `on_text`, chunk by chunk
    /// of whole characters, its thinking apart where the template marks
    /// thinking (else every chunk is [`Split::Answer`]); `ControlFlow::Break`
    /// stops it.
    pub fn say(
        &mut self,
        user_text: &str,
        options: &ReplyOptions,
        mut on_text: impl FnMut(&Split) -> ControlFlow<()>,
    ) -> Result<Reply> {
        // A failed turn is not kept: on error the conversation is put back
        // as it was before it, older turns included.
        let before = self.messages.clone();
        self.messages.push(Message::user(user_text));
        // Room for a short answer is kept, not for `max_new_tokens`: with a
        // small context that would leave the question alone in it. The
        // answer may then run to the end of the context.
        let context = self.session.context_tokens();
        let reserve = options.max_new_tokens.min(context / ANSWER_RESERVE_DIVISOR);
        let (ids, dropped_messages, thinking_start) = match self.fit_context(reserve) {
            Ok(fitted) => fitted,
            Err(e) => {
                self.messages = before;
                return Err(e);
            }
        };
        if ids.len() >= context {
            self.messages = before;
            return Err(Error::InvalidRequest(format!(
                "the message is {} tokens with the system prompt; the context holds {context}",
                ids.len()
            )));
        }
        // Feed only what the session does not already hold: from the
        // longest common prefix it can resume at (with a recurrent state,
        // its latest snapshot there), the rest in the prompt's pass.
        let common = self.session.common_prefix_len(&ids).min(ids.len().saturating_sub(1));
        let common = self.session.rewind(common);
        let mut detok = self.text.tokenizer.detokenizer(true);
        let mut stops = StopStrings::new(options.stop.iter().cloned());
        let mut splitter = self.text.thinks().then(|| ReasoningSplitter::new(thinking_start));
        let mut answer = String::new();
        let mut reasoning = String::new();
        // Hands out text of the reply as its parts; whether the caller broke off.
        let mut hand_out = |splitter: &mut Option<ReasoningSplitter>, text: String, done: bool| {
            let mut splits = match splitter {
                None if text.is_empty() => Vec::new(),
                None => vec![Split::Answer(text)],
                Some(splitter) => splitter.push(&text),
            };
            if done {
                splits.extend(splitter.as_mut().map(ReasoningSplitter::finish).unwrap_or_default());
            }
            let mut broke = false;
            for split in splits {
                match &split {
                    Split::Answer(text) => answer.push_str(text),
                    Split::Reasoning(text) => reasoning.push_str(text),
                }
                // Once stopped, the rest is kept but not shown.
                broke = broke || on_text(&split).is_break();
            }
            broke
        };
        let mut cancelled = false;
        let mut failure = None;
        let generate = GenerateOptions {
            max_new_tokens: options.max_new_tokens.min(context - ids.len()),
            sampling: options.sampling,
            ignore_eos: false,
            extra_eos_token_ids: self.text.eos_token_ids.clone(),
        };
        let eos = self.text.eos_token_ids.clone();
        let report = self.session.generate(&ids[common..], &generate, |token| {
            if eos.contains(&token) {
                return ControlFlow::Continue(());
            }
            let piece = match detok.push(token) {
                Ok(piece) => piece,
                Err(err) => {
                    failure = Some(err);
                    return ControlFlow::Break(());
                }
            };
            let out = stops.push(&piece);
            if hand_out(&mut splitter, out.text, false) {
                cancelled = true;
                return ControlFlow::Break(());
            }
            if out.stopped.is_some() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        let report = match (report, failure) {
            (Ok(report), None) => report,
            (Err(err), _) => {
                self.messages = before;
                return Err(err.into());
            }
            (Ok(_), Some(err)) => {
                self.messages = before;
                return Err(err);
            }
        };
        let tail =
            if stops.stopped().is_none() { stops.push(&detok.finish()?).text + &stops.finish() } else { String::new() };
        hand_out(&mut splitter, tail, true);
        // A stop string or the caller broke off, which the session saw as
        // a cancel; the model's own end or the length limit it saw itself.
        let finish = match (cancelled, stops.stopped()) {
            (true, _) => Finish::Cancelled,
            (false, Some(index)) => Finish::StopString(index),
            (false, None) => report.finish,
        };
        reasoning.truncate(reasoning.trim_end().len());
        let reasoning_content = (!reasoning.is_empty()).then(|| reasoning.clone());
        self.messages.push(Message { reasoning_content, ..Message::assistant(answer.clone()) });
        Ok(Reply { text: answer, reasoning, finish, dropped_messages, stats: report.stats })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|m| m.role.as_str()).collect()
    }

    fn conversation(roles: &[&str]) -> Vec<Message> {
        roles.iter().map(|&role| Message { role: role.to_owned(), ..Message::user("") }).collect()
    }

    #[test]
    fn a_dropped_turn_takes_its_answer_and_tool_messages_and_leaves_a_question_first() {
        let mut messages =
            conversation(&["system", "user", "assistant", "tool", "assistant", "user", "assistant", "user"]);
        let turn = oldest_turn(&messages).unwrap();
        assert_eq!(turn, 1..5);
        messages.drain(turn);
        assert_eq!(roles(&messages), ["system", "user", "assistant", "user"]);
        // A history that begins with an answer (saved before turns were
        // dropped whole) loses that answer first, and is whole again.
        let messages = conversation(&["assistant", "user", "assistant", "user"]);
        assert_eq!(oldest_turn(&messages), Some(0..1));
    }

    #[test]
    fn the_newest_turn_and_system_messages_are_never_dropped() {
        for roles in [&["system", "user"][..], &["user", "assistant", "tool"], &["system"], &[]] {
            assert_eq!(oldest_turn(&conversation(roles)), None, "{roles:?}");
        }
        let messages = conversation(&["system", "user", "assistant", "system", "user"]);
        assert_eq!(oldest_turn(&messages), Some(1..3));
    }

    #[test]
    fn only_a_conversations_own_kv_files_are_taken_for_it() {
        let stamp = "0123456789abcdef".repeat(2);
        assert!(is_save_of("a", &format!("a.{stamp}.kvs")));
        for other in [
            "a.kvs".to_owned(),
            "a.b.kvs".to_owned(),
            format!("a.b.{stamp}.kvs"),
            format!("ab.{stamp}.kvs"),
            format!("a.{}.kvs", &stamp[1..]),
            format!("a.{stamp}.kvs.tmp-1"),
        ] {
            assert!(!is_save_of("a", &other), "{other}");
        }
    }
}
