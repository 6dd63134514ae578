//! Any bytes as a .npy file: an array or an error, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = strata_format::npy::decode(data);
});
