//! Two network namespaces, the coordinator's and the worker's, each joined
//! to the root namespace by a veth pair; the relay runs in the root
//! namespace between them, and `tbf` on each namespace's end sets the
//! link's rate in the direction it sends.

use std::process::Command;

use crate::BoxResult;

pub const COORDINATOR_NS: &str = "sdist-c";
pub const WORKER_NS: &str = "sdist-w";
/// The coordinator's address and the relay's on its side.
pub const COORDINATOR_IP: &str = "10.77.1.1";
pub const RELAY_COORDINATOR_SIDE_IP: &str = "10.77.1.254";
/// The worker's address and the relay's on its side.
pub const WORKER_IP: &str = "10.77.2.1";
pub const RELAY_WORKER_SIDE_IP: &str = "10.77.2.254";

/// The namespaces, removed when dropped.
pub struct Topology;

fn run(args: &[&str]) -> BoxResult<()> {
    let status = Command::new(args[0]).args(&args[1..]).status()?;
    if !status.success() {
        return Err(format!("`{}` failed: {status}", args.join(" ")).into());
    }
    Ok(())
}

impl Topology {
    pub fn create() -> BoxResult<Topology> {
        Topology::remove();
        let topology = Topology;
        for (ns, root_end, ns_end, root_ip, ns_ip) in [
            (COORDINATOR_NS, "sdist-c0", "sdist-c1", RELAY_COORDINATOR_SIDE_IP, COORDINATOR_IP),
            (WORKER_NS, "sdist-w0", "sdist-w1", RELAY_WORKER_SIDE_IP, WORKER_IP),
        ] {
            run(&["ip", "netns", "add", ns])?;
            run(&["ip", "link", "add", root_end, "type", "veth", "peer", "name", ns_end])?;
            run(&["ip", "link", "set", ns_end, "netns", ns])?;
            run(&["ip", "addr", "add", &format!("{root_ip}/24"), "dev", root_end])?;
            run(&["ip", "link", "set", root_end, "up"])?;
            run(&["ip", "-n", ns, "addr", "add", &format!("{ns_ip}/24"), "dev", ns_end])?;
            run(&["ip", "-n", ns, "link", "set", ns_end, "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            // Without segmentation offloads every packet is at most one MTU,
            // so `tbf` paces the wire packet by packet as a NIC does; a 64 KB
            // GSO packet would leave in one burst. Where ethtool is missing
            // tbf still segments oversized packets, more coarsely.
            let offloads_off = ["tso", "off", "gso", "off", "gro", "off"];
            let _ = Command::new("ethtool").arg("-K").arg(root_end).args(offloads_off).status();
            let _ = in_ns(ns, "ethtool".as_ref()).arg("-K").arg(ns_end).args(offloads_off).status();
        }
        Ok(topology)
    }

    /// Sets both directions of the link to `rate` (`tc`'s spelling,
    /// `1gbit`); the bucket holds a few packets, so a message is paced at the
    /// rate rather than sent as one burst.
    pub fn shape(&self, rate: &str, burst_bytes: usize) -> BoxResult<()> {
        for (ns, dev) in [(COORDINATOR_NS, "sdist-c1"), (WORKER_NS, "sdist-w1")] {
            let burst = burst_bytes.to_string();
            run(&[
                "tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", &burst,
                "latency", "50ms",
            ])?;
        }
        Ok(())
    }

    fn remove() {
        for ns in [COORDINATOR_NS, WORKER_NS] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for dev in ["sdist-c0", "sdist-w0"] {
            let _ = Command::new("ip").args(["link", "del", dev]).stderr(std::process::Stdio::null()).status();
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        Topology::remove();
    }
}

/// `ip netns exec NS` before a command.
pub fn in_ns(ns: &str, program: &std::path::Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}
