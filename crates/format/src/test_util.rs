//! What the tests of this crate and of the crates above it share (the
//! `test-util` feature): never part of a build that ships.

/// A pid no process has: a child's, once it has been waited for (the
/// owner of a temporary left by a killed process).
pub fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawning `true`");
    let pid = child.id();
    child.wait().expect("waiting for `true`");
    pid
}
