use serde::{Deserialize, Serialize};

/// `{"type":"error","error":{…},"request_id":…}`: the SDK picks its exception
/// class from the HTTP status and `error.details.error_code`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: ErrorBody,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ErrorEnvelope {
    pub fn error_code(&self) -> Option<&str> {
        self.error.details.as_ref()?.get("error_code")?.as_str()
    }
}

/// Stable `details.error_code` values.
pub mod codes {
    pub const HEARTBEAT_PRECONDITION_FAILED: &str = "heartbeat_precondition_failed";
    pub const INVALID_METADATA: &str = "invalid_metadata";
    pub const ENVIRONMENT_ARCHIVED: &str = "environment_archived";
    pub const ENVIRONMENT_NOT_FOUND: &str = "environment_not_found";
    pub const INVALID_CONFIG_TYPE_CHANGE: &str = "invalid_config_type_change";
    pub const UNSUPPORTED_CONFIG_TYPE: &str = "unsupported_config_type";
    pub const WORK_NOT_FOUND: &str = "work_not_found";
    pub const WORK_ALREADY_STOPPED: &str = "work_already_stopped";
    pub const WORK_NOT_CLAIMED: &str = "work_not_claimed";
    pub const WORK_NOT_ACTIVE: &str = "work_not_active";
    pub const RESULT_CONFLICT: &str = "result_conflict";
    pub const NOT_A_HEALTHCHECK: &str = "not_a_healthcheck";
    pub const INVALID_PARAMETER: &str = "invalid_parameter";
    pub const INVALID_JSON: &str = "invalid_json";
    pub const INVALID_CURSOR: &str = "invalid_cursor";
    pub const AGENT_NOT_FOUND: &str = "agent_not_found";
    pub const AGENT_ARCHIVED: &str = "agent_archived";
    pub const AGENT_VERSION_CONFLICT: &str = "agent_version_conflict";
    pub const INVALID_TOOLS: &str = "invalid_tools";
}
