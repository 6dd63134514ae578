//! Checks on every name the hub chooses (commit ids, file names of its
//! listing, ETags) before one reaches a path or a comparison: the hub, or
//! anyone between it and us on a plain-HTTP endpoint, picks these strings,
//! and a `../` in one would otherwise write outside the cache.

/// Hex digits in a git commit id and a git blob id (SHA-1).
pub(super) const SHA1_HEX_DIGITS: usize = 40;
/// Hex digits in an LFS object id (SHA-256).
pub(super) const SHA256_HEX_DIGITS: usize = 64;
/// A file name of the listing, whole: git itself has no limit, but no
/// checkpoint file comes near it and a longer one is not a model's.
const REPO_FILE_NAME_BYTES_MAX: usize = 1024;
/// One component of such a name: Linux's NAME_MAX (255) less the `.part`
/// a download in progress adds to it.
const REPO_FILE_COMPONENT_BYTES_MAX: usize = 250;

/// `text` is `digits` hex digits, nothing else.
pub(super) fn is_hex(text: &str, digits: usize) -> bool {
    text.len() == digits && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A git commit id: 40 hex digits.
pub(super) fn is_commit_id(text: &str) -> bool {
    is_hex(text, SHA1_HEX_DIGITS)
}

/// A file name from the listing that is a plain relative path inside the
/// repository: `/`-separated components, none empty, `.` or `..`, no
/// backslash (a separator on Windows), no control characters, and short
/// enough that it and its `.part` are valid names.
pub(super) fn is_repo_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= REPO_FILE_NAME_BYTES_MAX
        && !name.chars().any(|c| c == '\\' || c.is_control())
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != ".." && part.len() <= REPO_FILE_COMPONENT_BYTES_MAX)
}

/// The digest an ETag names, as the hub sends it (`"<hex>"`, possibly weak:
/// `W/"<hex>"`), lower-cased; `None` unless it is `digits` hex digits.
pub(super) fn etag_digest(etag: &str, digits: usize) -> Option<String> {
    let quoted = etag.trim().strip_prefix("W/").unwrap_or(etag.trim());
    let hex = quoted.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(quoted);
    is_hex(hex, digits).then(|| hex.to_ascii_lowercase())
}

/// Up to `chars_max` characters of a string the hub sent, for an error
/// line: escaped, so it can neither break the line nor drive the terminal.
pub(super) fn quoted_for_error(text: &str, chars_max: usize) -> String {
    let mut quoted: String = text.chars().take(chars_max).flat_map(char::escape_debug).collect();
    if text.chars().nth(chars_max).is_some() {
        quoted.push('…');
    }
    format!("\"{quoted}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_id_is_forty_hex_digits_and_nothing_else() {
        assert!(is_commit_id("0123456789abcdef0123456789ABCDEF01234567"));
        for bad in ["", "0123", "../../../../../../../../../../../../pwned", &"0".repeat(41), &"g".repeat(40)] {
            assert!(!is_commit_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_listing_name_with_dotdot_an_absolute_path_or_a_backslash_is_refused() {
        for good in ["config.json", "onnx/model.onnx", "a.b/..c/d..", "..safetensors"] {
            assert!(is_repo_file_name(good), "{good}");
        }
        let long_component = "a".repeat(251);
        let long_name = ["a"; 600].join("/");
        for bad in [
            "",
            "../x",
            "a/../../x",
            "..",
            "/etc/passwd",
            "a//b",
            "a/",
            "./a",
            "a\\..\\b",
            "a\nb",
            long_component.as_str(),
            long_name.as_str(),
        ] {
            assert!(!is_repo_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_hub_etag_with_dotdot_or_a_path_is_not_a_digest() {
        let sha1 = "ce013625030ba8dba906f756967f9e9ca394464a";
        assert_eq!(etag_digest(&format!("\"{sha1}\""), 40).as_deref(), Some(sha1));
        assert_eq!(etag_digest(&format!("W/\"{}\"", sha1.to_uppercase()), 40).as_deref(), Some(sha1));
        assert_eq!(etag_digest(sha1, 40).as_deref(), Some(sha1));
        for bad in
            ["\"../../../../../pwned_rel\"", "\"/tmp/pwned_abs\"", "\"\"", &format!("\"{sha1}\""), "\"5f3e-1a2b\""]
        {
            assert_eq!(etag_digest(bad, 64), None, "{bad}");
        }
    }

    #[test]
    fn a_hub_string_in_an_error_is_escaped_and_bounded() {
        assert_eq!(quoted_for_error("a\nb\u{1b}[2J", 100), "\"a\\nb\\u{1b}[2J\"");
        assert_eq!(quoted_for_error("abcdef", 3), "\"abc…\"");
    }
}
