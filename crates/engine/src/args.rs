//! The engine's command-line flags, shared by every binary that runs a
//! model (`strata`, `chat`, `serve`), so each flag is defined once.

use std::path::PathBuf;

use clap::Args;
use strata_tier::{ByteSize, IoBackend, MirrorSpec, PolicyKind, RamBudget};

use crate::{
    ActivationPrecision, DRAFT_TOKENS_DEFAULT, DeviceKind, EngineOptions, Prefetch, SamplingDefaults, SamplingOptions,
    SpeculateMode, VramBudget,
};

/// Flags of every command that runs a model.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// The one memory budget for dense weights, expert cache, KV and I/O
    /// buffers: a size (e.g. 6GiB) or `auto` (75% of MemAvailable).
    #[arg(long, default_value = "auto")]
    pub ram_budget: RamBudget,
    /// A further cap on the RAM holding routed experts, e.g. 16KiB, 512MiB.
    #[arg(long)]
    pub expert_cache: Option<ByteSize>,
    /// Expert cache replacement policy: predict (learned routing
    /// transitions; measures best on real traces), lru, lfru or pinned.
    #[arg(long, default_value = "predict")]
    pub cache_policy: PolicyKind,
    /// How experts are read: auto (pread), pread, direct (O_DIRECT), uring
    /// (io_uring) or mmap (copied out of a mapping).
    #[arg(long, default_value = "auto")]
    pub io: IoBackend,
    /// Kernel worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// The most tokens a session may hold; its KV arena comes out of the
    /// budget (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// Record every routing decision (layer, token, experts) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Where learned expert usage is kept (default: usage.json in the model directory).
    #[arg(long)]
    pub usage_file: Option<PathBuf>,
    /// A copy of some or all expert files on another drive, staged by
    /// `strata mirror stage`; RATE (e.g. 3GB, per second) weighs its share
    /// of reads, measured at open if not given. Repeatable.
    #[arg(long = "mirror", value_name = "DIR[=RATE]")]
    pub mirrors: Vec<MirrorSpec>,
    /// Read the next layer's predicted experts while a layer computes: on,
    /// off, or auto (on when the expert cache cannot hold every expert).
    /// Off by default: it measured faster on the demo model's real routes
    /// but slower on a random-weight streaming model (docs/BENCHMARKS.md).
    #[arg(long, default_value = "off")]
    pub prefetch: Prefetch,
    /// How q8/q4 products quantize their inputs: exact (int16, within the
    /// tolerance q8/q4 models are tested to) or q8 (int8 as llama.cpp
    /// computes it: faster, but LOSSY, the tokens differ).
    #[arg(long, default_value = "exact")]
    pub activations: ActivationPrecision,
    /// Where the model's products run: cpu, or gpu (the first GPU
    /// adapter, Vulkan, Metal or DX12; a build with `--features gpu`): the
    /// q8/q4 matrices its kernels take, computed bit for bit as on the CPU;
    /// what it does not run stays on the CPU, as said at start; or cuda[:N]
    /// (an NVIDIA GPU through CUDA, a build with `--features cuda`; the
    /// same, its kernels compiled by NVRTC at start).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceKind,
    /// The most GPU memory the model's matrices may take with `--device
    /// gpu` or `cuda`, the dense part first and routed experts in what it
    /// leaves: a size (e.g. 8GiB) or auto (gpu: every matrix its kernels
    /// take; cuda: the free memory less a reserve).
    #[arg(long, default_value = "auto")]
    pub vram_budget: VramBudget,
    /// Speculative decoding with the model's own MTP layer (where it has
    /// one): on, off, or auto (drafts while it measures faster than plain
    /// steps, greedy decoding only). Greedy tokens are plain decoding's;
    /// sampled ones keep its distribution.
    #[arg(long, default_value = "auto")]
    pub speculate: SpeculateMode,
    /// Tokens the MTP layer drafts ahead per verify pass.
    #[arg(long, default_value_t = DRAFT_TOKENS_DEFAULT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub draft_tokens: usize,
}

impl EngineArgs {
    /// The engine options these flags ask for.
    pub fn options(&self) -> EngineOptions {
        EngineOptions {
            threads: self.threads,
            ram_budget: self.ram_budget,
            expert_cache_bytes: self.expert_cache.map(ByteSize::bytes),
            cache_policy: self.cache_policy,
            io: self.io,
            context_tokens: self.context,
            trace_file: self.trace.clone(),
            usage_file: self.usage_file.clone(),
            mirrors: self.mirrors.clone(),
            prefetch: self.prefetch,
            activations: self.activations,
            device: self.device.request(self.vram_budget),
            speculate: self.speculate,
            draft_tokens: self.draft_tokens,
            ..EngineOptions::default()
        }
    }
}

/// Sampling flags of every command that generates, so `strata generate`
/// and `chat` sample alike from the same flags (as `serve` does per request).
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// 0 means greedy (default: the model's generation_config.json, else 1).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the K most likely tokens, 0 meaning all (default: the
    /// model's generation_config.json, else 0).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Keep the fewest tokens whose probability reaches P (default: the
    /// model's generation_config.json, else 1).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Sampling seed (default: a random one, printed so the run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// The sampling a run uses, and whether its seed was drawn at random (and
/// so must be printed for the run to be repeatable).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResolvedSampling {
    pub options: SamplingOptions,
    pub seed_drawn: bool,
}

impl SamplingArgs {
    /// These flags over the model's defaults, checked: a flag not given
    /// takes the default, a seed not given is drawn at random.
    pub fn resolve(&self, defaults: &SamplingDefaults) -> crate::Result<ResolvedSampling> {
        let options = SamplingOptions {
            temperature: self.temperature.unwrap_or(defaults.temperature as f32),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p as f32),
            seed: self.seed.unwrap_or_else(rand::random),
        };
        options.check()?;
        Ok(ResolvedSampling { options, seed_drawn: self.seed.is_none() })
    }
}

/// An error and its causes as one line, each said once. The library errors
/// put their cause in their own message (so that they read whole shown
/// alone) and give it as `source()` too, which anyhow's `{:#}` would then
/// print a second time.
pub fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: SamplingDefaults = SamplingDefaults { temperature: 0.8, top_p: 0.95, top_k: 40 };

    #[test]
    fn sampling_flags_not_given_take_the_models_defaults_and_a_drawn_seed() {
        let args = SamplingArgs { temperature: None, top_k: None, top_p: None, seed: None };
        let resolved = args.resolve(&DEFAULTS).unwrap();
        assert_eq!((resolved.options.temperature, resolved.options.top_k, resolved.options.top_p), (0.8, 40, 0.95));
        assert!(resolved.seed_drawn);
    }

    #[test]
    fn sampling_flags_given_override_the_defaults_and_a_given_seed_is_not_drawn() {
        let args = SamplingArgs { temperature: Some(0.0), top_k: Some(0), top_p: Some(1.0), seed: Some(7) };
        let resolved = args.resolve(&DEFAULTS).unwrap();
        assert_eq!(resolved.options, SamplingOptions { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 7 });
        assert!(!resolved.seed_drawn);
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    fn engine_options(flags: &[&str]) -> Result<EngineOptions, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("strata").chain(flags.iter().copied())).map(|cli| cli.engine.options())
    }

    #[test]
    fn int8_activations_are_on_only_when_the_flag_asks() {
        assert_eq!(engine_options(&[]).unwrap().activations, ActivationPrecision::Int16);
        assert_eq!(engine_options(&["--activations", "exact"]).unwrap().activations, ActivationPrecision::Int16);
        assert_eq!(engine_options(&["--activations", "q8"]).unwrap().activations, ActivationPrecision::Int8);
        assert!(engine_options(&["--activations", "int8"]).is_err());
    }

    #[test]
    fn sampling_flags_out_of_range_are_refused_up_front() {
        let args = SamplingArgs { temperature: None, top_k: None, top_p: Some(1.5), seed: None };
        assert!(args.resolve(&DEFAULTS).is_err());
    }
}
