//! AFL++ target: `strata_fuzz::trace` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::trace(data));
}
