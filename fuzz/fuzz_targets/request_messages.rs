#![no_main]
use perpetuity::proxy::wire::Format;
libfuzzer_sys::fuzz_target!(|data: &[u8]| perpetuity_fuzz::request(Format::Messages, data));
