//! strata-format (skeleton).
