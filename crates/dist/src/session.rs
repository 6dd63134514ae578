//! The Zenoh session of a worker or a coordinator: peer to peer, no broker,
//! peers named by the command line (`--listen`, `--workers`) rather than
//! found by multicast, and the shared key required.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use zenoh::Wait;

use crate::key::{SharedKey, USER};
use crate::{Error, Result};

/// Where a worker answers queries for its shard's experts and for the
/// shard it is; a coordinator asks `strata/shard/*` to find its workers.
pub(crate) fn experts_key(shard_index: usize) -> String {
    format!("strata/experts/{shard_index}")
}
pub(crate) fn shard_key(shard_index: usize) -> String {
    format!("strata/shard/{shard_index}")
}
pub(crate) const ALL_SHARDS_KEY: &str = "strata/shard/*";

pub(crate) fn zenoh_error<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Error + '_ {
    move |source| Error::Zenoh(format!("{what}: {source}"))
}

/// A peer's configuration: it listens on `listen` (a worker) or nowhere (a
/// coordinator), connects to `connect`, and neither scouts nor gossips, so
/// only the peers named on the command line ever connect.
fn config(listen: Option<&str>, connect: &[String]) -> Result<zenoh::Config> {
    let mut config = zenoh::Config::default();
    let endpoints = |addrs: &mut dyn Iterator<Item = &str>| serde_json_list(addrs.map(|addr| format!("tcp/{addr}")));
    let settings = [
        ("mode", r#""peer""#.to_owned()),
        ("scouting/multicast/enabled", "false".to_owned()),
        ("scouting/gossip/enabled", "false".to_owned()),
        ("listen/endpoints", endpoints(&mut listen.into_iter())),
        ("connect/endpoints", endpoints(&mut connect.iter().map(String::as_str))),
    ];
    for (key, value) in settings {
        config.insert_json5(key, &value).map_err(zenoh_error(key))?;
    }
    Ok(config)
}

/// `["a", "b"]`, each string JSON-quoted.
fn serde_json_list(items: impl Iterator<Item = String>) -> String {
    let quoted: Vec<String> = items.map(|item| format!("{item:?}")).collect();
    format!("[{}]", quoted.join(","))
}

/// A worker's session: listening on `listen`, admitting only peers that
/// present `key`.
pub(crate) fn open_worker(listen: &str, key: &SharedKey) -> Result<zenoh::Session> {
    let mut config = config(Some(listen), &[])?;
    // Zenoh reads the accepted users from a file when the session opens:
    // one of this process's own, readable by it alone, gone once open.
    let dictionary = std::env::temp_dir().join(format!("strata-worker-{}.users", std::process::id()));
    let io = |source| Error::Io { what: format!("key dictionary {}", dictionary.display()), source };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&dictionary)
        .map_err(io)?;
    writeln!(file, "{USER}:{}", key.secret()).map_err(io)?;
    drop(file);
    let path = format!("{:?}", dictionary.display().to_string());
    let opened = config
        .insert_json5("transport/auth/usrpwd/dictionary_file", &path)
        .map_err(zenoh_error("dictionary_file"))
        .and_then(|()| zenoh::open(config).wait().map_err(zenoh_error("opening the worker's session")));
    let _ = std::fs::remove_file(&dictionary);
    opened
}

/// A coordinator's session: connected to every worker, presenting `key`.
pub(crate) fn open_coordinator(workers: &[String], key: &SharedKey) -> Result<zenoh::Session> {
    let mut config = config(None, workers)?;
    for (setting, value) in [("transport/auth/usrpwd/user", USER), ("transport/auth/usrpwd/password", key.secret())] {
        config.insert_json5(setting, &format!("{value:?}")).map_err(zenoh_error(setting))?;
    }
    zenoh::open(config).wait().map_err(zenoh_error("opening the coordinator's session"))
}
