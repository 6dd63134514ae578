//! AFL++ target: `strata_fuzz::manifest` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::manifest(data));
}
