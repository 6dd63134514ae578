//! Named sessions persisted under a KV directory: `<kv_dir>/<name>.kvs`
//! (layout: docs/FORMAT.md, "KV session file").
//!
//! Opening a session loads its rows straight into a fresh cache: no token is
//! re-run, except, after a crash, the last one, whose logits died with the
//! process. A recurrent state resumes from the latest snapshot in the file
//! (taken at the end of each prompt and answer), and the tokens after it are
//! run again. Sampling depends only on the seed and the position, so a
//! session continued in a new process yields exactly the tokens of one that
//! never stopped.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use strata_kv::{CutTail, HASH_BYTES, Persist, SequenceState, SessionFile, SessionHeader, parse_hash};
use strata_models::Logits;

use crate::{Engine, Error, Result, Session};

/// Extension of session files.
pub const SESSION_FILE_EXTENSION: &str = "kvs";
/// The longest session name, in bytes.
pub const SESSION_NAME_MAX_BYTES: usize = 128;
/// Whose hash binds a session to its tokenizer.
const TOKENIZER_FILE: &str = "tokenizer.json";

/// What [`Engine::open_session`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionReport {
    /// The session file.
    pub path: PathBuf,
    /// Whether the session is new.
    pub created: bool,
    /// Tokens of the sequence read back from the file.
    pub reopened_tokens: usize,
    /// Tokens run again, whose rows the file held: the tokens after the
    /// latest snapshot of a recurrent state (run when opening), and the
    /// last token when the file ended on one that had been run but whose
    /// logits were lost with the process that ran it, as after a crash (run
    /// by the next feed).
    pub rerun_tokens: usize,
    /// A torn or corrupt tail cut off the file.
    pub cut: Option<CutTail>,
}

impl SessionReport {
    /// Bytes cut off the file's tail (0 if none).
    pub fn cut_bytes(&self) -> u64 {
        self.cut.as_ref().map_or(0, |c| c.cut_bytes)
    }
}

/// Checks that `name` can name a session file: 1 to 128 bytes of
/// `[A-Za-z0-9._-]`, not `.` or `..`, so that it never leaves the KV
/// directory.
pub fn validate_session_name(name: &str) -> Result<()> {
    let invalid = |reason: &str| Err(Error::InvalidOption { option: "session", reason: format!("{name:?}: {reason}") });
    if name.is_empty() {
        return invalid("a session name cannot be empty");
    }
    if name.len() > SESSION_NAME_MAX_BYTES {
        return invalid(&format!("longer than {SESSION_NAME_MAX_BYTES} bytes"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return invalid("only letters, digits, '.', '_' and '-' are allowed");
    }
    if name == "." || name == ".." {
        return invalid("not a file name");
    }
    Ok(())
}

/// The file of session `name` under `kv_dir`.
pub fn session_path(kv_dir: &Path, name: &str) -> Result<PathBuf> {
    validate_session_name(name)?;
    Ok(kv_dir.join(format!("{name}.{SESSION_FILE_EXTENSION}")))
}

impl Engine {
    /// Opens session `name` under `kv_dir` (created if missing), or creates
    /// it empty. Its rows are loaded into the session's cache without
    /// running the model; every token fed or generated from then on is
    /// appended to the file. A file for another model (content hash,
    /// tokenizer or cache dimensions) is refused; a torn tail is cut off and
    /// reported.
    pub fn open_session(&self, kv_dir: &Path, name: &str) -> Result<(Session<'_>, SessionReport)> {
        let path = session_path(kv_dir, name)?;
        std::fs::create_dir_all(kv_dir).map_err(|source| Error::Io { path: kv_dir.to_owned(), source })?;
        self.restore_session(&path, true)
    }

    /// Reads the session file at `path` into a new session that is not
    /// bound to it: nothing the session does later changes the file (a
    /// copy, as `Chat::save` writes). The file must exist, and is only
    /// read: a damaged one is refused as it is, never cut.
    pub fn read_session_copy(&self, path: &Path) -> Result<(Session<'_>, SessionReport)> {
        if !path.is_file() {
            return Err(Error::Io { path: path.to_owned(), source: std::io::ErrorKind::NotFound.into() });
        }
        self.restore_session(path, false)
    }

    /// The session held in `path` (created if missing), saving every later
    /// change there when `bind`.
    fn restore_session(&self, path: &Path, bind: bool) -> Result<(Session<'_>, SessionReport)> {
        let mut cache = self.model().new_cache(self.context_tokens());
        let header = self.session_header(&cache)?;
        // A copy is only read: never cut, locked or set aside.
        let (file, recovered) = if bind {
            let (file, recovered) = SessionFile::open_or_create(path, &header, &mut cache)?;
            (Some(file), recovered)
        } else {
            (None, SessionFile::read_copy(path, &header, &mut cache)?)
        };
        let tokens = recovered.tokens;
        let (unfed, rerun_tokens) = match tokens.last() {
            None => (None, 0),
            Some(&last) => {
                // The last token is left to the next feed: either the last
                // generated one, which the run that generated it would have
                // run next, or one whose logits are gone with the process
                // (its rows stay in the file and are not rewritten).
                let mut kept = recovered.resumed_tokens;
                if kept == tokens.len() {
                    kept = cache.truncate(tokens.len() - 1);
                }
                // A recurrent state resumed at a snapshot before that: run
                // the tokens after it now (their rows are in the file).
                let gap = &tokens[kept..tokens.len() - 1];
                if !gap.is_empty() {
                    self.forward(gap, &mut cache, Logits::Last)?;
                }
                (Some(last), recovered.rows_tokens - kept)
            }
        };
        let report = SessionReport {
            path: path.to_owned(),
            created: recovered.created,
            reopened_tokens: tokens.len(),
            rerun_tokens,
            cut: recovered.cut,
        };
        let persist = file.map(Persist::new);
        Ok((Session::restored(self, cache, tokens, unfed, persist), report))
    }

    /// What binds a session file to this model: the container's content
    /// hash, the tokenizer's SHA-256 (when there is a tokenizer.json) and
    /// the shape of `cache`.
    pub fn session_header(&self, cache: &SequenceState) -> Result<SessionHeader> {
        let container = self.container();
        let content_hash = parse_hash(container.content_hash()).ok_or_else(|| {
            Error::InvalidRequest(format!("content hash {:?} is not a SHA-256", container.content_hash()))
        })?;
        let tokenizer = container
            .aux_file(TOKENIZER_FILE)
            .or_else(|| Some(container.dir().join(TOKENIZER_FILE)).filter(|p| p.is_file()));
        let tokenizer_hash = tokenizer.map(|path| sha256_of(&path)).transpose()?;
        let created_by = concat!("strata ", env!("CARGO_PKG_VERSION"));
        Ok(SessionHeader::for_cache(content_hash, tokenizer_hash, cache, created_by))
    }
}

fn sha256_of(path: &Path) -> Result<[u8; HASH_BYTES]> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    Ok(Sha256::digest(&bytes).into())
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use strata_format::{ConvertOptions, QuantPreset};

    use super::*;
    use crate::{EngineOptions, GenerateOptions, SamplingOptions};

    fn engine(family: &str, dir: &Path) -> Engine {
        let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf");
        let model = dir.join(family);
        strata_format::convert(&hf, &model, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
        Engine::open(&model, &EngineOptions { threads: 1, ..EngineOptions::default() }).unwrap()
    }

    fn generate(session: &mut Session<'_>, prompt: &[u32], n: usize) -> Vec<u32> {
        let sampling = SamplingOptions { temperature: 0.8, top_k: 0, top_p: 0.95, seed: 3 };
        let options = GenerateOptions { max_new_tokens: n, ignore_eos: true, sampling, ..GenerateOptions::default() };
        session.generate(prompt, &options, |_| ControlFlow::Continue(())).unwrap().tokens
    }

    #[test]
    fn a_session_continues_in_process_and_after_reopening_as_one_run_would() {
        let dir = tempfile::tempdir().unwrap();
        let kv = dir.path().join("kv");
        for family in ["olmoe", "glm_moe_dsa"] {
            let engine = engine(family, dir.path());
            let prompt = [3, 1, 4];
            let whole = generate(&mut engine.session(), &prompt, 24);

            // In one process: generate twice in the same session.
            let (mut session, report) = engine.open_session(&kv, family).unwrap();
            assert!(report.created && report.reopened_tokens == 0);
            let mut got = generate(&mut session, &prompt, 8);
            got.extend(generate(&mut session, &[], 8));
            assert_eq!(got, whole[..16], "{family}: continuing in process");
            drop(session);

            // Reopened: all 19 tokens back, the last one not yet run.
            let (mut session, report) = engine.open_session(&kv, family).unwrap();
            assert_eq!((report.reopened_tokens, report.rerun_tokens, report.cut_bytes()), (19, 0, 0));
            assert_eq!(session.tokens()[3..], whole[..16]);
            got.extend(generate(&mut session, &[], 8));
            assert_eq!(got, whole, "{family}: continuing after reopening");

            // Truncation and reset reach the file.
            session.truncate(10).unwrap();
            drop(session);
            let (mut session, report) = engine.open_session(&kv, family).unwrap();
            assert_eq!((report.reopened_tokens, report.rerun_tokens), (10, 1), "{family}: all 10 have rows");
            assert_eq!(session.tokens()[3..], whole[..7]);
            assert_eq!(generate(&mut session, &[], 2), whole[7..9], "{family}: after the rerun token");
            session.reset();
            assert!(session.take_warnings().is_empty() && session.is_persisted());
            drop(session);
            let (session, report) = engine.open_session(&kv, family).unwrap();
            assert_eq!((report.created, report.reopened_tokens), (false, 0));
            assert!(session.tokens().is_empty());
        }
    }

    #[test]
    fn session_names_stay_inside_the_kv_directory() {
        for good in ["s", "chat-1", "a.b_c", "X9", &"n".repeat(128)] {
            assert!(validate_session_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "sp ace", "é", &"n".repeat(129), "nul\0"] {
            let err = validate_session_name(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid option session:"), "{bad:?}: {err}");
        }
        assert_eq!(session_path(Path::new("/kv"), "s1").unwrap(), Path::new("/kv/s1.kvs"));
    }
}
