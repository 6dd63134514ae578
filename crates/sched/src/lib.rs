//! strata-sched (skeleton).
