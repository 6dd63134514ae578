//! AFL++ target: `strata_fuzz::tokenizer_json` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::tokenizer_json(data));
}
