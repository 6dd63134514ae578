//! `serve`: the HTTP server (OpenAI- and Anthropic-compatible), still to come.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("serve: the HTTP server is not implemented yet; use `strata generate` for now");
    ExitCode::from(2)
}
