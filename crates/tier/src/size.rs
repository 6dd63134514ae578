//! Human-readable byte sizes (`16KiB`, `512MiB`, `1.5GB`, `4096`).

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A size in bytes, parsed from the forms people type on a command line.
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024, decimal
/// ones (`KB`, `MB`, `GB`, `TB`) powers of 1000, and a bare `K`/`M`/`G`/`T`
/// is binary, as in llama.cpp and most Unix tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidSize { text: text.to_owned(), reason };
        let trimmed = text.trim();
        let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
        let (number, suffix) = trimmed.split_at(split);
        if number.is_empty() {
            return Err(invalid("expected a number such as 512MiB"));
        }
        let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(invalid("unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole.checked_mul(multiplier).map(ByteSize).ok_or_else(|| invalid("too large"));
        }
        let value: f64 = number.parse().map_err(|_| invalid("not a number"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(invalid("too large"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 { write!(f, "{} B", self.0) } else { write!(f, "{value:.2} {}", UNITS[unit]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_bare_units() {
        let cases = [
            ("4096", 4096),
            ("16KiB", 16 << 10),
            ("512MiB", 512 << 20),
            ("2G", 2 << 30),
            ("1.5GiB", 3 << 29),
            ("3MB", 3_000_000),
            ("  7 kib ", 7 << 10),
        ];
        for (text, bytes) in cases {
            assert_eq!(text.parse::<ByteSize>().unwrap().bytes(), bytes, "{text}");
        }
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for text in ["", "MiB", "12 parsecs", "1e999GiB", "99999999999999999999TiB"] {
            let err = text.parse::<ByteSize>().unwrap_err();
            assert!(err.to_string().contains("invalid size"), "{text}: {err}");
        }
    }
}
