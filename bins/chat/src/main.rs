//! `chat`: interactive chat with a model.
//!
//! Text chat needs a tokenizer and a chat template, which arrive with the
//! demo-model and chat issues. Until then this binary says so and points to
//! the `strata` commands that already run a model on token ids.

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "chat", version, about = "Chat with a Mixture-of-Experts model")]
struct Cli {
    /// A Strata container directory.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let which = cli.model.map_or_else(|| "no model is configured".to_owned(), |m| format!("model {}", m.display()));
    println!(
        "chat: {which}, and text chat is not available yet (no embedded default model or tokenizer).\n\
         Convert a Hugging Face checkpoint and run it on token ids instead:\n\
         \n  cargo run --release --bin strata -- convert path/to/hf-checkpoint my-model --quant q4\n  \
         cargo run --release --bin strata -- generate my-model --tokens 1,2,3 --max-new-tokens 32"
    );
    ExitCode::SUCCESS
}
