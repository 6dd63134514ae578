//! AFL++ target: `strata_fuzz::npy` (see fuzz/README.md).

fn main() {
    afl::fuzz!(|data: &[u8]| strata_fuzz::npy(data));
}
