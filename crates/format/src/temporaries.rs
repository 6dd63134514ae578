//! Temporaries a killed run left behind. Strata writes large outputs (a
//! converted container, a mirror's copy of a layer file) under a sibling
//! name `STEM.tmp-PID` and renames them into place when complete; a run
//! killed before that leaves the temporary, as large as the output. The
//! next run removes those whose process is gone, and never one of a run
//! still going.

use std::path::{Path, PathBuf};

/// What follows the stem in a temporary's name, before the owner's pid.
pub const TEMPORARY_MARK: &str = ".tmp-";

/// The name of the temporary this process writes for `stem`.
pub fn temporary_name(stem: &str) -> String {
    format!("{stem}{TEMPORARY_MARK}{}", std::process::id())
}

/// Whether the process `pid` has ended. Only where `/proc` shows processes
/// is that known; elsewhere every owner counts as alive, so nothing is
/// removed. (A run in another pid namespace writing to the same directory
/// is not seen; Strata does not share output directories that way.)
pub fn owner_is_gone(pid: u32) -> bool {
    let proc = Path::new("/proc");
    proc.join("self").exists() && !proc.join(pid.to_string()).exists()
}

/// Removes every `STEM.tmp-PID` in `dir` (file or directory) whose stem
/// `is_ours` accepts and whose process has ended, and returns what it
/// removed. Best effort: a temporary that cannot be removed stays for the
/// next run, and the caller's work goes on.
pub fn remove_stale(dir: &Path, is_ours: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some((stem, pid)) = file_name.to_str().and_then(|n| n.rsplit_once(TEMPORARY_MARK)) else { continue };
        // Digits only: `u32::from_str` would also take a leading '+'.
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid == std::process::id() || !is_ours(stem) || !owner_is_gone(pid) {
            continue;
        }
        let path = entry.path();
        // Not followed if it is a link: only the link goes.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let gone = if is_dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::dead_pid;

    #[test]
    fn only_temporaries_of_ended_processes_with_our_stem_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dead_pid();
        assert!(owner_is_gone(dead));
        let live = std::process::id();
        let parent = std::os::unix::process::parent_id();
        for name in [
            format!("out.tmp-{dead}"),
            format!("out.tmp-{live}"),
            format!("out.tmp-{parent}"),
            format!("other.tmp-{dead}"),
            format!("out.tmp-+{dead}"),
            "out.tmp-".to_owned(),
            format!("out.tmp-{dead}x"),
        ] {
            std::fs::create_dir_all(dir.path().join(name).join("experts")).unwrap();
        }
        let removed = remove_stale(dir.path(), |stem| stem == "out");
        assert_eq!(removed, [dir.path().join(format!("out.tmp-{dead}"))]);
        assert!(dir.path().join(format!("out.tmp-{parent}")).is_dir(), "a live run's temporary stays");
        assert!(dir.path().join(format!("other.tmp-{dead}")).is_dir(), "another output's temporary stays");
    }
}
