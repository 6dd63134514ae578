//! The binaries' log: the `tracing` events of every crate (a request, a
//! batch step, a mirror falling back) as lines on stderr, text for a person
//! or JSON for a machine (`--log-format`), filtered by `RUST_LOG`.
//!
//! A log nobody reads any more (`serve 2>&1 | head -1`, a closed pipe)
//! never stops a thread: a failed write is dropped, where `eprintln!` would
//! panic and a panic on the batcher's thread would stop every generation.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `serve: warning: message`, with the spans it happened in
    /// (`request{id=...}: `) before the message.
    #[default]
    Text,
    /// One JSON object a line: time, level, message and fields, and the
    /// spans it happened in (a request's id among them).
    Json,
}

/// Sends every crate's events at `default_filter` and above (a
/// `tracing_subscriber::EnvFilter` directive, e.g. `info`) to stderr, or as
/// `RUST_LOG` says where it is set. Text lines begin with `program`.
/// Only the first call in a process takes effect.
pub fn init(program: &'static str, format: LogFormat, default_filter: &str) {
    let from_env = std::env::var(EnvFilter::DEFAULT_ENV).ok().map(|directives| EnvFilter::try_new(&directives));
    let (filter, bad_env) = match from_env {
        Some(Ok(filter)) => (filter, None),
        Some(Err(e)) => (EnvFilter::new(default_filter), Some(e)),
        None => (EnvFilter::new(default_filter), None),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| QuietStderr)
        .with_ansi(false)
        // Its own complaint about a failed write would go to stderr too.
        .log_internal_errors(false);
    // A second call (tests that start twice) keeps the first logger.
    let _ = match format {
        LogFormat::Text => builder.event_format(Plain { program }).try_init(),
        LogFormat::Json => builder.json().with_current_span(false).with_span_list(true).try_init(),
    };
    if let Some(e) = bad_env {
        tracing::warn!("RUST_LOG is not a filter ({e}); logging at {default_filter}");
    }
}

/// stderr, every write reported done whether or not it was.
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().lock().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `program: warning: request{id=7f3a}: message field=value`: the lines
/// the binaries printed before they had a logger, with the spans added.
struct Plain {
    program: &'static str,
}

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG | Level::TRACE => "debug: ",
        };
        write!(writer, "{}: {level}", self.program)?;
        for span in ctx.event_scope().into_iter().flat_map(|scope| scope.from_root()) {
            write!(writer, "{}", span.name())?;
            if let Some(fields) = span.extensions().get::<FormattedFields<N>>().filter(|f| !f.is_empty()) {
                write!(writer, "{{{fields}}}")?;
            }
            write!(writer, ": ")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
