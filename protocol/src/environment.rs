use crate::patch::Patch;
use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `BetaEnvironment`. Mango runs `self_hosted` Environments only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Environment {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub description: Option<String>,
    pub config: serde_json::Value,
    pub metadata: BTreeMap<String, String>,
    pub scope: Option<String>,
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvironmentDeleted {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `config`: Mango runs `self_hosted` Environments only; which other types
/// exist, and what to answer for them, is the api's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvironmentConfig {
    #[serde(rename = "type")]
    pub kind: String,
    /// The other fields of its type (a `self_hosted` config has none).
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

crate::wire_enum! {
    pub enum Scope {
        Organization => "organization",
        Account => "account",
    }
}

/// `POST /v1/environments`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateEnvironment {
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<EnvironmentConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

/// `POST /v1/environments/{id}`: fields absent are kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateEnvironment {
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, min_length = 1))]
    pub name: Patch<String>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub description: Patch<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<EnvironmentConfig>,
    /// A patch: a string sets, null or "" deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Patch::is_absent")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Scope>))]
    pub scope: Patch<Scope>,
}
