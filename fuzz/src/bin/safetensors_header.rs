//! AFL++ target: `strata_fuzz::safetensors_header` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::safetensors_header(data));
}
