//! `strata`: convert, inspect and run models from the command line.
//!
//! A thin binary: it parses flags, calls the library crates, and maps errors
//! to one line on stderr and a non-zero exit code.

mod cli;
mod commands;
mod mirror;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    restore_sigpipe();
    // The engine's news (a usage file ignored, a mirror falling back) as
    // `strata: warning: ...` lines; `RUST_LOG` for more.
    strata_engine::logging::init("strata", strata_engine::logging::LogFormat::Text, "warn");
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("strata: error: {}", strata_engine::args::error_line(&*err));
            ExitCode::from(1)
        }
    }
}

/// A closed pipe (`strata info | head -1`) ends the program quietly, as it
/// ends `cat`: Rust starts programs with SIGPIPE ignored, which turns the
/// next print into a panic.
fn restore_sigpipe() {
    // SAFETY: called first thing in `main`, before any thread exists; it
    // only sets the signal's disposition back to the system default.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
