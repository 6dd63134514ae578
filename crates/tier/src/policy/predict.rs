//! Predict: evict the expert whose next use is expected farthest ahead,
//! from routing transitions learned while running, and beforehand
//! ([`Predict::learn`]) from the routing events earlier runs kept in the
//! usage file (`Usage::routing`) or from a trace of other text. A run that
//! starts from earlier runs' events closes much more of the gap to Belady
//! than a cold one (docs/BENCHMARKS.md, "A real run").
//!
//! # Algorithm
//!
//! Belady evicts the key needed farthest ahead. This policy estimates that
//! distance from what MoE routing makes predictable:
//!
//! - **Events.** Every token visits the MoE layers in order and uses a few
//!   experts in each: one *event*. The policy sees accesses only, so an event
//!   ends when an access names another layer (or an expert the event already
//!   used: a new token of a one-layer model).
//! - **Transitions.** Per layer, for each of the last [`LAGS`] events of that
//!   layer (the previous token's, the one before), counts of "expert `x` in
//!   that event, expert `y` in this one". Routing at a layer is strongly
//!   correlated with the same layer's routing a token or two earlier (on the
//!   demo model's decode trace, the previous token's experts predict the
//!   next event better than any frequency count).
//! - **Probability of use at the next visit.** For a layer's next event,
//!   `p(y)` combines the layer's prior `P(y)` (uses per event) with each lag's
//!   evidence `mean over x of P(y | x)` by adding log-odds (naive Bayes over
//!   lags, weighted by [`LAG_WEIGHTS`]). For the current layer the event in
//!   progress is the most recent history.
//! - **Expected distance.** An expert is next used after `V` visits of its
//!   layer on average, `V = 1 + (1 − p₁) + (1 − p₁)(1 − p₂) / p∞`: `p₁` is
//!   the chance above; `p₂`, of use at the visit after, comes from the lag-2
//!   transitions of the latest event alone; `p∞`, per visit after those,
//!   mixes `p₁` with the layer's recent use rate (decayed per event by
//!   [`RECENT_DECAY`]), not its all-time rate: routing follows the topic of
//!   the last few dozen tokens (on the demo's held-out text at a quarter of
//!   its experts, `p∞ = p₁` hits 61.8%, the all-time rate 59.5%, this mix
//!   62.5%).
//!   A key whose layer is `d` events ahead (1 = the next event) is then next
//!   used after `d + layers × (V − 1)` events. The victim is the unleased
//!   key with the largest distance.
//! - **Admission.** A missing key is cached only if its own expected
//!   distance (its layer comes back after `layers` events) is not larger than
//!   the victim's: caching a key that will return later than what it evicts
//!   only loses hits, which is how Belady gains much of its lead.
//!
//! # Cost
//!
//! Memory: per layer, [`LAGS`] matrices of `experts²` u16 counts (64 experts:
//! 16 KiB a layer; 256 experts: 256 KiB a layer, 15 MiB for DeepSeek-V3's 58
//! MoE layers), allocated when the layer is first seen. It is not part of
//! the memory budget's plan; the budget's slack covers it up to about 256
//! experts per layer. Time: `on_hit`/`on_insert`/`on_remove` are O(1) except at an
//! event's end, which adds `LAGS × k²` counts. A layer's estimates are
//! recomputed (O(experts × k × (LAGS + 1))) and its resident keys re-sorted only
//! when its history changed; `victim` then looks at one candidate per layer
//! (plus the leased keys it skips). Both are small next to the read of a
//! whole expert that every miss costs.

use std::collections::VecDeque;

use super::Policy;
use crate::ExpertKey;

/// Earlier events of a layer whose experts predict its next event.
const LAGS: usize = 2;

/// Weight of each lag's evidence in log-odds, the previous token first.
/// Chosen on the demo model's held-out text past the tokens of the committed
/// decode trace (never on that trace, where the policy is judged).
const LAG_WEIGHTS: [f64; LAGS] = [1.2, 0.9];

/// Pseudo-observations of the prior in each conditional `P(y | x)`, so an
/// expert seen once does not predict with certainty.
const SMOOTHING: f64 = 1.0;

/// Share of each event by which a layer's recent use rate moves towards
/// that event: the rate follows the last ~25 tokens, a topic's span.
const RECENT_DECAY: f64 = 0.04;

/// Beyond the next two visits, an expert's chance per visit is taken as this
/// share of its next-visit chance, the rest its recent use rate (chosen as
/// `LAG_WEIGHTS` were).
const TAIL_NEXT_SHARE: f64 = 0.7;

/// Probabilities are clamped to `[MIN_PROBABILITY, 1 − MIN_PROBABILITY]` so
/// log-odds and distances stay finite.
const MIN_PROBABILITY: f64 = 0.02;

/// A row's counts halve when its predecessor count reaches this. A count
/// never exceeds its row's predecessors, so u16 counts cannot overflow; and
/// the halving lets the transitions follow a change of topic.
const COUNT_HALVING_AT: u32 = 1 << 15;

#[derive(Debug, Clone)]
struct Layer {
    /// Events of this layer that ended.
    events: u64,
    /// The count of every layer's ended events ([`Predict::events`]) when
    /// this layer's last two ended, the latest first (`None`: not this run).
    ended_at: [Option<u64>; 2],
    /// Per expert: events that used it.
    uses: Vec<u64>,
    /// `transitions[lag][x * experts + y]`: events in which `y` was used
    /// while `x` was used `lag + 1` events of this layer earlier.
    transitions: [Vec<u16>; LAGS],
    /// `predecessors[lag][x]`: events counted in row `x` of `transitions[lag]`.
    predecessors: [Vec<u32>; LAGS],
    /// The last `LAGS` events' experts, the most recent first.
    history: VecDeque<Vec<usize>>,
    /// Resident experts, sorted by `probability` ascending when `sorted`.
    resident: Vec<usize>,
    /// Expected visits of this layer until the expert's next use (1 = the
    /// next event), valid when `fresh`.
    visits: Vec<f64>,
    /// Per expert: its use rate per event, decayed by `RECENT_DECAY` per
    /// event, so it follows the topic of the last few dozen tokens.
    recent: Vec<f64>,
    fresh: bool,
    sorted: bool,
}

impl Layer {
    fn new(experts: usize) -> Self {
        Self {
            events: 0,
            ended_at: [None; 2],
            uses: vec![0; experts],
            transitions: std::array::from_fn(|_| vec![0; experts * experts]),
            predecessors: std::array::from_fn(|_| vec![0; experts]),
            history: VecDeque::with_capacity(LAGS + 1),
            resident: Vec::new(),
            visits: vec![0.0; experts],
            recent: vec![0.0; experts],
            fresh: false,
            sorted: false,
        }
    }

    fn experts(&self) -> usize {
        self.uses.len()
    }

    /// Learns from one finished event and makes it the latest history.
    fn learn(&mut self, event: Vec<usize>) {
        let experts = self.experts();
        for (lag, earlier) in self.history.iter().enumerate() {
            for &x in earlier {
                let row = &mut self.transitions[lag][x * experts..(x + 1) * experts];
                for &y in &event {
                    row[y] += 1;
                }
                self.predecessors[lag][x] += 1;
                if self.predecessors[lag][x] >= COUNT_HALVING_AT {
                    row.iter_mut().for_each(|count| *count /= 2);
                    self.predecessors[lag][x] /= 2;
                }
            }
        }
        self.recent.iter_mut().for_each(|rate| *rate *= 1.0 - RECENT_DECAY);
        for &y in &event {
            self.uses[y] += 1;
            self.recent[y] += RECENT_DECAY;
        }
        self.events += 1;
        self.history.push_front(event);
        self.history.truncate(LAGS);
        self.fresh = false;
    }

    /// Recomputes `visits` for the next events, given `current` (the event
    /// in progress at this layer, if any) as the most recent history.
    fn predict(&mut self, current: Option<&[usize]>) {
        let experts = self.experts();
        let history: Vec<&[usize]> =
            current.into_iter().chain(self.history.iter().map(Vec::as_slice)).take(LAGS).collect();
        for y in 0..experts {
            // Laplace-smoothed share of events that used y.
            let prior = clamp((self.uses[y] as f64 + 0.5) / (self.events as f64 + 1.0));
            let evidence = |lag: usize, earlier: &[usize]| -> f64 {
                if earlier.is_empty() {
                    return 0.0;
                }
                let mean: f64 = earlier
                    .iter()
                    .map(|&x| {
                        let count = f64::from(self.transitions[lag][x * experts + y]);
                        (count + SMOOTHING * prior) / (f64::from(self.predecessors[lag][x]) + SMOOTHING)
                    })
                    .sum::<f64>()
                    / earlier.len() as f64;
                logit(clamp(mean)) - logit(prior)
            };
            let mut next = logit(prior);
            for (lag, earlier) in history.iter().enumerate() {
                next += LAG_WEIGHTS[lag] * evidence(lag, earlier);
            }
            // The visit after next: the latest event two events earlier.
            let after = logit(prior) + history.first().map_or(0.0, |latest| evidence(1, latest));
            let (next, after) = (sigmoid(next), sigmoid(after));
            let tail = TAIL_NEXT_SHARE * next + (1.0 - TAIL_NEXT_SHARE) * clamp(self.recent[y]);
            // Visits until the next use, each visit used with its own
            // chance: the next, the one after, then every later one at `tail`.
            self.visits[y] = 1.0 + (1.0 - next) + (1.0 - next) * (1.0 - after) / tail;
            // Every chance is clamped away from 0, so the estimate is finite.
            debug_assert!(self.visits[y].is_finite() && self.visits[y] >= 1.0, "visits {}", self.visits[y]);
        }
        self.fresh = true;
        self.sorted = false;
    }

    /// The resident expert not leased whose next use is farthest ahead, and
    /// its expected visits. Needs `fresh` estimates.
    fn farthest(&mut self, layer: usize, leased: &dyn Fn(ExpertKey) -> bool) -> Option<(usize, f64)> {
        if !self.sorted {
            let visits = &self.visits;
            self.resident.sort_by(|&a, &b| visits[b].total_cmp(&visits[a]).then(a.cmp(&b)));
            self.sorted = true;
        }
        self.resident
            .iter()
            .find(|&&expert| !leased(ExpertKey { layer, expert }))
            .map(|&expert| (expert, self.visits[expert]))
    }
}

fn clamp(p: f64) -> f64 {
    p.clamp(MIN_PROBABILITY, 1.0 - MIN_PROBABILITY)
}

fn sigmoid(log_odds: f64) -> f64 {
    clamp(1.0 / (1.0 + (-log_odds).exp()))
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

#[derive(Debug, Clone)]
pub struct Predict {
    /// Experts per layer, the size of every layer's tables.
    experts: usize,
    /// Indexed by layer; `None` for a layer not seen yet.
    layers: Vec<Option<Layer>>,
    /// Layers seen, ascending: the order a token visits them.
    visit_order: Vec<usize>,
    /// The layer of the event in progress and the experts it used so far.
    current: Option<(usize, Vec<usize>)>,
    /// Events of every layer that ended.
    events: u64,
}

impl Predict {
    /// A policy for models with at most `experts` routed experts per layer.
    pub fn new(experts: usize) -> Self {
        Self { experts, layers: Vec::new(), visit_order: Vec::new(), current: None, events: 0 }
    }

    /// Learns the routing transitions of `events` (a trace recorded on
    /// other text) as if they had been run, and starts the next event
    /// afresh. Residency is untouched.
    ///
    /// Each `(layer, experts)` is one event, however the events are ordered
    /// (a prefill's are layer by layer, a decode's token by token).
    pub fn learn<'e>(&mut self, events: impl IntoIterator<Item = (usize, &'e [usize])>) {
        for (layer, experts) in events {
            self.end_event();
            for &expert in experts {
                self.observe(ExpertKey { layer, expert }, false);
            }
        }
        self.end_event();
        // Learned events teach transitions, not which layers tokens visit
        // now: every layer starts the run as if just visited.
        self.events = 0;
        self.layers.iter_mut().flatten().for_each(|layer| layer.ended_at = [None; 2]);
    }

    /// Learns from the event in progress, if any, and starts none.
    fn end_event(&mut self) {
        if let Some((layer, used)) = self.current.take() {
            let events = self.events;
            let state = self.layer_mut(layer);
            state.learn(used);
            state.ended_at = [Some(events), state.ended_at[0]];
            self.events += 1;
        }
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.layers.iter().flatten().map(|layer| layer.resident.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn layer_mut(&mut self, layer: usize) -> &mut Layer {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, || None);
        }
        if self.layers[layer].is_none() {
            let at = self.visit_order.partition_point(|&seen| seen < layer);
            self.visit_order.insert(at, layer);
        }
        let experts = self.experts;
        self.layers[layer].get_or_insert_with(|| Layer::new(experts))
    }

    /// Notes an access: it starts a new event if it names another layer, or
    /// an expert the current event already used and `repeat_ends` (a second
    /// report of the same access, e.g. a miss then its insert, does not).
    fn observe(&mut self, key: ExpertKey, repeat_ends: bool) {
        assert!(
            key.expert < self.experts,
            "expert {} outside the {} the policy was built for",
            key.expert,
            self.experts
        );
        self.layer_mut(key.layer);
        let continues = match &self.current {
            Some((layer, used)) => *layer == key.layer && (!repeat_ends || !used.contains(&key.expert)),
            None => false,
        };
        if !continues {
            self.end_event();
            self.current = Some((key.layer, Vec::new()));
        }
        let (layer, used) = self.current.as_mut().expect("an event is in progress");
        if !used.contains(&key.expert) {
            used.push(key.expert);
            let layer = *layer;
            self.layer_mut(layer).fresh = false;
        }
    }

    /// Expected events until the next use of an expert of `layer` expected
    /// back after `visits` visits of its layer.
    fn expected_distance(&self, layer: usize, visits: f64) -> f64 {
        let layers = self.visit_order.len();
        if let Some(away_events) = self.away(layer) {
            // Tokens skip this layer (an MTP layer while drafting is off):
            // it is expected back no sooner than it has been away, so its
            // experts leave first instead of counting as due at its turn
            // of the cycle.
            return away_events as f64 + layers as f64 * (visits - 1.0);
        }
        let rank = |l: usize| self.visit_order.partition_point(|&seen| seen < l);
        let current_rank = self.current.as_ref().map_or(layers - 1, |(l, _)| rank(*l));
        // 1 = the next event; the current layer comes back after `layers`.
        let ahead = (rank(layer) + layers - current_rank - 1) % layers + 1;
        ahead as f64 + layers as f64 * (visits - 1.0)
    }

    /// Events since `layer`'s last, where every other layer ended two
    /// events since (a whole cycle went by without it; one would be its
    /// turn coming, and a layer visited several times a token, an MTP
    /// layer drafting k tokens, only counts once); `None` where it is not
    /// away.
    fn away(&self, layer: usize) -> Option<u64> {
        if self.current.as_ref().is_some_and(|(l, _)| *l == layer) {
            return None;
        }
        let last = self.layers[layer].as_ref().expect("a seen layer").ended_at[0]?;
        let others_came_round = self.visit_order.iter().filter(|&&other| other != layer).all(|&other| {
            self.layers[other].as_ref().and_then(|o| o.ended_at[1]).is_some_and(|earlier| earlier > last)
        });
        (others_came_round && self.visit_order.len() > 1).then(|| self.events - last - 1)
    }

    fn visits(&mut self, key: ExpertKey) -> f64 {
        self.refresh(key.layer);
        self.layers[key.layer].as_ref().expect("refreshed").visits[key.expert]
    }

    fn refresh(&mut self, layer: usize) {
        let current = match &self.current {
            Some((l, used)) if *l == layer => Some(used.clone()),
            _ => None,
        };
        let state = self.layer_mut(layer);
        if !state.fresh {
            state.predict(current.as_deref());
        }
    }
}

impl Policy for Predict {
    fn on_hit(&mut self, key: ExpertKey) {
        self.observe(key, true);
    }

    fn on_miss(&mut self, key: ExpertKey) {
        self.observe(key, true);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.observe(key, false);
        let layer = self.layer_mut(key.layer);
        debug_assert!(!layer.resident.contains(&key.expert), "{key:?} is already resident");
        layer.resident.push(key.expert);
        layer.sorted = false;
    }

    fn on_bypass(&mut self, key: ExpertKey) {
        self.observe(key, false);
    }

    fn on_remove(&mut self, key: ExpertKey) {
        if let Some(Some(layer)) = self.layers.get_mut(key.layer)
            && let Some(at) = layer.resident.iter().position(|&expert| expert == key.expert)
        {
            // Removing keeps the others in order.
            layer.resident.remove(at);
        }
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        let mut best: Option<(f64, ExpertKey)> = None;
        for at in 0..self.visit_order.len() {
            let layer = self.visit_order[at];
            self.refresh(layer);
            let state = self.layers[layer].as_mut().expect("visited layers exist");
            let Some((expert, visits)) = state.farthest(layer, leased) else { continue };
            let distance = self.expected_distance(layer, visits);
            if best.is_none_or(|(farthest, _)| distance > farthest) {
                best = Some((distance, ExpertKey { layer, expert }));
            }
        }
        best.map(|(_, key)| key)
    }

    fn admits(&mut self, key: ExpertKey, victim: ExpertKey) -> bool {
        let (key_visits, victim_visits) = (self.visits(key), self.visits(victim));
        self.expected_distance(key.layer, key_visits) <= self.expected_distance(victim.layer, victim_visits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceEvent;
    use crate::policy::tests::{key, no_lease};

    #[test]
    fn keeps_the_expert_that_follows() {
        let mut policy = Predict::new(4);
        // Layer 0 alternates {0} and {1}; 2 and 3 were used once, long ago.
        for expert in [2, 3] {
            policy.on_miss(key(0, expert));
            policy.on_insert(key(0, expert));
        }
        for token in 0..40 {
            let expert = token % 2;
            policy.on_miss(key(0, expert));
            if token < 2 {
                policy.on_insert(key(0, expert));
            } else {
                policy.on_hit(key(0, expert));
            }
        }
        // The event in progress used 1, so 0 is next: anything but 0 goes.
        assert_ne!(policy.victim(&no_lease), Some(key(0, 0)));
        assert_eq!(policy.victim(&|k| k.expert != 0), Some(key(0, 0)));
        assert_eq!(policy.victim(&|_| true), None);
        assert_eq!(policy.len(), 4);
        // An expert that never follows is not cached over one that will.
        assert!(!policy.admits(key(0, 3), key(0, 0)));
        assert!(policy.admits(key(0, 0), key(0, 3)));
        policy.on_remove(key(0, 3));
        assert_eq!(policy.len(), 3);
    }

    /// A layer the tokens stop visiting (an MTP layer once drafting is
    /// off) gives up its experts first: one event there made them look due
    /// at every turn of the cycle, and they held the cache against the
    /// layers every token needs.
    #[test]
    fn a_layer_tokens_skip_gives_up_its_experts_first() {
        let mut policy = Predict::new(4);
        // As the store reports them: a miss and its insert, or a hit.
        let visit = |policy: &mut Predict, layer: usize, expert: usize, first: bool| {
            if first {
                policy.on_miss(key(layer, expert));
                policy.on_insert(key(layer, expert));
            } else {
                policy.on_hit(key(layer, expert));
            }
        };
        // Layers 0 and 1 every token, each alternating two experts; layer 2
        // once, early (a probe's draft).
        for token in 0..30 {
            for layer in 0..2 {
                visit(&mut policy, layer, token % 2, token < 2);
            }
            if token == 2 {
                visit(&mut policy, 2, 3, true);
            }
        }
        assert_eq!(policy.victim(&no_lease), Some(key(2, 3)));
        assert!(!policy.admits(key(2, 0), key(0, 1)), "a skipped layer's expert is not cached over a stack one");

        // Drafting every token, several events of layer 2 a token: no layer
        // is away (each is at most one turn behind the others).
        let mut drafting = Predict::new(4);
        let mut resident = std::collections::HashSet::new();
        for token in 0..30 {
            let accesses = [(0, token % 2), (1, token % 2), (2, 3), (2, 3), (2, 2)];
            for (layer, expert) in accesses {
                visit(&mut drafting, layer, expert, resident.insert((layer, expert)));
            }
        }
        assert_eq!((0..3).map(|layer| drafting.away(layer)).collect::<Vec<_>>(), [None, None, None]);
    }

    #[test]
    fn learned_events_of_one_layer_in_a_row_stay_apart() {
        // A prefill's order: every token of layer 0, then of layer 1. Read
        // as accesses, 0 then 1 at layer 0 would be one event; given as
        // events they are two, and 1 follows 0.
        let events: [(usize, &[usize]); 4] = [(0, &[0]), (0, &[1]), (1, &[2]), (1, &[3])];
        let mut policy = Predict::new(4);
        policy.learn(events);
        let layer = policy.layers[0].as_ref().unwrap();
        assert_eq!(layer.events, 2);
        assert_eq!(layer.transitions[0][1], 1, "0 then 1: one transition");
        assert_eq!(policy.layers[1].as_ref().unwrap().events, 2);
    }

    #[test]
    fn learned_transitions_steer_the_first_choices() {
        // Learned elsewhere: at layer 0, expert 1 always follows expert 0.
        let learned: Vec<TraceEvent> =
            (0..40).map(|token| TraceEvent { layer: 0, token, experts: vec![(token % 2) as usize] }).collect();
        let mut policy = Predict::new(4);
        policy.learn(learned.iter().map(|event| (event.layer, event.experts.as_slice())));
        assert!(policy.is_empty(), "learning caches nothing");
        for expert in [1, 3, 0] {
            policy.on_miss(key(0, expert));
            policy.on_insert(key(0, expert));
        }
        // The event in progress used 0, so 1 comes next and stays.
        assert_ne!(policy.victim(&|k| k.expert == 0), Some(key(0, 1)));
        let mut cold = Predict::new(4);
        for expert in [1, 3, 0] {
            cold.on_miss(key(0, expert));
            cold.on_insert(key(0, expert));
        }
        assert_eq!(cold.len(), 3);
    }

    #[test]
    fn prefers_evicting_the_layer_visited_last() {
        let mut policy = Predict::new(1);
        // Two layers, one expert each, always used: equally likely, so the
        // one whose layer comes back later goes first.
        for layer in 0..2 {
            policy.on_miss(key(layer, 0));
            policy.on_insert(key(layer, 0));
        }
        // In layer 1's event, layer 0 is next.
        assert_eq!(policy.victim(&no_lease), Some(key(1, 0)));
        assert!(!policy.is_empty());
    }

    proptest::proptest! {
        /// Whatever the accesses, a victim is resident and not leased, and
        /// `None` only when every resident key is leased.
        #[test]
        fn victims_are_resident_and_unleased(
            accesses in proptest::collection::vec((0usize..3, 0usize..6, proptest::bool::ANY), 1..300),
            leased_expert in 0usize..6,
        ) {
            let mut policy = Predict::new(6);
            let mut resident = std::collections::HashSet::new();
            let leased = |k: ExpertKey| k.expert == leased_expert;
            for (layer, expert, evict) in accesses {
                let k = key(layer, expert);
                if resident.contains(&k) {
                    policy.on_hit(k);
                } else {
                    policy.on_miss(k);
                    policy.on_insert(k);
                    resident.insert(k);
                }
                if evict {
                    match policy.victim(&leased) {
                        Some(victim) => {
                            proptest::prop_assert!(resident.contains(&victim) && !leased(victim));
                            resident.remove(&victim);
                            policy.on_remove(victim);
                        }
                        None => proptest::prop_assert!(resident.iter().all(|&k| leased(k))),
                    }
                }
                proptest::prop_assert_eq!(policy.len(), resident.len());
            }
        }
    }
}
