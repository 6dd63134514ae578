//! strata-engine (skeleton).
