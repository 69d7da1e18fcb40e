#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _accepted = mango_api::fuzzing::skill_upload(data);
});
