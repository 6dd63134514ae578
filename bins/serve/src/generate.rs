//! What every generation endpoint shares: checking a request against the
//! limits, queueing it in the engine's batcher, and turning its tokens into
//! text pieces (streamed detokenization, stop strings) and tool calls.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::http::StatusCode;
use strata_engine::{
    Admission, Constraint, Detokenizer, Error as EngineError, Event, EventSink, Finish, GenerateOptions, Job,
    ParsedCall, ReasoningSplitter, SamplingOptions, Split, StopStrings, ToolCallParser, ToolEvent,
};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::App;

/// Stop strings one request may give (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 16;
/// The longest stop string accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;
/// Requests prepared (templated and tokenized) at once, at most.
pub const TOKENIZE_MAX_CONCURRENT: usize = 4;

/// A generation request in the terms every API shares.
#[derive(Default)]
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
    /// The grammar the reply is held to (`App::constraint`).
    pub constraint: Option<Box<dyn Constraint>>,
    /// Reads the reply's tool calls, when tools may be called.
    pub calls: Option<ToolCallParser>,
    /// Keeps the reply's thinking apart, when the template thinks.
    pub reasoning: Option<ReasoningSplitter>,
}

/// One piece of a reply.
#[derive(Debug)]
pub enum Piece {
    Text(String),
    /// The model's thinking (of a template that marks it).
    Reasoning(String),
    Call(ParsedCall),
    End {
        reason: Finish,
        completion_tokens: usize,
    },
}

/// A whole reply, collected.
#[derive(Debug)]
pub struct Reply {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<ParsedCall>,
    pub reason: Finish,
    pub completion_tokens: usize,
}

/// A queued generation: its pieces as they come.
pub struct Generation {
    pub prompt_tokens: usize,
    pub stop: Vec<String>,
    rx: Option<mpsc::Receiver<Event>>,
    /// The server's shutdown cut (`App::cut`).
    cut: tokio::sync::watch::Receiver<bool>,
    detok: Detokenizer,
    stops: StopStrings,
    calls: Option<ToolCallParser>,
    reasoning: Option<ReasoningSplitter>,
    /// Reads calls the model writes inside its thinking (some do, and
    /// then act on them), when calls are read.
    thinking_calls: Option<ToolCallParser>,
    /// Left out of the text even where special tokens are kept.
    eos_token_ids: Vec<u32>,
    tokens: usize,
    ready: VecDeque<Result<Piece, ApiError>>,
}

/// A job's events, handed from the batcher's thread to its request's task.
/// The channel holds every event the job can send (one per token, one for
/// the end), so the batcher never waits on a slow client; when the request
/// drops its receiver (client gone, stop string), the job is cancelled.
struct RequestSink(mpsc::Sender<Event>);

impl EventSink for RequestSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.try_send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

impl App {
    /// A place in the batcher's queue, taken before anything is done with
    /// a request's body; 429 when the queue is full.
    pub fn admit(&self) -> Result<Admission, ApiError> {
        match self.batcher.reserve() {
            Ok(admission) => Ok(admission),
            Err(EngineError::QueueFull { .. }) => {
                self.metrics.rejected_queue_full.fetch_add(1, Relaxed);
                Err(ApiError {
                    retry_after: Some(1),
                    ..ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "the server is busy ({} requests waiting); retry shortly",
                            self.batcher.queue_capacity()
                        ),
                    )
                    .code("queue_full")
                })
            }
            Err(_) => Err(shutting_down()),
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
            .map_err(|_| shutting_down())?;
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
        let options = GenerateOptions {
            max_new_tokens: max_tokens,
            sampling,
            ignore_eos: request.ignore_eos,
            extra_eos_token_ids: self.eos_token_ids.clone(),
        };
        let (events, rx) = mpsc::channel(max_tokens + 1);
        let job = Job {
            prompt: request.prompt,
            options,
            constraint: request.constraint,
            request_id: crate::trace::request_id(),
        };
        // Checked above as the APIs word it; the batcher's own check agrees.
        admission.send(job, Box::new(RequestSink(events))).map_err(|e| match e {
            EngineError::BatcherStopped => shutting_down(),
            e => ApiError::invalid(e.to_string()),
        })?;
        self.metrics.request(endpoint);
        Ok(Generation {
            prompt_tokens,
            stops: StopStrings::new(request.stop.iter().cloned()),
            stop: request.stop,
            rx: Some(rx),
            cut: self.cut.clone(),
            // Some families write their call markers as special tokens
            // (DeepSeek, Kimi): kept where calls are read.
            detok: self.tokenizer.detokenizer(request.calls.is_none()),
            thinking_calls: request.calls.as_ref().filter(|_| request.reasoning.is_some()).cloned(),
            calls: request.calls,
            reasoning: request.reasoning,
            eos_token_ids: self.eos_token_ids.clone(),
            tokens: 0,
            ready: VecDeque::new(),
        })
    }
}

impl Generation {
    /// The next piece; `None` after the end. Dropping the generation (or
    /// reaching a stop string) cancels it in the batcher.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        loop {
            if let Some(piece) = self.ready.pop_front() {
                return Some(piece);
            }
            let rx = self.rx.as_mut()?;
            // The cut first: at the deadline, a reply still in the channel
            // is not waited for either. A closed sender (the server gone)
            // cuts too.
            let event = tokio::select! {
                biased;
                _ = self.cut.wait_for(|cut| *cut) => None,
                event = rx.recv() => Some(event),
            };
            let Some(event) = event else {
                self.fail(shutdown_cut());
                continue;
            };
            match event {
                Some(Event::Token(id)) => {
                    self.tokens += 1;
                    // Only with `ignore_eos` does an end-of-sequence token arrive.
                    if self.eos_token_ids.contains(&id) {
                        continue;
                    }
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
                None => self.fail(ApiError::internal("generation ended without finishing (the batcher stopped)")),
            }
        }
    }

    /// Collects the whole reply.
    pub async fn collect(mut self) -> Result<Reply, ApiError> {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        while let Some(piece) = self.next().await {
            match piece? {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
                Piece::Call(call) => calls.push(call),
                Piece::End { reason, completion_tokens } => {
                    // The whitespace before the close marker is the marker's.
                    reasoning.truncate(reasoning.trim_end().len());
                    return Ok(Reply { text, reasoning, calls, reason, completion_tokens });
                }
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
            self.answer(out.text);
            self.finish_calls();
            let completion_tokens = end.map_or(self.tokens, |(_, n)| n);
            self.end(Finish::StopString(index), completion_tokens);
            return;
        }
        let mut text = out.text;
        if let Some((finish, completion_tokens)) = end {
            text.push_str(&self.stops.finish());
            self.answer(text);
            self.finish_calls();
            self.end(finish, completion_tokens);
        } else {
            self.answer(text);
        }
    }

    /// The last piece. Dropping the receiver tells the batcher to stop (a
    /// stop string) or that nothing more is to come.
    fn end(&mut self, reason: Finish, completion_tokens: usize) {
        tracing::info!(prompt_tokens = self.prompt_tokens, completion_tokens, finish = ?reason, "generated");
        self.ready.push_back(Ok(Piece::End { reason, completion_tokens }));
        self.rx = None;
    }

    /// Hands out `text` of the reply: its thinking apart, when the template
    /// thinks, and the rest as [`Generation::answer_text`].
    fn answer(&mut self, text: String) {
        let splits = match &mut self.reasoning {
            None => vec![Split::Answer(text)],
            Some(splitter) => splitter.push(&text),
        };
        self.hand_out(splits);
    }

    fn hand_out(&mut self, splits: Vec<Split>) {
        for split in splits {
            match split {
                Split::Answer(text) => {
                    self.finish_thinking_calls();
                    self.answer_text(text);
                }
                Split::Reasoning(text) => match &mut self.thinking_calls {
                    None => self.ready.push_back(Ok(Piece::Reasoning(text))),
                    Some(parser) => {
                        let events = parser.push(&text);
                        self.ready.extend(events.into_iter().map(|e| Ok(thinking_piece(e))));
                    }
                },
            }
        }
    }

    /// What the thinking's call parser held back, once the thinking is over.
    fn finish_thinking_calls(&mut self) {
        if let Some(mut parser) = self.thinking_calls.take() {
            let events = parser.finish();
            self.ready.extend(events.into_iter().map(|e| Ok(thinking_piece(e))));
        }
    }

    /// Hands out `text` of the answer: as it is, or through the call parser.
    fn answer_text(&mut self, text: String) {
        match &mut self.calls {
            None if text.is_empty() => {}
            None => self.ready.push_back(Ok(Piece::Text(text))),
            Some(parser) => {
                let events = parser.push(&text);
                self.ready.extend(events.into_iter().map(|e| Ok(tool_piece(e))));
            }
        }
    }

    /// What the splitter and the call parsers held back at the end of the reply.
    fn finish_calls(&mut self) {
        if let Some(splits) = self.reasoning.as_mut().map(ReasoningSplitter::finish) {
            self.hand_out(splits);
        }
        self.finish_thinking_calls();
        if let Some(parser) = &mut self.calls {
            let events = parser.finish();
            self.ready.extend(events.into_iter().map(|e| Ok(tool_piece(e))));
        }
    }

    fn fail(&mut self, error: ApiError) {
        self.ready.push_back(Err(error));
        self.rx = None;
    }
}

fn tool_piece(event: ToolEvent) -> Piece {
    match event {
        ToolEvent::Text(text) => Piece::Text(text),
        ToolEvent::Call(call) => Piece::Call(call),
    }
}

/// A piece of the thinking: its text is reasoning, its calls are calls.
fn thinking_piece(event: ToolEvent) -> Piece {
    match event {
        ToolEvent::Text(text) => Piece::Reasoning(text),
        ToolEvent::Call(call) => Piece::Call(call),
    }
}

/// A reply still running at the shutdown deadline: an error the client can
/// tell from a network fault, and retry elsewhere.
fn shutdown_cut() -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; this reply was cut short")
            .code("shutting_down")
    }
}

fn shutting_down() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use strata_engine::{ThinkingStart, Tokenizer, ToolSyntax};

    use super::*;

    /// A generation of a template that thinks, whose text arrives by hand.
    fn thinking_generation(start: ThinkingStart) -> Generation {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let tokenizer = Tokenizer::from_dir(&demo).unwrap().expect("the demo's tokenizer");
        let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather"}})];
        let calls = ToolCallParser::new(ToolSyntax::JsonTags, &tools);
        Generation {
            prompt_tokens: 1,
            stop: Vec::new(),
            rx: None,
            detok: tokenizer.detokenizer(false),
            stops: StopStrings::new(Vec::<String>::new()),
            thinking_calls: Some(calls.clone()),
            calls: Some(calls),
            reasoning: Some(ReasoningSplitter::new(start)),
            eos_token_ids: Vec::new(),
            tokens: 0,
            ready: VecDeque::new(),
            // A sender dropped at once: the test's replies are never cut.
            cut: tokio::sync::watch::channel(false).1,
        }
    }

    /// The pieces of a reply that arrives as `chunks`.
    fn pieces(start: ThinkingStart, chunks: &[&str]) -> Vec<String> {
        let mut generation = thinking_generation(start);
        for (i, chunk) in chunks.iter().enumerate() {
            let end = (i + 1 == chunks.len()).then_some((Finish::Stop, chunks.len()));
            generation.text((*chunk).to_owned(), end);
        }
        generation
            .ready
            .into_iter()
            .map(|piece| match piece.unwrap() {
                Piece::Text(text) => format!("text {text}"),
                Piece::Reasoning(text) => format!("reasoning {text}"),
                Piece::Call(call) => format!("call {} {}", call.name, call.arguments),
                Piece::End { .. } => "end".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_call_inside_or_after_the_thinking_still_parses() {
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let inside = format!("I will look it up.{call}</think>\n\nDone.");
        assert_eq!(
            pieces(ThinkingStart::Opened, &[&inside[..20], &inside[20..]]),
            ["reasoning I will look it up.", "call get_weather {\"city\":\"Paris\"}", "text Done.", "end"]
        );
        let after = format!("<think>\nHmm.\n</think>\n\n{call}");
        let got = pieces(ThinkingStart::MayOpen, &[&after]);
        assert_eq!(got, ["reasoning Hmm.\n", "call get_weather {\"city\":\"Paris\"}", "end"]);
    }
}
