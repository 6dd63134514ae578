//! Trace replay: the hit rate each policy would get on a recorded routing
//! trace, next to the optimum, for `strata trace replay FILE --expert-cache SIZE`.
//!
//! The simulated cache holds `capacity_records` records (all records of a
//! container have the same size). Events are replayed in file order, and
//! each event's experts are accessed in their listed order. While an event
//! runs, all of its experts are leased, as they are in the store while a
//! layer computes: admitting one of them never evicts another. An event
//! with more experts than the cache holds records cannot be resident at
//! once; the store streams it, so its accesses all count as misses and the
//! cache is left untouched, for every policy alike.
//!
//! A miss with no evictable victim (everything resident is leased or
//! pinned) is served without being cached. Belady may also decline to cache
//! a miss (see `policy/belady.rs`); with that freedom it is the optimum over
//! every policy here, so its hit rate is an upper bound for them all.
//!
//! The pinned policy learns its usage from a first pass over the same trace,
//! so its hot set is the one a usage file learned from exactly this workload
//! would give: the ideal case for learned usage, which runs that learn from
//! other workloads approach only as far as their routing resembles it.

use std::fmt;

use crate::policy::{Belady, Lfru, Lru, Pinned, Policy, Predict};
use crate::{ExpertKey, TraceEvent, TraceHeader, Usage};

/// Hits out of accesses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HitRate {
    pub hits: u64,
    pub accesses: u64,
    /// `hits / accesses`, 0 for no accesses.
    pub rate: f64,
}

impl HitRate {
    pub fn new(hits: u64, accesses: u64) -> Self {
        let rate = if accesses == 0 { 0.0 } else { hits as f64 / accesses as f64 };
        Self { hits, accesses, rate }
    }
}

/// What [`replay`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    pub capacity_records: usize,
    /// Bytes of one record, from the trace header.
    pub record_bytes: u64,
    pub events: usize,
    pub lru: HitRate,
    pub lfru: HitRate,
    /// The pinned policy with the trace's own usage as its learned usage:
    /// the ideal hot set for this trace, so an upper bound on what learned
    /// usage from other runs can give it. Its hot set holds up to half the
    /// capacity.
    pub pinned: HitRate,
    /// Learned routing transitions (`predict`), starting from nothing or
    /// from another trace's ([`replay_learned`]).
    pub predict: HitRate,
    /// Belady's optimal policy.
    pub belady: HitRate,
}

impl ReplayReport {
    /// `(name, hit rate)` for each policy, in table order.
    pub fn rows(&self) -> [(&'static str, HitRate); 5] {
        [
            ("lru", self.lru),
            ("lfru", self.lfru),
            ("pinned", self.pinned),
            ("predict", self.predict),
            ("belady", self.belady),
        ]
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let capacity_mib = self.capacity_records as f64 * self.record_bytes as f64 / (1u64 << 20) as f64;
        writeln!(
            f,
            "{} events, {} expert accesses; cache of {} records ({capacity_mib:.1} MiB)",
            self.events, self.belady.accesses, self.capacity_records
        )?;
        writeln!(f, "{:<8} {:>12} {:>9}", "policy", "hits", "hit rate")?;
        for (name, rate) in self.rows() {
            let note = if name == "belady" { "  (optimal)" } else { "" };
            writeln!(f, "{name:<8} {:>12} {:>8.2}%{note}", rate.hits, 100.0 * rate.rate)?;
        }
        Ok(())
    }
}

/// Replays `events` through a cache of `capacity_records` records under
/// each policy, `predict` starting from nothing.
pub fn replay(header: &TraceHeader, events: &[TraceEvent], capacity_records: usize) -> ReplayReport {
    replay_learned(header, events, capacity_records, &[])
}

/// [`replay`], with `predict` first learning the transitions of `learned`:
/// a trace recorded on other text, as a run that had learned them would.
pub fn replay_learned(
    header: &TraceHeader,
    events: &[TraceEvent],
    capacity_records: usize,
    learned: &[TraceEvent],
) -> ReplayReport {
    // The pinned policy learns from a first pass over the same trace.
    let usage: Usage = accesses(events).collect();
    let mut predict = Predict::new(header.num_experts);
    predict.learn(learned.iter().map(|event| (event.layer, event.experts.as_slice())));
    let pinned_max = capacity_records / 2;
    let mut belady = Belady::new(
        events.iter().filter(|event| fits(event, capacity_records)).map(|event| accesses([event]).collect()),
        capacity_records,
    );
    ReplayReport {
        capacity_records,
        record_bytes: header.record_bytes,
        events: events.len(),
        lru: simulate(&mut Lru::new(), events, capacity_records),
        lfru: simulate(&mut Lfru::new(), events, capacity_records),
        pinned: simulate(&mut Pinned::new(usage.top(pinned_max)), events, capacity_records),
        predict: simulate(&mut predict, events, capacity_records),
        belady: simulate_admitting(&mut belady, events, capacity_records, Belady::admits),
    }
}

/// The hit rate of `policy` on `events` in a cache of `capacity_records`
/// records, under the rules in this module's docs.
pub fn simulate(policy: &mut dyn Policy, events: &[TraceEvent], capacity_records: usize) -> HitRate {
    simulate_admitting(policy, events, capacity_records, |_| true)
}

/// Every access of `events`, in order.
fn accesses<'a>(events: impl IntoIterator<Item = &'a TraceEvent>) -> impl Iterator<Item = ExpertKey> {
    events.into_iter().flat_map(|event| event.experts.iter().map(|&expert| ExpertKey { layer: event.layer, expert }))
}

/// Whether all of `event`'s experts can be resident at once.
fn fits(event: &TraceEvent, capacity_records: usize) -> bool {
    event.experts.len() <= capacity_records
}

/// [`simulate`], asking `admits(policy)` before caching a miss.
fn simulate_admitting<P: Policy + ?Sized>(
    policy: &mut P,
    events: &[TraceEvent],
    capacity_records: usize,
    mut admits: impl FnMut(&mut P) -> bool,
) -> HitRate {
    let mut resident = std::collections::HashSet::new();
    let (mut hits, mut accesses) = (0u64, 0u64);
    for event in events {
        accesses += event.experts.len() as u64;
        if !fits(event, capacity_records) {
            continue;
        }
        let leased = |key: ExpertKey| key.layer == event.layer && event.experts.contains(&key.expert);
        // The store looks up every expert of a layer before it reads the
        // missing ones, so a policy hears of all of the event's misses
        // before its first admission; so it does here.
        for &expert in &event.experts {
            let key = ExpertKey { layer: event.layer, expert };
            if !resident.contains(&key) {
                policy.on_miss(key);
            }
        }
        for &expert in &event.experts {
            let key = ExpertKey { layer: event.layer, expert };
            if resident.contains(&key) {
                hits += 1;
                policy.on_hit(key);
                continue;
            }
            if !admits(policy) {
                policy.on_bypass(key);
                continue;
            }
            let victim = if resident.len() < capacity_records {
                None
            } else {
                match policy.victim(&leased) {
                    Some(victim) => Some(victim),
                    None => {
                        policy.on_bypass(key);
                        continue;
                    }
                }
            };
            if let Some(victim) = victim {
                if !policy.admits(key, victim) {
                    policy.on_bypass(key);
                    continue;
                }
                debug_assert!(resident.contains(&victim) && !leased(victim), "bad victim {victim:?}");
                resident.remove(&victim);
                policy.on_remove(victim);
            }
            resident.insert(key);
            policy.on_insert(key);
        }
    }
    HitRate::new(hits, accesses)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn event(layer: usize, token: u64, experts: &[usize]) -> TraceEvent {
        TraceEvent { layer, token, experts: experts.to_vec() }
    }

    fn header(num_layers: usize, num_experts: usize) -> TraceHeader {
        TraceHeader::new("h", num_layers, num_experts, 4096)
    }

    #[test]
    fn counts_hits_per_policy_on_a_known_trace() {
        // One layer, one expert per token: 0 1 2 0 1 2 0 with room for 2.
        let events: Vec<_> = [0, 1, 2, 0, 1, 2, 0].iter().enumerate().map(|(t, &e)| event(0, t as u64, &[e])).collect();
        let report = replay(&header(1, 3), &events, 2);
        // LRU always evicts the key needed next: no hits.
        assert_eq!(report.lru, HitRate::new(0, 7));
        // Pinned holds expert 0 (the most used; one slot of two).
        assert_eq!(report.pinned.hits, 2);
        // Belady: keeps 0 and bypasses or churns the other slot: 0 hits 2×,
        // plus one of 1/2 each round.
        assert_eq!(report.belady.hits, 3);
        assert_eq!(report.events, 7);
        let table = report.to_string();
        assert!(table.contains("belady") && table.contains("(optimal)") && table.contains("42.86%"), "{table}");
    }

    #[test]
    fn experts_of_one_event_are_leased() {
        // Room for 2. Event 2 uses {2, 1}: admitting 2 must evict 0, never 1,
        // even though 1 is the least recently used.
        let events = [event(0, 0, &[1]), event(0, 1, &[0]), event(0, 2, &[2, 1]), event(0, 3, &[1])];
        assert_eq!(simulate(&mut Lru::new(), &events, 2), HitRate::new(2, 5));
    }

    #[test]
    fn events_larger_than_the_cache_are_all_misses_and_leave_it_alone() {
        let events = [event(0, 0, &[0]), event(0, 1, &[0, 1, 2]), event(0, 2, &[0])];
        let report = replay(&header(1, 3), &events, 2);
        for (name, rate) in report.rows() {
            assert_eq!(rate, HitRate::new(1, 5), "{name}");
        }
        let none = replay(&header(1, 3), &events, 0);
        assert!(none.rows().iter().all(|(_, rate)| rate.hits == 0 && rate.accesses == 5));
        assert_eq!(HitRate::new(0, 0).rate, 0.0);
    }

    #[test]
    fn belady_plans_around_leases() {
        // Room for 3. Caching L1E0 (never used again) into the free slot
        // would lease it and force L1E1 out; declining it keeps all three
        // of L0E0, L0E1, L1E1 for their next uses.
        let events = [event(0, 0, &[0, 1]), event(1, 0, &[0, 1]), event(0, 1, &[0, 1]), event(1, 1, &[1, 2])];
        let report = replay(&header(2, 3), &events, 3);
        assert_eq!(report.belady.hits, 3);
        assert_eq!(report.lru.hits, 2);
    }

    #[test]
    fn a_cache_full_of_pinned_and_leased_keys_bypasses() {
        // Room for 2, expert 0 pinned; event {1, 2} must bypass 2.
        let events = [event(0, 0, &[0]), event(0, 1, &[1, 2]), event(0, 2, &[1])];
        let rate = simulate(&mut Pinned::new([ExpertKey { layer: 0, expert: 0 }]), &events, 2);
        assert_eq!(rate, HitRate::new(1, 4));
    }

    /// The most hits any policy can get: exhaustive search over every
    /// choice at every miss (evict any unleased resident, or do not cache).
    fn optimum(events: &[TraceEvent], capacity_records: usize) -> u64 {
        let mut ids: HashMap<ExpertKey, usize> = HashMap::new();
        // (key id, event index) per access, skipping events that cannot fit.
        let mut flat = Vec::new();
        for (index, event) in events.iter().enumerate().filter(|(_, e)| fits(e, capacity_records)) {
            for &expert in &event.experts {
                let next_id = ids.len();
                let id = *ids.entry(ExpertKey { layer: event.layer, expert }).or_insert(next_id);
                flat.push((id, index));
            }
        }
        let lease_masks: HashMap<usize, u64> = flat.iter().fold(HashMap::new(), |mut masks, &(id, index)| {
            *masks.entry(index).or_insert(0) |= 1 << id;
            masks
        });
        fn best(
            at: usize,
            resident: u64,
            flat: &[(usize, usize)],
            leases: &HashMap<usize, u64>,
            capacity: usize,
            memo: &mut HashMap<(usize, u64), u64>,
        ) -> u64 {
            let Some(&(id, index)) = flat.get(at) else { return 0 };
            if let Some(&known) = memo.get(&(at, resident)) {
                return known;
            }
            let bit = 1u64 << id;
            let found = if resident & bit != 0 {
                1 + best(at + 1, resident, flat, leases, capacity, memo)
            } else {
                let mut most = best(at + 1, resident, flat, leases, capacity, memo);
                if (resident.count_ones() as usize) < capacity {
                    most = most.max(best(at + 1, resident | bit, flat, leases, capacity, memo));
                } else {
                    let evictable = resident & !leases[&index];
                    for victim in (0..64).filter(|v| evictable & (1 << v) != 0) {
                        let next = (resident & !(1 << victim)) | bit;
                        most = most.max(best(at + 1, next, flat, leases, capacity, memo));
                    }
                }
                most
            };
            memo.insert((at, resident), found);
            found
        }
        best(0, 0, &flat, &lease_masks, capacity_records, &mut HashMap::new())
    }

    /// Every trace of up to four events over three experts (each event one
    /// to three distinct experts, in every order), for every capacity.
    #[test]
    fn belady_matches_the_exhaustive_optimum_on_every_tiny_trace() {
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for a in 0..3 {
            sets.push(vec![a]);
            for b in (0..3).filter(|&b| b != a) {
                sets.push(vec![a, b]);
                sets.extend((0..3).filter(|&c| c != a && c != b).map(|c| vec![a, b, c]));
            }
        }
        for num_events in 1..=4u32 {
            for mut choice in 0..sets.len().pow(num_events) {
                let mut events = Vec::new();
                for token in 0..u64::from(num_events) {
                    events.push(event(0, token, &sets[choice % sets.len()]));
                    choice /= sets.len();
                }
                for capacity in 1..=3 {
                    let report = replay(&header(1, 3), &events, capacity);
                    assert_eq!(report.belady.hits, optimum(&events, capacity), "{events:?} in {capacity}");
                }
            }
        }
    }

    /// Skewed traces: expert `⌊E·u³⌋` for uniform `u`, so low experts are
    /// hot, and each slot repeats the previous token's choice half the time
    /// (temporal locality across tokens).
    fn skewed_trace(
        max_layers: usize,
        max_experts: usize,
        max_tokens: usize,
    ) -> impl Strategy<Value = (usize, usize, Vec<TraceEvent>)> {
        (1..=max_layers, 2..=max_experts, 1usize..=3, 1..=max_tokens).prop_flat_map(
            move |(layers, experts, top_k, tokens)| {
                let top_k = top_k.min(experts);
                let draws = prop::collection::vec((0.0f64..1.0, any::<bool>()), layers * tokens * top_k);
                draws.prop_map(move |draws| {
                    let mut previous: Vec<Vec<usize>> = vec![Vec::new(); layers];
                    let mut events = Vec::new();
                    let mut draw = draws.into_iter();
                    for token in 0..tokens {
                        for layer in 0..layers {
                            let mut chosen: Vec<usize> = Vec::new();
                            for slot in 0..top_k {
                                let (u, repeat) = draw.next().unwrap();
                                let candidate = match previous[layer].get(slot) {
                                    Some(&e) if repeat => e,
                                    _ => ((experts as f64) * u * u * u) as usize,
                                };
                                // Keep experts distinct within the event.
                                let mut expert = candidate;
                                while chosen.contains(&expert) {
                                    expert = (expert + 1) % experts;
                                }
                                chosen.push(expert);
                            }
                            previous[layer] = chosen.clone();
                            events.push(TraceEvent { layer, token: token as u64, experts: chosen });
                        }
                    }
                    (layers, experts, events)
                })
            },
        )
    }

    /// A deterministic xorshift generator, so the synthetic traces below
    /// are the same on every run.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The shape of a synthetic MoE routing trace.
    struct Synthetic {
        layers: usize,
        experts: usize,
        top_k: usize,
        tokens: usize,
        /// Zipf exponent of each layer's expert popularity.
        zipf: f64,
        /// Chance that a slot reuses one of the previous token's experts.
        repeat: f64,
        /// Every this many tokens a quarter of each layer's popularity
        /// ranks are shuffled (a change of topic); 0 for never.
        drift_tokens: usize,
    }

    impl Synthetic {
        /// Token by token, layer by layer, as the engine runs decode.
        fn trace(&self, seed: u64) -> Vec<TraceEvent> {
            let mut rng = XorShift(seed);
            let weights: Vec<f64> = (0..self.experts).map(|rank| 1.0 / ((rank + 1) as f64).powf(self.zipf)).collect();
            let total: f64 = weights.iter().sum();
            let mut ranked: Vec<Vec<usize>> = (0..self.layers)
                .map(|_| {
                    let mut order: Vec<usize> = (0..self.experts).collect();
                    for i in (1..self.experts).rev() {
                        order.swap(i, rng.below(i + 1));
                    }
                    order
                })
                .collect();
            let mut previous: Vec<Vec<usize>> = vec![Vec::new(); self.layers];
            let mut events = Vec::new();
            for token in 0..self.tokens {
                if self.drift_tokens > 0 && token > 0 && token % self.drift_tokens == 0 {
                    for order in &mut ranked {
                        for _ in 0..self.experts / 4 {
                            let (i, j) = (rng.below(self.experts), rng.below(self.experts));
                            order.swap(i, j);
                        }
                    }
                }
                for layer in 0..self.layers {
                    let mut chosen: Vec<usize> = Vec::new();
                    while chosen.len() < self.top_k {
                        let expert = if !previous[layer].is_empty() && rng.unit() < self.repeat {
                            previous[layer][rng.below(previous[layer].len())]
                        } else {
                            let mut u = rng.unit() * total;
                            let mut rank = 0;
                            while rank + 1 < self.experts && u >= weights[rank] {
                                u -= weights[rank];
                                rank += 1;
                            }
                            ranked[layer][rank]
                        };
                        if !chosen.contains(&expert) {
                            chosen.push(expert);
                        }
                    }
                    previous[layer] = chosen.clone();
                    events.push(event(layer, token as u64, &chosen));
                }
            }
            events
        }
    }

    const OLMOE_LIKE: Synthetic =
        Synthetic { layers: 16, experts: 64, top_k: 8, tokens: 600, zipf: 0.8, repeat: 0.3, drift_tokens: 200 };

    #[test]
    fn lfru_beats_lru_on_skewed_cyclic_traces() {
        let events = OLMOE_LIKE.trace(0x9E37_79B9_7F4A_7C15);
        let header = header(16, 64);
        // 10% of the experts: less than a token's working set is left once
        // the layers cycle, so LRU gets nothing and frequency is what counts.
        let small = replay(&header, &events, 102);
        assert!(small.lru.rate < 0.01, "{small}");
        assert!(small.lfru.rate > 0.2, "{small}");
        // 25%: neighbouring tokens' reuse matters too; LFRU still leads.
        let medium = replay(&header, &events, 256);
        assert!(medium.lfru.rate > medium.lru.rate + 0.02, "{medium}");
        for report in [small, medium] {
            assert!(report.rows().iter().all(|(_, rate)| rate.hits <= report.belady.hits), "{report}");
        }
    }

    #[test]
    fn lfru_window_grows_when_recency_wins() {
        // Strong token-to-token reuse, flat popularity, room for a few
        // tokens' working sets: recency is what counts, and the window
        // share grows to serve it.
        let recency = Synthetic { zipf: 0.0, repeat: 0.7, ..OLMOE_LIKE };
        let events = recency.trace(7);
        let mut lfru = Lfru::new();
        let lfru_rate = simulate(&mut lfru, &events, 512);
        let lru_rate = simulate(&mut Lru::new(), &events, 512);
        let lfu_rate = simulate(&mut Lfru::fixed_window(0), &events, 512);
        // The hit rate plateaus once the window holds the reuse distance, so
        // the share settles well below its maximum; what matters is that it
        // left zero and closed the gap to LRU.
        assert!(lfru.window_percent() >= 10, "window {}%", lfru.window_percent());
        assert!(lfru_rate.rate > lfu_rate.rate, "lfru {lfru_rate:?} pure frequency {lfu_rate:?}");
        assert!(lfru_rate.rate > lru_rate.rate - 0.03, "lfru {lfru_rate:?} lru {lru_rate:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Belady's hits equal the exhaustive optimum on small traces.
        #[test]
        fn belady_is_optimal_on_small_traces(
            (layers, experts, events) in skewed_trace(2, 4, 6),
            capacity in 0usize..6,
        ) {
            let report = replay(&header(layers, experts), &events, capacity);
            prop_assert_eq!(report.belady.hits, optimum(&events, capacity));
        }

        /// No policy beats Belady, and all see the same accesses.
        #[test]
        fn belady_bounds_every_policy(
            (layers, experts, events) in skewed_trace(4, 16, 40),
            capacity in 0usize..40,
        ) {
            let report = replay(&header(layers, experts), &events, capacity);
            let accesses: u64 = events.iter().map(|e| e.experts.len() as u64).sum();
            for (name, rate) in report.rows() {
                prop_assert_eq!(rate.accesses, accesses);
                prop_assert!(rate.hits <= report.belady.hits, "{} got {} > belady {}", name, rate.hits, report.belady.hits);
            }
        }
    }
}

/// The committed demo decode trace, where the policies are judged.
#[cfg(test)]
mod demo_trace {
    use super::*;
    use crate::read_trace;

    fn demo_trace(name: &str) -> (TraceHeader, Vec<TraceEvent>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/demo").join(name);
        read_trace(&path).unwrap()
    }

    /// The share of the gap from LRU to Belady that `predict` closes, in
    /// percent (rounded down).
    fn gap_closed_percent(report: &ReplayReport) -> u64 {
        let gap = report.belady.hits - report.lru.hits;
        100 * report.predict.hits.saturating_sub(report.lru.hits) / gap
    }

    /// Issue 15 asks for half the gap from LRU to Belady at a quarter and at
    /// half of the demo model's 128 experts, on held-out text. Learning from
    /// the six windows of held-out text that follow the judged trace
    /// (`trace-heldout-learn.jsonl`), `predict` closes 50% at a quarter
    /// (63.07% against LRU 50.30%, Belady 75.75%) and 56% at half (88.65%
    /// against 82.54% and 93.36%); starting from nothing, 49% and 54%. This
    /// guards those shares, so a change that loses ground fails here.
    #[test]
    fn predict_closes_half_the_lru_to_belady_gap_on_held_out_demo_text() {
        let (header, events) = demo_trace("trace-heldout-decode.jsonl");
        let (learn_header, learned) = demo_trace("trace-heldout-learn.jsonl");
        assert_eq!(learn_header, header, "both traces come from the same container");
        for (capacity_records, learned_percent, cold_percent) in [(32, 50, 49), (64, 56, 54)] {
            let warm = replay_learned(&header, &events, capacity_records, &learned);
            let cold = replay(&header, &events, capacity_records);
            println!("{warm}{cold}");
            assert!(gap_closed_percent(&warm) >= learned_percent, "{warm}");
            assert!(gap_closed_percent(&cold) >= cold_percent, "{cold}");
            for report in [warm, cold] {
                assert!(report.rows().iter().all(|(_, rate)| rate.hits <= report.belady.hits), "{report}");
            }
        }
    }
}
