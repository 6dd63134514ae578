//! strata-kv (skeleton).
