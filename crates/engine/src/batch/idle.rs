//! The idle pool: sessions of finished jobs, kept for prompt-prefix reuse.

use crate::{Engine, Session};

/// Sessions of finished jobs, kept so that a later prompt sharing a prefix
/// with one (the next turn of a chat resends the whole conversation) is
/// prefilled only from where they differ. Together with the active
/// sequences they never exceed `max_batch`, the sessions the memory budget
/// holds KV for; the least recently finished goes first.
pub(super) struct IdlePool<'e> {
    sessions: Vec<Session<'e>>,
}

impl<'e> IdlePool<'e> {
    pub(super) fn with_capacity(max_batch: usize) -> Self {
        Self { sessions: Vec::with_capacity(max_batch) }
    }

    pub(super) fn sessions(&self) -> &[Session<'e>] {
        &self.sessions
    }

    /// The session for `prompt`: the idle one sharing the longest prefix with
    /// it (cut back to that prefix, at least one prompt token left to feed,
    /// or with a recurrent state to its latest snapshot there), or a fresh
    /// one, within `room` sessions; and how many prompt tokens it already
    /// holds.
    pub(super) fn take(&mut self, engine: &'e Engine, prompt: &[u32], room: usize) -> (Session<'e>, usize) {
        let usable = |s: &Session<'_>| s.common_prefix_len(prompt).min(prompt.len().saturating_sub(1));
        let best = (0..self.sessions.len()).max_by_key(|&i| (usable(&self.sessions[i]), i));
        if let Some(i) = best.filter(|&i| usable(&self.sessions[i]) > 0) {
            let mut session = self.sessions.remove(i);
            let usable = usable(&session);
            let reused = session.rewind(usable);
            return (session, reused);
        }
        // A fresh session's KV must fit beside the active ones.
        while !self.sessions.is_empty() && self.sessions.len() >= room {
            self.sessions.remove(0);
        }
        (engine.session(), 0)
    }

    /// Keeps `session`, within `room` sessions.
    pub(super) fn put(&mut self, session: Session<'e>, room: usize) {
        self.sessions.push(session);
        while self.sessions.len() > room {
            self.sessions.remove(0);
        }
    }
}
