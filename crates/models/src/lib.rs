//! strata-models (skeleton).
