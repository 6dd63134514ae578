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
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("strata: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
