//! One function per subcommand.

use std::ops::ControlFlow;

use anyhow::{Context, Result};
use strata_engine::{ByteSize, Engine, EngineOptions, GenerateOptions, SamplingOptions};
use strata_format::{ConvertOptions, QuantPreset, SynthOptions};

use crate::cli::{Cli, Command, RunArgs, TraceCommand};

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Convert { hf_dir, out_dir, quant, overwrite } => {
            let preset: QuantPreset = quant.parse()?;
            let options = ConvertOptions { overwrite, progress: true, ..ConvertOptions::new(preset) };
            let report = strata_format::convert(&hf_dir, &out_dir, &options)
                .with_context(|| format!("converting {}", hf_dir.display()))?;
            println!(
                "wrote {} ({}): dense {}, {} MoE layers of {} per expert, {} in all, in {:.1} s",
                report.out_dir.display(),
                report.preset,
                ByteSize(report.dense_bytes),
                report.num_moe_layers,
                ByteSize(report.expert_record_bytes),
                ByteSize(report.total_bytes),
                report.elapsed.as_secs_f64()
            );
            Ok(())
        }
        Command::Info { model_dir, verify } => info(&model_dir, verify),
        Command::Logits { model_dir, tokens, out, run } => {
            let engine = open(&model_dir, &run)?;
            let logits = engine.logits(&tokens.0)?;
            let vocab = engine.spec().vocab_size;
            strata_format::npy::write_f32(&out, &[tokens.0.len(), vocab], &logits)
                .with_context(|| format!("writing {}", out.display()))?;
            Ok(())
        }
        Command::Generate { model_dir, tokens, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos, json, run } => {
            let engine = open(&model_dir, &run)?;
            let sampling = SamplingOptions { temperature, top_k, top_p, seed };
            let options = GenerateOptions { max_new_tokens, sampling, ignore_eos };
            let mut session = engine.session();
            let report = session.generate(&tokens.0, &options, |token| {
                if !json {
                    println!("{token}");
                }
                ControlFlow::Continue(())
            })?;
            if json {
                let line = serde_json::json!({ "tokens": report.tokens, "stats": report.stats });
                println!("{line}");
            }
            Ok(())
        }
        Command::Synth { like, layers, quant, seed, overwrite, out_dir } => {
            let preset: QuantPreset = quant.parse()?;
            let options = SynthOptions { layers, seed, overwrite, progress: true, ..SynthOptions::new(&like, preset) };
            let report = strata_format::synth(&out_dir, &options)?;
            println!(
                "wrote {} (random weights shaped like {like}, {}): dense {}, {} MoE layers of {} per expert, {} in all, in {:.1} s",
                report.out_dir.display(),
                report.preset,
                ByteSize(report.dense_bytes),
                report.num_moe_layers,
                ByteSize(report.expert_record_bytes),
                ByteSize(report.total_bytes),
                report.elapsed.as_secs_f64()
            );
            Ok(())
        }
        Command::Trace { command: TraceCommand::Replay { file, expert_cache } } => replay(&file, expert_cache),
        Command::Export { model_dir, out_hf_dir } => {
            strata_format::export(&model_dir, &out_hf_dir)
                .with_context(|| format!("exporting {}", model_dir.display()))?;
            Ok(())
        }
    }
}

fn open(model_dir: &std::path::Path, run: &RunArgs) -> Result<Engine> {
    let options = EngineOptions {
        threads: run.threads,
        ram_budget: run.ram_budget,
        expert_cache_bytes: run.expert_cache.map(ByteSize::bytes),
        cache_policy: run.cache_policy,
        io: run.io,
        trace_file: run.trace.clone(),
        context_tokens: run.context,
        usage_file: run.usage_file.clone(),
        ..EngineOptions::default()
    };
    let engine = Engine::open(model_dir, &options).with_context(|| format!("opening {}", model_dir.display()))?;
    for warning in engine.warnings() {
        eprintln!("strata: warning: {warning}");
    }
    Ok(engine)
}

fn replay(file: &std::path::Path, expert_cache: ByteSize) -> Result<()> {
    let (header, events) =
        strata_tier::read_trace(file).with_context(|| format!("reading trace {}", file.display()))?;
    let record_bytes = header.record_bytes.max(1);
    let capacity_records = usize::try_from(expert_cache.bytes() / record_bytes).unwrap_or(usize::MAX);
    let report = strata_tier::replay(&header, &events, capacity_records);
    println!("trace {}: {} routing events, cache {} = {} records of {}", file.display(), events.len(), expert_cache, capacity_records, ByteSize(record_bytes));
    println!("policy  hit rate  hits/accesses");
    for (name, rate) in [("lru", report.lru), ("lfru", report.lfru), ("pinned", report.pinned), ("belady", report.belady)] {
        println!("{name:<7} {:>7.2}%  {}/{}", rate.rate * 100.0, rate.hits, rate.accesses);
    }
    Ok(())
}

fn info(model_dir: &std::path::Path, verify: bool) -> Result<()> {
    let container = strata_format::Container::open(model_dir)?;
    if verify {
        container.verify()?;
    }
    let spec = container.spec();
    let manifest = container.manifest();
    let per_expert_bytes = manifest.expert_layers.first().map_or(0, |l| l.record_bytes);
    let expert_bytes: u64 = manifest.expert_layers.iter().map(|l| l.record_bytes * l.num_experts as u64).sum();
    let total_bytes: u64 = manifest.files.iter().map(|f| f.size_bytes).sum();
    let dense_bytes: u64 = manifest.tensors.iter().map(|t| t.length_bytes + t.scale_length_bytes).sum();
    println!("family        {}", spec.family);
    println!("layers        {} ({} MoE)", spec.num_layers, manifest.expert_layers.len());
    println!("hidden        {}", spec.hidden_size);
    println!("heads         {} query, {} kv, head_dim {}", spec.num_heads, spec.num_kv_heads, spec.head_dim);
    println!("experts       {} per MoE layer, top-{}, intermediate {}", spec.moe.num_experts, spec.moe.top_k, spec.moe.intermediate_size);
    println!("vocab         {}", spec.vocab_size);
    println!("quant         {} (q8 group {}, q4 group {})", manifest.quant.preset, manifest.quant.q8_group, manifest.quant.q4_group);
    println!("bytes dense   {} ({})", dense_bytes, ByteSize(dense_bytes));
    println!("bytes/expert  {} ({})", per_expert_bytes, ByteSize(per_expert_bytes));
    println!("bytes experts {} ({})", expert_bytes, ByteSize(expert_bytes));
    println!("bytes total   {} ({})", total_bytes, ByteSize(total_bytes));
    let kv_floats = spec.kv_floats_per_token_per_layer();
    let kv_parts = match (&spec.mla, &spec.dsa) {
        (Some(mla), Some(dsa)) => format!("{} latent + {} index-key", mla.latent_dim(), dsa.index_head_dim),
        (Some(mla), None) => format!("{} latent", mla.latent_dim()),
        (None, _) => format!("{kv_floats} key+value"),
    };
    let (layers, kv_bytes) = (spec.num_layers, spec.num_layers * kv_floats * 4);
    println!("kv bytes/token {kv_bytes} ({kv_parts} f32 per layer x {layers} layers)");
    for file in &manifest.files {
        println!("sha256 {}  {}", file.sha256, file.path);
    }
    if verify {
        println!("verified: every file matches its SHA-256");
    }
    Ok(())
}
