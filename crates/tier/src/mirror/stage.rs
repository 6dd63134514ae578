//! `strata mirror plan|stage|verify`: choosing what a partial mirror holds,
//! copying it there safely, and checking copies made some other way.
//!
//! The container keeps one file per MoE layer, so a mirror holds whole
//! layers: the plan ranks layers by the uses the usage file learned for
//! their experts (hottest first; ties: lower layer) and takes them while
//! they fit the budget.

use std::fs::File;
use std::path::Path;

use strata_format::temporaries;

use super::LayerFile;
use super::receipt::{self, Receipt, ReceiptFile, hash_file, receipt_file};
use crate::{ByteSize, Error, ExpertKey, Result, Usage};

/// One layer file a plan puts on the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    pub file: LayerFile,
    /// Learned uses of the layer's experts.
    pub uses: u64,
}

/// The hottest layers whose files fit in `budget_bytes` together.
pub fn plan(files: &[LayerFile], usage: &Usage, budget_bytes: u64) -> Vec<PlannedFile> {
    let mut ranked: Vec<PlannedFile> = files
        .iter()
        .map(|file| PlannedFile {
            uses: (0..file.num_experts).map(|expert| usage.count(ExpertKey { layer: file.layer, expert })).sum(),
            file: file.clone(),
        })
        .collect();
    ranked.sort_by(|a, b| b.uses.cmp(&a.uses).then(a.file.layer.cmp(&b.file.layer)));
    let mut used_bytes = 0u64;
    ranked.retain(|planned| match used_bytes.checked_add(planned.file.size_bytes) {
        Some(total) if total <= budget_bytes => {
            used_bytes = total;
            true
        }
        _ => false,
    });
    ranked
}

fn io_err(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::MirrorIo { path, action, source }
}

/// What [`stage`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    /// Files copied now.
    pub copied: Vec<String>,
    /// Files that were already there, intact.
    pub kept: Vec<String>,
    /// Bytes copied.
    pub copied_bytes: u64,
}

/// Copies the planned files from `container_dir` into `mirror_dir` and
/// publishes its receipt.
///
/// Each copy goes to a temporary file next to its destination, is fsynced,
/// re-read and hashed, and only then linked under its name (a link never
/// replaces a file). A file already at a destination is kept if it matches
/// the container (by the old receipt, else by hashing it) and is otherwise
/// an error: staging never deletes or overwrites a mirror file. Before each
/// copy the destination's filesystem must keep `reserve_bytes` free after
/// it. The receipt, listing every intact file (earlier ones included), is
/// published atomically once every copy is done.
pub fn stage(
    container_dir: &Path,
    mirror_dir: &Path,
    container_hash: &str,
    planned: &[PlannedFile],
    reserve_bytes: u64,
) -> Result<StageReport> {
    std::fs::create_dir_all(mirror_dir).map_err(io_err(mirror_dir, "create"))?;
    let previous = match Receipt::read(mirror_dir)? {
        Some(old) if old.container_hash == container_hash => old.files,
        // Another version's receipt says nothing about these files.
        _ => Vec::new(),
    };
    remove_stale_temporaries(mirror_dir, planned);
    let mut held: Vec<ReceiptFile> = Vec::new();
    let mut report = StageReport::default();
    for PlannedFile { file, .. } in planned {
        let dest = receipt::join(mirror_dir, &file.path);
        if dest.exists() {
            let listed = previous.iter().find(|f| f.path == file.path && f.sha256 == file.sha256);
            let on_disk = std::fs::metadata(&dest).map_err(io_err(&dest, "stat"))?.len();
            let entry = match listed {
                Some(entry) if on_disk == file.size_bytes => entry.clone(),
                _ => checked_entry(mirror_dir, file, &dest)?,
            };
            held.push(entry);
            report.kept.push(file.path.clone());
            continue;
        }
        let dest_dir = dest.parent().expect("a joined path has a parent").to_owned();
        let dest_dir = dest_dir.as_path();
        std::fs::create_dir_all(dest_dir).map_err(io_err(dest_dir, "create"))?;
        let free_bytes = free_bytes(dest_dir)?;
        let needed = file.size_bytes.checked_add(reserve_bytes);
        if needed.is_none_or(|needed| needed > free_bytes) {
            return Err(Error::MirrorNoSpace {
                path: dest.clone(),
                dir: dest_dir.to_owned(),
                needed: ByteSize(file.size_bytes),
                free: ByteSize(free_bytes),
                reserve: ByteSize(reserve_bytes),
            });
        }
        let name = dest.file_name().expect("a file name").to_string_lossy().into_owned();
        let temp = dest_dir.join(temporaries::temporary_name(&format!(".{name}")));
        let copied = copy_verified(container_dir, file, &temp, mirror_dir);
        let published = copied.and_then(|entry| {
            // A hard link fails if the name exists: nothing is replaced.
            std::fs::hard_link(&temp, &dest).map_err(io_err(&dest, "publish"))?;
            File::open(dest_dir).and_then(|d| d.sync_all()).map_err(io_err(dest_dir, "sync"))?;
            Ok(entry)
        });
        // The temporary file is ours alone: removing it deletes no mirror file.
        let _ = std::fs::remove_file(&temp);
        held.push(published?);
        report.copied.push(file.path.clone());
        report.copied_bytes += file.size_bytes;
    }
    // Files an earlier stage put there and this plan leaves out stay listed.
    for old in previous {
        if !held.iter().any(|f| f.path == old.path) && receipt::join(mirror_dir, &old.path).exists() {
            held.push(old);
        }
    }
    Receipt::new(container_hash, held).publish(mirror_dir)?;
    Ok(report)
}

/// Removes the temporary copies (`.NAME.tmp-PID`) of planned files that
/// stages killed before publishing them left, each up to a layer file's
/// size; a stage still running keeps its own.
fn remove_stale_temporaries(mirror_dir: &Path, planned: &[PlannedFile]) {
    for PlannedFile { file, .. } in planned {
        let dest = receipt::join(mirror_dir, &file.path);
        let (Some(dest_dir), Some(name)) = (dest.parent(), dest.file_name()) else { continue };
        let stem = format!(".{}", name.to_string_lossy());
        temporaries::remove_stale(dest_dir, |s| s == stem);
    }
}

/// Copies `file` from the container to `temp`, fsyncs it, and hashes what
/// landed on the mirror's disk.
fn copy_verified(container_dir: &Path, file: &LayerFile, temp: &Path, mirror_dir: &Path) -> Result<ReceiptFile> {
    let source = receipt::join(container_dir, &file.path);
    let copy = || -> std::io::Result<()> {
        let mut from = File::open(&source)?;
        let mut to = File::options().write(true).create_new(true).open(temp)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()
    };
    copy().map_err(|source| Error::MirrorIo { path: temp.to_owned(), action: "copy to", source })?;
    checked_entry(mirror_dir, file, temp)
}

/// Hashes `path` and returns its receipt entry if it is a byte-identical
/// copy of `file`.
fn checked_entry(mirror_dir: &Path, file: &LayerFile, path: &Path) -> Result<ReceiptFile> {
    let hashes = hash_file(path, file.record_bytes)?;
    if hashes.size_bytes != file.size_bytes || hashes.sha256 != file.sha256 {
        return Err(Error::MirrorInvalid {
            dir: mirror_dir.to_owned(),
            reason: format!(
                "{} differs from the container's {} (size {} against {}, sha256 {} against {}); it is left as it is",
                path.display(),
                file.path,
                hashes.size_bytes,
                file.size_bytes,
                hashes.sha256,
                file.sha256
            ),
        });
    }
    Ok(receipt_file(&file.path, file.record_bytes, &hashes))
}

/// Bytes an unprivileged writer may still use on the filesystem of `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let io_err = |source| Error::MirrorIo { path: dir.to_owned(), action: "statvfs", source };
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io_err(std::io::Error::other("the path holds a NUL byte")))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed out-parameter of the right type.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io_err(std::io::Error::last_os_error()));
    }
    // Both are u64 on Linux targets.
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Copies identical to the container's.
    pub intact: Vec<String>,
    /// Expert files of the container the mirror does not hold.
    pub absent: Vec<String>,
}

/// Hashes every expert file present in `mirror_dir` against the container
/// and, if all are intact, publishes a receipt listing them: the way to
/// adopt copies made by hand, or to recheck a staged mirror. A differing
/// copy is an error naming it; nothing is deleted.
pub fn verify(mirror_dir: &Path, container_hash: &str, files: &[LayerFile]) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let mut held = Vec::new();
    for file in files {
        let path = receipt::join(mirror_dir, &file.path);
        if !path.exists() {
            report.absent.push(file.path.clone());
            continue;
        }
        held.push(checked_entry(mirror_dir, file, &path)?);
        report.intact.push(file.path.clone());
    }
    Receipt::new(container_hash, held).publish(mirror_dir)?;
    Ok(report)
}
