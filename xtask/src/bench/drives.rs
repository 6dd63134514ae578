//! `cargo xtask bench --only drives`: streaming decode from two drives of
//! different speeds (issue 15), the container on one and a full mirror of
//! its experts on the other (`--mirror`), against the sum of the drives'
//! rates, with the container's drive alone beside it.
//!
//! This machine has one disk, so the two drives are emulated: two loop
//! devices on it (direct I/O, ext4), each capped by the blkio cgroup's read
//! throttle at a rate well under what the disk gives, so that each behaves as
//! a drive of its own speed and their sum stays under the real disk's. The
//! runs (and the rate probes) are moved into that cgroup; everything else in
//! this process reads unthrottled. Needs root, loop devices and cgroup v1's
//! blkio controller: skipped with a note where any is missing.
//!
//! [`Throttle`] also gives the streaming suite's record-check A/B a drive of
//! fixed speed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::common::{Bins, evict, footprint, model_files, num, run_json, synth};
use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;

/// The emulated drives' read rates, bytes per second: a fast and a slow one,
/// together under half of what this machine's disk gives at its worst
/// (1.0–1.9 GB/s O_DIRECT, docs/BENCHMARKS.md), so neither waits on the
/// other at the real disk.
const DRIVE_RATES_BYTES_PER_S: [u64; 2] = [320_000_000, 160_000_000];

/// Where cgroup v1 keeps the blkio controller.
const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

pub(crate) fn suite_drives(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    if let Some(reason) = cannot_emulate() {
        eprintln!("drives: skipped: {reason}");
        report.notes.push(format!("drives: skipped: {reason}."));
        return Ok(());
    }
    let model = synth(bins, opts, &opts.stream_like, opts.stream_layers)?;
    let fp = footprint(&model)?;
    let budget_bytes = (fp.total_bytes / 4.0).max(1.2 * (1u64 << 30) as f64);
    let budget = format!("{}MiB", (budget_bytes / (1u64 << 20) as f64).round());
    let expert_cache = super::common::streaming_expert_cache(&fp);
    let headroom = |bytes: f64| (bytes * 1.1) as u64 + (256 << 20);
    let drives = Drives::create(&opts.out.join("drives"), [headroom(fp.total_bytes), headroom(fp.total_bytes)])?;
    eprintln!("drives: copying the container onto drive A and staging a full mirror on drive B");
    let primary = drives.dirs[0].join("model");
    let status = Command::new("cp").arg("-a").arg(&model).arg(&primary).status().context("running cp")?;
    if !status.success() {
        bail!("copying {} to {} failed with {status}", model.display(), primary.display());
    }
    let mirror = drives.dirs[1].join("mirror");
    let stage = Command::new(&bins.strata)
        .args(["mirror", "stage"])
        .arg(&mirror)
        .arg("--model")
        .arg(&primary)
        .args(["--reserve", "16MiB"])
        .output()
        .context("running strata mirror stage")?;
    if !stage.status.success() {
        bail!("strata mirror stage failed: {}", String::from_utf8_lossy(&stage.stderr).trim());
    }
    // Each drive's O_DIRECT rate under its throttle, measured as the engine
    // reads: whole records, best of 1/2/4 readers.
    let rate_gbs =
        [drives.direct_read_gbs(bins, &primary, &primary)?, drives.direct_read_gbs(bins, &primary, &mirror)?];
    eprintln!("drives: measured A {:.3} GB/s, B {:.3} GB/s", rate_gbs[0], rate_gbs[1]);
    let files = model_files(&primary)?;
    let mirror_arg = mirror.display().to_string();
    // Per run: decode tok/s, record bytes per decode step, and the share of
    // all record bytes the mirror served.
    let mut per_setup: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut raw = Vec::new();
    for rep in 0..opts.reps {
        for (k, with_mirror) in [false, true].into_iter().enumerate() {
            eprintln!("drives: {}, run {}/{}", if with_mirror { "A + B" } else { "A alone" }, rep + 1, opts.reps);
            let mut extra =
                vec!["--ram-budget", budget.as_str(), "--expert-cache", expert_cache.as_str(), "--io", "direct"];
            if with_mirror {
                extra.extend(["--mirror", mirror_arg.as_str()]);
            }
            evict(bins, &files)?;
            let stats = drives.generate(bins, &primary, &extra, opts.tokens)?;
            let tokens: Vec<f64> = stats["per_token"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s["bytes_read"].as_f64().unwrap_or(0.0))
                .collect();
            // The first entry is the prefill.
            let decode_bytes: f64 = tokens.iter().skip(1).sum();
            let per_token = decode_bytes / tokens.len().saturating_sub(1).max(1) as f64;
            let mirror_bytes: f64 =
                stats["mirror_bytes_read"].as_array().into_iter().flatten().filter_map(Value::as_f64).sum();
            let share = mirror_bytes / tokens.iter().sum::<f64>().max(1.0);
            per_setup[k].push((num(&stats, "decode_tokens_per_s")?, per_token, share));
            raw.push(json!({ "rep": rep, "mirror": with_mirror, "stats": stats }));
        }
    }
    drop(drives);
    let names = [
        format!("one drive ({:.0} MB/s): streaming decode --io direct, budget {budget}", rate_gbs[0] * 1e3),
        format!(
            "two drives ({:.0} + {:.0} MB/s, a full mirror on the second): streaming decode --io direct, budget {budget}",
            rate_gbs[0] * 1e3,
            rate_gbs[1] * 1e3
        ),
    ];
    for (k, runs) in per_setup.iter().enumerate() {
        let rate = median(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let per_token = median(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let drives_gbs = if k == 0 { rate_gbs[0] } else { rate_gbs[0] + rate_gbs[1] };
        let bound = drives_gbs * 1e9 / per_token;
        let mirror_share = median(&runs.iter().map(|r| r.2).collect::<Vec<_>>());
        report.push(Row {
            suite: "drives".into(),
            runs: Vec::new(),
            bound_runs: Vec::new(),
            load: None,
            name: names[k].clone(),
            measured: rate,
            unit: "tok/s".into(),
            limit_name: format!(
                "{} / {:.0} MB of records per token",
                if k == 0 { "drive A's O_DIRECT rate" } else { "the sum of both drives' O_DIRECT rates" },
                per_token / 1e6
            ),
            limit: drives_gbs,
            limit_unit: "GB/s".into(),
            bound,
            ratio: rate / bound,
            goal: (k == 1).then_some(0.9),
            note: if k == 1 {
                format!("share of record bytes the mirror served: {mirror_share:.2}")
            } else {
                "the container's drive alone".into()
            },
        });
    }
    report.raw.push(json!({
        "suite": "drives", "model": model, "budget": budget, "drive_gbs": rate_gbs,
        "throttle_bytes_per_s": DRIVE_RATES_BYTES_PER_S, "runs": raw,
    }));
    Ok(())
}

/// Why reads cannot be throttled here, if they cannot.
pub(crate) fn cannot_throttle() -> Option<String> {
    // SAFETY: geteuid has no preconditions and no effect.
    if unsafe { libc::geteuid() } != 0 {
        return Some("throttling a drive needs root (the blkio cgroup)".into());
    }
    if !Path::new(BLKIO_ROOT).join("blkio.throttle.read_bps_device").exists() {
        return Some(format!("no cgroup v1 blkio throttle at {BLKIO_ROOT}"));
    }
    None
}

/// Why two throttled drives cannot be made here, if they cannot.
fn cannot_emulate() -> Option<String> {
    if let Some(reason) = cannot_throttle() {
        return Some(reason);
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.map(|o| o.status.success()).unwrap_or(false) {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// A blkio cgroup (v1) capping the read rate of whole disks for the
/// programs run in it; removed on drop.
pub(crate) struct Throttle {
    cgroup: PathBuf,
}

impl Throttle {
    pub(crate) fn new(name: &str) -> Result<Throttle> {
        let cgroup = Path::new(BLKIO_ROOT).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).with_context(|| format!("creating the cgroup {}", cgroup.display()))?;
        Ok(Throttle { cgroup })
    }

    /// Caps reads from the disk `device` ("MAJOR:MINOR", a whole disk).
    pub(crate) fn cap(&self, device: &str, bytes_per_s: u64) -> Result<()> {
        let rule = format!("{device} {bytes_per_s}");
        std::fs::write(self.cgroup.join("blkio.throttle.read_bps_device"), &rule)
            .with_context(|| format!("throttling {rule}"))
    }

    /// `bin args` run inside the cgroup; its last line as JSON.
    pub(crate) fn run_json(&self, bin: &Path, args: &[String]) -> Result<Value> {
        let mut a = vec![
            "-c".to_string(),
            r#"echo $$ > "$0/cgroup.procs" && exec "$@""#.to_string(),
            self.cgroup.display().to_string(),
            bin.display().to_string(),
        ];
        a.extend(args.iter().cloned());
        run_json(Path::new("/bin/sh"), &a)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        // Empty by now: every process run in it has exited.
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// "MAJOR:MINOR" of the whole disk holding `path` (blkio throttles disks,
/// not partitions).
pub(crate) fn disk_of(path: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.dev();
    // The kernel's encoding of dev_t (glibc's gnu_dev_major/minor).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("partition").exists() {
        let parent = std::fs::read_to_string(sys.join("..").join("dev"))
            .with_context(|| format!("finding the disk of partition {major}:{minor}"))?;
        return Ok(parent.trim().to_owned());
    }
    Ok(format!("{major}:{minor}"))
}

/// Two loop-device drives, mounted, with a blkio cgroup capping each one's
/// reads; all of it undone on drop.
struct Drives {
    dirs: [PathBuf; 2],
    images: Vec<PathBuf>,
    loops: Vec<String>,
    mounted: Vec<PathBuf>,
    throttle: Throttle,
}

impl Drives {
    fn create(root: &Path, sizes_bytes: [u64; 2]) -> Result<Drives> {
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let mut drives = Drives {
            dirs: [root.join("a"), root.join("b")],
            images: Vec::new(),
            loops: Vec::new(),
            mounted: Vec::new(),
            throttle: Throttle::new("strata-bench-drives")?,
        };
        for (k, size_bytes) in sizes_bytes.into_iter().enumerate() {
            let image = root.join(format!("drive-{k}.img"));
            // Sparse: only what is written takes space on the real disk.
            let file = std::fs::File::create(&image).with_context(|| format!("creating {}", image.display()))?;
            file.set_len(size_bytes)?;
            drives.images.push(image.clone());
            let device = output(Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(&image))?;
            drives.loops.push(device.clone());
            output(
                Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
                    .arg(&device),
            )?;
            let dir = &drives.dirs[k];
            std::fs::create_dir_all(dir)?;
            output(Command::new("mount").arg(&device).arg(dir))?;
            drives.mounted.push(dir.clone());
            let name = device.trim_start_matches("/dev/");
            let dev = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
                .with_context(|| format!("reading the device number of {device}"))?;
            drives.throttle.cap(dev.trim(), DRIVE_RATES_BYTES_PER_S[k])?;
        }
        Ok(drives)
    }

    /// The best O_DIRECT rate of 1, 2 or 4 readers over the expert files of
    /// `model` as they lie under `dir` (the container or a mirror of it).
    fn direct_read_gbs(&self, bins: &Bins, model: &Path, dir: &Path) -> Result<f64> {
        let m: Value = serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json"))?)?;
        let mut disk = vec!["disk".to_string(), "--max-bytes".into(), (256u64 << 20).to_string()];
        for layer in m["expert_layers"].as_array().context("expert_layers")? {
            let path = dir.join(layer["file"].as_str().context("file")?);
            disk.extend([
                "--file".into(),
                format!("{}:{}:{}", path.display(), layer["record_bytes"], layer["num_experts"]),
            ]);
        }
        let mut best_gbs: f64 = 0.0;
        for readers in ["1", "2", "4"] {
            let mut a = disk.clone();
            a.extend(["--readers".to_string(), readers.to_string()]);
            best_gbs = best_gbs.max(num(&self.throttle.run_json(bins.probe(), &a)?, "direct_gbs")?);
        }
        Ok(best_gbs)
    }

    /// One `strata generate --json` run inside the cgroup; its stats.
    fn generate(&self, bins: &Bins, model: &Path, extra: &[&str], max_new: usize) -> Result<Value> {
        let mut a: Vec<String> = ["generate", &model.display().to_string(), "--tokens", super::common::PROMPT]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--max-new-tokens".into(), max_new.to_string()]);
        a.extend(["--ignore-eos", "--json", "--temperature", "0"].iter().map(|s| s.to_string()));
        a.extend(extra.iter().map(|s| s.to_string()));
        Ok(self.throttle.run_json(&bins.strata, &a)?["stats"].clone())
    }
}

impl Drop for Drives {
    fn drop(&mut self) {
        // Best effort, in reverse: a step that fails leaves the rest to do.
        for dir in self.mounted.drain(..).rev() {
            let _ = Command::new("umount").arg(&dir).status();
        }
        for device in self.loops.drain(..).rev() {
            let _ = Command::new("losetup").arg("-d").arg(&device).status();
        }
        for image in self.images.drain(..) {
            let _ = std::fs::remove_file(&image);
        }
        // The cgroup goes with `throttle`, dropped after this.
    }
}

/// Runs `command`, failing with its stderr; its trimmed stdout.
fn output(command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?} failed with {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
