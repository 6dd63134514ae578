//! Stop strings over streamed text: a stop string may arrive split across
//! any number of chunks, so text that could be its beginning is held back
//! until it either completes the stop string or cannot.

/// What [`StopStrings::push`] lets through.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text safe to show: it is not, and cannot become, part of a stop
    /// string. On a stop, everything before the stop string.
    pub text: String,
    /// The index (in the list given to [`StopStrings::new`]) of the stop
    /// string that matched, if one did. Generation should end; the stop
    /// string itself is not part of the output, as in OpenAI's API.
    pub stopped: Option<usize>,
}

/// Watches streamed text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet let through: the longest tail that is the
    /// beginning of some stop string.
    held: String,
    stopped: Option<usize>,
}

impl StopStrings {
    /// Watches for `stops`. Empty strings are ignored (they would match
    /// everywhere); they keep their place so indices stay those given.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> StopStrings {
        StopStrings { stops: stops.into_iter().map(Into::into).collect(), held: String::new(), stopped: None }
    }

    /// Whether there is anything to watch for.
    pub fn is_empty(&self) -> bool {
        self.stops.iter().all(String::is_empty)
    }

    /// The stop string that matched, once one has.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Takes the next chunk of text. After a stop, everything is swallowed.
    ///
    /// When several stop strings match in the text seen so far, the one
    /// that ends first wins (the one a token-by-token stream would have
    /// completed first); among those, the one that starts first.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if let Some(index) = self.stopped {
            return StopOutput { text: String::new(), stopped: Some(index) };
        }
        self.held.push_str(chunk);
        if let Some((index, start)) = self.first_match() {
            let text = self.held[..start].to_owned();
            self.held.clear();
            self.stopped = Some(index);
            return StopOutput { text, stopped: Some(index) };
        }
        let keep = self.partial_tail();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        StopOutput { text, stopped: None }
    }

    /// The end of the stream without a stop: the text held back, which
    /// turned out not to be a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// (stop index, byte start) of the match in `held` that ends first.
    fn first_match(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
        for (index, stop) in self.stops.iter().enumerate() {
            if stop.is_empty() {
                continue;
            }
            if let Some(start) = self.held.find(stop.as_str()) {
                let candidate = (start + stop.len(), start, index);
                if best.is_none_or(|b| (candidate.0, candidate.1) < (b.0, b.1)) {
                    best = Some(candidate);
                }
            }
        }
        best.map(|(_, start, index)| (index, start))
    }

    /// Bytes at the end of `held` that are a proper beginning of some stop
    /// string (the longest such tail), on a char boundary. Any later match
    /// must start inside this tail, since none lies wholly in `held`.
    fn partial_tail(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let held = self.held.as_str();
        let from = held.len().saturating_sub(longest.saturating_sub(1));
        held.char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= from)
            .find(|&i| {
                let tail = &held[i..];
                self.stops.iter().any(|stop| stop.len() > tail.len() && stop.starts_with(tail))
            })
            .map_or(0, |i| held.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_stops_let_everything_through() {
        let mut stops = StopStrings::new(["", ""]);
        assert!(stops.is_empty());
        assert_eq!(stops.push("abc").text, "abc");
        assert_eq!(stops.finish(), "");
    }

    #[test]
    fn tail_is_found_at_char_boundaries() {
        let mut stops = StopStrings::new(["é!"]);
        // "é" is two bytes: the held tail must be the whole character.
        let out = stops.push("caf\u{e9}");
        assert_eq!(out.text, "caf");
        assert_eq!(stops.push("!").stopped, Some(0));
    }
}
