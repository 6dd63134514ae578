//! AFL++ target: `strata_fuzz::kv_session` (see fuzz/README.md).

fn main() {
    // `fuzz_nohook!`: a panic that escapes the parser still aborts (a
    // finding), but one the parser catches on purpose (the tokenizers crate's,
    // in strata_text::Tokenizer) is not turned into an abort first.
    afl::fuzz_nohook!(|data: &[u8]| strata_fuzz::kv_session(data));
}
