//! The server's log: lines on stderr, written so that a log nobody reads
//! any more (`serve 2>&1 | head -1`, a closed pipe) never stops service.
//! `eprintln!` panics when its write fails, and a panic on the batcher's
//! thread would stop every generation; a lost log line harms no request.

/// Writes one line to stderr, `format!`-style; a failed write is ignored.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}

/// Writes `line` and a newline to stderr, ignoring a failure.
pub fn line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
