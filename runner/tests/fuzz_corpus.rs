//! The fuzz targets' seed corpora (fuzz/corpus/), replayed on the stable
//! toolchain: every seed, and every crash kept as one, runs through the
//! same entry point its fuzz target calls, without a panic.

/// Every seed of one fuzz target (fuzz/corpus/<target>/), which must have some.
fn corpus(target: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            (path, bytes)
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{} holds no seed", dir.display());
    seeds
}

/// Feeds every seed to `target`; a panic names the seed.
fn replay(target: &str, run: impl Fn(&[u8])) {
    for (path, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&bytes)));
        assert!(outcome.is_ok(), "{} panicked", path.display());
    }
}

#[test]
fn work_secret_seeds_decode_without_panic() {
    replay("work_secret", |data| {
        mango_runner::fuzzing::work_secret(data, mango_api::ids::encode_work_secret)
    });
}

#[test]
fn pty_marker_seeds_frame_without_panic() {
    replay("pty_marker", mango_runner::fuzzing::pty_marker);
}

#[test]
fn skill_extract_seeds_expand_without_panic() {
    replay("skill_extract", |data| {
        mango_runner::fuzzing::skill_archive(data);
    });
}

/// The seeds reach both sides: the valid archives expand (the runner only
/// expands: a missing SKILL.md or two top-level directories were the api's
/// to refuse at upload), the hostile and over-budget ones are refused.
#[test]
fn skill_extract_seeds_hold_valid_and_hostile_archives() {
    for (path, bytes) in corpus("skill_extract") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let expected = name.starts_with("valid");
        assert_eq!(
            mango_runner::fuzzing::skill_archive(&bytes),
            expected,
            "{name}"
        );
    }
}
