//! AFL++ target: `strata_fuzz::kv_session` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::kv_session(data));
}
