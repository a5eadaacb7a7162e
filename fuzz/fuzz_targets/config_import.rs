#![no_main]
#[path = "../../codegen/families/tests/fuzz_support/pipeline.rs"]
mod pipeline;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    pipeline::config_import(data);
});
