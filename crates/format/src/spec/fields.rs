//! Typed, field-named access to a config.json object.
//!
//! Absent and `null` are both "not given", as in transformers; a present
//! value of the wrong type is an error naming the field (with its prefix,
//! e.g. `rope_parameters.factor`).

use serde_json::{Map, Value};

use crate::error::{Error, Result};

pub(crate) fn as_u32(v: &Value, field: &str) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| Error::invalid(field, format!("expected a token id, got {v}")))
}

/// Typed access to one JSON object, naming `prefix + key` in errors. Absent
/// and `null` are both "not given", as in transformers.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    /// The value of `key` as given, `null` included: for the readers that
    /// tell null from absent.
    pub(crate) fn raw(&self, key: &str) -> Option<&'a Value> {
        #[cfg(test)]
        looked_up::record(self.prefix, key);
        self.map.get(key)
    }

    fn wrong(&self, key: &str, expected: &str, v: &Value) -> Error {
        Error::invalid(self.name(key), format!("expected {expected}, got {v}"))
    }

    fn missing(&self, key: &str) -> Error {
        Error::MissingField { field: self.name(key) }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
            })
            .transpose()
    }

    pub(crate) fn req_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| as_u32(v, &self.name(key))).transpose()
    }

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))).transpose()
    }

    pub(crate) fn req_f64(&self, key: &str) -> Result<f64> {
        self.f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "true or false", v))).transpose()
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong(key, "a string", v))).transpose()
    }

    pub(crate) fn req_str(&self, key: &str) -> Result<&'a str> {
        self.str(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.get(key).map(|v| v.as_object().ok_or_else(|| self.wrong(key, "an object", v))).transpose()
    }

    pub(crate) fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        self.get(key)
            .map(|v| {
                let items = v.as_array().ok_or_else(|| self.wrong(key, "a list of integers", v))?;
                items
                    .iter()
                    .map(|item| {
                        item.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| self.wrong(key, "a list of integers", v))
                    })
                    .collect()
            })
            .transpose()
    }
}

/// Every key a parse looks up, recorded in tests so that each family's
/// table of the keys it reads (`family/known.rs`) can be checked against
/// what its parser really reads.
#[cfg(test)]
pub(crate) mod looked_up {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static KEYS: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
    }

    pub(super) fn record(prefix: &str, key: &str) {
        KEYS.with(|keys| keys.borrow_mut().insert(format!("{prefix}{key}")));
    }

    /// The keys looked up while `run` ran (on this thread), as
    /// `prefix + key`.
    pub(crate) fn during(run: impl FnOnce()) -> BTreeSet<String> {
        KEYS.with(|keys| keys.borrow_mut().clear());
        run();
        KEYS.with(|keys| std::mem::take(&mut *keys.borrow_mut()))
    }
}
