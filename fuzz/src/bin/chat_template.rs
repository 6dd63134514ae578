//! AFL++ target: `strata_fuzz::chat_template` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::chat_template(data));
}
