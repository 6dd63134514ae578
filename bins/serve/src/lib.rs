//! The server behind the `serve` binary (src/main.rs: flags, opening the
//! model, the listener), as a library so that the fuzz targets reach the
//! request parsing (`openai::parse_chat`, `anthropic::parse_messages`)
//! exactly as a request meets it.

pub mod anthropic;
pub mod body;
pub mod cli;
pub mod error;
pub mod generate;
pub mod listen;
pub mod metrics;
pub mod openai;
pub mod page;
pub mod server;
pub mod state;
pub mod thinking;
pub mod tools;
pub mod trace;
