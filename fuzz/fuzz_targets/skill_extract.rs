#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _expanded = mango_runner::fuzzing::skill_archive(data);
});
