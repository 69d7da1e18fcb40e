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
fn sent_event_seeds_parse_without_panic() {
    replay("sent_event", mango_protocol::fuzzing::sent_event);
}

/// The seeds reach the round trip: the valid ones parse, the near-valid
/// ones are refused (else the replay would only ever test refusals).
#[test]
fn sent_event_seeds_hold_valid_and_near_valid_events() {
    use mango_protocol::events::SentEvent;
    let parses = |target: &str| {
        let (_, bytes) = corpus("sent_event")
            .into_iter()
            .find(|(path, _)| path.file_name().is_some_and(|n| n == target))
            .unwrap_or_else(|| panic!("no seed {target}"));
        SentEvent::parse(serde_json::from_slice(&bytes).expect("a JSON seed")).is_ok()
    };
    for valid in ["user_message", "user_interrupt", "tool_result"] {
        assert!(parses(valid), "{valid} was refused");
    }
    for near in [
        "unknown_field",
        "server_type",
        "routed_thread",
        "type_not_string",
    ] {
        assert!(!parses(near), "{near} was accepted");
    }
}

#[test]
fn envelope_seeds_parse_without_panic() {
    replay("envelope", mango_protocol::fuzzing::envelope);
}

/// The seeds reach both sides: the good lines parse, the bad ones are refused.
#[test]
fn envelope_seeds_hold_good_and_bad_lines() {
    use mango_protocol::envelope::Envelope;
    for (path, bytes) in corpus("envelope") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let good = matches!(name.as_str(), "session" | "healthcheck");
        assert_eq!(Envelope::parse_line(&bytes).is_ok(), good, "{name}");
    }
}
