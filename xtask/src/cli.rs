//! What every `cargo xtask` task shares: its command line and where the
//! workspace is.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Parser;
use clap::error::ErrorKind;

/// The workspace's root directory (xtask is one of its members).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Where cargo builds: `CARGO_TARGET_DIR`, else the workspace's `target`.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// Parses the arguments of `cargo xtask <name>` into `T`; `args` may start with `name` itself. `Ok(None)`
/// after printing the help for `-h`/`--help`.
pub(crate) fn parse_cli<T: Parser>(name: &str, args: &[String]) -> Result<Option<T>> {
    let args = match args.split_first() {
        Some((first, rest)) if first == name => rest,
        _ => args,
    };
    match T::try_parse_from(std::iter::once(format!("xtask {name}")).chain(args.iter().cloned())) {
        Ok(cli) => Ok(Some(cli)),
        Err(e) if e.kind() == ErrorKind::DisplayHelp => {
            print!("{}", e.render());
            Ok(None)
        }
        // clap's rendering ("error: ...", usage, "try '--help'") without its prefix: main adds "Error: ".
        Err(e) => {
            let msg = e.render().to_string();
            bail!("{}", msg.trim_end().strip_prefix("error: ").unwrap_or(msg.trim_end()))
        }
    }
}

/// The items of comma lists (`--family a,,b`) without the empty ones.
pub(crate) fn non_empty(items: Vec<String>) -> Vec<String> {
    items.into_iter().filter(|s| !s.is_empty()).collect()
}
