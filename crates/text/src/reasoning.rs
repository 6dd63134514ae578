//! Reasoning kept apart from the answer. The families that think (Qwen3 and
//! 3.5, GLM, DeepSeek V3.1, Kimi) write their thinking between `<think>` and
//! `</think>`, and their templates show where: a generation prompt that
//! opens `<think>` (Qwen3.5, DeepSeek V3.1 thinking) starts the reply inside
//! it; otherwise the model may open it itself (Qwen3, GLM).
//!
//! - [`ThinkingStart`]: where a reply starts, from its prompt.
//! - [`ReasoningSplitter`]: a streamed reply as reasoning and answer text.
//! - [`ThinkingBudget`]: a [`Constraint`] that ends the thinking once it has
//!   taken its budget of tokens (the model's own close marker, forced), and
//!   holds only what follows to an inner constraint (a forced call's or a
//!   response format's grammar applies to the answer, as vLLM applies it).

use strata_engine::{Constraint, Result};

/// The marker that opens a model's thinking.
pub const THINK_OPEN: &str = "<think>";
/// The marker that closes it.
pub const THINK_CLOSE: &str = "</think>";

/// Whether a chat template marks thinking (it writes the close marker).
pub fn template_thinks(template_source: &str) -> bool {
    template_source.contains(THINK_CLOSE)
}

/// Where a reply starts, as its rendered prompt leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingStart {
    /// Inside the thinking: the prompt's last open marker comes after its
    /// last close marker (Qwen3.5's and DeepSeek V3.1's thinking prompts).
    Opened,
    /// After it: the prompt ends with the close marker (an empty thinking
    /// written for the model when thinking is off).
    Closed,
    /// The reply may open it itself (Qwen3's and GLM's prompts).
    MayOpen,
}

impl ThinkingStart {
    pub fn of_prompt(prompt: &str) -> ThinkingStart {
        match (prompt.rfind(THINK_OPEN), prompt.rfind(THINK_CLOSE)) {
            (Some(open), close) if close.is_none_or(|close| open > close) => ThinkingStart::Opened,
            _ if prompt.trim_end().ends_with(THINK_CLOSE) => ThinkingStart::Closed,
            _ => ThinkingStart::MayOpen,
        }
    }

    fn phase(self) -> Phase {
        match self {
            ThinkingStart::Opened => Phase::Thinking,
            ThinkingStart::Closed => Phase::Answer,
            ThinkingStart::MayOpen => Phase::Before,
        }
    }
}

/// A piece of a split reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    Reasoning(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The reply has not shown yet whether it opens the thinking.
    Before,
    Thinking,
    Answer,
}

/// Splits a streamed reply at the thinking markers: reasoning (without the
/// markers, and without the whitespace that opens it) and then the answer
/// (without the whitespace templates put after the close marker). Text that
/// may be the start of a marker is held until it is known not to be.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    phase: Phase,
    /// Text not handed out yet.
    held: String,
    /// Whether the current part has handed out anything other than
    /// whitespace (leading whitespace of each part is dropped).
    started: bool,
}

impl ReasoningSplitter {
    /// A splitter for a reply that starts at `start`.
    pub fn new(start: ThinkingStart) -> ReasoningSplitter {
        ReasoningSplitter { phase: start.phase(), held: String::new(), started: false }
    }

    /// Whether the reply is inside its thinking now.
    pub fn is_thinking(&self) -> bool {
        self.phase == Phase::Thinking
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Before => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                        self.held = rest.to_owned();
                        self.enter(Phase::Thinking);
                    } else if THINK_OPEN.starts_with(trimmed) {
                        return out;
                    } else {
                        self.enter(Phase::Answer);
                    }
                }
                Phase::Thinking => match self.held.find(THINK_CLOSE) {
                    Some(at) => {
                        let reasoning = self.held[..at].to_owned();
                        self.held.replace_range(..at + THINK_CLOSE.len(), "");
                        self.hand_out(reasoning, &mut out);
                        self.enter(Phase::Answer);
                    }
                    None => {
                        let keep = partial_marker_len(&self.held, THINK_CLOSE);
                        let ready = self.held[..self.held.len() - keep].to_owned();
                        self.held.replace_range(..self.held.len() - keep, "");
                        self.hand_out(ready, &mut out);
                        return out;
                    }
                },
                Phase::Answer => {
                    let ready = std::mem::take(&mut self.held);
                    self.hand_out(ready, &mut out);
                    return out;
                }
            }
        }
    }

    /// What was held at the end of the reply: a marker never completed is text.
    pub fn finish(&mut self) -> Vec<Split> {
        let mut out = Vec::new();
        if self.phase == Phase::Before {
            self.enter(Phase::Answer);
        }
        let rest = std::mem::take(&mut self.held);
        self.hand_out(rest, &mut out);
        out
    }

    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.started = false;
    }

    fn hand_out(&mut self, text: String, out: &mut Vec<Split>) {
        let text = if self.started { text } else { text.trim_start().to_owned() };
        if text.is_empty() {
            return;
        }
        self.started = true;
        out.push(match self.phase {
            Phase::Thinking => Split::Reasoning(text),
            Phase::Before | Phase::Answer => Split::Answer(text),
        });
    }
}

/// The length of the longest end of `text` that begins `marker` (an ASCII
/// marker: the rest of `text` ends on a character boundary).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1)).rev().find(|&n| text.ends_with(&marker[..n])).unwrap_or(0)
}

/// Token ids of the thinking markers, as the model's tokenizer spells them.
#[derive(Debug, Clone)]
pub struct ThinkingMarkers {
    pub open_ids: Vec<u32>,
    pub close_ids: Vec<u32>,
}

/// Ends the thinking after `budget_tokens` of it: from then the close
/// marker's tokens are the only ones allowed, one by one, and the answer
/// goes on after them. The inner constraint, if any, holds the answer only.
pub struct ThinkingBudget {
    markers: ThinkingMarkers,
    budget_tokens: Option<usize>,
    inner: Option<Box<dyn Constraint>>,
    phase: Phase,
    /// The open marker's tokens the reply has begun with so far.
    opening: Vec<u32>,
    /// The thinking's tokens so far.
    thinking_tokens: usize,
    /// The most recent tokens of the thinking, as long as the close marker.
    recent: Vec<u32>,
    /// How many of the close marker's tokens have been forced so far, once
    /// the budget is spent.
    forced: Option<usize>,
}

impl std::fmt::Debug for ThinkingBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThinkingBudget")
            .field("budget_tokens", &self.budget_tokens)
            .field("thinking_tokens", &self.thinking_tokens)
            .finish_non_exhaustive()
    }
}

impl ThinkingBudget {
    /// A reply that starts at `start`, whose thinking takes at most
    /// `budget_tokens` (none: as long as the model likes), and whose answer
    /// `inner` holds.
    pub fn new(
        markers: ThinkingMarkers,
        start: ThinkingStart,
        budget_tokens: Option<usize>,
        inner: Option<Box<dyn Constraint>>,
    ) -> ThinkingBudget {
        assert!(!markers.open_ids.is_empty() && !markers.close_ids.is_empty(), "the markers have tokens");
        ThinkingBudget {
            markers,
            budget_tokens,
            inner,
            phase: start.phase(),
            opening: Vec::new(),
            thinking_tokens: 0,
            recent: Vec::new(),
            forced: None,
        }
    }

    /// The next token the close marker needs, while it is being forced.
    fn forced_next(&mut self) -> Option<u32> {
        if self.phase != Phase::Thinking {
            return None;
        }
        if self.forced.is_none() && self.budget_tokens.is_some_and(|budget| self.thinking_tokens >= budget) {
            self.forced = Some(0);
        }
        self.forced.map(|n| self.markers.close_ids[n])
    }
}

impl Constraint for ThinkingBudget {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        if let Some(token) = self.forced_next() {
            let allowed = token as usize;
            if allowed >= logits.len() {
                return Err(strata_engine::Error::Grammar(format!(
                    "the close marker's token {token} is outside the vocabulary"
                )));
            }
            for (id, logit) in logits.iter_mut().enumerate() {
                *logit = if id == allowed { 0.0 } else { f32::NEG_INFINITY };
            }
            return Ok(());
        }
        let Some(inner) = &mut self.inner else { return Ok(()) };
        match self.phase {
            Phase::Answer => inner.mask(logits),
            // The answer's first token, or the marker opening the thinking;
            // once the marker has begun, only the rest of it (the inner
            // constraint never sees a marker).
            Phase::Before => {
                let next_open = self.markers.open_ids[self.opening.len()] as usize;
                let kept = logits.get(next_open).copied();
                if self.opening.is_empty() {
                    inner.mask(logits)?;
                } else {
                    logits.fill(f32::NEG_INFINITY);
                }
                if let (Some(kept), Some(slot)) = (kept, logits.get_mut(next_open)) {
                    *slot = kept;
                }
                Ok(())
            }
            Phase::Thinking => Ok(()),
        }
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        match self.phase {
            Phase::Before if self.markers.open_ids.get(self.opening.len()) == Some(&token) => {
                self.opening.push(token);
                if self.opening.len() == self.markers.open_ids.len() {
                    self.phase = Phase::Thinking;
                }
                Ok(())
            }
            Phase::Before => {
                // No thinking. With an inner constraint the mask allowed no
                // detour through part of the marker, so this token is the
                // answer's first.
                debug_assert!(self.inner.is_none() || self.opening.is_empty());
                self.phase = Phase::Answer;
                self.inner.as_mut().map_or(Ok(()), |inner| inner.accept(token))
            }
            Phase::Thinking => {
                self.thinking_tokens += 1;
                if let Some(n) = self.forced {
                    self.forced = Some(n + 1);
                }
                let close = &self.markers.close_ids;
                self.recent.push(token);
                if self.recent.len() > close.len() {
                    self.recent.remove(0);
                }
                if self.recent == *close || self.forced == Some(close.len()) {
                    self.phase = Phase::Answer;
                    self.forced = None;
                }
                Ok(())
            }
            Phase::Answer => self.inner.as_mut().map_or(Ok(()), |inner| inner.accept(token)),
        }
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Answer && self.inner.as_ref().is_some_and(|inner| inner.is_finished())
    }

    /// The answer's way out is the inner constraint's; a reply still before
    /// or in its thinking knows none (it is cut at the limit, as before).
    fn closing(&mut self, next: &[u32]) -> Result<Option<Vec<u32>>> {
        match (&mut self.inner, self.phase) {
            (Some(inner), Phase::Answer) => inner.closing(next),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(start: ThinkingStart, pieces: &[&str]) -> (String, String) {
        let mut splitter = ReasoningSplitter::new(start);
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(splitter.push(piece));
        }
        events.extend(splitter.finish());
        let (mut reasoning, mut answer) = (String::new(), String::new());
        for event in events {
            match event {
                Split::Reasoning(text) => reasoning.push_str(&text),
                Split::Answer(text) => answer.push_str(&text),
            }
        }
        (reasoning, answer)
    }

    #[test]
    fn a_reply_that_opens_its_thinking_is_split_at_the_markers_however_streamed() {
        let reply = "<think>\nLet me see.\n</think>\n\nHello <b>there</b>.";
        let whole = split_all(ThinkingStart::MayOpen, &[reply]);
        assert_eq!(whole, ("Let me see.\n".to_owned(), "Hello <b>there</b>.".to_owned()));
        let by_char: Vec<String> = reply.chars().map(String::from).collect();
        let by_char: Vec<&str> = by_char.iter().map(String::as_str).collect();
        assert_eq!(split_all(ThinkingStart::MayOpen, &by_char), whole);
    }

    #[test]
    fn a_prompt_that_opened_the_thinking_starts_the_reply_inside_it() {
        assert_eq!(
            split_all(ThinkingStart::Opened, &["Hmm", ".</th", "ink>", "Yes."]),
            ("Hmm.".to_owned(), "Yes.".to_owned())
        );
        // Never closed: all of it is reasoning.
        assert_eq!(split_all(ThinkingStart::Opened, &["Hmm </thi"]), ("Hmm </thi".to_owned(), String::new()));
    }

    #[test]
    fn a_reply_without_markers_is_all_answer() {
        assert_eq!(
            split_all(ThinkingStart::MayOpen, &["  <thin", "king> is a word"]),
            (String::new(), "<thinking> is a word".to_owned())
        );
        assert_eq!(split_all(ThinkingStart::MayOpen, &["<thi"]), (String::new(), "<thi".to_owned()));
        assert_eq!(
            split_all(ThinkingStart::MayOpen, &["Plain. <think>x</think>"]),
            (String::new(), "Plain. <think>x</think>".to_owned())
        );
    }

    #[test]
    fn prompts_say_whether_they_opened_or_closed_the_thinking() {
        let start = ThinkingStart::of_prompt;
        assert_eq!(start("<|im_start|>assistant\n<think>\n"), ThinkingStart::Opened);
        assert_eq!(start("<|im_start|>assistant\n<think>\n\n</think>\n\n"), ThinkingStart::Closed);
        assert_eq!(start("<think>a</think>b<|im_start|>assistant\n"), ThinkingStart::MayOpen);
        assert_eq!(start("no markers"), ThinkingStart::MayOpen);
    }

    #[test]
    fn a_prompt_that_closed_the_thinking_leaves_all_of_the_reply_to_the_answer() {
        let closed = ThinkingStart::Closed;
        assert_eq!(split_all(closed, &["\n<think>x</think>y"]), (String::new(), "<think>x</think>y".to_owned()));
    }

    /// A constraint that allows everything and counts what it is told.
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Constraint for Counting {
        fn mask(&mut self, _: &mut [f32]) -> Result<()> {
            Ok(())
        }
        fn accept(&mut self, _: u32) -> Result<()> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        fn is_finished(&self) -> bool {
            false
        }
    }

    /// Runs `budget` over a model that always prefers token 9, for `steps`.
    fn run(budget: &mut ThinkingBudget, steps: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for _ in 0..steps {
            let mut logits = vec![0.0f32; 12];
            logits[9] = 5.0;
            budget.mask(&mut logits).unwrap();
            let token = (0..12).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            budget.accept(token).unwrap();
            out.push(token);
        }
        out
    }

    #[test]
    fn a_spent_thinking_budget_forces_the_close_marker_and_then_the_answer_is_free() {
        let markers = ThinkingMarkers { open_ids: vec![1], close_ids: vec![2, 3] };
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let inner = Box::new(Counting(answered.clone()));
        let mut budget = ThinkingBudget::new(markers, ThinkingStart::Opened, Some(3), Some(inner));
        assert_eq!(run(&mut budget, 7), [9, 9, 9, 2, 3, 9, 9]);
        // The inner constraint saw the answer only.
        assert_eq!(answered.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn without_a_budget_or_an_opening_nothing_is_forced() {
        let markers = ThinkingMarkers { open_ids: vec![1], close_ids: vec![2, 3] };
        assert_eq!(run(&mut ThinkingBudget::new(markers.clone(), ThinkingStart::Opened, None, None), 5), [9; 5]);
        // The reply did not open the thinking: no budget applies.
        for start in [ThinkingStart::MayOpen, ThinkingStart::Closed] {
            assert_eq!(run(&mut ThinkingBudget::new(markers.clone(), start, Some(1), None), 5), [9; 5]);
        }
    }

    fn committed_template(name: &str) -> crate::ChatTemplate {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/templates").join(name);
        let tokens = [("bos_token", "<｜begin▁of▁sentence｜>"), ("eos_token", "<|im_end|>")];
        let tokens = tokens.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        crate::ChatTemplate::new(std::fs::read_to_string(path).unwrap(), tokens).unwrap()
    }

    fn variables(json: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        json.as_object().unwrap().clone()
    }

    /// Each committed template that thinks: whether its generation prompt
    /// opens the thinking, as its own switch says; an earlier turn's
    /// thinking, given apart as `reasoning_content`, is dropped, and the
    /// thinking of the turn still going on (a call and its result) is shown.
    #[test]
    fn each_thinking_template_opens_and_drops_thinking_as_it_says() {
        use crate::{Message, ToolCall};
        use ThinkingStart::{Closed, MayOpen, Opened};
        let cases = [
            ("qwen3.jinja", serde_json::json!({}), MayOpen),
            ("qwen3.jinja", serde_json::json!({"enable_thinking": false}), Closed),
            ("qwen3.5.jinja", serde_json::json!({"enable_thinking": true}), Opened),
            ("qwen3.5.jinja", serde_json::json!({}), Closed),
            ("deepseek-v3.1.jinja", serde_json::json!({"thinking": true}), Opened),
            ("deepseek-v3.1.jinja", serde_json::json!({}), Closed),
            ("glm-4.6.jinja", serde_json::json!({}), MayOpen),
            ("glm-4.6.jinja", serde_json::json!({"enable_thinking": false}), Closed),
        ];
        let earlier = Message { reasoning_content: Some("EARLIER-THOUGHT".into()), ..Message::assistant("A1") };
        let asked_again = [Message::user("Q1"), earlier, Message::user("Q2")];
        let call = ToolCall { id: "call00001".into(), name: "f".into(), arguments: "{}".into() };
        let calling =
            Message { reasoning_content: Some("CURRENT-THOUGHT".into()), ..Message::assistant_calls("", vec![call]) };
        let mid_call = [Message::user("Q"), calling, Message::tool_result("call00001", "f", "42")];
        for (name, switch, start) in cases {
            let template = committed_template(name);
            assert!(template_thinks(template.source()), "{name}");
            let prompt = template.render_with(&asked_again, true, &variables(switch.clone())).unwrap();
            assert_eq!(ThinkingStart::of_prompt(&prompt), start, "{name} {switch}: {prompt}");
            assert!(!prompt.contains("EARLIER-THOUGHT"), "{name} {switch}: {prompt}");
            // DeepSeek V3.1's template shows no thinking back at all.
            if name != "deepseek-v3.1.jinja" {
                let prompt = template.render_with(&mid_call, true, &variables(switch.clone())).unwrap();
                assert!(prompt.contains("CURRENT-THOUGHT"), "{name} {switch}: {prompt}");
            }
        }
        let plain = committed_template("mixtral-instruct.jinja");
        assert!(!template_thinks(plain.source()));
    }
}
