use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `BetaEnvironment`. Mango runs `self_hosted` Environments only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Environment {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub description: Option<String>,
    pub config: serde_json::Value,
    pub metadata: BTreeMap<String, String>,
    pub scope: Option<String>,
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
    #[serde(with = "serde_ts::option")]
    pub archived_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EnvironmentDeleted {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
}
