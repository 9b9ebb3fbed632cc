//! Feeds arbitrary bytes to every tensorizer and safetensors parser (coverage-guided; the
//! stable mutation fuzzer in rust/format/fuzz_tests.rs runs the same entry
//! point in CI). Any panic is a bug: the parsers must reject bad input with
//! an error. Crashes found here go to fuzz/regressions/, which `cargo test`
//! replays.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    fastshard::format::fuzzing::exercise(bytes);
});
