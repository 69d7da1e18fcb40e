//! The error envelope (`{"type":"error","error":{…},"request_id":…}`) and
//! every error type and code the api answers with. The SDK picks its
//! exception class from the HTTP status and `error.details.error_code`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorEnvelope {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: ErrorBody,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ErrorEnvelope {
    /// `details.error_code` as sent (a newer server may send codes this
    /// build does not know).
    pub fn error_code(&self) -> Option<&str> {
        self.error.details.as_ref()?.get("error_code")?.as_str()
    }

    /// `details.error_code`, when it is one this build knows.
    pub fn code(&self) -> Option<ErrorCode> {
        self.error_code().and_then(ErrorCode::parse)
    }
}

/// `error.type`: the class of an error, with the HTTP status that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    InvalidRequestError,
    AuthenticationError,
    PermissionError,
    NotFoundError,
    ConflictError,
    RequestTooLarge,
    /// 429: too many requests of one credential; `retry-after` says when to try again.
    RateLimitError,
    OverloadedError,
    ApiError,
    /// 409: a memory's `content_sha256` precondition did not hold.
    MemoryPreconditionFailedError,
    /// 409: another memory of the store has that path.
    MemoryPathConflictError,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequestError => "invalid_request_error",
            ErrorType::AuthenticationError => "authentication_error",
            ErrorType::PermissionError => "permission_error",
            ErrorType::NotFoundError => "not_found_error",
            ErrorType::ConflictError => "conflict_error",
            ErrorType::RequestTooLarge => "request_too_large",
            ErrorType::RateLimitError => "rate_limit_error",
            ErrorType::OverloadedError => "overloaded_error",
            ErrorType::ApiError => "api_error",
            ErrorType::MemoryPreconditionFailedError => "memory_precondition_failed_error",
            ErrorType::MemoryPathConflictError => "memory_path_conflict_error",
        }
    }

    /// The code of an error of this type that has no more specific one.
    pub fn default_code(self) -> ErrorCode {
        match self {
            ErrorType::InvalidRequestError => ErrorCode::InvalidRequest,
            ErrorType::AuthenticationError => ErrorCode::AuthenticationFailed,
            ErrorType::PermissionError => ErrorCode::PermissionDenied,
            ErrorType::NotFoundError => ErrorCode::NotFound,
            ErrorType::ConflictError => ErrorCode::Conflict,
            ErrorType::RequestTooLarge => ErrorCode::RequestTooLarge,
            ErrorType::RateLimitError => ErrorCode::RateLimited,
            ErrorType::OverloadedError => ErrorCode::Overloaded,
            ErrorType::ApiError => ErrorCode::InternalError,
            ErrorType::MemoryPreconditionFailedError => ErrorCode::MemoryPreconditionFailed,
            ErrorType::MemoryPathConflictError => ErrorCode::MemoryPathConflict,
        }
    }
}

macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident => $code:literal,)*) => {
        /// Stable `details.error_code` values: every one the api sends.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }
        }
    };
}

error_codes! {
    // Defaults, one per error type.
    InvalidRequest => "invalid_request",
    AuthenticationFailed => "authentication_failed",
    PermissionDenied => "permission_denied",
    NotFound => "not_found",
    Conflict => "conflict",
    RequestTooLarge => "request_too_large",
    RateLimited => "rate_limited",
    Overloaded => "overloaded",
    InternalError => "internal_error",
    // Request parsing.
    InvalidParameter => "invalid_parameter",
    InvalidJson => "invalid_json",
    InvalidCursor => "invalid_cursor",
    InvalidMetadata => "invalid_metadata",
    // Environments.
    EnvironmentNotFound => "environment_not_found",
    EnvironmentArchived => "environment_archived",
    /// Deleting an Environment that still has Sessions.
    EnvironmentInUse => "environment_in_use",
    InvalidConfigTypeChange => "invalid_config_type_change",
    UnsupportedConfigType => "unsupported_config_type",
    // Work.
    WorkNotFound => "work_not_found",
    WorkAlreadyStopped => "work_already_stopped",
    WorkNotClaimed => "work_not_claimed",
    WorkNotActive => "work_not_active",
    HeartbeatPreconditionFailed => "heartbeat_precondition_failed",
    ResultConflict => "result_conflict",
    NotAHealthcheck => "not_a_healthcheck",
    // Agents.
    AgentNotFound => "agent_not_found",
    AgentArchived => "agent_archived",
    AgentVersionConflict => "agent_version_conflict",
    InvalidTools => "invalid_tools",
    // Memory Stores and their memories.
    MemoryStoreNotFound => "memory_store_not_found",
    MemoryStoreArchived => "memory_store_archived",
    MemoryNotFound => "memory_not_found",
    MemoryVersionNotFound => "memory_version_not_found",
    /// A memory path breaks a path rule (`..`, `//`, too long, not NFC …).
    InvalidMemoryPath => "invalid_memory_path",
    /// Content over 102,400 UTF-8 bytes.
    MemoryContentTooLarge => "memory_content_too_large",
    MemoryPreconditionFailed => "memory_precondition_failed",
    MemoryPathConflict => "memory_path_conflict",
    /// Redacting the version that holds a live memory's content.
    MemoryVersionCurrent => "memory_version_current",
    /// 413: the write would take the store past its content bytes or its
    /// count of memories (`details.quota`, `limit`, `current`, `requested`).
    MemoryStoreFull => "memory_store_full",
    /// 429: a sessions token wrote memories faster than its allowance.
    MemoryWriteRateLimited => "memory_write_rate_limited",
    // Sessions and their events.
    SessionNotFound => "session_not_found",
    SessionArchived => "session_archived",
    SessionTerminated => "session_terminated",
    EventNotSendable => "event_not_sendable",
    UnknownEventType => "unknown_event_type",
    UnknownToolUseId => "unknown_tool_use_id",
    WrongResultType => "wrong_result_type",
    ToolUseDenied => "tool_use_denied",
    AwaitingConfirmation => "awaiting_confirmation",
    ConfirmationNotRequested => "confirmation_not_requested",
    AlreadyConfirmed => "already_confirmed",
    AlreadyAnswered => "already_answered",
    // Skills.
    SkillNotFound => "skill_not_found",
    SkillVersionNotFound => "skill_version_not_found",
    /// An upload that breaks a rule of Skills (path, member type, SKILL.md).
    InvalidSkill => "invalid_skill",
    /// A new version whose SKILL.md names another Skill.
    SkillNameMismatch => "skill_name_mismatch",
    /// Deleting a version a Session that can still run pins.
    SkillInUse => "skill_in_use",
    /// Deleting a Skill's only version (delete the Skill instead).
    LastSkillVersion => "last_skill_version",
}

impl ErrorCode {
    pub fn parse(s: &str) -> Option<ErrorCode> {
        Self::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
    }

    #[test]
    fn types_serialize_as_their_names_and_have_default_codes() {
        for t in [
            ErrorType::InvalidRequestError,
            ErrorType::AuthenticationError,
            ErrorType::PermissionError,
            ErrorType::NotFoundError,
            ErrorType::ConflictError,
            ErrorType::RequestTooLarge,
            ErrorType::RateLimitError,
            ErrorType::OverloadedError,
            ErrorType::ApiError,
            ErrorType::MemoryPreconditionFailedError,
            ErrorType::MemoryPathConflictError,
        ] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
            assert!(ErrorCode::ALL.contains(&t.default_code()));
        }
    }
}
