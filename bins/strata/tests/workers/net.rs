//! Where a test's workers listen: each in a network namespace of its own,
//! joined to the test's namespace by a veth pair, as another machine on a
//! LAN is; on loopback where namespaces cannot be made (not root, no `ip`,
//! no veth in the kernel), said once on stderr with the reason.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

/// A worker's port inside its own namespace: nothing else listens there.
const NAMESPACE_PORT: u16 = 7447;

/// Where one worker runs.
pub enum Place {
    Loopback,
    Namespace(Namespace),
}

/// A network namespace and its veth pair, removed when dropped (after the
/// worker in it: `Worker` kills its process before its fields drop).
pub struct Namespace {
    name: String,
    /// The pair's end inside the namespace, and its address.
    inner_end: String,
    inner_ip: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).stdin(Stdio::null()).output().map_err(|error| format!("ip: {error}"))?;
    if !output.status.success() {
        return Err(format!("`ip {}`: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(())
}

impl Namespace {
    /// A namespace named after this process and a counter, so that tests
    /// running at once (and other runs of them) never share one; its subnet
    /// `10.(100 + pid mod 100).(counter).0/24`, the worker at `.1`.
    fn create() -> Result<Namespace, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(serial < 250, "more namespaces than subnets");
        let pid = std::process::id();
        // Interface names are at most 15 bytes: "sw" + 7 digits + "-" + 3 + 1.
        let name = format!("sw{pid}-{serial}");
        let (outer_end, inner_end) = (format!("{name}o"), format!("{name}i"));
        let subnet = format!("10.{}.{serial}", 100 + pid % 100);
        let (outer_ip, inner_ip) = (format!("{subnet}.254"), format!("{subnet}.1"));
        ip(&["netns", "add", &name])?;
        let namespace = Namespace { name, inner_end, inner_ip };
        let ns = namespace.name.as_str();
        ip(&["link", "add", &outer_end, "type", "veth", "peer", "name", &namespace.inner_end])?;
        ip(&["link", "set", &namespace.inner_end, "netns", ns])?;
        ip(&["addr", "add", &format!("{outer_ip}/24"), "dev", &outer_end])?;
        ip(&["link", "set", &outer_end, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{}/24", namespace.inner_ip), "dev", &namespace.inner_end])?;
        ip(&["-n", ns, "link", "set", &namespace.inner_end, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(namespace)
    }

    /// Takes the link down: nothing crosses it, no connection is closed, as
    /// when a cable is pulled.
    pub fn cut(&self) {
        ip(&["-n", &self.name, "link", "set", &self.inner_end, "down"]).unwrap();
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Deleting the namespace deletes the pair with it.
        let _ = ip(&["netns", "del", &self.name]);
    }
}

impl Place {
    /// A namespace of its own, or loopback where one cannot be made.
    pub fn new() -> Place {
        static SAID: Once = Once::new();
        match Namespace::create() {
            Ok(namespace) => Place::Namespace(namespace),
            Err(why) => {
                SAID.call_once(|| eprintln!("workers on loopback: no network namespace could be made ({why})"));
                Place::Loopback
            }
        }
    }

    /// The address a worker here listens on, and the coordinator connects
    /// to.
    pub fn listen_addr(&self) -> String {
        match self {
            Place::Namespace(namespace) => format!("{}:{NAMESPACE_PORT}", namespace.inner_ip),
            Place::Loopback => {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
            }
        }
    }

    /// `program`, run here.
    pub fn command(&self, program: &Path) -> Command {
        match self {
            Place::Namespace(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", &namespace.name]).arg(program);
                command
            }
            Place::Loopback => Command::new(program),
        }
    }
}
