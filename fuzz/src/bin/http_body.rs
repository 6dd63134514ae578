//! AFL++ target: `strata_fuzz::http_body` (see fuzz/README.md).

fn main() {
    // `fuzz_nohook!`: see chat_template.rs (a caught template panic is not a finding).
    afl::fuzz_nohook!(|data: &[u8]| strata_fuzz::http_body(data));
}
