//! Conversations in text: the chat template renders the messages, the
//! tokenizer turns them into ids, the session feeds only what it does not
//! already hold, and generated ids stream back as text with stop strings
//! applied. `chat` and `serve` both stand on this.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::persist::session_path;
use crate::text::{ChatTemplate, Message, StopStrings, Tokenizer, eos_ids_from_dir};
use crate::{Engine, Error, GenerateOptions, Result, RunStats, SamplingOptions, Session};

/// Where a saved conversation's messages live, beside its session file.
fn messages_path(kv_dir: &Path, name: &str) -> Result<PathBuf> {
    Ok(session_path(kv_dir, name)?.with_extension("messages.json"))
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
        let dir = engine.container().dir();
        let tokenizer = Tokenizer::from_dir(dir)?.ok_or_else(|| {
            Error::InvalidRequest(format!("{} has no tokenizer.json: this model takes token ids only", dir.display()))
        })?;
        let template = ChatTemplate::from_dir(dir)?;
        let eos_token_ids = eos_ids_from_dir(dir, &engine.spec().eos_token_ids)?;
        Ok(Self { tokenizer, template, eos_token_ids })
    }

    /// The prompt text for `messages`, ending where the assistant speaks next.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        match &self.template {
            Some(template) => template.render(messages, true),
            None => {
                let mut text: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
                text.push_str("assistant:");
                Ok(text)
            }
        }
    }
}

/// How to answer.
#[derive(Debug, Clone, Default)]
pub struct ReplyOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingOptions,
    /// Strings that end the answer (not included in it).
    pub stop: Vec<String>,
}

/// Why an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// The caller broke off.
    Cancelled,
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub text: String,
    pub finish: FinishReason,
    pub stats: RunStats,
}

/// A conversation with a model.
pub struct Chat<'e> {
    text: TextModel,
    session: Session<'e>,
    messages: Vec<Message>,
}

impl<'e> Chat<'e> {
    /// A new conversation, optionally opened by a system message.
    pub fn new(engine: &'e Engine, system: Option<&str>) -> Result<Self> {
        let text = TextModel::load(engine)?;
        let messages = system.map(|s| vec![Message::system(s)]).unwrap_or_default();
        Ok(Self { text, session: engine.session(), messages })
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

    /// Saves the conversation as `name` under `kv_dir`: its KV cache (the
    /// session file) and its messages (`NAME.messages.json` beside it).
    /// From then on every turn is saved as it happens. Returns the tokens
    /// saved.
    pub fn save(&mut self, kv_dir: &Path, name: &str) -> Result<usize> {
        let tokens = self.session.save_as(kv_dir, name)?;
        let path = messages_path(kv_dir, name)?;
        let json = serde_json::to_vec_pretty(&self.messages.iter().map(|m| [&m.role, &m.content]).collect::<Vec<_>>())
            .map_err(|e| Error::InvalidRequest(format!("encoding messages: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).map_err(|source| Error::Io { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &path).map_err(|source| Error::Io { path: path.clone(), source })?;
        Ok(tokens)
    }

    /// Continues the conversation saved as `name`: its KV cache is read back,
    /// not recomputed. Returns the tokens loaded.
    pub fn load(&mut self, engine: &'e Engine, kv_dir: &Path, name: &str) -> Result<usize> {
        let path = messages_path(kv_dir, name)?;
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let pairs: Vec<[String; 2]> = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidRequest(format!("{}: not a saved conversation: {e}", path.display())))?;
        // Let go of the current session (and of its file's lock: it may be
        // the very session being loaded) before opening the saved one.
        self.session = engine.session();
        let (session, report) = engine.open_session(kv_dir, name)?;
        self.session = session;
        self.messages = pairs.into_iter().map(|[role, content]| Message::new(role, content)).collect();
        Ok(report.reopened_tokens)
    }

    /// The prompt's ids, after dropping the oldest turns (never the system
    /// message or the newest) until the prompt and the answer fit the context.
    fn fit_context(&mut self, max_new_tokens: usize) -> Result<Vec<u32>> {
        let context = self.session.context_tokens();
        loop {
            let ids = self.text.tokenizer.encode(&self.text.render(&self.messages)?, false)?;
            let oldest = self.messages.iter().position(|m| m.role != "system");
            let fits = ids.len() + max_new_tokens <= context;
            match oldest {
                Some(i) if !fits && i + 1 < self.messages.len() => {
                    self.messages.remove(i);
                }
                _ => return Ok(ids),
            }
        }
    }

    /// Adds `user_text` and streams the answer to `on_text`, chunk by chunk
    /// of whole characters; `ControlFlow::Break` stops it.
    pub fn say(
        &mut self,
        user_text: &str,
        options: &ReplyOptions,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Reply> {
        self.messages.push(Message::user(user_text));
        let ids = self.fit_context(options.max_new_tokens)?;
        // Feed only what the session does not already hold.
        let common = self.session.common_prefix_len(&ids).min(ids.len().saturating_sub(1));
        self.session.truncate(common);
        let mut detok = self.text.tokenizer.detokenizer(true);
        let mut stops = StopStrings::new(options.stop.iter().cloned());
        let mut answer = String::new();
        let mut cancelled = false;
        let mut failure = None;
        let generate = GenerateOptions {
            max_new_tokens: options.max_new_tokens,
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
            answer.push_str(&out.text);
            if !out.text.is_empty() && on_text(&out.text).is_break() {
                cancelled = true;
                return ControlFlow::Break(());
            }
            if out.stopped.is_some() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })?;
        if let Some(err) = failure {
            return Err(err);
        }
        let stopped_by_string = stops.stopped().is_some();
        if !stopped_by_string {
            let tail = stops.push(&detok.finish()?).text + &stops.finish();
            if !tail.is_empty() {
                answer.push_str(&tail);
                let _ = on_text(&tail);
            }
        }
        let hit_eos = report.tokens.last().is_some_and(|t| eos.contains(t));
        let finish = if cancelled {
            FinishReason::Cancelled
        } else if hit_eos || stopped_by_string {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        self.messages.push(Message::assistant(answer.clone()));
        Ok(Reply { text: answer, finish, stats: report.stats })
    }
}
