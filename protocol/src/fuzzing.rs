//! Entry points for the fuzz targets under `fuzz/` and their corpus replay
//! (`tests/fuzz_corpus.rs`). Not for production callers.

use crate::envelope::Envelope;
use crate::events::SentEvent;
use serde_json::Value;

/// One sent event, as `POST /v1/sessions/{id}/events` reads each element:
/// never a panic, and an event it accepts is accepted again, unchanged,
/// once written out (what the api stores is what a client could send).
pub fn sent_event(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(event) = SentEvent::parse(value) else {
        return;
    };
    let written = serde_json::to_value(&event).expect("a parsed event serializes");
    let again = SentEvent::parse(written.clone())
        .unwrap_or_else(|err| panic!("{written} was written but refused: {err:?}"));
    assert_eq!(again, event, "{written} changed on a round trip");
}

/// One envelope line, as a waiting runner reads it: never a panic; an
/// envelope it accepts is accepted again, equal, from its own line; and no
/// refusal quotes the secret it was given.
pub fn envelope(data: &[u8]) {
    match Envelope::parse_line(data) {
        Ok(envelope) => {
            let line = envelope.to_line();
            let again = Envelope::parse_line(line.as_bytes())
                .unwrap_or_else(|err| panic!("a written envelope was refused: {err}"));
            assert_eq!(again, envelope, "an envelope changed on a round trip");
        }
        Err(err) => {
            let secret = serde_json::from_slice::<Value>(data.strip_suffix(b"\n").unwrap_or(data))
                .ok()
                .and_then(|v| v.get("secret")?.as_str().map(str::to_string))
                .filter(|s| s.len() >= 8);
            if let Some(secret) = secret {
                let shown = format!("{err} {err:?}");
                assert!(
                    !shown.contains(&secret),
                    "a refusal quoted the secret: {shown}"
                );
            }
        }
    }
}
