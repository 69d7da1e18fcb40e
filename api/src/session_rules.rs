//! Session admission rules, pure (spec §2, §5): which events a caller may
//! send, which input is runnable (creates Work), how events move the Session's
//! status, and the tool-call permission barrier. The store applies these inside
//! the admission transaction; HTTP maps the errors to status codes.

use mango_protocol::events::{Confirmation, EventBody, Permission, SentEvent};
use mango_protocol::sessions::SessionStatus as Status;

/// Who is sending events to a Session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// A Workspace key: the operator or an application acting for the user.
    Operator,
    /// The sessions token of this Session's live Work: the worker.
    Worker,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendRefusal {
    /// A type this credential may not send (the worker sends only tool results).
    NotPermitted(&'static str),
    Terminated,
}

/// May `sender` send `event` to a Session in `status`? (Which types any
/// client may send at all is [`SentEvent`]'s.)
pub fn may_send(sender: Sender, event: &SentEvent, status: Status) -> Result<(), SendRefusal> {
    let worker_may = matches!(
        event,
        SentEvent::UserToolResult(_) | SentEvent::UserCustomToolResult(_)
    );
    if sender == Sender::Worker && !worker_may {
        return Err(SendRefusal::NotPermitted(event.type_name()));
    }
    if status == Status::Terminated {
        return Err(SendRefusal::Terminated);
    }
    Ok(())
}

/// Whether an event is what clients send (`user.*`, `system.message`),
/// which nothing else may append.
pub fn is_client_input(event: &EventBody) -> bool {
    matches!(
        event,
        EventBody::UserMessage(_)
            | EventBody::UserInterrupt(_)
            | EventBody::UserToolConfirmation(_)
            | EventBody::UserToolResult(_)
            | EventBody::UserCustomToolResult(_)
            | EventBody::UserDefineOutcome(_)
            | EventBody::SystemMessage(_)
    )
}

/// Runnable input wakes the agent loop and needs a worker: it creates Work.
pub fn is_runnable(event: &EventBody) -> bool {
    matches!(
        event,
        EventBody::UserMessage(_)
            | EventBody::UserToolResult(_)
            | EventBody::UserCustomToolResult(_)
            | EventBody::UserToolConfirmation(_)
            | EventBody::UserDefineOutcome(_)
    )
}

/// The Session status after an event is appended (agent-loop status events move it).
pub fn status_after(current: Status, event: &EventBody) -> Status {
    if current == Status::Terminated {
        return Status::Terminated;
    }
    match event {
        EventBody::SessionStatusRunning => Status::Running,
        EventBody::SessionStatusIdle(_) => Status::Idle,
        EventBody::SessionStatusRescheduled => Status::Rescheduling,
        EventBody::SessionStatusTerminated | EventBody::SessionDeleted => Status::Terminated,
        _ => current,
    }
}

/// A confirmation as `session_tool_calls.confirmation` stores it.
pub fn confirmation_str(result: Confirmation) -> &'static str {
    match result {
        Confirmation::Allow => Permission::Allow.as_str(),
        Confirmation::Deny => Permission::Deny.as_str(),
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
    answer: Confirmation,
) -> Result<ConfirmationDecision, ConfirmationRefusal> {
    let call = call.ok_or(ConfirmationRefusal::UnknownCall)?;
    if call.kind != CallKind::Tool || call.permission != Permission::Ask {
        return Err(ConfirmationRefusal::NotAsked);
    }
    let answer = Permission::parse(confirmation_str(answer));
    match call.confirmation {
        Some(previous) if Some(previous) == answer => Ok(ConfirmationDecision::Duplicate),
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

    fn sent(v: serde_json::Value) -> SentEvent {
        SentEvent::parse(v).unwrap()
    }

    fn body(v: serde_json::Value) -> EventBody {
        serde_json::from_value(v).unwrap()
    }

    fn every_sendable_event() -> Vec<SentEvent> {
        use serde_json::json;
        vec![
            sent(json!({"type": "user.message", "content": [{"type": "text", "text": "hi"}]})),
            sent(json!({"type": "user.interrupt"})),
            sent(json!({"type": "user.tool_confirmation", "tool_use_id": "a", "result": "allow"})),
            sent(json!({"type": "user.tool_result", "tool_use_id": "a"})),
            sent(json!({"type": "user.custom_tool_result", "custom_tool_use_id": "a"})),
            sent(
                json!({"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}}),
            ),
            sent(json!({"type": "system.message", "content": [{"type": "text", "text": "s"}]})),
        ]
    }

    #[test]
    fn worker_sends_only_tool_results() {
        let all = every_sendable_event();
        assert_eq!(all.len(), SentEvent::TYPES.len());
        for e in &all {
            let t = e.type_name();
            let worker = may_send(Sender::Worker, e, Status::Running);
            assert_eq!(worker.is_ok(), t.ends_with("tool_result"), "{t}");
            assert!(may_send(Sender::Operator, e, Status::Idle).is_ok(), "{t}");
        }
        assert_eq!(
            may_send(Sender::Operator, &all[0], Status::Terminated),
            Err(SendRefusal::Terminated)
        );
    }

    #[test]
    fn runnable_input_and_status_projection() {
        use serde_json::json;
        let runnable: Vec<bool> = every_sendable_event()
            .into_iter()
            .map(|e| is_runnable(&e.into()))
            .collect();
        // message, interrupt, confirmation, result, custom result, outcome, system
        assert_eq!(runnable, [true, false, true, true, true, true, false]);
        assert!(!is_runnable(&body(
            json!({"type": "agent.message", "content": []})
        )));
        let running = body(json!({"type": "session.status_running"}));
        let idle =
            body(json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}}));
        let rescheduled = body(json!({"type": "session.status_rescheduled"}));
        let terminated = body(json!({"type": "session.status_terminated"}));
        let message = body(json!({"type": "agent.message", "content": []}));
        assert_eq!(status_after(Status::Idle, &running), Status::Running);
        assert_eq!(status_after(Status::Running, &idle), Status::Idle);
        assert_eq!(
            status_after(Status::Running, &rescheduled),
            Status::Rescheduling
        );
        assert_eq!(status_after(Status::Idle, &terminated), Status::Terminated);
        assert_eq!(
            status_after(Status::Terminated, &running),
            Status::Terminated,
            "terminal"
        );
        assert_eq!(status_after(Status::Running, &message), Status::Running);
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
            admit_confirmation(Some(&c), Confirmation::Allow),
            Ok(ConfirmationDecision::Accept)
        );
        c.confirmation = Some(Allow);
        assert!(
            c.may_run() && c.is_pending(),
            "an approval alone does not clear the barrier"
        );
        assert_eq!(
            admit_confirmation(Some(&c), Confirmation::Allow),
            Ok(ConfirmationDecision::Duplicate)
        );
        assert_eq!(
            admit_confirmation(Some(&c), Confirmation::Deny),
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
            admit_confirmation(Some(&c), Confirmation::Allow),
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
            admit_confirmation(Some(&custom), Confirmation::Allow),
            Err(ConfirmationRefusal::NotAsked)
        );
        assert_eq!(
            admit_confirmation(None, Confirmation::Allow),
            Err(ConfirmationRefusal::UnknownCall)
        );
        let mut answered = call(CallKind::Tool, Permission::Ask);
        answered.answered_by = Some("x".into());
        assert_eq!(
            admit_confirmation(Some(&answered), Confirmation::Allow),
            Err(ConfirmationRefusal::AlreadyAnswered)
        );
    }
}
