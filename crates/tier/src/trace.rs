//! Routing traces: which experts each token used in each layer, recorded by
//! `--trace FILE` and replayed by `strata trace replay`.
//!
//! A trace is JSON lines: a header line
//!
//! ```json
//! {"format":"strata-trace","version":1,"container_hash":"…","num_layers":16,"num_experts":64,"record_bytes":4096}
//! ```
//!
//! then one line per (layer, token), in the order the engine ran them:
//!
//! ```json
//! {"layer":3,"token":17,"experts":[5,12,40,61]}
//! ```
//!
//! `token` is the absolute position in the sequence, so a new session starts
//! again from 0; nothing requires tokens to increase. `experts` are the
//! token's distinct routed experts in that layer, in the order the engine
//! used them.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The `format` field of a trace header.
pub const TRACE_FORMAT: &str = "strata-trace";
/// The trace version this build reads and writes.
pub const TRACE_VERSION: u32 = 1;

/// The first line of a trace: what model it was recorded on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub format: String,
    pub version: u32,
    /// The content hash of the container the trace was recorded with.
    pub container_hash: String,
    pub num_layers: usize,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Bytes of one expert record; turns `--expert-cache SIZE` into records.
    pub record_bytes: u64,
}

impl TraceHeader {
    /// A version-1 header.
    pub fn new(container_hash: impl Into<String>, num_layers: usize, num_experts: usize, record_bytes: u64) -> Self {
        Self {
            format: TRACE_FORMAT.to_owned(),
            version: TRACE_VERSION,
            container_hash: container_hash.into(),
            num_layers,
            num_experts,
            record_bytes,
        }
    }

    /// How many whole records fit in `cache_bytes`.
    pub fn capacity_records(&self, cache_bytes: u64) -> usize {
        cache_bytes.checked_div(self.record_bytes).map_or(0, |records| usize::try_from(records).unwrap_or(usize::MAX))
    }
}

/// One layer of one token: the experts it was routed to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub layer: usize,
    /// Absolute position of the token in its sequence.
    pub token: u64,
    pub experts: Vec<usize>,
}

/// Writes a trace line by line through a fixed-size buffer, so recording a
/// long generation costs no memory beyond the buffer.
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: TraceHeader,
    line: String,
}

impl TraceWriter {
    /// Creates (or truncates) `path` and writes the header line.
    pub fn create(path: impl AsRef<Path>, header: TraceHeader) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| trace_io(path, "create", source))?;
        let mut writer = Self { path: path.to_path_buf(), out: BufWriter::new(file), header, line: String::new() };
        let mut header_line = serde_json::to_string(&writer.header).expect("header serialises: numbers and strings");
        header_line.push('\n');
        writer.put(&header_line)?;
        Ok(writer)
    }

    /// The header written at the top.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Appends the experts `token` used in `layer`.
    pub fn write(&mut self, layer: usize, token: u64, experts: &[usize]) -> Result<()> {
        debug_assert!(layer < self.header.num_layers, "layer {layer} outside the trace header");
        debug_assert!(experts.iter().all(|&e| e < self.header.num_experts), "expert outside the trace header");
        use std::fmt::Write as _;
        // Formatted by hand: the line is three integers and a list, and this
        // runs for every layer of every token.
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        let _ = write!(line, "{{\"layer\":{layer},\"token\":{token},\"experts\":[");
        for (i, expert) in experts.iter().enumerate() {
            let _ = write!(line, "{}{expert}", if i == 0 { "" } else { "," });
        }
        line.push_str("]}\n");
        let written = self.put(&line);
        self.line = line;
        written
    }

    /// Flushes the buffer and fsyncs the file.
    pub fn finish(self) -> Result<()> {
        let Self { path, out, .. } = self;
        let file = out.into_inner().map_err(|err| trace_io(&path, "write", err.into_error()))?;
        file.sync_all().map_err(|source| trace_io(&path, "write", source))
    }

    /// Pushes buffered lines to the file, so a reader sees every event so far.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|source| trace_io(&self.path, "write", source))
    }

    fn put(&mut self, text: &str) -> Result<()> {
        self.out.write_all(text.as_bytes()).map_err(|source| trace_io(&self.path, "write", source))
    }
}

fn trace_io(path: &Path, action: &'static str, source: std::io::Error) -> Error {
    Error::TraceIo { path: path.to_path_buf(), action, source }
}

/// Reads a whole trace, checking the header and every event against it.
/// Errors name the file and the 1-based line. Blank lines are skipped.
pub fn read_trace(path: impl AsRef<Path>) -> Result<(TraceHeader, Vec<TraceEvent>)> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|source| trace_io(path, "open", source))?;
    let bad = |line: usize, reason: String| Error::TraceLine { path: path.to_path_buf(), line, reason };
    let mut header: Option<TraceHeader> = None;
    let mut events = Vec::new();
    let mut seen = HashSet::new();
    for (index, text) in BufReader::new(file).lines().enumerate() {
        let line = index + 1;
        let text = text.map_err(|source| trace_io(path, "read", source))?;
        if text.trim().is_empty() {
            continue;
        }
        let Some(header) = &header else {
            header = Some(parse_header(&text).map_err(|reason| bad(line, reason))?);
            continue;
        };
        let event: TraceEvent =
            serde_json::from_str(&text).map_err(|err| bad(line, format!("not a trace event: {err}")))?;
        if event.layer >= header.num_layers {
            return Err(bad(line, format!("layer {} is outside the {} layers", event.layer, header.num_layers)));
        }
        seen.clear();
        for &expert in &event.experts {
            if expert >= header.num_experts {
                return Err(bad(line, format!("expert {expert} is outside the {} experts", header.num_experts)));
            }
            if !seen.insert(expert) {
                return Err(bad(line, format!("expert {expert} is listed twice")));
            }
        }
        events.push(event);
    }
    let header = header.ok_or_else(|| bad(1, "empty file, expected a strata-trace header".to_owned()))?;
    Ok((header, events))
}

fn parse_header(text: &str) -> std::result::Result<TraceHeader, String> {
    #[derive(Deserialize)]
    struct Head {
        format: String,
        version: u64,
    }
    let head: Head = serde_json::from_str(text).map_err(|err| format!("not a strata-trace header: {err}"))?;
    if head.format != TRACE_FORMAT {
        return Err(format!("format is {:?}, expected {TRACE_FORMAT:?}", head.format));
    }
    if head.version != u64::from(TRACE_VERSION) {
        return Err(format!(
            "trace version {} is not supported (this build reads version {TRACE_VERSION})",
            head.version
        ));
    }
    serde_json::from_str(text).map_err(|err| format!("bad strata-trace header: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TraceHeader {
        TraceHeader::new("c0ffee", 2, 8, 4096)
    }

    #[test]
    fn round_trips_events_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let events = vec![
            TraceEvent { layer: 0, token: 0, experts: vec![3, 1] },
            TraceEvent { layer: 1, token: 0, experts: vec![7] },
            TraceEvent { layer: 0, token: 1, experts: vec![] },
            TraceEvent { layer: 1, token: 0, experts: vec![0, 2, 4, 6] },
        ];
        let mut writer = TraceWriter::create(&path, header()).unwrap();
        for event in &events {
            writer.write(event.layer, event.token, &event.experts).unwrap();
        }
        assert_eq!(writer.header(), &header());
        writer.finish().unwrap();
        let (read_header, read_events) = read_trace(&path).unwrap();
        assert_eq!(read_header, header());
        assert_eq!(read_events, events);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"format":"strata-trace","version":1,"container_hash":"c0ffee","num_layers":2,"num_experts":8,"record_bytes":4096}"#
        );
        assert_eq!(lines[1], r#"{"layer":0,"token":0,"experts":[3,1]}"#);
        assert_eq!(lines[3], r#"{"layer":0,"token":1,"experts":[]}"#);
    }

    #[test]
    fn capacity_counts_whole_records() {
        assert_eq!(header().capacity_records(3 * 4096 + 4095), 3);
        assert_eq!(TraceHeader::new("h", 1, 1, 0).capacity_records(1 << 20), 0);
    }

    fn read_text(text: &str) -> Result<(TraceHeader, Vec<TraceEvent>)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, text).unwrap();
        read_trace(&path)
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let head = serde_json::to_string(&header()).unwrap();
        let cases = [
            (
                format!("{head}\n{{\"layer\":0,\"token\":0,\"experts\":[1]}}\n{{\"layer\":0,\"tok"),
                3,
                "not a trace event",
            ),
            (format!("{head}\n\n{{\"layer\":2,\"token\":0,\"experts\":[1]}}\n"), 3, "layer 2 is outside"),
            (format!("{head}\n{{\"layer\":1,\"token\":0,\"experts\":[8]}}\n"), 2, "expert 8 is outside"),
            (format!("{head}\n{{\"layer\":1,\"token\":0,\"experts\":[4,4]}}\n"), 2, "listed twice"),
            (format!("{head}\n{{\"layer\":1,\"experts\":[4]}}\n"), 2, "missing field `token`"),
            ("{\"format\":\"strata-usage\",\"version\":1}\n".to_owned(), 1, "format is"),
            ("{\"format\":\"strata-trace\",\"version\":9}\n".to_owned(), 1, "version 9"),
            ("{\"format\":\"strata-trace\",\"version\":1}\n".to_owned(), 1, "bad strata-trace header"),
            (String::new(), 1, "empty file"),
        ];
        for (text, line, why) in cases {
            let err = read_text(&text).unwrap_err();
            assert!(matches!(err, Error::TraceLine { line: l, .. } if l == line), "{text:?}: {err}");
            let message = err.to_string();
            assert!(message.contains(&format!("bad.jsonl:{line}:")) && message.contains(why), "{message}");
        }
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = read_trace("/nonexistent/trace.jsonl").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/trace.jsonl"), "{err}");
    }
}
