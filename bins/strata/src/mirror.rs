//! `strata mirror plan|stage|verify`.

use std::path::Path;

use anyhow::{Context, Result};
use strata_engine::{ByteSize, USAGE_FILE_NAME};
use strata_format::Container;
use strata_tier::Usage;
use strata_tier::mirror::{PlannedFile, plan, stage, verify};

use crate::cli::{MirrorArgs, MirrorCommand};

pub fn run(command: MirrorCommand, model_dir: &Path) -> Result<()> {
    let container = Container::open(model_dir).with_context(|| format!("opening {}", model_dir.display()))?;
    let files = strata_engine::mirror::expert_files(&container)?;
    let hash = container.content_hash().to_owned();
    match command {
        MirrorCommand::Plan { args } => {
            let planned = planned(&args, model_dir, &container, &files)?;
            print_plan(&planned, &files);
        }
        MirrorCommand::Stage { args } => {
            let planned = planned(&args, model_dir, &container, &files)?;
            print_plan(&planned, &files);
            let report = stage(model_dir, &args.dir, &hash, &planned, args.reserve.bytes())?;
            println!(
                "staged {}: copied {} files ({}), kept {} already there; receipt published",
                args.dir.display(),
                report.copied.len(),
                ByteSize(report.copied_bytes),
                report.kept.len()
            );
        }
        MirrorCommand::Verify { args } => {
            let report = verify(&args.dir, &hash, &files)?;
            println!(
                "verified {}: {} expert files identical to the container's, {} absent; receipt published",
                args.dir.display(),
                report.intact.len(),
                report.absent.len()
            );
        }
    }
    Ok(())
}

/// The hottest layers within `--budget`, by the usage learned for this
/// container.
fn planned(
    args: &MirrorArgs,
    model_dir: &Path,
    container: &Container,
    files: &[strata_tier::LayerFile],
) -> Result<Vec<PlannedFile>> {
    let usage_file = args.usage_file.clone().unwrap_or_else(|| model_dir.join(USAGE_FILE_NAME));
    let experts_per_layer: Vec<usize> = (0..container.arch().stored_layers())
        .map(|layer| container.expert_layout(layer).map_or(0, |layout| layout.num_experts))
        .collect();
    let (usage, warning) = Usage::load(&usage_file, container.content_hash(), &experts_per_layer)?;
    if let Some(warning) = warning {
        eprintln!("strata: warning: {warning}");
    }
    if usage.is_empty() {
        eprintln!("strata: warning: no learned usage in {}: layers are taken in order", usage_file.display());
    }
    Ok(plan(files, &usage, args.budget.map_or(u64::MAX, ByteSize::bytes)))
}

fn print_plan(planned: &[PlannedFile], files: &[strata_tier::LayerFile]) {
    // One file per MoE layer: a mirror holds whole layers.
    let total: u64 = planned.iter().map(|p| p.file.size_bytes).sum();
    println!(
        "plan: {} of {} layer files ({}), hottest first (whole layers: the container stores one file per layer)",
        planned.len(),
        files.len(),
        ByteSize(total)
    );
    for PlannedFile { file, uses } in planned {
        println!("  {}  {}  {uses} learned uses", file.path, ByteSize(file.size_bytes));
    }
}
