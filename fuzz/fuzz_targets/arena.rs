#![no_main]
libfuzzer_sys::fuzz_target!(init: perpetuity_fuzz::arena_init(), |data: &[u8]| perpetuity_fuzz::arena(data));
