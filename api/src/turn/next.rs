//! What the agent loop should do next for a Session, from its events alone.

use super::transcript::transcript;
use mango_protocol::events::{Confirmation, Event, EventBody, Permission, RetryStatus};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Call the model; `open_request` is a `span.model_request_start` whose
    /// call never stored a result (resume it rather than start another).
    CallModel { open_request: Option<String> },
    /// The last input was an interrupt: end the turn.
    EndTurn,
    /// An interrupt came after a request that never stored its end (its
    /// step stopped, or the interrupt came before the call was made): close
    /// the request without a reply and end its turn.
    EndInterruptedRequest { start_id: String },
    /// Waiting for tool results or confirmations, or nothing to answer.
    Wait,
}

fn terminated(events: &[Event]) -> bool {
    events
        .iter()
        .any(|e| matches!(e.body, EventBody::SessionStatusTerminated))
}

/// The call a result names, if the event is a result.
fn result_for(body: &EventBody) -> Option<&str> {
    match body {
        EventBody::UserToolResult(r) => Some(&r.tool_use_id),
        EventBody::UserCustomToolResult(r) => Some(&r.custom_tool_use_id),
        _ => None,
    }
}

/// Tool calls still holding the turn: not answered, not denied.
pub fn pending_calls(events: &[Event]) -> Vec<String> {
    let mut open: Vec<String> = Vec::new();
    for e in events {
        match &e.body {
            EventBody::AgentToolUse(call)
                if call.evaluated_permission != Some(Permission::Deny) =>
            {
                open.push(e.id.clone())
            }
            EventBody::AgentCustomToolUse(_) => open.push(e.id.clone()),
            EventBody::UserToolResult(_) | EventBody::UserCustomToolResult(_) => {
                let call = result_for(&e.body);
                open.retain(|id| Some(id.as_str()) != call);
            }
            EventBody::UserToolConfirmation(c) if c.result == Confirmation::Deny => {
                open.retain(|id| *id != c.tool_use_id)
            }
            // An interrupt abandons the turn's open calls.
            EventBody::UserInterrupt(_) => open.clear(),
            _ => {}
        }
    }
    open
}

/// Tool calls an interrupt abandoned while they were still open.
fn abandoned_calls(events: &[Event]) -> Vec<String> {
    let mut abandoned = Vec::new();
    for (at, e) in events.iter().enumerate() {
        if let EventBody::UserInterrupt(_) = e.body {
            abandoned.extend(pending_calls(&events[..at]));
        }
    }
    abandoned
}

/// Input that calls for the model: a message, or an answer to a call.
fn is_model_input(body: &EventBody) -> bool {
    matches!(
        body,
        EventBody::UserMessage(_)
            | EventBody::UserToolResult(_)
            | EventBody::UserCustomToolResult(_)
            | EventBody::UserToolConfirmation(_)
    )
}

/// A `session.error` after which nothing is retried.
fn ends_the_turn_in_error(body: &EventBody) -> bool {
    matches!(body, EventBody::SessionError(e) if e.error.retry_status != RetryStatus::Retrying)
}

/// Where the last `span.model_request_start` is, if no end followed it.
fn open_request(events: &[Event]) -> Option<usize> {
    let last = |kind: fn(&EventBody) -> bool| events.iter().rposition(|e| kind(&e.body));
    let start = last(|b| matches!(b, EventBody::ModelRequestStart))?;
    let end = last(|b| matches!(b, EventBody::ModelRequestEnd(_)));
    end.is_none_or(|end| end < start).then_some(start)
}

/// What the log holds after a model request's `span.model_request_start`,
/// read when the request's reply is to be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinceRequest {
    /// Its reply is stored already (a step after a lost lock got there first).
    Answered,
    /// An interrupt came while the model was asked: the reply is not wanted.
    Interrupted,
    /// A message came while the model was asked: the turn goes on after the
    /// reply, so the model answers it too.
    MoreInput,
    /// Nothing that changes the turn.
    Quiet,
}

pub fn since_request(start_id: &str, since_start: &[Event]) -> SinceRequest {
    let has = |matches: fn(&EventBody) -> bool| since_start.iter().any(|e| matches(&e.body));
    if since_start.iter().any(|e| {
        matches!(&e.body, EventBody::ModelRequestEnd(end) if end.model_request_start_id == start_id)
    }) {
        SinceRequest::Answered
    } else if has(|b| matches!(b, EventBody::UserInterrupt(_))) {
        SinceRequest::Interrupted
    } else if has(|b| matches!(b, EventBody::UserMessage(_))) {
        // Results and confirmations are not counted: no call is open while
        // the model is asked, so any that come answer calls an interrupt abandoned.
        SinceRequest::MoreInput
    } else {
        SinceRequest::Quiet
    }
}

pub fn next(events: &[Event]) -> Next {
    if terminated(events) {
        return Next::Wait;
    }
    let open = open_request(events);
    if let Some(at) = open {
        if since_request(&events[at].id, &events[at + 1..]) == SinceRequest::Interrupted {
            return Next::EndInterruptedRequest {
                start_id: events[at].id.clone(),
            };
        }
    }
    // A late answer to a call an interrupt abandoned is kept in the history
    // but is not input: it must not start a turn of its own.
    let abandoned = abandoned_calls(events);
    let answers_abandoned = |body: &EventBody| {
        let call = match body {
            EventBody::UserToolConfirmation(c) => Some(c.tool_use_id.as_str()),
            other => result_for(other),
        };
        call.is_some_and(|call| abandoned.iter().any(|a| a == call))
    };
    let last_input = events.iter().rev().find(|e| match &e.body {
        EventBody::UserMessage(_) | EventBody::UserInterrupt(_) => true,
        other if is_model_input(other) => !answers_abandoned(other),
        _ => false,
    });
    let last_idle = events
        .iter()
        .rposition(|e| matches!(e.body, EventBody::SessionStatusIdle(_)));
    let interrupt_at = events
        .iter()
        .rposition(|e| matches!(e.body, EventBody::UserInterrupt(_)));
    if let Some(at) = interrupt_at {
        if last_input.is_some_and(|e| matches!(e.body, EventBody::UserInterrupt(_))) {
            return if last_idle.is_some_and(|idle| idle > at) {
                Next::Wait
            } else {
                Next::EndTurn
            };
        }
    }
    if !pending_calls(events).is_empty() {
        return Next::Wait;
    }
    // A turn that failed for good (a request that ended in error, or an
    // error no retry follows, as when no model is configured) waits for new
    // input before trying again.
    let last_outcome = events.iter().rposition(|e| {
        matches!(e.body, EventBody::ModelRequestEnd(_)) || ends_the_turn_in_error(&e.body)
    });
    if let Some(at) = last_outcome {
        let failed = match &events[at].body {
            EventBody::ModelRequestEnd(end) => end.is_error == Some(true),
            _ => true,
        };
        if failed && !events[at..].iter().any(|e| is_model_input(&e.body)) {
            return Next::Wait;
        }
    }
    let messages = transcript(events);
    if messages.last().is_none_or(|m| m["role"] != "user") {
        return Next::Wait;
    }
    Next::CallModel {
        open_request: open.map(|at| events[at].id.clone()),
    }
}

/// Pending calls a worker may run now (allowed, or asked and confirmed):
/// while any exist the Session needs live Work.
pub fn runnable_worker_calls(events: &[Event]) -> Vec<String> {
    if terminated(events) {
        return Vec::new();
    }
    let pending = pending_calls(events);
    let confirmed: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserToolConfirmation(c) if c.result == Confirmation::Allow => {
                Some(c.tool_use_id.as_str())
            }
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter_map(|e| {
            let EventBody::AgentToolUse(call) = &e.body else {
                return None;
            };
            let allowed = match call.permission() {
                Permission::Allow => true,
                Permission::Deny => false,
                Permission::Ask => confirmed.contains(&e.id.as_str()),
            };
            (allowed && pending.contains(&e.id)).then(|| e.id.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{events, transcript};
    use super::*;
    use serde_json::{json, Value};

    fn ev(id: &str, t: &str, extra: Value) -> Value {
        let mut e = json!({"id": id, "type": t});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    }
    fn end(is_error: bool) -> Value {
        json!({"model_request_start_id": "2", "is_error": is_error, "model_usage": {
            "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
    }
    fn next_of(list: &[Value]) -> Next {
        next(&events(list.to_vec()))
    }
    fn pending_of(list: &[Value]) -> Vec<String> {
        pending_calls(&events(list.to_vec()))
    }
    fn msg(id: &str) -> Value {
        ev(
            id,
            "user.message",
            json!({"content": [{"type": "text", "text": "hi"}]}),
        )
    }

    #[test]
    fn a_new_message_calls_the_model_and_a_finished_turn_waits() {
        assert_eq!(next_of(&[msg("1")]), Next::CallModel { open_request: None });
        let done = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev(
                "3",
                "agent.message",
                json!({"content": [{"type": "text", "text": "hello"}]}),
            ),
            ev("4", "span.model_request_end", end(false)),
            ev(
                "5",
                "session.status_idle",
                json!({"stop_reason": {"type": "end_turn"}}),
            ),
        ];
        assert_eq!(next_of(&done), Next::Wait);
        let mut again = done.clone();
        again.push(msg("6"));
        assert_eq!(next_of(&again), Next::CallModel { open_request: None });
    }

    #[test]
    fn tool_calls_hold_the_turn_until_answered_or_denied() {
        let mut e = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev(
                "3",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "allow"}),
            ),
            ev(
                "4",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "ask"}),
            ),
            ev("5", "span.model_request_end", end(false)),
        ];
        assert_eq!(pending_of(&e), vec!["3".to_string(), "4".to_string()]);
        assert_eq!(next_of(&e), Next::Wait);
        e.push(ev(
            "6",
            "user.tool_result",
            json!({"tool_use_id": "3", "content": []}),
        ));
        assert_eq!(next_of(&e), Next::Wait, "one still pending");
        e.push(ev(
            "7",
            "user.tool_confirmation",
            json!({"tool_use_id": "4", "result": "deny"}),
        ));
        assert_eq!(
            next_of(&e),
            Next::CallModel { open_request: None },
            "all resolved: the model sees the results"
        );
    }

    #[test]
    fn a_failed_request_waits_for_new_input() {
        let mut e = vec![
            msg("1"),
            ev("2", "span.model_request_start", json!({})),
            ev("3", "span.model_request_end", end(true)),
            ev(
                "4",
                "session.status_idle",
                json!({"stop_reason": {"type": "retries_exhausted"}}),
            ),
        ];
        assert_eq!(next_of(&e), Next::Wait);
        e.push(msg("5"));
        assert_eq!(next_of(&e), Next::CallModel { open_request: None });
    }

    #[test]
    fn a_final_error_without_a_request_waits_for_new_input() {
        // What the loop writes when no model is configured: no request, an
        // error nothing retries, the idle.
        let error = |retry: &str| {
            ev(
                "2",
                "session.error",
                json!({"error": {"type": "model_request_failed_error", "message": "no model",
                                 "retry_status": {"type": retry}}}),
            )
        };
        let idle = ev(
            "3",
            "session.status_idle",
            json!({"stop_reason": {"type": "retries_exhausted"}}),
        );
        let mut e = vec![msg("1"), error("terminal"), idle.clone()];
        assert_eq!(next_of(&e), Next::Wait);
        e.push(msg("4"));
        assert_eq!(
            next_of(&e),
            Next::CallModel { open_request: None },
            "new input tries again"
        );
        assert_eq!(
            next_of(&[msg("1"), error("retrying")]),
            Next::CallModel { open_request: None },
            "a retrying error leaves the turn open"
        );
        let succeeded_after = vec![
            msg("1"),
            error("exhausted"),
            msg("4"),
            ev("5", "span.model_request_start", json!({})),
            ev(
                "6",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "allow"}),
            ),
            ev("7", "span.model_request_end", end(false)),
            ev(
                "8",
                "user.tool_result",
                json!({"tool_use_id": "6", "content": []}),
            ),
        ];
        assert_eq!(
            next_of(&succeeded_after),
            Next::CallModel { open_request: None },
            "an old error does not hold a later turn"
        );
    }

    #[test]
    fn an_unfinished_request_is_resumed_not_restarted() {
        let e = vec![msg("1"), ev("2", "span.model_request_start", json!({}))];
        assert_eq!(
            next_of(&e),
            Next::CallModel {
                open_request: Some("2".into())
            }
        );
    }

    fn said(list: &[Value]) -> Vec<(String, Vec<String>)> {
        transcript(&events(list.to_vec()))
            .iter()
            .map(|m| {
                let blocks = m["content"].as_array().unwrap().iter();
                let what = blocks
                    .map(|b| match b["type"].as_str().unwrap() {
                        "tool_result" => format!("result {}", b["tool_use_id"].as_str().unwrap()),
                        "tool_use" => format!("call {}", b["id"].as_str().unwrap()),
                        _ => b["text"].as_str().unwrap().to_string(),
                    })
                    .collect();
                (m["role"].as_str().unwrap().to_string(), what)
            })
            .collect()
    }
    fn text(id: &str, t: &str, text: &str) -> Value {
        ev(id, t, json!({"content": [{"type": "text", "text": text}]}))
    }
    fn turn(role: &str, what: &[&str]) -> (String, Vec<String>) {
        (role.into(), what.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn a_message_sent_while_the_model_is_asked_follows_the_reply_and_is_answered() {
        let mut e = vec![
            text("1", "user.message", "hi"),
            ev("s", "session.status_running", json!({})),
            ev("2", "span.model_request_start", json!({})),
            text("3", "user.message", "more"),
        ];
        assert_eq!(
            next_of(&e),
            Next::CallModel {
                open_request: Some("2".into())
            },
            "the request in hand is made (or resumed) first"
        );
        e.push(text("4", "agent.message", "hello"));
        e.push(ev("5", "span.model_request_end", end(false)));
        assert_eq!(
            said(&e),
            [
                turn("user", &["hi"]),
                turn("assistant", &["hello"]),
                turn("user", &["more"])
            ]
        );
        assert_eq!(next_of(&e), Next::CallModel { open_request: None });
        assert_eq!(
            since_request("2", &events(e[3..].to_vec())),
            SinceRequest::Answered
        );
        assert_eq!(
            since_request("2", &events(e[3..4].to_vec())),
            SinceRequest::MoreInput
        );
    }

    #[test]
    fn a_result_that_arrives_after_a_message_sent_during_the_request_comes_first() {
        let e = vec![
            text("1", "user.message", "hi"),
            ev("2", "span.model_request_start", json!({})),
            text("3", "user.message", "more"),
            ev(
                "4",
                "agent.tool_use",
                json!({"name": "bash", "input": {}, "evaluated_permission": "allow"}),
            ),
            ev("5", "span.model_request_end", end(false)),
            ev(
                "6",
                "user.tool_result",
                json!({"tool_use_id": "4", "content": [{"type": "text", "text": "out"}]}),
            ),
        ];
        assert_eq!(
            said(&e),
            [
                turn("user", &["hi"]),
                turn("assistant", &["call 4"]),
                turn("user", &["result 4", "more"])
            ],
            "the Messages API wants a turn's results before its text"
        );
        assert_eq!(next_of(&e), Next::CallModel { open_request: None });
    }

    #[test]
    fn an_interrupt_after_a_request_started_ends_it_and_later_input_runs() {
        let mut e = vec![
            text("1", "user.message", "hi"),
            ev("2", "span.model_request_start", json!({})),
            ev("3", "user.interrupt", json!({})),
            text("4", "user.message", "y"),
            text("5", "system.message", "z"),
        ];
        assert_eq!(
            next_of(&e),
            Next::EndInterruptedRequest {
                start_id: "2".into()
            }
        );
        assert_eq!(
            since_request("2", &events(e[2..].to_vec())),
            SinceRequest::Interrupted
        );
        e.push(ev("6", "span.model_request_end", end(false)));
        e.push(ev(
            "7",
            "session.status_idle",
            json!({"stop_reason": {"type": "end_turn"}}),
        ));
        assert_eq!(next_of(&e), Next::CallModel { open_request: None });
        assert_eq!(said(&e), [turn("user", &["hi", "y", "[system] z"])]);
        // With nothing after the interrupt, the turn just ends.
        let alone = [&e[..3], &e[5..]].concat();
        assert_eq!(next_of(&alone), Next::Wait);
    }

    #[test]
    fn what_came_while_the_model_was_asked() {
        let late_result = ev(
            "9",
            "user.tool_result",
            json!({"tool_use_id": "old", "content": []}),
        );
        let quiet = [late_result, text("8", "system.message", "note")];
        assert_eq!(
            since_request("2", &events(quiet.to_vec())),
            SinceRequest::Quiet
        );
        let other_end = ev(
            "7",
            "span.model_request_end",
            json!({"model_request_start_id": "1", "is_error": false, "model_usage": {
                "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0}}),
        );
        assert_eq!(
            since_request("2", &events(vec![other_end])),
            SinceRequest::Quiet,
            "only this request's end counts"
        );
        assert_eq!(
            since_request(
                "2",
                &events(vec![msg("3"), ev("4", "user.interrupt", json!({}))])
            ),
            SinceRequest::Interrupted,
            "an interrupt outweighs a message"
        );
    }

    #[test]
    fn after_an_interrupt_new_input_runs_and_abandoned_calls_are_answered_once() {
        let e = vec![
            msg("1"),
            ev("2", "agent.tool_use", json!({"name": "bash", "input": {}})),
            ev("3", "user.interrupt", json!({})),
            ev(
                "4",
                "session.status_idle",
                json!({"stop_reason": {"type": "end_turn"}}),
            ),
            ev(
                "5",
                "user.tool_result",
                json!({"tool_use_id": "2", "content": [{"type": "text", "text": "late"}]}),
            ),
            msg("6"),
        ];
        assert!(pending_of(&e).is_empty());
        assert_eq!(next_of(&e), Next::CallModel { open_request: None });
        let m = transcript(&events(e.clone()));
        let results: Vec<&Value> = m
            .iter()
            .flat_map(|x| x["content"].as_array().unwrap())
            .filter(|b| b["type"] == "tool_result")
            .collect();
        assert_eq!(
            results.len(),
            1,
            "exactly one result for the interrupted call: {m:#?}"
        );
        assert_eq!(
            results[0]["content"][0]["text"],
            "the user interrupted this tool call"
        );
        assert_eq!(m.last().unwrap()["role"], "user");
    }

    #[test]
    fn interrupts_end_the_turn_once_and_termination_stops_everything() {
        let e = vec![
            msg("1"),
            ev("2", "agent.tool_use", json!({"name": "bash", "input": {}})),
            ev("3", "user.interrupt", json!({})),
        ];
        assert_eq!(next_of(&e), Next::EndTurn);
        let mut ended = e.clone();
        ended.push(ev(
            "4",
            "session.status_idle",
            json!({"stop_reason": {"type": "end_turn"}}),
        ));
        assert_eq!(next_of(&ended), Next::Wait);
        // A late result for the abandoned call is not input: no new turn.
        let late = ev(
            "5",
            "user.tool_result",
            json!({"tool_use_id": "2", "content": [{"type": "text", "text": "late"}]}),
        );
        let mut with_late = ended.clone();
        with_late.push(late.clone());
        assert_eq!(next_of(&with_late), Next::Wait);
        let mut late_before_the_idle = e.clone();
        late_before_the_idle.push(late);
        assert_eq!(next_of(&late_before_the_idle), Next::EndTurn);
        with_late.push(msg("6"));
        assert_eq!(next_of(&with_late), Next::CallModel { open_request: None });
        assert_eq!(
            next_of(&[msg("1"), ev("2", "session.status_terminated", json!({}))]),
            Next::Wait
        );
    }
}

#[cfg(test)]
mod runnable_tests {
    use super::super::events;
    use super::*;
    use serde_json::json;

    #[test]
    fn only_allowed_or_confirmed_unanswered_calls_need_a_worker() {
        let e = vec![
            json!({"id": "a", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "allow"}),
            json!({"id": "b", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "ask"}),
            json!({"id": "c", "type": "agent.tool_use", "name": "bash", "evaluated_permission": "ask"}),
            json!({"id": "d", "type": "agent.custom_tool_use", "name": "lookup"}),
            json!({"id": "e", "type": "agent.tool_use", "name": "bash"}),
            json!({"id": "x", "type": "user.tool_confirmation", "tool_use_id": "c", "result": "allow"}),
            json!({"id": "y", "type": "user.tool_result", "tool_use_id": "e"}),
        ];
        assert_eq!(
            runnable_worker_calls(&events(e.clone())),
            vec!["a".to_string(), "c".to_string()]
        );
        let mut over = e.clone();
        over.push(json!({"id": "z", "type": "session.status_terminated"}));
        assert!(
            runnable_worker_calls(&events(over.clone())).is_empty(),
            "a terminated Session needs no worker"
        );
    }
}
