//! Entry points for the fuzz targets under `fuzz/` and their corpus replay
//! (`tests/fuzz_corpus.rs`). Not for production callers.

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
