//! Memory Stores (the SDK's `beta.memory_stores`): named containers of text
//! memories at paths, each change kept as an immutable memory version.
//! Shapes follow `anthropic` 2.14.0's `types/beta/memory_stores/`.

use crate::patch::Patch;
use crate::time::{serde_ts, Timestamp};
use crate::wire_enum;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The most a memory's content may hold, in UTF-8 bytes (100 kB).
pub const MAX_CONTENT_BYTES: usize = 102_400;
/// Where Sessions mount their stores by default, and where sandboxes have a
/// writable, empty directory for them.
pub const DEFAULT_MOUNT_ROOT: &str = "/mnt/memory";
/// The file a runner writes at every store root it mounts; never synced.
pub const MARKER_PATH: &str = ".anthropic-memory-store";

/// `BetaManagedAgentsMemoryStore`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryStore {
    /// `memstore_…`
    pub id: String,
    /// Always `memory_store`.
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    /// Empty when unset.
    pub description: String,
    pub metadata: BTreeMap<String, String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub archived_at: Option<Timestamp>,
}

/// `POST /v1/memory_stores`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateMemoryStore {
    /// 1 to 255 characters, no control characters.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 255))]
    pub name: String,
    /// Up to 1,024 characters; rendered into the system prompt of Sessions that attach the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// `POST /v1/memory_stores/{id}`: fields absent (or null) are kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateMemoryStore {
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, min_length = 1, max_length = 255))]
    pub name: Patch<String>,
    /// `""` clears it.
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, max_length = 1024))]
    pub description: Patch<String>,
    /// A patch: a string sets a key, null removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryStoreDeleted {
    pub id: String,
    /// `memory_store_deleted`
    #[serde(rename = "type")]
    pub kind: String,
}

wire_enum! {
    /// Whether a memory or version in a response carries its `content`.
    pub enum MemoryView {
        Basic => "basic",
        Full => "full",
    }
}

/// `BetaManagedAgentsMemory`: a text document at a path of a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Memory {
    /// `mem_…`, stable across renames.
    pub id: String,
    /// Always `memory`.
    #[serde(rename = "type")]
    pub kind: String,
    pub memory_store_id: String,
    /// The version holding the current content (`memver_…`).
    pub memory_version_id: String,
    pub path: String,
    /// Null under `view=basic`.
    pub content: Option<String>,
    /// Lowercase hex SHA-256 of the content's UTF-8 bytes.
    pub content_sha256: String,
    pub content_size_bytes: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
}

/// `BetaManagedAgentsMemoryPrefix`: memories below a list's `depth`, rolled up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryPrefix {
    /// Ends with `/`.
    pub path: String,
}

/// One item of a memory list: a memory, or a prefix rolling up deeper ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MemoryListItem {
    Memory(MemoryItem),
    MemoryPrefix(MemoryPrefix),
}

/// [`Memory`] without its `type` (the list item's tag carries it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryItem {
    pub id: String,
    pub memory_store_id: String,
    pub memory_version_id: String,
    pub path: String,
    pub content: Option<String>,
    pub content_sha256: String,
    pub content_size_bytes: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
}

impl From<Memory> for MemoryItem {
    fn from(m: Memory) -> Self {
        MemoryItem {
            id: m.id,
            memory_store_id: m.memory_store_id,
            memory_version_id: m.memory_version_id,
            path: m.path,
            content: m.content,
            content_sha256: m.content_sha256,
            content_size_bytes: m.content_size_bytes,
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

/// `POST /v1/memory_stores/{id}/memories`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateMemory {
    /// Required; `""` (or null) makes an empty memory. At most 102,400 UTF-8 bytes.
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub content: Patch<String>,
    /// Starts with `/`; 1 to 20 segments; at most 1,024 bytes; NFC.
    pub path: String,
}

/// `POST /v1/memory_stores/{id}/memories/{memory_id}`: fields absent (or null) are kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateMemory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A new path renames the memory; its id stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The update applies only if it holds (else 409 `memory_precondition_failed_error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precondition: Option<MemoryPrecondition>,
}

/// The one precondition kind: the stored content's SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryPrecondition {
    /// `content_sha256`
    #[serde(rename = "type")]
    pub kind: String,
    /// 64 lowercase hexadecimal characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{64}$"))]
    pub content_sha256: Option<String>,
}

impl MemoryPrecondition {
    pub fn content_sha256(sha: &str) -> Self {
        MemoryPrecondition {
            kind: "content_sha256".into(),
            content_sha256: Some(sha.into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryDeleted {
    pub id: String,
    /// `memory_deleted`
    #[serde(rename = "type")]
    pub kind: String,
}

wire_enum! {
    /// What a memory version records.
    pub enum MemoryOperation {
        Created => "created",
        Modified => "modified",
        Deleted => "deleted",
    }
}

/// Who made a change (`BetaManagedAgentsActor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Actor {
    /// A Session's runner, through its sessions token.
    SessionActor {
        session_id: String,
    },
    /// A caller with a Workspace key, named by the key's id.
    ApiActor {
        api_key_id: String,
    },
    UserActor {
        user_id: String,
    },
    ServiceAccountActor {
        service_account_id: String,
    },
}

/// `BetaManagedAgentsMemoryVersion`: one change of a memory, immutable but
/// for redaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryVersion {
    /// `memver_…`
    pub id: String,
    /// Always `memory_version`.
    #[serde(rename = "type")]
    pub kind: String,
    pub memory_id: String,
    pub memory_store_id: String,
    pub operation: MemoryOperation,
    /// Null under `view=basic`, for `deleted`, and once redacted.
    pub content: Option<String>,
    pub content_sha256: Option<String>,
    pub content_size_bytes: Option<i64>,
    /// The memory's path at this write; null once redacted.
    pub path: Option<String>,
    pub created_by: Option<Actor>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub redacted_at: Option<Timestamp>,
    pub redacted_by: Option<Actor>,
}

/// Lowercase hex SHA-256 of `content`'s UTF-8 bytes, as `content_sha256` holds it.
pub fn is_content_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict;
    use serde_json::json;

    #[test]
    fn list_items_are_told_apart_by_type() {
        let items: Vec<MemoryListItem> = serde_json::from_value(json!([
            {"type": "memory_prefix", "path": "/a/"},
            {"type": "memory", "id": "mem_1", "memory_store_id": "memstore_1", "memory_version_id": "memver_1",
             "path": "/b", "content": null, "content_sha256": "0".repeat(64), "content_size_bytes": 0,
             "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z"}
        ]))
        .unwrap();
        assert!(matches!(&items[0], MemoryListItem::MemoryPrefix(p) if p.path == "/a/"));
        assert!(matches!(&items[1], MemoryListItem::Memory(m) if m.path == "/b"));
        assert_eq!(serde_json::to_value(&items[1]).unwrap()["type"], "memory");
    }

    #[test]
    fn create_tells_a_missing_content_from_a_null_one() {
        let body: CreateMemory = strict::from_value(json!({"path": "/a"})).unwrap();
        assert!(body.content.is_absent());
        let body: CreateMemory =
            strict::from_value(json!({"path": "/a", "content": null})).unwrap();
        assert_eq!(body.content, Patch::Null);
        let err = strict::from_value::<UpdateMemory>(
            json!({"precondition": {"type": "content_sha256", "x": 1}}),
        )
        .unwrap_err();
        assert_eq!(err.path, "precondition.x");
    }

    #[test]
    fn digests_are_64_lowercase_hex() {
        assert!(is_content_sha256(&"a".repeat(64)));
        assert!(!is_content_sha256(&"A".repeat(64)));
        assert!(!is_content_sha256(&"a".repeat(63)));
        assert!(!is_content_sha256(&"g".repeat(64)));
    }
}
