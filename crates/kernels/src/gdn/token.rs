//! One value head's inputs to the delta rule: a token, or a run of them.

/// The log decay of one token for one value head: row `i` of the
/// `[d_k, d_v]` state is multiplied by `exp(g_i)`.
#[derive(Debug, Clone, Copy)]
pub enum LogDecay<'a> {
    /// One `g` for every row (Gated DeltaNet).
    Head(f32),
    /// One `g` per key channel, `d_k` values (Kimi Delta Attention).
    Channel(&'a [f32]),
}

/// The log decays of a run of tokens for one value head.
#[derive(Debug, Clone, Copy)]
pub enum LogDecays<'a> {
    /// `[tokens]`: one per token (Gated DeltaNet).
    Head(&'a [f32]),
    /// `[tokens, d_k]`: one per token and key channel (Kimi Delta Attention).
    Channel(&'a [f32]),
}

/// The inputs of one token for one value head (see the module docs for
/// what `q` and `k` must already be).
#[derive(Debug, Clone, Copy)]
pub struct DeltaToken<'a> {
    /// `d_k` values, l2-normalised and scaled by [`super::query_scale`].
    pub q: &'a [f32],
    /// `d_k` values, l2-normalised.
    pub k: &'a [f32],
    /// `d_v` values.
    pub v: &'a [f32],
    /// Log decay: the state's rows are multiplied by `exp(g)` (`g <= 0` in
    /// the models: [`super::log_decay`], [`super::channel_log_decay`]).
    pub g: LogDecay<'a>,
    /// Write strength, `sigmoid(b)` in the models.
    pub beta: f32,
}

impl DeltaToken<'_> {
    /// Checks every length against `d_k = k.len()`, `d_v = v.len()` and
    /// returns them.
    ///
    /// # Panics
    /// If `d_k` or `d_v` is 0 or any length disagrees.
    pub(crate) fn check(&self, state: &[f32], out: &[f32]) -> (usize, usize) {
        let (d_k, d_v) = (self.k.len(), self.v.len());
        assert!(d_k > 0 && d_v > 0, "delta rule: empty head (d_k {d_k}, d_v {d_v})");
        assert_eq!(self.q.len(), d_k, "delta rule: q and k lengths differ");
        assert_eq!(state.len(), d_k * d_v, "delta rule: state must be [d_k, d_v] = [{d_k}, {d_v}]");
        assert_eq!(out.len(), d_v, "delta rule: output must hold d_v = {d_v} values");
        if let LogDecay::Channel(g) = self.g {
            assert_eq!(g.len(), d_k, "delta rule: one log decay per key channel, d_k = {d_k}");
        }
        (d_k, d_v)
    }
}

/// A run of tokens for one value head, token-major: `q`, `k` are
/// `[tokens, d_k]`, `v` is `[tokens, d_v]`, `beta` `[tokens]`, `g` as
/// [`LogDecays`] says.
#[derive(Debug, Clone, Copy)]
pub struct DeltaTokens<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: LogDecays<'a>,
    pub beta: &'a [f32],
}

impl<'a> DeltaTokens<'a> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.beta.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.beta.is_empty()
    }

    /// Token `t`, for heads of `d_k` key and `d_v` value components.
    pub(crate) fn token(&self, t: usize, d_k: usize, d_v: usize) -> DeltaToken<'a> {
        DeltaToken {
            q: &self.q[t * d_k..(t + 1) * d_k],
            k: &self.k[t * d_k..(t + 1) * d_k],
            v: &self.v[t * d_v..(t + 1) * d_v],
            g: match self.g {
                LogDecays::Head(g) => LogDecay::Head(g[t]),
                LogDecays::Channel(g) => LogDecay::Channel(&g[t * d_k..(t + 1) * d_k]),
            },
            beta: self.beta[t],
        }
    }

    /// Checks every length against a `[d_k, d_v]` state and returns
    /// `(d_k, d_v)`.
    ///
    /// # Panics
    /// If `d_k` or `d_v` is 0 or any length disagrees.
    pub(crate) fn check(&self, state: &[f32], d_v: usize, out: &[f32]) -> (usize, usize) {
        let n = self.len();
        assert!(d_v > 0 && state.len().is_multiple_of(d_v), "delta rule: state is not [d_k, d_v = {d_v}]");
        let d_k = state.len() / d_v;
        assert!(d_k > 0, "delta rule: empty state");
        let (g, g_per_token) = match self.g {
            LogDecays::Head(g) => (g, 1),
            LogDecays::Channel(g) => (g, d_k),
        };
        assert_eq!(g.len(), n * g_per_token, "delta rule: {n} tokens of beta, so g must be [{n}, {g_per_token}]");
        assert_eq!(self.q.len(), n * d_k, "delta rule: q must be [{n}, {d_k}]");
        assert_eq!(self.k.len(), n * d_k, "delta rule: k must be [{n}, {d_k}]");
        assert_eq!(self.v.len(), n * d_v, "delta rule: v must be [{n}, {d_v}]");
        assert_eq!(out.len(), n * d_v, "delta rule: output must be [{n}, {d_v}]");
        (d_k, d_v)
    }
}
