//! A slower disk for the rows that ask for one: a control group whose reads
//! from the disk holding a file are held to a rate by the kernel's block
//! layer (cgroup v2 `io.max`, or v1's `blkio.throttle.read_bps_device`).
//! The engine reads as it always does (`--io direct` bypasses the page
//! cache, so every miss reaches the disk); the kernel delays its requests
//! as a disk of that rate would. Made only where the bench runs as root on
//! a machine with either controller; elsewhere a row says why it is missing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The v2 hierarchy, and v1's block-I/O controller.
const CGROUP_V2: &str = "/sys/fs/cgroup";
const CGROUP_V1_BLKIO: &str = "/sys/fs/cgroup/blkio";

/// A control group holding its members' reads from one disk to a rate;
/// removed when dropped (its members have exited by then).
pub(crate) struct ReadThrottle {
    dir: PathBuf,
    /// The disk, as `major:minor`.
    pub(crate) disk: String,
    pub(crate) read_bytes_per_s: u64,
}

impl ReadThrottle {
    /// A group whose reads from the disk holding `file` go at most
    /// `read_bytes_per_s`; `Err` says why none can be made here.
    pub(crate) fn new(file: &Path, read_bytes_per_s: u64) -> Result<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("holding a disk to a rate needs root (a control group's I/O limit)");
        }
        let disk = whole_disk(file)?;
        let name = format!("strata-bench-{}", std::process::id());
        let v2 = Path::new(CGROUP_V2);
        let v2_has_io = std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "io"));
        let (dir, limit_file, limit) = if v2_has_io {
            // The root's children get the controller only once it says so.
            std::fs::write(v2.join("cgroup.subtree_control"), "+io").context("enabling the io controller")?;
            (v2.join(&name), "io.max", format!("{disk} rbps={read_bytes_per_s}"))
        } else if Path::new(CGROUP_V1_BLKIO).join("blkio.throttle.read_bps_device").exists() {
            (
                Path::new(CGROUP_V1_BLKIO).join(&name),
                "blkio.throttle.read_bps_device",
                format!("{disk} {read_bytes_per_s}"),
            )
        } else {
            bail!("no cgroup I/O controller here (neither v2's io nor v1's blkio)");
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let throttle = Self { dir, disk, read_bytes_per_s };
        let limit_path = throttle.dir.join(limit_file);
        std::fs::write(&limit_path, &limit)
            .with_context(|| format!("writing {limit:?} to {}", limit_path.display()))?;
        Ok(throttle)
    }

    /// `bin args` run inside the group: a shell that joins it, then
    /// becomes the command (so its every thread and child is a member).
    pub(crate) fn wrap(&self, bin: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        let procs = self.dir.join("cgroup.procs");
        let mut wrapped = vec![
            "-c".to_string(),
            r#"echo $$ > "$0" && exec "$@""#.to_string(),
            procs.display().to_string(),
            bin.display().to_string(),
        ];
        wrapped.extend(args.iter().cloned());
        (PathBuf::from("/bin/sh"), wrapped)
    }
}

impl Drop for ReadThrottle {
    fn drop(&mut self) {
        // An empty group is removed with rmdir; a failure leaves an empty
        // group behind, which limits nothing outside it.
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("bench: could not remove {}: {e}", self.dir.display());
        }
    }
}

/// `major:minor` of the whole disk holding `file` (a partition's parent:
/// the block layer limits whole disks).
fn whole_disk(file: &Path) -> Result<String> {
    let dev = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        bail!("{} is on {major}:{minor}, not a block device (an overlay or a network file system)", file.display());
    }
    let disk = if sys.join("partition").exists() { sys.join("../dev") } else { sys.join("dev") };
    let text = std::fs::read_to_string(&disk).with_context(|| format!("reading {}", disk.display()))?;
    Ok(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper joins the group before it becomes the command, passing
    /// every argument through as it was (spaces and quotes included).
    #[test]
    fn a_wrapped_command_joins_the_group_then_runs_with_its_arguments_intact() {
        let dir = std::env::temp_dir().join(format!("strata-throttle-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = vec!["one two".to_string(), "it's \"quoted\"".to_string()];
        let throttle = ReadThrottle { dir: dir.clone(), disk: "0:0".into(), read_bytes_per_s: 1 };
        let (sh, wrapped) = throttle.wrap(Path::new("/bin/echo"), &args);
        // Not a group: nothing for Drop to remove (the directory goes below).
        std::mem::forget(throttle);
        let out = std::process::Command::new(sh).args(&wrapped).output().unwrap();
        let joined = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "one two it's \"quoted\"\n");
        assert!(joined.trim().parse::<u32>().is_ok(), "{joined:?}");
    }
}
