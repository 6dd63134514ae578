//! What the tests of this crate and of the engine share (the `test-util`
//! feature): never part of a build that ships.

use std::sync::{Arc, Mutex};

/// The warnings a [`WarningLog::subscriber`] was given, kept as text lines,
/// so a test can read what the code under it logged.
#[derive(Debug, Clone, Default)]
pub struct WarningLog(Arc<Mutex<Vec<u8>>>);

impl WarningLog {
    /// A subscriber that writes warnings and errors into this log: for
    /// `tracing::subscriber::with_default` (one thread) or
    /// `set_global_default` (every thread, e.g. an I/O pool's).
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let log = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || log.clone())
            .finish()
    }

    /// The lines logged so far.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes).lines().map(str::to_owned).collect()
    }
}

impl std::io::Write for WarningLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
