#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| perpetuity_fuzz::dictionary_table(data));
