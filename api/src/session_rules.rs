//! Session admission rules, pure (spec §2, §5): which events a caller may
//! send, which input is runnable (creates Work), how events move the Session's
//! status, and the tool-call permission barrier. The store applies these inside
//! the admission transaction; HTTP maps the errors to status codes.

/// Session status, as the SDK names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    Running,
    Rescheduling,
    Terminated,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::Running => "running",
            Status::Rescheduling => "rescheduling",
            Status::Terminated => "terminated",
        }
    }
    pub fn parse(s: &str) -> Option<Status> {
        [
            Status::Idle,
            Status::Running,
            Status::Rescheduling,
            Status::Terminated,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// Who is sending events to a Session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// A Workspace key: the operator or an application acting for the user.
    Operator,
    /// The sessions token of this Session's live Work: the worker.
    Worker,
}

/// Event types a client may send (`POST …/events`).
pub const SENDABLE: &[&str] = &[
    "user.message",
    "user.interrupt",
    "user.tool_confirmation",
    "user.tool_result",
    "user.custom_tool_result",
    "user.define_outcome",
    "system.message",
];

/// Every event type the API knows, for `types[]` filters (SDK order).
pub const KNOWN_TYPES: &[&str] = &[
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendRefusal {
    /// Not a type any client may send (e.g. `agent.*`, or unknown).
    NotSendable(String),
    /// A type this credential may not send (the worker sends only tool results).
    NotPermitted(String),
    Terminated,
}

/// May `sender` send an event of `event_type` to a Session in `status`?
pub fn may_send(sender: Sender, event_type: &str, status: Status) -> Result<(), SendRefusal> {
    if !SENDABLE.contains(&event_type) {
        return Err(SendRefusal::NotSendable(event_type.to_string()));
    }
    if sender == Sender::Worker
        && !matches!(event_type, "user.tool_result" | "user.custom_tool_result")
    {
        return Err(SendRefusal::NotPermitted(event_type.to_string()));
    }
    if status == Status::Terminated {
        return Err(SendRefusal::Terminated);
    }
    Ok(())
}

/// Runnable input wakes the agent loop and needs a worker: it creates Work.
pub fn is_runnable(event_type: &str) -> bool {
    matches!(
        event_type,
        "user.message"
            | "user.tool_result"
            | "user.custom_tool_result"
            | "user.tool_confirmation"
            | "user.define_outcome"
    )
}

/// The Session status after an event is appended (agent-loop status events move it).
pub fn status_after(current: Status, event_type: &str) -> Status {
    if current == Status::Terminated {
        return Status::Terminated;
    }
    match event_type {
        "session.status_running" => Status::Running,
        "session.status_idle" => Status::Idle,
        "session.status_rescheduled" => Status::Rescheduling,
        "session.status_terminated" | "session.deleted" => Status::Terminated,
        _ => current,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `agent.tool_use`: a toolset tool, gated by `evaluated_permission`.
    Tool,
    /// `agent.custom_tool_use`: an operator tool; no permission gate.
    Custom,
}

impl CallKind {
    /// As stored in `session_tool_calls.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Tool => "tool",
            CallKind::Custom => "custom",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Allow,
    Ask,
    Deny,
}

impl Permission {
    /// `evaluated_permission` of an `agent.tool_use`; absent means allow, and
    /// any value the runner does not know is treated as ask (SDK behaviour).
    pub fn from_event(value: Option<&str>) -> Permission {
        match value {
            None | Some("allow") => Permission::Allow,
            Some("deny") => Permission::Deny,
            Some(_) => Permission::Ask,
        }
    }
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

/// One tool call the agent made and what has happened to it since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub kind: CallKind,
    pub permission: Permission,
    /// A persisted `user.tool_confirmation` result, if any.
    pub confirmation: Option<Permission>,
    /// The id of the result event that answered it.
    pub answered_by: Option<String>,
}

impl ToolCall {
    /// Still holding the Session's pending-action barrier? Only a result clears
    /// an allowed call; a denied call (by policy or by confirmation) never runs.
    pub fn is_pending(&self) -> bool {
        self.answered_by.is_none()
            && self.permission != Permission::Deny
            && self.confirmation != Some(Permission::Deny)
    }

    /// May the worker run it now? (allow, or ask with a persisted allow)
    pub fn may_run(&self) -> bool {
        self.is_pending()
            && (self.permission == Permission::Allow
                || self.confirmation == Some(Permission::Allow))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultDecision {
    Accept,
    /// Already answered: a retried send. 2xx, nothing changes.
    Duplicate {
        answered_by: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultRefusal {
    /// No such call in this Session.
    UnknownCall,
    /// `user.tool_result` for a custom call or `user.custom_tool_result` for a toolset call.
    WrongKind,
    /// Denied by policy or confirmation: it never produces a result.
    Denied,
    /// `ask` without a persisted allow yet.
    AwaitingConfirmation,
}

/// A result for `call` (the `tool_use_id` / `custom_tool_use_id` it names).
pub fn admit_result(
    call: Option<&ToolCall>,
    result_kind: CallKind,
) -> Result<ResultDecision, ResultRefusal> {
    let call = call.ok_or(ResultRefusal::UnknownCall)?;
    if call.kind != result_kind {
        return Err(ResultRefusal::WrongKind);
    }
    if let Some(by) = &call.answered_by {
        return Ok(ResultDecision::Duplicate {
            answered_by: by.clone(),
        });
    }
    if call.permission == Permission::Deny || call.confirmation == Some(Permission::Deny) {
        return Err(ResultRefusal::Denied);
    }
    if !call.may_run() {
        return Err(ResultRefusal::AwaitingConfirmation);
    }
    Ok(ResultDecision::Accept)
}

/// [`may_send`] for a worker's result and [`admit_result`] = `Accept`,
/// restated in SQL over a Session row `s` and its call row `c` for the
/// one-statement result path (`$3`: the result's call kind, `tool` or
/// `custom`). The schema constrains every column it reads, and
/// `tests/it/admission.rs` checks it against these rules for every combination
/// of values the schema allows; where it says no, the locking path decides.
pub const WORKER_RESULT_ACCEPTED_SQL: &str = "s.status <> 'terminated' AND s.archived_at IS NULL
      AND c.kind = $3 AND c.answered_by IS NULL
      AND c.permission <> 'deny' AND c.confirmation IS DISTINCT FROM 'deny'
      AND (c.permission = 'allow' OR c.confirmation = 'allow')";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmationDecision {
    Accept,
    /// The same answer again: a retried send. 2xx, nothing changes.
    Duplicate,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmationRefusal {
    UnknownCall,
    /// Only toolset calls evaluated `ask` take a confirmation.
    NotAsked,
    /// A different answer was already persisted.
    AlreadyConfirmed,
    AlreadyAnswered,
}

pub fn admit_confirmation(
    call: Option<&ToolCall>,
    answer: Permission,
) -> Result<ConfirmationDecision, ConfirmationRefusal> {
    let call = call.ok_or(ConfirmationRefusal::UnknownCall)?;
    if call.kind != CallKind::Tool || call.permission != Permission::Ask {
        return Err(ConfirmationRefusal::NotAsked);
    }
    match call.confirmation {
        Some(previous) if previous == answer => Ok(ConfirmationDecision::Duplicate),
        Some(_) => Err(ConfirmationRefusal::AlreadyConfirmed),
        None if call.answered_by.is_some() => Err(ConfirmationRefusal::AlreadyAnswered),
        None => Ok(ConfirmationDecision::Accept),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: CallKind, permission: Permission) -> ToolCall {
        ToolCall {
            kind,
            permission,
            confirmation: None,
            answered_by: None,
        }
    }

    #[test]
    fn worker_sends_only_tool_results_and_nobody_sends_agent_events() {
        for t in SENDABLE {
            let worker = may_send(Sender::Worker, t, Status::Running);
            assert_eq!(worker.is_ok(), t.ends_with("tool_result"), "{t}");
            assert!(may_send(Sender::Operator, t, Status::Idle).is_ok(), "{t}");
        }
        for t in [
            "agent.message",
            "agent.tool_use",
            "session.status_idle",
            "user.bogus",
            "",
        ] {
            assert_eq!(
                may_send(Sender::Operator, t, Status::Idle),
                Err(SendRefusal::NotSendable(t.into()))
            );
        }
        assert_eq!(
            may_send(Sender::Operator, "user.message", Status::Terminated),
            Err(SendRefusal::Terminated)
        );
    }

    #[test]
    fn runnable_input_and_status_projection() {
        assert!(
            is_runnable("user.message")
                && is_runnable("user.tool_result")
                && is_runnable("user.tool_confirmation")
        );
        assert!(
            !is_runnable("user.interrupt")
                && !is_runnable("system.message")
                && !is_runnable("agent.message")
        );
        assert_eq!(
            status_after(Status::Idle, "session.status_running"),
            Status::Running
        );
        assert_eq!(
            status_after(Status::Running, "session.status_idle"),
            Status::Idle
        );
        assert_eq!(
            status_after(Status::Running, "session.status_rescheduled"),
            Status::Rescheduling
        );
        assert_eq!(
            status_after(Status::Idle, "session.status_terminated"),
            Status::Terminated
        );
        assert_eq!(
            status_after(Status::Terminated, "session.status_running"),
            Status::Terminated,
            "terminal"
        );
        assert_eq!(
            status_after(Status::Running, "agent.message"),
            Status::Running
        );
    }

    #[test]
    fn permission_matrix_allow_ask_allow_ask_deny_deny() {
        use Permission::*;
        // allow: runs, one result, then duplicates are no-ops.
        let mut c = call(CallKind::Tool, Allow);
        assert!(c.may_run() && c.is_pending());
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Ok(ResultDecision::Accept)
        );
        c.answered_by = Some("sevt_1".into());
        assert!(!c.is_pending());
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Ok(ResultDecision::Duplicate {
                answered_by: "sevt_1".into()
            })
        );

        // ask → allow: held until the allow, and the allow alone keeps the barrier.
        let mut c = call(CallKind::Tool, Ask);
        assert!(!c.may_run() && c.is_pending());
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Err(ResultRefusal::AwaitingConfirmation)
        );
        assert_eq!(
            admit_confirmation(Some(&c), Allow),
            Ok(ConfirmationDecision::Accept)
        );
        c.confirmation = Some(Allow);
        assert!(
            c.may_run() && c.is_pending(),
            "an approval alone does not clear the barrier"
        );
        assert_eq!(
            admit_confirmation(Some(&c), Allow),
            Ok(ConfirmationDecision::Duplicate)
        );
        assert_eq!(
            admit_confirmation(Some(&c), Deny),
            Err(ConfirmationRefusal::AlreadyConfirmed)
        );
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Ok(ResultDecision::Accept)
        );

        // ask → deny: never runs, takes no result, clears the barrier.
        let mut c = call(CallKind::Tool, Ask);
        c.confirmation = Some(Deny);
        assert!(!c.may_run() && !c.is_pending());
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Err(ResultRefusal::Denied)
        );

        // deny by policy: never runs, takes no confirmation or result.
        let c = call(CallKind::Tool, Deny);
        assert!(!c.may_run() && !c.is_pending());
        assert_eq!(
            admit_result(Some(&c), CallKind::Tool),
            Err(ResultRefusal::Denied)
        );
        assert_eq!(
            admit_confirmation(Some(&c), Allow),
            Err(ConfirmationRefusal::NotAsked)
        );
    }

    #[test]
    fn results_must_match_an_existing_call_of_their_kind() {
        assert_eq!(
            admit_result(None, CallKind::Tool),
            Err(ResultRefusal::UnknownCall)
        );
        let custom = call(CallKind::Custom, Permission::Allow);
        assert_eq!(
            admit_result(Some(&custom), CallKind::Tool),
            Err(ResultRefusal::WrongKind)
        );
        assert_eq!(
            admit_result(Some(&custom), CallKind::Custom),
            Ok(ResultDecision::Accept)
        );
        assert_eq!(
            admit_confirmation(Some(&custom), Permission::Allow),
            Err(ConfirmationRefusal::NotAsked)
        );
        assert_eq!(
            admit_confirmation(None, Permission::Allow),
            Err(ConfirmationRefusal::UnknownCall)
        );
        let mut answered = call(CallKind::Tool, Permission::Ask);
        answered.answered_by = Some("x".into());
        assert_eq!(
            admit_confirmation(Some(&answered), Permission::Allow),
            Err(ConfirmationRefusal::AlreadyAnswered)
        );
    }

    #[test]
    fn unknown_evaluated_permission_is_treated_as_ask() {
        assert_eq!(Permission::from_event(None), Permission::Allow);
        assert_eq!(Permission::from_event(Some("allow")), Permission::Allow);
        assert_eq!(Permission::from_event(Some("deny")), Permission::Deny);
        assert_eq!(Permission::from_event(Some("ask")), Permission::Ask);
        assert_eq!(
            Permission::from_event(Some("something_new")),
            Permission::Ask
        );
    }
}
