//! What every generation endpoint shares: checking a request against the
//! limits, queueing it, and turning the scheduler's tokens into text pieces
//! (streamed detokenization, stop strings).

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::http::StatusCode;
use strata_engine::{Detokenizer, SamplingOptions, StopStrings};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::scheduler::{Admission, Event, Finish, Job, Rejected};
use crate::state::App;

/// Stop strings one request may give (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 16;
/// The longest stop string accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;
/// Requests prepared (templated and tokenized) at once, at most.
pub const TOKENIZE_MAX_CONCURRENT: usize = 4;

/// Sampling defaults: the model's `generation_config.json` where it has
/// them (as transformers' `generate` and vLLM use them), else OpenAI's.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Defaults {
    /// f64 so `/info` shows 0.8, not 0.800000011920929.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
}

impl Defaults {
    pub fn from_dir(dir: &Path) -> Defaults {
        let mut defaults = Defaults { temperature: 1.0, top_p: 1.0, top_k: 0 };
        let Ok(text) = std::fs::read_to_string(dir.join("generation_config.json")) else { return defaults };
        let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else { return defaults };
        if let Some(t) = config.get("temperature").and_then(serde_json::Value::as_f64) {
            defaults.temperature = t;
        }
        if let Some(p) = config.get("top_p").and_then(serde_json::Value::as_f64) {
            defaults.top_p = p;
        }
        if let Some(k) = config.get("top_k").and_then(serde_json::Value::as_u64) {
            defaults.top_k = k as usize;
        }
        if config.get("do_sample") == Some(&serde_json::Value::Bool(false)) {
            defaults.temperature = 0.0;
        }
        defaults
    }
}

/// A generation request in the terms every API shares.
#[derive(Debug, Default)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u64>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Treat `max_tokens` as a cap, lowered to what the context and the
    /// server allow, instead of refusing a request that asks for more
    /// (Anthropic's clients send large fixed values, e.g. 4096).
    pub cap_max_tokens: bool,
}

/// Why generation ended, as the APIs tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Eos,
    Length,
    /// The stop string at this index matched.
    Stop(usize),
}

/// One piece of a reply.
#[derive(Debug)]
pub enum Piece {
    Text(String),
    End { reason: EndReason, completion_tokens: usize },
}

/// A queued generation: its pieces as they come.
pub struct Generation {
    pub prompt_tokens: usize,
    pub stop: Vec<String>,
    rx: Option<mpsc::Receiver<Event>>,
    detok: Detokenizer,
    stops: StopStrings,
    tokens: usize,
    ready: VecDeque<Result<Piece, ApiError>>,
}

impl App {
    /// A place in the scheduler's queue, taken before anything is done with
    /// a request's body; 429 when the queue is full.
    pub fn admit(&self) -> Result<Admission, ApiError> {
        match self.scheduler.reserve() {
            Ok(admission) => Ok(admission),
            Err(Rejected::QueueFull) => {
                self.metrics.rejected_queue_full.fetch_add(1, Relaxed);
                Err(ApiError {
                    retry_after: Some(1),
                    ..ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "the server is busy ({} requests waiting); retry shortly",
                            self.scheduler.queue_capacity()
                        ),
                    )
                    .code("queue_full")
                })
            }
            Err(Rejected::ShutDown) => {
                Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"))
            }
        }
    }

    /// Runs the CPU-bound preparation of a request of `body_bytes` (chat
    /// template, tokenization of up to --max-body of text) off the async
    /// workers, within the tokenizing budget: at most
    /// [`App::tokenize_bytes_in_flight`] bytes of requests at once, and a
    /// small request counts as a share of it, so at most
    /// [`TOKENIZE_MAX_CONCURRENT`] run at once. Tokenizing takes tens of
    /// bytes of memory per byte of text; this bounds what requests cost
    /// before they run.
    pub async fn prepare<T: Send + 'static>(
        self: &Arc<Self>,
        body_bytes: usize,
        work: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let budget = self.tokenize_bytes_in_flight;
        let weight = body_bytes.clamp(budget / TOKENIZE_MAX_CONCURRENT, budget);
        let _permit = self
            .tokenizing
            .acquire_many(u32::try_from(weight).unwrap_or(u32::MAX))
            .await
            .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"))?;
        let app = Arc::clone(self);
        tokio::task::spawn_blocking(move || work(&app))
            .await
            .map_err(|e| ApiError::internal(format!("preparing the request: {e}")))?
    }

    /// Checks `request` against the limits and queues it in the place
    /// `admission` holds.
    pub fn generate(
        &self,
        admission: Admission,
        request: GenRequest,
        endpoint: Endpoint,
    ) -> Result<Generation, ApiError> {
        let prompt_tokens = request.prompt.len();
        if prompt_tokens == 0 {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        if let Some(&bad) = request.prompt.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(ApiError::invalid_param(
                "prompt",
                format!("token id {bad} is outside the vocabulary (0..{})", self.vocab_size),
            ));
        }
        let context = self.context_tokens;
        if prompt_tokens >= context {
            return Err(ApiError::invalid_param(
                "messages",
                format!(
                    "this model's maximum context length is {context} tokens, and the prompt alone is \
                     {prompt_tokens} tokens; shorten it"
                ),
            )
            .code("context_length_exceeded"));
        }
        let room = context - prompt_tokens;
        let max_tokens = match request.max_tokens {
            None => room.min(self.max_tokens_limit),
            Some(n) if request.cap_max_tokens && n > 0 => {
                usize::try_from(n).unwrap_or(usize::MAX).min(room).min(self.max_tokens_limit)
            }
            Some(0) => return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1")),
            Some(n) if n > self.max_tokens_limit as u64 => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!("max_tokens is {n}, and this server allows at most {}", self.max_tokens_limit),
                ));
            }
            Some(n) if n > room as u64 => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!(
                        "this model's maximum context length is {context} tokens; you asked for {} \
                         ({prompt_tokens} in the prompt, {n} to generate)",
                        prompt_tokens as u64 + n
                    ),
                )
                .code("context_length_exceeded"));
            }
            Some(n) => n as usize,
        };
        let temperature = request.temperature.unwrap_or(self.defaults.temperature as f32);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid_param("temperature", "temperature must be between 0 and 2"));
        }
        let top_p = request.top_p.unwrap_or(self.defaults.top_p as f32);
        if !(0.0..=1.0).contains(&top_p) {
            return Err(ApiError::invalid_param("top_p", "top_p must be between 0 and 1"));
        }
        let top_k = request.top_k.map_or(self.defaults.top_k, |k| usize::try_from(k).unwrap_or(usize::MAX));
        if request.stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid_param("stop", format!("at most {MAX_STOP_STRINGS} stop strings")));
        }
        if request.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid_param("stop", format!("stop strings are at most {MAX_STOP_BYTES} bytes")));
        }
        // No seed: a fresh one, so replies vary as clients expect.
        let seed = request.seed.unwrap_or_else(|| std::hash::RandomState::new().hash_one(prompt_tokens));
        let sampling = SamplingOptions { temperature, top_k, top_p, seed };
        let (events, rx) = Job::channel(max_tokens);
        let job = Job { prompt: request.prompt, max_tokens, sampling, ignore_eos: request.ignore_eos, events };
        admission.send(job);
        self.metrics.request(endpoint);
        Ok(Generation {
            prompt_tokens,
            stops: StopStrings::new(request.stop.iter().cloned()),
            stop: request.stop,
            rx: Some(rx),
            detok: self.tokenizer.detokenizer(true),
            tokens: 0,
            ready: VecDeque::new(),
        })
    }
}

impl Generation {
    /// The next piece; `None` after the end. Dropping the generation (or
    /// reaching a stop string) cancels it in the scheduler.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        loop {
            if let Some(piece) = self.ready.pop_front() {
                return Some(piece);
            }
            let event = self.rx.as_mut()?.recv().await;
            match event {
                Some(Event::Token(id)) => {
                    self.tokens += 1;
                    match self.detok.push(id) {
                        Ok(text) => self.text(text, None),
                        Err(e) => self.fail(ApiError::internal(e.to_string())),
                    }
                }
                Some(Event::Done { finish, completion_tokens }) => match self.detok.finish() {
                    Ok(text) => self.text(text, Some((finish, completion_tokens))),
                    Err(e) => self.fail(ApiError::internal(e.to_string())),
                },
                Some(Event::Failed(message)) => self.fail(ApiError::internal(message)),
                None => self.fail(ApiError::internal("generation ended without finishing (the scheduler stopped)")),
            }
        }
    }

    /// Collects the whole reply.
    pub async fn collect(mut self) -> Result<(String, EndReason, usize), ApiError> {
        let mut text = String::new();
        while let Some(piece) = self.next().await {
            match piece? {
                Piece::Text(t) => text.push_str(&t),
                Piece::End { reason, completion_tokens } => return Ok((text, reason, completion_tokens)),
            }
        }
        Err(ApiError::internal("generation ended without finishing"))
    }

    /// Turns a stream of pieces into a `futures` stream (for SSE bodies).
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Piece, ApiError>> + Send + 'static {
        futures_util::stream::unfold(self, |mut g| async move { g.next().await.map(|piece| (piece, g)) })
    }

    fn text(&mut self, text: String, end: Option<(Finish, usize)>) {
        let out = self.stops.push(&text);
        if let Some(index) = out.stopped {
            if !out.text.is_empty() {
                self.ready.push_back(Ok(Piece::Text(out.text)));
            }
            let completion_tokens = end.map_or(self.tokens, |(_, n)| n);
            self.ready.push_back(Ok(Piece::End { reason: EndReason::Stop(index), completion_tokens }));
            // Dropping the receiver tells the scheduler to stop.
            self.rx = None;
            return;
        }
        let mut text = out.text;
        if let Some((finish, completion_tokens)) = end {
            text.push_str(&self.stops.finish());
            if !text.is_empty() {
                self.ready.push_back(Ok(Piece::Text(text)));
            }
            let reason = match finish {
                Finish::Eos => EndReason::Eos,
                Finish::Length => EndReason::Length,
            };
            self.ready.push_back(Ok(Piece::End { reason, completion_tokens }));
            self.rx = None;
        } else if !text.is_empty() {
            self.ready.push_back(Ok(Piece::Text(text)));
        }
    }

    fn fail(&mut self, error: ApiError) {
        self.ready.push_back(Err(error));
        self.rx = None;
    }
}
