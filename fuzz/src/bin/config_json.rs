//! AFL++ target: `strata_fuzz::config_json` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::config_json(data));
}
