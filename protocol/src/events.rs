//! Session events (wire contract §7.5 and Appendix A): every type the api
//! emits or accepts and every type the item runner reads, as one tagged
//! enum, plus [`EventBody::Other`] for the types the SDK knows and Mango
//! neither writes nor reads. This module is the only place in Rust that
//! spells an event type.
//!
//! The types are lenient readers (unknown fields are ignored, so a newer
//! server never breaks an older runner). What a client sends is parsed
//! strictly, type by type, with [`SentEvent::parse`].

use crate::content::ContentBlock;
use crate::strict::{self, FieldError};
use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One event of a Session's log, as stored and served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    pub id: String,
    #[serde(flatten)]
    pub body: EventBody,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    #[serde(default, with = "serde_ts::option")]
    pub processed_at: Option<Timestamp>,
}

/// What an event says, by its `type`. (Its OpenAPI schema is `crate::schema`'s.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum EventBody {
    #[serde(rename = "user.message")]
    UserMessage(UserMessage),
    #[serde(rename = "user.interrupt")]
    UserInterrupt(UserInterrupt),
    #[serde(rename = "user.tool_confirmation")]
    UserToolConfirmation(UserToolConfirmation),
    #[serde(rename = "user.tool_result")]
    UserToolResult(UserToolResult),
    #[serde(rename = "user.custom_tool_result")]
    UserCustomToolResult(UserCustomToolResult),
    #[serde(rename = "user.define_outcome")]
    UserDefineOutcome(UserDefineOutcome),
    #[serde(rename = "system.message")]
    SystemMessage(SystemMessage),
    #[serde(rename = "agent.message")]
    AgentMessage(AgentMessage),
    #[serde(rename = "agent.thinking")]
    AgentThinking,
    #[serde(rename = "agent.tool_use")]
    AgentToolUse(AgentToolUse),
    #[serde(rename = "agent.custom_tool_use")]
    AgentCustomToolUse(AgentCustomToolUse),
    #[serde(rename = "session.status_running")]
    SessionStatusRunning,
    #[serde(rename = "session.status_idle")]
    SessionStatusIdle(SessionStatusIdle),
    #[serde(rename = "session.status_rescheduled")]
    SessionStatusRescheduled,
    #[serde(rename = "session.status_terminated")]
    SessionStatusTerminated,
    #[serde(rename = "session.deleted")]
    SessionDeleted,
    #[serde(rename = "session.error")]
    SessionError(SessionError),
    #[serde(rename = "session.thread_status_terminated")]
    ThreadStatusTerminated(ThreadStatusTerminated),
    #[serde(rename = "span.model_request_start")]
    ModelRequestStart,
    #[serde(rename = "span.model_request_end")]
    ModelRequestEnd(ModelRequestEnd),
    /// Any other type, kept as it came (its `type` included). A known type
    /// whose fields do not fit its variant also lands here.
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The wire `type` of every modelled event, each spelled once, for readers
/// that filter on a frame's `event:` line or a raw body's `type` without
/// parsing the event (the benchmarks). [`EventBody::type_name`] and
/// [`SentEvent::type_name`] answer with these; the serde tags above agree
/// (tested).
pub mod types {
    pub const USER_MESSAGE: &str = "user.message";
    pub const USER_INTERRUPT: &str = "user.interrupt";
    pub const USER_TOOL_CONFIRMATION: &str = "user.tool_confirmation";
    pub const USER_TOOL_RESULT: &str = "user.tool_result";
    pub const USER_CUSTOM_TOOL_RESULT: &str = "user.custom_tool_result";
    pub const USER_DEFINE_OUTCOME: &str = "user.define_outcome";
    pub const SYSTEM_MESSAGE: &str = "system.message";
    pub const AGENT_MESSAGE: &str = "agent.message";
    pub const AGENT_THINKING: &str = "agent.thinking";
    pub const AGENT_TOOL_USE: &str = "agent.tool_use";
    pub const AGENT_CUSTOM_TOOL_USE: &str = "agent.custom_tool_use";
    pub const SESSION_STATUS_RUNNING: &str = "session.status_running";
    pub const SESSION_STATUS_IDLE: &str = "session.status_idle";
    pub const SESSION_STATUS_RESCHEDULED: &str = "session.status_rescheduled";
    pub const SESSION_STATUS_TERMINATED: &str = "session.status_terminated";
    pub const SESSION_DELETED: &str = "session.deleted";
    pub const SESSION_ERROR: &str = "session.error";
    pub const SESSION_THREAD_STATUS_TERMINATED: &str = "session.thread_status_terminated";
    pub const SPAN_MODEL_REQUEST_START: &str = "span.model_request_start";
    pub const SPAN_MODEL_REQUEST_END: &str = "span.model_request_end";
}

/// Every event type the SDK knows, in its `types[]` filter order.
pub const EVENT_TYPES: &[&str] = &[
    "user.message",
    "user.interrupt",
    "user.tool_confirmation",
    "user.custom_tool_result",
    "agent.custom_tool_use",
    "agent.message",
    "agent.thinking",
    "agent.mcp_tool_use",
    "agent.mcp_tool_result",
    "agent.tool_use",
    "agent.tool_result",
    "agent.thread_message_received",
    "agent.thread_message_sent",
    "agent.thread_context_compacted",
    "session.error",
    "session.status_rescheduled",
    "session.status_running",
    "session.status_idle",
    "session.status_terminated",
    "session.thread_created",
    "span.outcome_evaluation_start",
    "span.outcome_evaluation_end",
    "span.model_request_start",
    "span.model_request_end",
    "span.outcome_evaluation_ongoing",
    "user.define_outcome",
    "session.thread_status_running",
    "session.thread_status_idle",
    "session.thread_status_terminated",
    "user.tool_result",
    "session.thread_status_rescheduled",
    "session.updated",
    "system.message",
    "session.usage",
    "session.deleted",
];

impl EventBody {
    /// The wire `type`.
    pub fn type_name(&self) -> &str {
        match self {
            EventBody::UserMessage(_) => types::USER_MESSAGE,
            EventBody::UserInterrupt(_) => types::USER_INTERRUPT,
            EventBody::UserToolConfirmation(_) => types::USER_TOOL_CONFIRMATION,
            EventBody::UserToolResult(_) => types::USER_TOOL_RESULT,
            EventBody::UserCustomToolResult(_) => types::USER_CUSTOM_TOOL_RESULT,
            EventBody::UserDefineOutcome(_) => types::USER_DEFINE_OUTCOME,
            EventBody::SystemMessage(_) => types::SYSTEM_MESSAGE,
            EventBody::AgentMessage(_) => types::AGENT_MESSAGE,
            EventBody::AgentThinking => types::AGENT_THINKING,
            EventBody::AgentToolUse(_) => types::AGENT_TOOL_USE,
            EventBody::AgentCustomToolUse(_) => types::AGENT_CUSTOM_TOOL_USE,
            EventBody::SessionStatusRunning => types::SESSION_STATUS_RUNNING,
            EventBody::SessionStatusIdle(_) => types::SESSION_STATUS_IDLE,
            EventBody::SessionStatusRescheduled => types::SESSION_STATUS_RESCHEDULED,
            EventBody::SessionStatusTerminated => types::SESSION_STATUS_TERMINATED,
            EventBody::SessionDeleted => types::SESSION_DELETED,
            EventBody::SessionError(_) => types::SESSION_ERROR,
            EventBody::ThreadStatusTerminated(_) => types::SESSION_THREAD_STATUS_TERMINATED,
            EventBody::ModelRequestStart => types::SPAN_MODEL_REQUEST_START,
            EventBody::ModelRequestEnd(_) => types::SPAN_MODEL_REQUEST_END,
            EventBody::Other(fields) => fields.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    /// Which event this is an answer to: the call a tool result or a
    /// confirmation names.
    pub fn answers(&self) -> Option<CallAnswer<'_>> {
        match self {
            EventBody::UserToolResult(r) => Some(CallAnswer::ToolResult(&r.tool_use_id)),
            EventBody::UserCustomToolResult(r) => {
                Some(CallAnswer::CustomToolResult(&r.custom_tool_use_id))
            }
            EventBody::UserToolConfirmation(c) => {
                Some(CallAnswer::Confirmation(&c.tool_use_id, c.result))
            }
            _ => None,
        }
    }

    /// The body as the JSON object that is stored, `type` first.
    pub fn to_json(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            _ => unreachable!("an event body serializes to an object"),
        }
    }
}

/// How an event refers to an earlier tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallAnswer<'a> {
    ToolResult(&'a str),
    CustomToolResult(&'a str),
    Confirmation(&'a str, Confirmation),
}

impl<'a> CallAnswer<'a> {
    /// The id of the call it answers.
    pub fn call_id(self) -> &'a str {
        match self {
            CallAnswer::ToolResult(id)
            | CallAnswer::CustomToolResult(id)
            | CallAnswer::Confirmation(id, _) => id,
        }
    }

    /// The field that names the call: `tool_use_id` or `custom_tool_use_id`.
    pub fn field(self) -> &'static str {
        match self {
            CallAnswer::CustomToolResult(_) => "custom_tool_use_id",
            _ => "tool_use_id",
        }
    }
}

// ------------------------------------------------------------------ user and system events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserMessage {
    pub content: Vec<ContentBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserInterrupt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_thread_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Confirmation {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserToolConfirmation {
    pub tool_use_id: String,
    pub result: Confirmation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(read_only))]
    pub session_thread_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserToolResult {
    pub tool_use_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ContentBlock>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// Set by the server: the thread of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(read_only))]
    pub session_thread_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserCustomToolResult {
    pub custom_tool_use_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ContentBlock>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(read_only))]
    pub session_thread_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserDefineOutcome {
    pub description: String,
    pub rubric: Rubric,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Rubric {
    Text { content: String },
    File { file_id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemMessage {
    pub content: Vec<ContentBlock>,
}

// ------------------------------------------------------------------ agent events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentMessage {
    pub content: Vec<ContentBlock>,
}

/// `evaluated_permission` of a tool call. Absent means allow; a value this
/// reader does not know counts as ask (SDK behaviour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    Allow,
    Deny,
    #[serde(other)]
    Ask,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Allow => "allow",
            Permission::Ask => "ask",
            Permission::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Option<Permission> {
        [Permission::Allow, Permission::Ask, Permission::Deny]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// How the agent's policy evaluated a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Evaluation {
    AlwaysAllow,
    AlwaysAsk,
    /// An evaluation this reader does not know (the union is open).
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentToolUse {
    pub name: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluated_permission: Option<Permission>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    /// Why a denied call was denied (Mango's; the model reads it as the call's result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_thread_id: Option<String>,
}

impl AgentToolUse {
    /// The permission the call carries, absent read as allow.
    pub fn permission(&self) -> Permission {
        self.evaluated_permission.unwrap_or(Permission::Allow)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentCustomToolUse {
    pub name: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_thread_id: Option<String>,
}

// ------------------------------------------------------------------ session and span events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionStatusIdle {
    pub stop_reason: StopReason,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    RequiresAction {
        event_ids: Vec<String>,
    },
    RetriesExhausted,
    BudgetReached,
    Refusal,
    /// A stop reason this reader does not know.
    #[serde(other)]
    Other,
}

impl StopReason {
    /// Whether this idle ends the turn (the runner's idle countdown starts).
    pub fn ends_turn(&self) -> bool {
        !matches!(self, StopReason::RequiresAction { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionError {
    pub error: SessionErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionErrorDetail {
    #[serde(rename = "type")]
    pub kind: SessionErrorType,
    pub message: String,
    pub retry_status: RetryStatus,
}

/// `session.error.error.type`: the ones Mango writes; the SDK lists more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionErrorType {
    ModelOverloadedError,
    ModelRateLimitedError,
    ModelRequestFailedError,
    /// Fail: a permanent, immutable-input error terminated the Session.
    SessionInputFailedError,
    #[serde(other)]
    UnknownError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RetryStatus {
    Retrying,
    Exhausted,
    Terminal,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ThreadStatusTerminated {
    pub session_thread_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelRequestEnd {
    pub model_request_start_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    pub model_usage: ModelUsage,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

// ------------------------------------------------------------------ what clients send

/// One sent event, serialized as JSON, may be at most this many bytes
/// (256 KiB): the api refuses a larger one, and the item runner brings
/// every tool result it sends under it.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// An event a client sends (`POST /v1/sessions/{id}/events`,
/// `initial_events`). Who may send which is the api's rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type")]
pub enum SentEvent {
    #[serde(rename = "user.message")]
    UserMessage(UserMessage),
    #[serde(rename = "user.interrupt")]
    UserInterrupt(UserInterrupt),
    #[serde(rename = "user.tool_confirmation")]
    UserToolConfirmation(UserToolConfirmation),
    #[serde(rename = "user.tool_result")]
    UserToolResult(UserToolResult),
    #[serde(rename = "user.custom_tool_result")]
    UserCustomToolResult(UserCustomToolResult),
    #[serde(rename = "user.define_outcome")]
    UserDefineOutcome(UserDefineOutcome),
    #[serde(rename = "system.message")]
    SystemMessage(SystemMessage),
}

/// Why a sent event was refused before its fields were looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentEventError {
    /// Not a JSON object.
    NotAnEvent,
    /// A type the server produces (`agent.*`, `session.*`, `span.*`).
    NotSendable(String),
    /// A type nobody knows.
    UnknownType(String),
    /// A sendable type whose fields are wrong.
    Field(FieldError),
}

impl SentEvent {
    /// Parses one sent event strictly: the type must be sendable, and its
    /// fields exactly those of the type (unknown fields refused). A
    /// server-set field (`session_thread_id` on results and confirmations)
    /// is not for clients to send.
    pub fn parse(value: Value) -> Result<SentEvent, SentEventError> {
        let Value::Object(mut fields) = value else {
            return Err(SentEventError::NotAnEvent);
        };
        let kind = match fields.remove("type") {
            Some(Value::String(kind)) => kind,
            // No type, or not a string: no type anyone knows.
            Some(other) => return Err(SentEventError::UnknownType(other.to_string())),
            None => return Err(SentEventError::UnknownType(String::new())),
        };
        let rest = Value::Object(fields);
        let parsed = match kind.as_str() {
            types::USER_MESSAGE => strict::from_value(rest).map(SentEvent::UserMessage),
            types::USER_INTERRUPT => strict::from_value(rest).map(SentEvent::UserInterrupt),
            types::USER_TOOL_CONFIRMATION => {
                strict::from_value(rest).map(SentEvent::UserToolConfirmation)
            }
            types::USER_TOOL_RESULT => strict::from_value(rest).map(SentEvent::UserToolResult),
            types::USER_CUSTOM_TOOL_RESULT => {
                strict::from_value(rest).map(SentEvent::UserCustomToolResult)
            }
            types::USER_DEFINE_OUTCOME => {
                strict::from_value(rest).map(SentEvent::UserDefineOutcome)
            }
            types::SYSTEM_MESSAGE => strict::from_value(rest).map(SentEvent::SystemMessage),
            other
                if ["agent.", "session.", "span."]
                    .iter()
                    .any(|p| other.starts_with(p)) =>
            {
                return Err(SentEventError::NotSendable(kind));
            }
            _ => return Err(SentEventError::UnknownType(kind)),
        };
        let parsed = parsed.map_err(SentEventError::Field)?;
        if parsed.routed_thread().is_some() {
            return Err(SentEventError::Field(FieldError::new(
                "session_thread_id",
                "unknown field",
            )));
        }
        Ok(parsed)
    }

    /// The thread the server routes a result or confirmation to.
    fn routed_thread(&self) -> Option<&str> {
        match self {
            SentEvent::UserToolConfirmation(c) => c.session_thread_id.as_deref(),
            SentEvent::UserToolResult(r) => r.session_thread_id.as_deref(),
            SentEvent::UserCustomToolResult(r) => r.session_thread_id.as_deref(),
            _ => None,
        }
    }

    /// The wire `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            SentEvent::UserMessage(_) => types::USER_MESSAGE,
            SentEvent::UserInterrupt(_) => types::USER_INTERRUPT,
            SentEvent::UserToolConfirmation(_) => types::USER_TOOL_CONFIRMATION,
            SentEvent::UserToolResult(_) => types::USER_TOOL_RESULT,
            SentEvent::UserCustomToolResult(_) => types::USER_CUSTOM_TOOL_RESULT,
            SentEvent::UserDefineOutcome(_) => types::USER_DEFINE_OUTCOME,
            SentEvent::SystemMessage(_) => types::SYSTEM_MESSAGE,
        }
    }

    /// Every type a client may send, for messages.
    pub const TYPES: [&'static str; 7] = [
        types::USER_MESSAGE,
        types::USER_INTERRUPT,
        types::USER_TOOL_CONFIRMATION,
        types::USER_TOOL_RESULT,
        types::USER_CUSTOM_TOOL_RESULT,
        types::USER_DEFINE_OUTCOME,
        types::SYSTEM_MESSAGE,
    ];
}

impl From<SentEvent> for EventBody {
    fn from(sent: SentEvent) -> EventBody {
        match sent {
            SentEvent::UserMessage(e) => EventBody::UserMessage(e),
            SentEvent::UserInterrupt(e) => EventBody::UserInterrupt(e),
            SentEvent::UserToolConfirmation(e) => EventBody::UserToolConfirmation(e),
            SentEvent::UserToolResult(e) => EventBody::UserToolResult(e),
            SentEvent::UserCustomToolResult(e) => EventBody::UserCustomToolResult(e),
            SentEvent::UserDefineOutcome(e) => EventBody::UserDefineOutcome(e),
            SentEvent::SystemMessage(e) => EventBody::SystemMessage(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_modelled_type_round_trips_and_is_in_the_sdk_list() {
        let samples = [
            json!({"type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            json!({"type": "user.interrupt"}),
            json!({"type": "user.tool_confirmation", "tool_use_id": "sevt_1", "result": "deny", "deny_message": "no"}),
            json!({"type": "user.tool_result", "tool_use_id": "sevt_1", "content": [{"type": "text", "text": "ok"}], "is_error": false}),
            json!({"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_2"}),
            json!({"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}, "max_iterations": 3}),
            json!({"type": "system.message", "content": [{"type": "text", "text": "s"}]}),
            json!({"type": "agent.message", "content": [{"type": "text", "text": "a"}]}),
            json!({"type": "agent.thinking"}),
            json!({"type": "agent.tool_use", "name": "bash", "input": {"command": "ls"}, "evaluated_permission": "ask", "evaluation": {"type": "always_ask"}}),
            json!({"type": "agent.custom_tool_use", "name": "lookup", "input": {}}),
            json!({"type": "session.status_running"}),
            json!({"type": "session.status_idle", "stop_reason": {"type": "requires_action", "event_ids": ["sevt_1"]}}),
            json!({"type": "session.status_rescheduled"}),
            json!({"type": "session.status_terminated"}),
            json!({"type": "session.deleted"}),
            json!({"type": "session.error", "error": {"type": "session_input_failed_error", "message": "m", "retry_status": {"type": "terminal"}}}),
            json!({"type": "session.thread_status_terminated", "session_thread_id": "thr_1"}),
            json!({"type": "span.model_request_start"}),
            json!({"type": "span.model_request_end", "model_request_start_id": "sevt_3", "is_error": false,
                   "model_usage": {"input_tokens": 1, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}),
        ];
        for sample in samples {
            let mut stored = sample.clone();
            stored["id"] = json!("sevt_x");
            stored["processed_at"] = json!("2026-12-01T00:00:00.000000Z");
            let e = event(stored.clone());
            assert!(
                !matches!(e.body, EventBody::Other(_)),
                "{sample} is modelled"
            );
            assert_eq!(e.body.type_name(), sample["type"]);
            assert!(EVENT_TYPES.contains(&e.body.type_name()));
            assert_eq!(serde_json::to_value(&e).unwrap(), stored, "round trip");
        }
    }

    #[test]
    fn sent_type_names_are_their_serde_tags_and_sendable() {
        let samples = [
            json!({"type": "user.message", "content": [{"type": "text", "text": "hi"}]}),
            json!({"type": "user.interrupt"}),
            json!({"type": "user.tool_confirmation", "tool_use_id": "sevt_1", "result": "allow"}),
            json!({"type": "user.tool_result", "tool_use_id": "sevt_1"}),
            json!({"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_2"}),
            json!({"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}, "max_iterations": 3}),
            json!({"type": "system.message", "content": [{"type": "text", "text": "s"}]}),
        ];
        let mut names = Vec::new();
        for sample in samples {
            let sent = SentEvent::parse(sample.clone()).unwrap();
            assert_eq!(sent.type_name(), sample["type"]);
            assert_eq!(serde_json::to_value(&sent).unwrap()["type"], sample["type"]);
            assert_eq!(EventBody::from(sent.clone()).type_name(), sent.type_name());
            names.push(sent.type_name());
        }
        assert_eq!(names, SentEvent::TYPES);
        assert_eq!(types::USER_MESSAGE, "user.message");
        assert_eq!(types::AGENT_TOOL_USE, "agent.tool_use");
    }

    #[test]
    fn readers_are_lenient_and_keep_what_they_do_not_model() {
        let e = event(
            json!({"id": "e", "type": "agent.tool_use", "name": "bash", "input": {},
                             "evaluated_permission": "auto_magic", "toolset_name": "x"}),
        );
        let EventBody::AgentToolUse(call) = e.body else {
            panic!("still a tool use")
        };
        assert_eq!(call.permission(), Permission::Ask, "unknown counts as ask");
        let e = event(json!({"id": "e", "type": "workflow_run.created", "name": "w"}));
        assert_eq!(e.body.type_name(), "workflow_run.created");
        assert_eq!(
            serde_json::to_value(&e).unwrap()["name"],
            "w",
            "kept as it came"
        );
        let idle = event(
            json!({"id": "i", "type": "session.status_idle", "stop_reason": {"type": "something_new"}}),
        );
        let EventBody::SessionStatusIdle(idle) = idle.body else {
            panic!("an idle")
        };
        assert!(idle.stop_reason.ends_turn());
    }

    #[test]
    fn sent_events_are_parsed_strictly_and_by_type() {
        let ok = SentEvent::parse(
            json!({"type": "user.tool_result", "tool_use_id": "sevt_1", "is_error": null}),
        )
        .unwrap();
        assert_eq!(ok.type_name(), "user.tool_result");
        assert_eq!(
            SentEvent::parse(json!({"type": "agent.tool_use", "name": "x", "input": {}})),
            Err(SentEventError::NotSendable("agent.tool_use".into()))
        );
        assert_eq!(
            SentEvent::parse(json!({"type": "user.bogus"})),
            Err(SentEventError::UnknownType("user.bogus".into()))
        );
        assert_eq!(
            SentEvent::parse(json!({"content": []})),
            Err(SentEventError::UnknownType(String::new()))
        );
        assert_eq!(SentEvent::parse(json!([])), Err(SentEventError::NotAnEvent));
        let Err(SentEventError::Field(err)) = SentEvent::parse(
            json!({"type": "user.message", "content": [{"type": "text", "text": "x"}], "extra": 1}),
        ) else {
            panic!("refused")
        };
        assert_eq!(err.path, "extra");
        let Err(SentEventError::Field(err)) = SentEvent::parse(
            json!({"type": "user.tool_result", "tool_use_id": "a", "session_thread_id": "thr"}),
        ) else {
            panic!("a client does not route results")
        };
        assert_eq!(err.path, "session_thread_id");
        let Err(SentEventError::Field(err)) = SentEvent::parse(
            json!({"type": "user.tool_confirmation", "tool_use_id": "a", "result": "maybe"}),
        ) else {
            panic!("refused")
        };
        assert_eq!(err.path, "result");
    }
}
