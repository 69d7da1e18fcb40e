use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The literal that claims a lease on the first heartbeat.
pub const NO_HEARTBEAT: &str = "NO_HEARTBEAT";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkState {
    Queued,
    Starting,
    Active,
    Stopping,
    Stopped,
}

impl WorkState {
    pub const ALL: [WorkState; 5] = [
        WorkState::Queued,
        WorkState::Starting,
        WorkState::Active,
        WorkState::Stopping,
        WorkState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Queued => "queued",
            WorkState::Starting => "starting",
            WorkState::Active => "active",
            WorkState::Stopping => "stopping",
            WorkState::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// What a Work item is for: a Session activation or an Environment healthcheck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkData {
    Session { id: String },
    Healthcheck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Succeeded => "succeeded",
            CheckStatus::Failed => "failed",
            CheckStatus::TimedOut => "timed_out",
            CheckStatus::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Succeeded,
            Self::Failed,
            Self::TimedOut,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub status: CheckStatus,
    pub message: String,
}

/// `BetaSelfHostedWork`, plus Mango's healthcheck fields.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Work {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub environment_id: String,
    pub data: WorkData,
    pub metadata: BTreeMap<String, String>,
    pub state: WorkState,
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[serde(with = "serde_ts::option")]
    pub acknowledged_at: Option<Timestamp>,
    #[serde(with = "serde_ts::option")]
    pub started_at: Option<Timestamp>,
    #[serde(with = "serde_ts::option")]
    pub latest_heartbeat_at: Option<Timestamp>,
    #[serde(with = "serde_ts::option")]
    pub stop_requested_at: Option<Timestamp>,
    #[serde(with = "serde_ts::option")]
    pub stopped_at: Option<Timestamp>,
    /// Only a Poll response carries it.
    pub secret: Option<String>,
    #[serde(with = "serde_ts::option")]
    pub expires_at: Option<Timestamp>,
    pub result: Option<CheckResult>,
}

/// The decoded Work secret: URL-safe base64 (no padding) of this JSON.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkSecret {
    pub sessions_token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeartbeatResponse {
    #[serde(rename = "type")]
    pub kind: String,
    /// The exact string to echo next time; `""` before the first heartbeat.
    pub last_heartbeat: String,
    pub lease_extended: bool,
    pub state: WorkState,
    pub ttl_seconds: i64,
}

/// `details.current_state` of a 412 `heartbeat_precondition_failed`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseStateBody {
    pub last_heartbeat: Option<String>,
    pub lease_extended: bool,
    pub state: WorkState,
    pub ttl_seconds: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QueueStats {
    #[serde(rename = "type")]
    pub kind: String,
    pub depth: i64,
    pub pending: i64,
    #[serde(with = "serde_ts::option")]
    pub oldest_queued_at: Option<Timestamp>,
    pub workers_polling: Option<i64>,
}
