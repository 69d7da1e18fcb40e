#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _accepted = mango_api::fuzzing::request_body(data);
});
