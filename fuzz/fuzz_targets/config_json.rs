//! Any bytes as config.json: a spec or an error, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = strata_format::ModelSpec::from_config_json(text);
    }
});
