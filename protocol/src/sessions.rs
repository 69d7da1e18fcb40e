//! Sessions (the SDK's `BetaManagedAgentsSession`) and the bodies that
//! create one and send it events.

use crate::agents::AgentSnapshot;
use crate::events::Event;
use crate::time::{serde_ts, Timestamp};
use crate::wire_enum;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

wire_enum! {
    /// A Session's status; it starts `idle`.
    pub enum SessionStatus {
        Idle => "idle",
        Running => "running",
        Rescheduling => "rescheduling",
        Terminated => "terminated",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Session {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: SessionObject,
    pub status: SessionStatus,
    pub environment_id: String,
    pub agent: AgentSnapshot,
    pub resources: Vec<SessionResource>,
    pub metadata: BTreeMap<String, String>,
    pub title: Option<String>,
    pub outcome_evaluations: Vec<Value>,
    pub stats: SessionStats,
    pub usage: Map<String, Value>,
    pub vault_ids: Vec<String>,
    pub budget: Option<Value>,
    pub deployment_id: Option<String>,
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

/// The literal `"session"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SessionObject {
    #[default]
    #[serde(rename = "session")]
    Session,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionStats {
    pub active_seconds: Option<f64>,
    pub duration_seconds: Option<f64>,
}

/// What a Session attaches. A repository's `authorization_token` is taken
/// on creation and never stored or echoed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionResource {
    MemoryStore(MemoryStoreResource),
    File(FileResource),
    GithubRepository(RepositoryResource),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryStoreResource {
    pub memory_store_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<MemoryAccess>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MemoryAccess {
    ReadWrite,
    ReadOnly,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileResource {
    pub file_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RepositoryResource {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout: Option<Value>,
    /// Input only: used to clone, never stored or echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_token: Option<String>,
}

// ------------------------------------------------------------------ request and response bodies

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateSession {
    pub agent: AgentRef,
    pub environment_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<SessionResource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Parsed one by one as [`crate::events::SentEvent`]s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<crate::events::SentEvent>>))]
    pub initial_events: Option<Vec<Value>>,
    /// Refused unless empty: Mango has no vaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault_ids: Option<Vec<String>>,
    /// Refused unless null: Mango has no budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Value>,
}

/// `agent`: an Agent id (its latest version), or `{type?, id, version?}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum AgentRef {
    Id(String),
    Version(AgentVersionRef),
}

impl<'de> Deserialize<'de> for AgentRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::strict::string_or_object(
            d,
            "an agent id or {\"id\", \"version\"}",
            AgentRef::Id,
            AgentRef::Version,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentVersionRef {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

/// `POST /v1/sessions/{id}/events`; each event is parsed as a
/// [`crate::events::SentEvent`], so a refusal names its index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SendEvents {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::events::SentEvent>, min_items = 1))]
    pub events: Vec<Value>,
}

/// The answer to [`SendEvents`]: each event as stored (a retried result
/// gets the event that answered first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SentEvents {
    pub data: Vec<Event>,
}

/// A page of Sessions: cursors both ways.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionPage {
    pub data: Vec<Session>,
    pub next_page: Option<String>,
    pub prev_page: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionDeleted {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict;
    use serde_json::json;

    #[test]
    fn create_bodies_take_an_id_or_a_version_and_typed_resources() {
        let body: CreateSession = strict::from_value(json!({
            "agent": {"type": "agent", "id": "agent_1", "version": 2}, "environment_id": "env_1",
            "resources": [{"type": "memory_store", "memory_store_id": "ms_1", "access": "read_only"},
                          {"type": "github_repository", "url": "https://x", "authorization_token": "t"}]
        }))
        .unwrap();
        assert!(matches!(body.agent, AgentRef::Version(ref v) if v.version == Some(2)));
        let body: CreateSession =
            strict::from_value(json!({"agent": "agent_1", "environment_id": "e"})).unwrap();
        assert_eq!(body.agent, AgentRef::Id("agent_1".into()));
        let err = strict::from_value::<CreateSession>(json!({
            "agent": "a", "environment_id": "e", "resources": [{"type": "memory_store", "memory_store_id": "m", "x": 1}]
        }))
        .unwrap_err();
        assert!(err.path.starts_with("resources[0]"), "{err}");
    }
}
