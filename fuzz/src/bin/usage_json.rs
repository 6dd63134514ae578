//! AFL++ target: `strata_fuzz::usage_json` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::usage_json(data));
}
