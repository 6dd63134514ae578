//! One function per subcommand.

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use strata_engine::{ByteSize, Engine, GenerateOptions, SamplingDefaults};
use strata_format::{ConvertOptions, QuantPreset, SynthOptions};
use strata_hub::{self as hub, ModelName, default_cache_dir, resolve_model};
use strata_text::{TOKENIZER_FILE, TextModel};

use crate::cli::{Cli, Command, RunArgs, TraceCommand, WorkersArgs};

pub fn run(cli: Cli) -> Result<()> {
    let cache_dir = cli.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let allowed = cli.allow_unknown_config.clone();
    let model = |dir: Option<PathBuf>| -> Result<PathBuf> {
        Ok(resolve_model(dir.as_deref(), &cache_dir, std::io::stderr().is_terminal(), &allowed)?.container_dir)
    };
    match cli.command {
        Command::Convert { hf_dir, out_dir, quant, q4_group, overwrite, no_mtp, dequantize_mxfp4 } => {
            let preset: QuantPreset = quant.parse()?;
            let options = ConvertOptions {
                overwrite,
                q4_group,
                drop_mtp: no_mtp,
                dequantize_mxfp4,
                progress: true,
                allow_unknown_config: allowed.clone(),
                ..ConvertOptions::new(preset)
            };
            // Before minutes of conversion: a tokenizer or template that
            // cannot be used would otherwise fail every start of the model.
            strata_text::check_text_files(&hf_dir).with_context(|| format!("converting {}", hf_dir.display()))?;
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
        Command::Info { model_dir, verify } => match model_dir.dir() {
            Some(dir) if is_config_only(&dir) => info_config(&dir),
            dir => info(&model(dir)?, verify),
        },
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "strata", &mut std::io::stdout());
            Ok(())
        }
        Command::Worker { model_dir, listen, shard, key_file, run } => {
            let key = strata_dist::SharedKey::from_file_or_env(key_file.as_deref())?;
            let model_dir = model(model_dir.dir())?;
            let engine = open(&model_dir, &run)?;
            let ready = || eprintln!("strata: worker: shard {shard} of {} on {listen}", model_dir.display());
            Ok(strata_dist::serve(&engine, &listen, shard, &key, ready)?)
        }
        Command::Perplexity { model_dir, text, json, run } => perplexity(&model(model_dir.dir())?, &text, json, &run),
        Command::Logits { model_dir, tokens, out, pass_tokens, run, workers } => {
            let model_dir = model(model_dir.dir())?;
            let mut options = run.options();
            options.prefill_chunk_tokens = pass_tokens.map(|n| n as usize);
            let engine = open_with_workers(&model_dir, options, &workers)?;
            let logits = engine.logits(&tokens.0)?;
            let vocab = engine.core().logits_width();
            strata_format::npy::write_f32(&out, &[tokens.0.len(), vocab], &logits)
                .with_context(|| format!("writing {}", out.display()))?;
            Ok(())
        }
        Command::Generate {
            model_dir,
            tokens,
            prompt: prompt_text,
            max_new_tokens,
            sampling,
            ignore_eos,
            json,
            kv_dir,
            session,
            run,
            workers,
        } => {
            let named = match (kv_dir, session) {
                (Some(kv_dir), Some(name)) => Some((kv_dir, name)),
                (None, None) => None,
                _ => anyhow::bail!("--kv-dir and --session go together: give both or neither"),
            };
            // Checked before the model is opened, and before a new session
            // file would be created for nothing.
            let exists = match &named {
                Some((kv_dir, name)) => strata_engine::session_path(kv_dir, name)?.exists(),
                None => false,
            };
            if tokens.is_none() && prompt_text.is_none() && !exists {
                anyhow::bail!("no tokens and no session to continue (give --tokens or --prompt)");
            }
            let model_dir = model(model_dir.dir())?;
            if prompt_text.is_some() {
                require_tokenizer(&model_dir, "--prompt")?;
            }
            // The same defaults as `chat` and `serve`: generation_config.json
            // next to the tokenizer, which `generate` takes from the container.
            let sampling = sampling.resolve(&SamplingDefaults::from_dir(&model_dir))?;
            let engine = open_with_workers(&model_dir, run.options(), &workers)?;
            let text = prompt_text.as_ref().map(|_| TextModel::load(&engine)).transpose()?;
            let prompt = match (&text, &prompt_text) {
                (Some(text), Some(prompt)) => text.tokenizer.encode(prompt, true)?,
                _ => tokens.map(|t| t.0).unwrap_or_default(),
            };
            let (mut session, opened) = match &named {
                Some((kv_dir, name)) => {
                    let (session, opened) =
                        engine.open_session(kv_dir, name).with_context(|| format!("opening session {name}"))?;
                    if let Some(cut) = &opened.cut {
                        eprintln!("strata: warning: session {name} ({}): torn tail {cut}", opened.path.display());
                    }
                    (session, Some(opened))
                }
                None => (engine.session(), None),
            };
            if prompt.is_empty() && session.tokens().is_empty() {
                anyhow::bail!("no tokens and no session to continue (the session is empty: give --tokens or --prompt)");
            }
            // Up front, not after generating up to the context's end.
            let context = engine.context_tokens();
            let held = session.tokens().len().saturating_add(prompt.len());
            if held.saturating_add(max_new_tokens) > context {
                anyhow::bail!(
                    "the prompt ({held} tokens) and --max-new-tokens {max_new_tokens} do not fit the context of \
                     {context} tokens: give --max-new-tokens {} or less, or a larger --context",
                    context.saturating_sub(held)
                );
            }
            let seed = sampling.options.seed;
            // A greedy run ignores the seed; a sampled one is repeatable
            // only if its seed is known.
            if sampling.seed_drawn && sampling.options.temperature > 0.0 {
                eprintln!("strata: seed {seed} (--seed {seed} repeats this)");
            }
            let options = GenerateOptions {
                max_new_tokens,
                sampling: sampling.options,
                ignore_eos,
                ..GenerateOptions::default()
            };
            let mut detok = text.as_ref().map(|t| t.tokenizer.detokenizer(true));
            let mut stdout = std::io::stdout();
            if let (Some(prompt), false) = (&prompt_text, json) {
                print!("{prompt}");
            }
            let result = session.generate(&prompt, &options, |token| {
                match (&mut detok, json) {
                    (Some(detok), false) => {
                        if let Ok(piece) = detok.push(token) {
                            let _ = stdout.write_all(piece.as_bytes());
                            let _ = stdout.flush();
                        }
                    }
                    (None, false) => println!("{token}"),
                    (_, true) => {}
                }
                ControlFlow::Continue(())
            });
            if let (Some(detok), false) = (&mut detok, json) {
                println!("{}", detok.finish().unwrap_or_default());
            }
            for warning in session.take_warnings() {
                eprintln!("strata: warning: {warning}");
            }
            let report = result?;
            if json {
                let mut stats = serde_json::to_value(&report.stats)?;
                // The engine was opened for this run, so its counters are the run's.
                let store = engine.store_stats();
                stats["mirror_bytes_read"] = store.mirror_bytes_read.into();
                stats["mirror_rates_bytes_per_s"] = store.mirror_rates_bytes_per_s.into();
                stats["activations"] = engine.activations().name().into();
                if let Some(opened) = &opened {
                    // Documented in docs/FORMAT.md, "strata generate --json".
                    stats["session_reopened_tokens"] = opened.reopened_tokens.into();
                    stats["session_cut_bytes"] = opened.cut_bytes().into();
                    stats["session_tokens"] = session.tokens().len().into();
                    stats["session_saved"] = session.is_persisted().into();
                }
                let used = &sampling.options;
                let sampling = serde_json::json!({
                    "temperature": shortest_f64(used.temperature),
                    "top_k": used.top_k,
                    "top_p": shortest_f64(used.top_p),
                });
                let mut line =
                    serde_json::json!({ "tokens": report.tokens, "sampling": sampling, "seed": seed, "stats": stats });
                if let Some(text) = &text {
                    line["text"] = text.tokenizer.decode(&report.tokens, true)?.into();
                }
                println!("{line}");
            }
            Ok(())
        }
        Command::Synth { like, layers, quant, seed, overwrite, ngram_vocab_size_base, out_dir } => {
            let preset: QuantPreset = quant.parse()?;
            let options = SynthOptions {
                layers,
                seed,
                overwrite,
                progress: true,
                ngram_vocab_size_base,
                ..SynthOptions::new(&like, preset)
            };
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
        Command::Trace { command: TraceCommand::Replay { file, expert_cache, learn } } => {
            replay(&file, expert_cache, learn.as_deref())
        }
        Command::Pull { name, endpoint, quant } => pull(&name, endpoint, &quant, &cache_dir, allowed.clone()),
        Command::Models => models(&cache_dir),
        Command::Rm { name } => {
            let removed = hub::remove(&cache_dir, &name)?;
            if let Some(model) = &removed.model {
                println!("removed {} ({}, {})", model.record.repo, model.family, ByteSize(model.size_bytes));
            }
            if removed.partial_bytes > 0 {
                println!("removed a partial download of {} ({})", name.repo, ByteSize(removed.partial_bytes));
            }
            Ok(())
        }
        Command::Mirror { command } => {
            let model_dir = model(command.args().model.clone())?;
            crate::mirror::run(command, &model_dir)
        }
        Command::Export { model_dir, out_hf_dir, overwrite } => {
            let model_dir = model(Some(model_dir))?;
            if overwrite && out_hf_dir.exists() {
                std::fs::remove_dir_all(&out_hf_dir).with_context(|| format!("removing {}", out_hf_dir.display()))?;
            }
            strata_format::export(&model_dir, &out_hf_dir)
                .with_context(|| format!("exporting {}", model_dir.display()))?;
            Ok(())
        }
    }
}

/// `strata pull`: the hub from `--endpoint`, else `HF_ENDPOINT`, and the
/// token from `HF_TOKEN`, the conventions of Hugging Face's own clients.
fn pull(
    name: &ModelName,
    endpoint: Option<String>,
    quant: &str,
    cache_dir: &Path,
    allow_unknown_config: Vec<String>,
) -> Result<()> {
    let preset: QuantPreset = quant.parse()?;
    let non_empty = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    let endpoint = endpoint.or_else(|| non_empty("HF_ENDPOINT")).unwrap_or_else(|| hub::DEFAULT_ENDPOINT.to_owned());
    let options = hub::PullOptions {
        endpoint,
        token: non_empty("HF_TOKEN"),
        progress: std::io::stderr().is_terminal(),
        preset,
        allow_unknown_config,
    };
    let report = hub::pull(name, cache_dir, &options)?;
    let seconds = report.download_time.as_secs_f64();
    let record = &report.model.record;
    println!(
        "pulled {}@{} (commit {}): {} files, {} in {seconds:.1} s ({:.1} MB/s), converted to {} {} in {:.1} s",
        record.repo,
        record.revision,
        &record.commit[..record.commit.len().min(12)],
        report.files,
        ByteSize(report.checkpoint_bytes),
        report.checkpoint_bytes as f64 / 1e6 / seconds.max(1e-9),
        report.model.family,
        report.model.preset,
        report.convert_time.as_secs_f64(),
    );
    println!("run it: strata generate --model {} --prompt \"Hello\"   (or chat --model, serve --model)", record.repo);
    Ok(())
}

/// `strata models`: one line per pulled model.
fn models(cache_dir: &Path) -> Result<()> {
    let models = hub::list(cache_dir)?;
    let partials = hub::partial_downloads(cache_dir)?;
    for partial in &partials {
        eprintln!(
            "{}: a partial download of {} (`strata pull {}` resumes it, `strata rm {}` removes it)",
            partial.repo,
            ByteSize(partial.bytes),
            partial.repo,
            partial.repo
        );
    }
    if models.is_empty() {
        println!("no models pulled into {}; `strata pull ORG/NAME` fetches one", cache_dir.display());
        return Ok(());
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let rows: Vec<[String; 6]> = models
        .iter()
        .map(|m| {
            let commit = &m.record.commit[..m.record.commit.len().min(8)];
            [
                m.record.repo.clone(),
                format!("{} ({commit})", m.record.revision),
                m.family.clone(),
                m.preset.to_string(),
                ByteSize(m.size_bytes).to_string(),
                m.record.last_used_unix_s.map_or_else(|| "never".to_owned(), |t| ago(now.saturating_sub(t))),
            ]
        })
        .collect();
    let header = ["NAME", "REVISION", "FAMILY", "FORMAT", "SIZE", "LAST USED"].map(str::to_owned);
    let widths: Vec<usize> =
        (0..header.len()).map(|i| rows.iter().chain([&header]).map(|r| r[i].len()).max().unwrap_or(0)).collect();
    for row in [&header].into_iter().chain(&rows) {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    }
    Ok(())
}

/// A time in the past as people say it.
fn ago(seconds: u64) -> String {
    match seconds {
        0..60 => "just now".to_owned(),
        60..3600 => format!("{} min ago", seconds / 60),
        3600..86400 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86400),
    }
}

/// Refuses `what` on a model without a tokenizer before the model is
/// opened: opening reads every expert that fits the budget (gigabytes, tens
/// of seconds, for a large model) before the text side would be read.
fn require_tokenizer(model_dir: &Path, what: &str) -> Result<()> {
    if !model_dir.join(TOKENIZER_FILE).exists() {
        anyhow::bail!(
            "{} has no {TOKENIZER_FILE}, which {what} needs: this model takes token ids only (generate --tokens)",
            model_dir.display()
        );
    }
    Ok(())
}

/// Perplexity of `text_file`: teacher-forced in windows of the model's
/// context, each window predicting its own tokens after the first.
fn perplexity(model_dir: &Path, text_file: &Path, json: bool, run: &RunArgs) -> Result<()> {
    require_tokenizer(model_dir, "perplexity")?;
    let engine = open(model_dir, run)?;
    let text_model = TextModel::load(&engine)?;
    let text = std::fs::read_to_string(text_file).with_context(|| format!("reading {}", text_file.display()))?;
    let ids = text_model.tokenizer.encode(&text, false)?;
    if ids.len() < 2 {
        anyhow::bail!("{}: fewer than two tokens of text", text_file.display());
    }
    let window = engine.context_tokens().max(2);
    let vocab = engine.core().logits_width();
    let started = std::time::Instant::now();
    let (mut nll, mut predicted) = (0.0f64, 0usize);
    // The running value per window on a terminal, as llama-perplexity shows
    // it, so a long text is not minutes of silence.
    let progress = std::io::stderr().is_terminal();
    let windows = ids.chunks(window).filter(|c| c.len() >= 2).count();
    for (i, chunk) in ids.chunks(window).filter(|c| c.len() >= 2).enumerate() {
        let logits = engine.logits(chunk)?;
        for (row, &next) in logits.chunks_exact(vocab).zip(&chunk[1..]) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let log_sum = row.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln() + f64::from(max);
            nll += log_sum - f64::from(row[next as usize]);
            predicted += 1;
        }
        if progress {
            eprint!("\rwindow {}/{windows}: perplexity so far {:.3}", i + 1, (nll / predicted as f64).exp());
        }
    }
    if progress {
        eprintln!();
    }
    let seconds = started.elapsed().as_secs_f64();
    let ppl = (nll / predicted as f64).exp();
    let tokens_per_s = ids.len() as f64 / seconds;
    if json {
        let line = serde_json::json!({
            "perplexity": ppl, "mean_nll": nll / predicted as f64, "tokens": ids.len(),
            "predicted_tokens": predicted, "window_tokens": window, "tokens_per_s": tokens_per_s,
            "activations": engine.activations().name(),
        });
        println!("{line}");
    } else {
        println!(
            "perplexity {ppl:.3} over {predicted} predicted tokens ({} tokens, windows of {window}), {tokens_per_s:.0} tokens/s",
            ids.len()
        );
    }
    Ok(())
}

fn open(model_dir: &std::path::Path, run: &RunArgs) -> Result<Engine> {
    open_with(model_dir, &run.options())
}

fn open_with(model_dir: &std::path::Path, options: &strata_engine::EngineOptions) -> Result<Engine> {
    Engine::open(model_dir, options).with_context(|| format!("opening {}", model_dir.display()))
}

/// Opens the model with its routed experts on the workers `workers` names, if any.
fn open_with_workers(
    model_dir: &std::path::Path,
    options: strata_engine::EngineOptions,
    workers: &WorkersArgs,
) -> Result<Engine> {
    workers.open(model_dir, options).with_context(|| format!("opening {}", model_dir.display()))
}

fn replay(file: &std::path::Path, expert_cache: ByteSize, learn: Option<&std::path::Path>) -> Result<()> {
    let (header, events) =
        strata_tier::read_trace(file).with_context(|| format!("reading trace {}", file.display()))?;
    let learned = match learn {
        Some(path) => {
            let (learned_header, learned) =
                strata_tier::read_trace(path).with_context(|| format!("reading trace {}", path.display()))?;
            // Transitions learned on another model would steer this one blind.
            if learned_header.container_hash != header.container_hash
                || learned_header.num_experts != header.num_experts
            {
                anyhow::bail!("{} was recorded on another container than {}", path.display(), file.display());
            }
            learned
        }
        None => Vec::new(),
    };
    let record_bytes = header.record_bytes.max(1);
    let capacity_records = usize::try_from(expert_cache.bytes() / record_bytes).unwrap_or(usize::MAX);
    let report = strata_tier::replay_learned(&header, &events, capacity_records, &learned);
    println!(
        "trace {}: {} routing events, cache {} = {} records of {}",
        file.display(),
        events.len(),
        expert_cache,
        capacity_records,
        ByteSize(record_bytes)
    );
    println!("policy  hit rate  hits/accesses");
    for (name, rate) in report.rows() {
        println!("{name:<7} {:>7.2}%  {}/{}", rate.rate * 100.0, rate.hits, rate.accesses);
    }
    Ok(())
}

/// A folder with a config.json but neither a container nor weights: `info`
/// describes the architecture alone (what a checkpoint of it needs).
fn is_config_only(dir: &Path) -> bool {
    let has = |name: &str| dir.join(name).exists();
    let has_weights = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "safetensors")))
        .unwrap_or(false);
    has("config.json") && !has("manifest.json") && !has_weights
}

fn info_config(dir: &Path) -> Result<()> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let arch =
        strata_format::ModelArch::from_config_json(&text).with_context(|| format!("reading {}", path.display()))?;
    print_architecture(&arch);
    print_checkpoint_bytes(&arch)?;
    print_state(&arch);
    Ok(())
}

/// Bytes of one weight at bf16, the precision models are published in.
const BF16_BYTES: u64 = 2;

/// What a bf16 checkpoint of `arch` holds: its dense tensors, one routed
/// expert's three matrices, and every routed expert's (the sizes a
/// container's `info` gives, before quantization).
fn print_checkpoint_bytes(arch: &strata_format::ModelArch) -> Result<()> {
    let overflow = || anyhow::anyhow!("the config's tensor sizes overflow 64 bits");
    let bytes =
        |shape: &[usize]| shape.iter().try_fold(BF16_BYTES, |n, &d| n.checked_mul(d as u64)).ok_or_else(overflow);
    let (mut dense_bytes, mut ple_bytes) = (0u64, 0u64);
    for tensor in strata_format::names::dense_tensors(arch) {
        let tensor_bytes = bytes(&tensor.shape)?;
        dense_bytes = dense_bytes.checked_add(tensor_bytes).ok_or_else(overflow)?;
        if strata_format::names::is_ple_table(&tensor.name) {
            ple_bytes = ple_bytes.checked_add(tensor_bytes).ok_or_else(overflow)?;
        }
    }
    let mut per_expert_bytes = 0u64;
    for shape in strata_format::names::expert_shapes(arch) {
        per_expert_bytes = per_expert_bytes.checked_add(bytes(&shape)?).ok_or_else(overflow)?;
    }
    let experts = (arch.moe_layers().len() as u64).checked_mul(arch.num_experts() as u64).ok_or_else(overflow)?;
    let expert_bytes = per_expert_bytes.checked_mul(experts).ok_or_else(overflow)?;
    println!("bytes dense   {dense_bytes} ({}) at bf16", ByteSize(dense_bytes));
    println!("bytes/expert  {per_expert_bytes} ({}) at bf16", ByteSize(per_expert_bytes));
    println!("bytes experts {expert_bytes} ({}) at bf16, {experts} experts", ByteSize(expert_bytes));
    print_ple_bytes(ple_bytes, " at bf16");
    Ok(())
}

/// The PLE tables' share of the dense bytes: on disk, read by row (a line
/// only where the model has them).
fn print_ple_bytes(ple_bytes: u64, precision: &str) {
    if ple_bytes > 0 {
        println!("bytes ple     {ple_bytes} ({}){precision}, n-gram tables read by row from disk", ByteSize(ple_bytes));
    }
}

/// The common part, then each distinct kind of layer once with how many
/// layers are of it (a hybrid's 48 layers are two lines).
fn print_architecture(arch: &strata_format::ModelArch) {
    let core = &arch.core;
    let moe_layers = arch.layers.iter().filter(|l| matches!(l.ffn, strata_format::FfnSpec::Moe(_))).count();
    println!("family        {}", core.family);
    println!("layers        {} ({moe_layers} MoE)", arch.layers.len());
    println!("hidden        {}", core.hidden_size);
    println!("vocab         {}", core.vocab_size);
    for (description, count) in counted(arch.layers.iter().map(strata_format::LayerSpec::describe)) {
        println!("{count:>4} x layer {description}");
    }
    if !arch.mtp.is_empty() {
        println!("mtp layers    {} ({})", arch.mtp.len(), arch.mtp_form.describe());
        for (description, count) in counted(arch.mtp.iter().map(strata_format::LayerSpec::describe)) {
            println!("{count:>4} x mtp layer {description}");
        }
    }
}

/// Each distinct item once, in first-seen order, with how many times it
/// came.
fn counted(items: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for item in items {
        match kinds.iter_mut().find(|(known, _)| *known == item) {
            Some((_, count)) => *count += 1,
            None => kinds.push((item, 1)),
        }
    }
    kinds
}

/// What the container's multi-token-prediction layers take (a line only
/// where it keeps them): their dense tensors and their expert records.
fn print_mtp_bytes(arch: &strata_format::ModelArch, manifest: &strata_format::Manifest) {
    if arch.mtp.is_empty() {
        return;
    }
    let stack: std::collections::HashSet<String> =
        strata_format::names::dense_tensors(&arch.clone().without_mtp()).into_iter().map(|d| d.name).collect();
    let tensors: Vec<_> = manifest.tensors.iter().filter(|t| !stack.contains(&t.name)).collect();
    let dense_bytes: u64 = tensors.iter().map(|t| t.length_bytes + t.scale_length_bytes).sum();
    let mtp_experts = manifest.expert_layers.iter().filter(|l| l.layer >= arch.layers.len());
    let expert_bytes: u64 = mtp_experts.map(|l| l.record_bytes * l.num_experts as u64).sum();
    println!(
        "bytes mtp     {} ({}): {} tensors, {} in experts",
        dense_bytes + expert_bytes,
        ByteSize(dense_bytes + expert_bytes),
        tensors.len(),
        ByteSize(expert_bytes)
    );
}

/// What one sequence costs besides the weights: bytes per token of
/// attention cache and, on recurrent layers, fixed state, as the engine's
/// budget counts them.
fn print_state(arch: &strata_format::ModelArch) {
    let footprint = strata_engine::kv_footprint(&arch.layers);
    let rows_layers = arch.layers.iter().filter(|l| l.cache_floats_per_token() > 0).count();
    let kv_bytes = footprint.bytes_per_token;
    println!("kv bytes/token {kv_bytes} ({}) (f32 rows of {rows_layers} layers)", ByteSize(kv_bytes));
    print_state_parts(arch);
    let state_bytes = footprint.state_bytes;
    if state_bytes > 0 {
        let recurrent = arch.layers.iter().filter(|l| l.state_floats() > 0).count();
        println!(
            "state bytes/session {state_bytes} ({}) (f32 state of {recurrent} layers: windows' rings, recurrent and convolution state)",
            ByteSize(state_bytes)
        );
        println!(
            "state budget/session {} (the state, its staged copy and snapshots)",
            ByteSize(footprint.state_bytes_max)
        );
    }
}

/// Each distinct list of state parts a layer keeps (`strata_kv::layout_of`,
/// what session files and the budget count), once with how many layers keep
/// it, e.g. `state parts   4 x rows 128, rows 128`.
fn print_state_parts(arch: &strata_format::ModelArch) {
    let layouts = arch.layers.iter().map(|layer| {
        let parts: Vec<String> = strata_kv::layout_of(layer)
            .parts
            .iter()
            .map(|part| match *part {
                strata_kv::StatePart::Rows { dim } => format!("rows {dim}"),
                strata_kv::StatePart::Ring { dim, window } => format!("ring {dim} of the last {window}"),
                strata_kv::StatePart::Strided { dim, every } => format!("rows {dim} every {every}"),
                strata_kv::StatePart::Fixed { floats } => format!("fixed {floats}"),
                strata_kv::StatePart::Tokens { n } => format!("last {n} token ids"),
            })
            .collect();
        parts.join(", ")
    });
    for (parts, count) in counted(layouts) {
        println!("state parts   {count} x {parts} (f32)");
    }
}

fn info(model_dir: &std::path::Path, verify: bool) -> Result<()> {
    let container = std::sync::Arc::new(strata_format::Container::open(model_dir)?);
    if verify {
        container.verify()?;
    }
    if let Some(notice) = container.missing_checksums_notice() {
        println!("notice: {notice}");
    }
    let arch = container.arch();
    let manifest = container.manifest();
    let per_expert_bytes = manifest.expert_layers.first().map_or(0, |l| l.record_bytes);
    let expert_bytes: u64 = manifest.expert_layers.iter().map(|l| l.record_bytes * l.num_experts as u64).sum();
    let total_bytes: u64 = manifest.files.iter().map(|f| f.size_bytes).sum();
    let dense_bytes: u64 = manifest.tensors.iter().map(|t| t.length_bytes + t.scale_length_bytes).sum();
    print_architecture(arch);
    println!(
        "quant         {} (q8 group {}, q4 group {})",
        manifest.quant.preset, manifest.quant.q8_group, manifest.quant.q4_group
    );
    // Routed experts kept in the checkpoint's own format (MXFP4) rather
    // than the preset's.
    let preset = manifest.quant.preset;
    let kept: std::collections::BTreeSet<String> = arch
        .expert_layers()
        .into_iter()
        .filter_map(|layer| {
            let format = if layer < arch.layers.len() { preset.expert_format() } else { preset.mtp_expert_format() };
            Some((format, container.expert_layout(layer).ok()?))
        })
        .flat_map(|(format, layout)| layout.components.iter().filter(move |c| c.format != format))
        .map(|c| c.format.to_string())
        .collect();
    if !kept.is_empty() {
        println!("experts       {} (as the checkpoint stores them)", kept.into_iter().collect::<Vec<_>>().join(", "));
    }
    println!("bytes dense   {} ({})", dense_bytes, ByteSize(dense_bytes));
    println!("bytes/expert  {} ({})", per_expert_bytes, ByteSize(per_expert_bytes));
    println!("bytes experts {} ({})", expert_bytes, ByteSize(expert_bytes));
    println!("bytes total   {} ({})", total_bytes, ByteSize(total_bytes));
    print_mtp_bytes(arch, manifest);
    let ple_tables = manifest.tensors.iter().filter(|t| strata_format::names::is_ple_table(&t.name));
    print_ple_bytes(ple_tables.map(|t| t.length_bytes + t.scale_length_bytes).sum(), "");
    // Loading checks the template as every binary that chats does (a sample
    // conversation within the render limits).
    match strata_text::ChatTemplate::from_dir(model_dir)? {
        Some(template) => println!("chat template {}", template.path().display()),
        None => println!("chat template none (only plain prompts)"),
    }
    print_state(arch);
    for file in &manifest.files {
        println!("sha256 {}  {}", file.sha256, file.path);
    }
    if verify {
        println!("verified: every file matches its SHA-256");
    }
    Ok(())
}

/// An f32 as the f64 its shortest decimal names, so JSON shows the 0.8
/// given, not the 0.800000011920929 a widening cast gives.
fn shortest_f64(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}
