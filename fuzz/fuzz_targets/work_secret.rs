#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mango_runner::fuzzing::work_secret(data, mango_api::ids::encode_work_secret);
});
