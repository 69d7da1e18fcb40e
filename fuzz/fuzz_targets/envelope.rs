#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mango_protocol::fuzzing::envelope(data);
});
