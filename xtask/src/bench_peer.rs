//! `cargo xtask bench --peer llama.cpp`: the same synthetic model run by
//! llama.cpp, for a ratio against a peer engine.
//!
//! Not implemented yet. The plan (see docs/BENCHMARKS.md and
//! shared/research/peer-llamacpp.md): build llama.cpp from the
//! llama-cpp-python sdist in a venv, export the container to a Hugging Face
//! checkpoint (`strata export`), convert it with the vendored
//! `convert_hf_to_gguf.py` and quantize to Q4_0/Q8_0, then run both engines
//! alternately, resident and under one memory cgroup at 40% of the model.

use anyhow::{Result, bail};

use crate::bench::Options;

pub(crate) fn run(peer: &str, _opts: &Options) -> Result<()> {
    if peer != "llama.cpp" {
        bail!("unknown peer {peer:?} (known: llama.cpp)");
    }
    bail!(
        "--peer llama.cpp is not implemented yet: building llama.cpp from the llama-cpp-python sdist, \
         converting the synthetic model to GGUF and the cgroup runs are still to do (docs/BENCHMARKS.md)"
    )
}
