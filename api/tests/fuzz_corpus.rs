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
fn request_body_seeds_parse_without_panic() {
    replay("request_body", |data| {
        mango_api::fuzzing::request_body(data);
    });
}

/// The corpus reaches every body type: the first byte of some seed picks each.
#[test]
fn request_body_seeds_cover_every_body_type() {
    let count = mango_api::fuzzing::REQUEST_BODIES.len();
    let mut picked = vec![false; count];
    for (_, bytes) in corpus("request_body") {
        if let Some(&first) = bytes.first() {
            picked[usize::from(first) % count] = true;
        }
    }
    let missing: Vec<_> = mango_api::fuzzing::REQUEST_BODIES
        .iter()
        .zip(&picked)
        .filter(|(_, seen)| !**seen)
        .map(|(name, _)| *name)
        .collect();
    assert!(missing.is_empty(), "no seed for {missing:?}");
}

#[test]
fn skill_upload_seeds_build_without_panic() {
    replay("skill_upload", |data| {
        mango_api::fuzzing::skill_upload(data);
    });
}

/// The seeds reach the round trip: each body type's valid seed (`NN_name`)
/// is accepted and its unknown-field twin refused, and the valid Skill
/// archives build while the hostile ones do not.
#[test]
fn seeds_hold_valid_and_near_valid_inputs() {
    let mut checked = 0;
    for (path, bytes) in corpus("request_body") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let accepted = mango_api::fuzzing::request_body(&bytes);
        if name.ends_with("_unknown_field") {
            assert!(!accepted, "{name} was accepted");
        } else if name.len() > 3
            && !name.contains("nul")
            && !name.contains("not_object")
            && !name.contains("wrong_type")
            && !name.contains("invalid_json")
            && !name.contains("deep")
        {
            assert!(accepted, "{name} was refused");
            checked += 1;
        }
    }
    assert!(checked >= mango_api::fuzzing::REQUEST_BODIES.len());
    for (path, bytes) in corpus("skill_upload") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let valid = name.starts_with("valid");
        assert_eq!(mango_api::fuzzing::skill_upload(&bytes), valid, "{name}");
    }
}
