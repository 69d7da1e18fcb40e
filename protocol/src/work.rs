use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The literal that claims a lease on the first heartbeat.
pub const NO_HEARTBEAT: &str = "NO_HEARTBEAT";

/// A string enum of the wire (and of the store's text columns): its names
/// are its serde names, listed once in [`wire_enum!`].
pub trait WireEnum: Copy + Sized + 'static {
    const ALL: &'static [Self];
    fn as_str(self) -> &'static str;
    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == s)
    }
}

/// Defines a string enum with its wire names, serde, [`WireEnum`] and
/// `TryFrom<String>` (what the store decodes its columns with).
#[macro_export]
macro_rules! wire_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[doc = $doc:literal])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $($(#[doc = $doc])* #[serde(rename = $text)] $variant,)*
        }

        impl $crate::work::WireEnum for $name {
            const ALL: &'static [Self] = &[$($name::$variant,)*];
            fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                <Self as $crate::work::WireEnum>::as_str(self)
            }
            pub fn parse(s: &str) -> Option<Self> {
                <Self as $crate::work::WireEnum>::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                Self::parse(&s).ok_or_else(|| format!("{s:?} is not a {}", stringify!($name)))
            }
        }

        /// A string of its wire names. (Written out, not derived: the derive
        /// cannot read a `serde(rename)` whose name is a macro argument.)
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some(
                        <Self as $crate::work::WireEnum>::ALL.iter().map(|v| v.as_str()),
                    ))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum! {
    /// A Work item's state: `queued → starting → active → stopping → stopped`.
    pub enum WorkState {
        Queued => "queued",
        Starting => "starting",
        Active => "active",
        Stopping => "stopping",
        Stopped => "stopped",
    }
}

wire_enum! {
    /// What a Work item is for (`data.type`, `MANGO_WORK_TYPE`).
    pub enum WorkType {
        Session => "session",
        Healthcheck => "healthcheck",
    }
}

/// What a Work item is for: a Session activation or an Environment healthcheck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkData {
    Session { id: String },
    Healthcheck,
}

impl WorkData {
    pub fn work_type(&self) -> WorkType {
        match self {
            WorkData::Session { .. } => WorkType::Session,
            WorkData::Healthcheck => WorkType::Healthcheck,
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        match self {
            WorkData::Session { id } => Some(id),
            WorkData::Healthcheck => None,
        }
    }
}

wire_enum! {
    /// A healthcheck's terminal result.
    pub enum CheckStatus {
        Succeeded => "succeeded",
        Failed => "failed",
        TimedOut => "timed_out",
        Cancelled => "cancelled",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckResult {
    pub status: CheckStatus,
    pub message: String,
}

/// `BetaSelfHostedWork`, plus Mango's healthcheck fields.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Work {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub environment_id: String,
    pub data: WorkData,
    pub metadata: BTreeMap<String, String>,
    pub state: WorkState,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub acknowledged_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub started_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub latest_heartbeat_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub stop_requested_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub stopped_at: Option<Timestamp>,
    /// Only a Poll response carries it.
    pub secret: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub expires_at: Option<Timestamp>,
    pub result: Option<CheckResult>,
    /// Mango's extension, in Poll responses only: the number of the claim
    /// this Poll made (1 for the first, one more per reclaim). A supervisor
    /// names its sandbox from the Work id and this, so a second create for
    /// the same claim conflicts. The SDKs ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<i64>,
    /// Mango's extension, on Workspace-key reads only (Create, Get, List,
    /// Update): who holds the item and how long its lease has left. The
    /// SDKs ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<WorkLease>,
}

/// Who claimed a Work item and how long its lease has left, for operators
/// (Mango's extension, in `Work.lease`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkLease {
    /// The number of the item's current or last claim: 0 while nobody has
    /// claimed it, one more per reclaim (the number Poll answered).
    pub claim: i64,
    /// The worker id that claim's poller sent (`Anthropic-Worker-ID` or
    /// `worker_id`); null when it sent none or nobody claimed the item.
    pub worker_id: Option<String>,
    /// When the lease runs out unless heartbeats extend it; null while no
    /// lease runs (queued, a claim not yet acknowledged, stopped).
    #[serde(with = "serde_ts::option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub expires_at: Option<Timestamp>,
    /// Milliseconds left until `expires_at` by the api's clock when it
    /// answered (0 once it has passed); null with `expires_at`. Clients show
    /// this rather than subtract their own clock.
    pub remaining_ms: Option<i64>,
}

/// Mango's extension for supervisors (`GET …/work/claims`, Environment
/// key): where the items this key claimed stand, so a supervisor can
/// remove a sandbox whose Work stopped or was reclaimed by someone else.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkClaims {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: Vec<ClaimState>,
}

/// One item a key claimed: its state now and its current claim's number.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimState {
    pub id: String,
    pub state: WorkState,
    pub claim: i64,
    #[serde(with = "serde_ts::option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub stop_requested_at: Option<Timestamp>,
    /// The claim no longer holds the item: its lease ran out (or, before
    /// Ack, the pending claim lapsed), so any Poll may take it now. The
    /// runner of this claim has lost its lease and its sandbox should go.
    #[serde(default)]
    pub lease_lost: bool,
    /// The item stopped at its runner's idle end (its holder's `idle`
    /// Stop, with nobody asking to stop it before): its sandbox may be kept
    /// for the Session's next activation. False for every other end — an
    /// operator's Stop, a Fail, a lost lease, a Result — and while it runs.
    #[serde(default)]
    pub keepable: bool,
}

/// Mango's extension for supervisors (`GET …/sessions/deleted`,
/// Environment key): which of the Session ids asked about name no Session
/// of the Environment any more, so their workspaces (volumes, PVCs) can go.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeletedSessions {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: Vec<String>,
}

/// The decoded Work secret: URL-safe base64 (no padding) of this JSON.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkSecret {
    pub sessions_token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    #[serde(rename = "type")]
    pub kind: String,
    pub depth: i64,
    pub pending: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(with = "serde_ts::option")]
    pub oldest_queued_at: Option<Timestamp>,
    pub workers_polling: Option<i64>,
}

// ------------------------------------------------------------------ request bodies

/// `POST /v1/environments/{id}/work`: healthchecks only (Session Work is
/// created by Session admission).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateWork {
    pub data: WorkData,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `POST /v1/environments/{id}/work/{work_id}`: a metadata patch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateWork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `…/heartbeat`'s JSON body; the SDK sends the same fields as query parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_last_heartbeat: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_ttl_seconds: Option<i64>,
}

/// `…/stop`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StopWork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    /// Mango's extension, the holder's only: `idle` says its Session's
    /// activation ended idle, so its sandbox may be kept for the Session's
    /// next activation (spec §7.1). Needs `force: true` and the Work's
    /// sessions token; the SDKs never send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<WorkStopReason>,
}

wire_enum! {
    /// Why a holder stops its Work (`…/stop`'s `reason`).
    pub enum WorkStopReason {
        /// The Session's activation ended idle (the runner's idle end
        /// after an end-of-turn), not stopped, failed or lost.
        Idle => "idle",
    }
}

wire_enum! {
    /// What a healthcheck's worker may report.
    pub enum ReportedStatus {
        Succeeded => "succeeded",
        Failed => "failed",
    }
}

impl From<ReportedStatus> for CheckStatus {
    fn from(s: ReportedStatus) -> CheckStatus {
        match s {
            ReportedStatus::Succeeded => CheckStatus::Succeeded,
            ReportedStatus::Failed => CheckStatus::Failed,
        }
    }
}

/// `…/result` (sessions token, healthchecks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkResult {
    pub status: ReportedStatus,
    pub message: String,
}

/// `…/fail` (sessions token): a permanent, immutable-input error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailWork {
    pub error: FailReason,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailReason {
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub message: String,
}
