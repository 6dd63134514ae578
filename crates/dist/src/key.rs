//! The shared key a worker requires before it computes anything: Zenoh's
//! user-password authentication, checked when a peer opens its session, so
//! a peer without the key never reaches a queryable.

use std::path::Path;

use crate::{Error, Result};

/// The user name every coordinator presents; the key is its password.
#[cfg(feature = "workers")]
pub(crate) const USER: &str = "strata";
/// Shorter keys are guessable.
const KEY_CHARS_MIN: usize = 16;
/// The environment variable `strata worker` and `--workers` read the key
/// from when no `--key-file` is given.
pub const KEY_ENV: &str = "STRATA_WORKER_KEY";

/// A shared key, never printed.
// Read only by the Zenoh session; a build without it still checks the key.
#[cfg_attr(not(feature = "workers"), allow(dead_code))]
#[derive(Clone)]
pub struct SharedKey(String);

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedKey(..)")
    }
}

impl SharedKey {
    /// A key from text (surrounding whitespace dropped): at least 16
    /// printable characters, no `:` (Zenoh's dictionary is `user:password`
    /// lines).
    pub fn new(text: &str) -> Result<SharedKey> {
        let key = text.trim();
        let why = if key.chars().count() < KEY_CHARS_MIN {
            Some(format!("it is shorter than {KEY_CHARS_MIN} characters"))
        } else if key.chars().any(|c| c == ':' || c.is_control() || c.is_whitespace()) {
            Some("it holds a ':', a space or a control character".to_owned())
        } else {
            None
        };
        match why {
            Some(why) => Err(Error::Key(why)),
            None => Ok(SharedKey(key.to_owned())),
        }
    }

    /// The key in `path`.
    pub fn from_file(path: &Path) -> Result<SharedKey> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Io { what: format!("key file {}", path.display()), source })?;
        SharedKey::new(&text)
    }

    /// `--key-file`'s key if given, else `$STRATA_WORKER_KEY`'s.
    pub fn from_file_or_env(path: Option<&Path>) -> Result<SharedKey> {
        match path {
            Some(path) => SharedKey::from_file(path),
            None => match std::env::var(KEY_ENV) {
                Ok(text) => SharedKey::new(&text),
                Err(_) => Err(Error::Key(format!("none given: pass --key-file FILE or set {KEY_ENV}"))),
            },
        }
    }

    #[cfg(feature = "workers")]
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_colon_key_is_refused() {
        assert!(SharedKey::new("0123456789abcdef").is_ok());
        assert!(matches!(SharedKey::new("0123456789abcde"), Err(Error::Key(_))));
        assert!(matches!(SharedKey::new("0123456789:abcdef"), Err(Error::Key(_))));
        assert!(matches!(SharedKey::new("0123456789 abcdef"), Err(Error::Key(_))));
        assert_eq!(format!("{:?}", SharedKey::new("0123456789abcdef").unwrap()), "SharedKey(..)");
    }
}
