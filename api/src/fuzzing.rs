//! Entry points for the fuzz targets under `fuzz/` and their corpus replay
//! (`tests/fuzz_corpus.rs`). Not for production callers.

use crate::extract::{body, optional_body};
use crate::skills::archive::{build, UploadedFile};
use mango_protocol::agents::{CreateAgent, UpdateAgent};
use mango_protocol::memory::{CreateMemory, CreateMemoryStore, UpdateMemory, UpdateMemoryStore};
use mango_protocol::sessions::{CreateSession, SendEvents};
use mango_protocol::{
    CreateEnvironment, CreateWork, FailWork, HeartbeatParams, StopWork, UpdateEnvironment,
    UpdateWork, WorkResult,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Every request body the api parses strictly, in the order the first byte
/// of a fuzz input picks them (modulo their number).
pub const REQUEST_BODIES: &[&str] = &[
    "CreateEnvironment",
    "UpdateEnvironment",
    "CreateMemoryStore",
    "UpdateMemoryStore",
    "CreateMemory",
    "UpdateMemory",
    "CreateSession",
    "SendEvents",
    "CreateWork",
    "UpdateWork",
    "HeartbeatParams",
    "StopWork",
    "WorkResult",
    "FailWork",
    "CreateAgent",
    "UpdateAgent",
];

/// A request body: the first byte picks the body type, the rest is the
/// body. Never a panic, and a body accepted is accepted again once written
/// out (the strict parser and the wire type agree). True when accepted.
pub fn request_body(data: &[u8]) -> bool {
    let Some((&pick, bytes)) = data.split_first() else {
        return false;
    };
    match usize::from(pick) % REQUEST_BODIES.len() {
        0 => required::<CreateEnvironment>(bytes),
        1 => optional::<UpdateEnvironment>(bytes),
        2 => required::<CreateMemoryStore>(bytes),
        3 => optional::<UpdateMemoryStore>(bytes),
        4 => required::<CreateMemory>(bytes),
        5 => optional::<UpdateMemory>(bytes),
        6 => required::<CreateSession>(bytes),
        7 => required::<SendEvents>(bytes),
        8 => required::<CreateWork>(bytes),
        9 => required::<UpdateWork>(bytes),
        10 => optional::<HeartbeatParams>(bytes),
        11 => optional::<StopWork>(bytes),
        12 => required::<WorkResult>(bytes),
        13 => required::<FailWork>(bytes),
        14 => required::<CreateAgent>(bytes),
        _ => optional::<UpdateAgent>(bytes),
    }
}

fn required<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> bool {
    body::<T>(bytes)
        .map(|parsed| round_trip(&parsed, body::<T>))
        .is_ok()
}

fn optional<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> bool {
    optional_body::<T>(bytes)
        .map(|parsed| round_trip(&parsed, optional_body::<T>))
        .is_ok()
}

fn round_trip<T: Serialize>(parsed: &T, parse: fn(&[u8]) -> crate::error::ApiResult<T>) {
    let written = serde_json::to_vec(parsed).expect("a parsed body serializes");
    let again = parse(&written).unwrap_or_else(|err| {
        panic!(
            "{} was written but refused: {err:?}",
            String::from_utf8_lossy(&written)
        )
    });
    assert_eq!(
        serde_json::to_vec(&again).expect("serializes"),
        written,
        "a body changed on a round trip"
    );
}

/// A Skill upload of one zip archive: never a panic, and an archive Mango
/// built is accepted again and rebuilt to the same bytes. True when accepted.
pub fn skill_upload(data: &[u8]) -> bool {
    let upload = |bytes: &[u8]| {
        build(vec![UploadedFile {
            filename: "skill.zip".into(),
            bytes: bytes::Bytes::copy_from_slice(bytes),
        }])
    };
    let Ok(built) = upload(data) else {
        return false;
    };
    let rebuilt =
        upload(&built.archive).unwrap_or_else(|err| panic!("a built archive was refused: {err:?}"));
    assert_eq!(rebuilt.sha256, built.sha256, "a rebuilt archive differs");
    assert_eq!(rebuilt.name, built.name);
    assert_eq!(rebuilt.file_count, built.file_count);
    true
}
