//! Criterion bench of KV session persistence: appending one token's rows
//! to a session file (encode, checksum, write), alone and with the fsync of
//! a commit. `cargo bench -p strata-benches --bench kv_append`.
//!
//! Shapes are those of the models Strata targets: Qwen3-30B-A3B's 48 layers
//! of 512-wide keys and values (192 KiB a token) and DeepSeek-V3's 61 layers
//! of 576-wide latents (144 KiB a token).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_kv::{LayerLayout, SequenceState, SessionFile, SessionHeader, StatePart};

/// Tokens a file takes before the bench starts a new one.
const TOKENS_PER_FILE: usize = 128;

/// A cache of `TOKENS_PER_FILE` tokens of made-up rows.
fn filled(mut cache: SequenceState) -> SequenceState {
    cache.reserve(TOKENS_PER_FILE).expect("capacity");
    for layer in 0..cache.n_layers() {
        let parts = cache.layout(layer).parts.clone();
        for (part, width) in parts.iter().enumerate().filter_map(|(i, p)| Some((i, p.row_dim()?))) {
            let rows: Vec<f32> = (0..TOKENS_PER_FILE * width).map(|i| (i as f32 * 0.37).sin()).collect();
            cache.write(layer, part, &rows);
        }
    }
    cache.advance(TOKENS_PER_FILE);
    cache
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("kv_append");
    group.sample_size(20);
    let rows = |dims: &[usize]| LayerLayout::new(dims.iter().map(|&dim| StatePart::Rows { dim }).collect());
    let shapes = [
        // Keys and values.
        ("qwen3-30b-a3b", SequenceState::new(48, rows(&[512, 512]), TOKENS_PER_FILE)),
        // The latent with its rotary key.
        ("deepseek-v3", SequenceState::new(61, rows(&[512 + 64]), TOKENS_PER_FILE)),
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = 0usize;
    for (name, cache) in shapes {
        let cache = filled(cache);
        let header = SessionHeader::for_cache([7; 32], None, &cache, "strata-benches");
        let mut new_file = || {
            files += 1;
            SessionFile::create(&dir.path().join(format!("{files}.kvs")), &header).expect("create")
        };
        group.throughput(Throughput::Bytes(cache.bytes_per_token() as u64));
        for commit in [false, true] {
            let mut file = new_file();
            let mut written = 0;
            let label = if commit { "append + commit (fsync)" } else { "append" };
            group.bench_function(format!("{name} {label}"), |b| {
                b.iter(|| {
                    // Each position needs its own rows in the cache.
                    if written == TOKENS_PER_FILE {
                        file = new_file();
                        written = 0;
                    }
                    file.append(1, true, &cache).expect("append");
                    if commit {
                        file.commit().expect("commit");
                    }
                    written += 1;
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
