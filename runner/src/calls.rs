//! What the runner knows about a Session's tool calls, built from events in
//! any order and any number of times (stream and history overlap after a
//! reconnect): pure, so the dispatch rules are testable without a server.

use mango_protocol::events::{Confirmation, Event, EventBody, Permission};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub input: Value,
    /// Absent counts as allow, unknown as ask.
    pub permission: Permission,
    pub thread_id: Option<String>,
}

/// Why the Session no longer needs this runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOver {
    Terminated,
}

#[derive(Debug, Default)]
pub struct Calls {
    /// Unanswered calls in the order the agent made them (by event sequence
    /// of first sight); an answer removes its call, so a long Session's
    /// dispatch scans only what is still open.
    calls: BTreeMap<u64, Call>,
    /// Where each call in `calls` sits.
    positions: HashMap<String, u64>,
    seen_events: HashSet<String>,
    order: u64,
    answered: HashSet<String>,
    allowed: HashSet<String>,
    denied: HashSet<String>,
    /// Threads that terminated: their open calls are dropped.
    dead_threads: HashSet<String>,
    /// Calls this runner started (whether or not their result came back yet).
    started: HashSet<String>,
    /// Set by an idle that ends the turn; cleared by any later event that counts.
    idle_since_end_turn: bool,
    over: Option<SessionOver>,
}

impl Calls {
    /// Folds one event in; repeated events are ignored.
    pub fn apply(&mut self, event: &Event) {
        let id = event.id.as_str();
        if !self.seen_events.insert(id.to_string()) {
            return;
        }
        match &event.body {
            EventBody::AgentToolUse(_) if self.answered.contains(id) => {}
            EventBody::AgentToolUse(call) => {
                self.order += 1;
                self.positions.insert(id.to_string(), self.order);
                self.calls.insert(
                    self.order,
                    Call {
                        id: id.to_string(),
                        name: call.name.clone(),
                        input: call.input.clone(),
                        permission: call.permission(),
                        thread_id: call.session_thread_id.clone(),
                    },
                );
            }
            EventBody::UserToolResult(result) => {
                let call = &result.tool_use_id;
                if let Some(position) = self.positions.remove(call) {
                    self.calls.remove(&position);
                }
                self.answered.insert(call.clone());
            }
            EventBody::UserToolConfirmation(c) => {
                match c.result {
                    Confirmation::Allow => self.allowed.insert(c.tool_use_id.clone()),
                    Confirmation::Deny => self.denied.insert(c.tool_use_id.clone()),
                };
            }
            EventBody::ThreadStatusTerminated(t) => {
                self.dead_threads.insert(t.session_thread_id.clone());
            }
            EventBody::SessionStatusTerminated | EventBody::SessionDeleted => {
                self.over = Some(SessionOver::Terminated)
            }
            _ => {}
        }
        // The idle countdown (SDK rule): an end-of-turn idle starts it; any
        // other event stops it, except confirmations and thread terminations.
        match &event.body {
            EventBody::SessionStatusIdle(idle) => {
                self.idle_since_end_turn = idle.stop_reason.ends_turn();
            }
            EventBody::UserToolConfirmation(_) | EventBody::ThreadStatusTerminated(_) => {}
            _ => self.idle_since_end_turn = false,
        }
    }

    /// The next call this runner should run: owned, not answered, not started,
    /// allowed (by policy or by a persisted confirmation), in a live thread.
    pub fn next_runnable(&self, owns: impl Fn(&str) -> bool) -> Option<Call> {
        self.calls
            .values()
            .find(|c| {
                owns(&c.name)
                    && !self.answered.contains(&c.id)
                    && !self.started.contains(&c.id)
                    && !self.denied.contains(&c.id)
                    && c.thread_id
                        .as_ref()
                        .is_none_or(|t| !self.dead_threads.contains(t))
                    && (c.permission == Permission::Allow
                        || (c.permission == Permission::Ask && self.allowed.contains(&c.id)))
            })
            .cloned()
    }

    pub fn mark_started(&mut self, call_id: &str) {
        self.started.insert(call_id.to_string());
    }

    pub fn is_idle_after_end_turn(&self) -> bool {
        self.idle_since_end_turn
    }

    pub fn over(&self) -> Option<SessionOver> {
        self.over
    }

    /// Calls not answered yet (run, waiting, denied or not ours).
    pub fn unanswered(&self) -> usize {
        self.calls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Folds a JSON event in, as the stream would deliver it.
    trait ApplyJson {
        fn apply_json(&mut self, event: Value);
    }

    impl ApplyJson for Calls {
        fn apply_json(&mut self, event: Value) {
            self.apply(&serde_json::from_value(event).expect("an event"));
        }
    }

    fn owns(name: &str) -> bool {
        ["bash", "read"].contains(&name)
    }

    fn tool_use(id: &str, name: &str, permission: Option<&str>) -> Value {
        let mut e =
            json!({"id": id, "type": "agent.tool_use", "name": name, "input": {"command": "echo"}});
        if let Some(p) = permission {
            e["evaluated_permission"] = json!(p);
        }
        e
    }

    #[test]
    fn permission_matrix() {
        let mut calls = Calls::default();
        calls.apply_json(tool_use("a", "bash", Some("allow")));
        calls.apply_json(tool_use("b", "bash", Some("ask")));
        calls.apply_json(tool_use("c", "bash", Some("deny")));
        calls.apply_json(tool_use("d", "bash", Some("something_new")));
        calls.apply_json(tool_use("e", "bash", None));
        assert_eq!(calls.next_runnable(owns).unwrap().id, "a");
        calls.mark_started("a");
        assert_eq!(
            calls.next_runnable(owns).unwrap().id,
            "e",
            "ask and unknown wait; deny never runs"
        );
        calls.mark_started("e");
        assert!(calls.next_runnable(owns).is_none());
        calls.apply_json(json!({"id": "x1", "type": "user.tool_confirmation", "tool_use_id": "b", "result": "allow"}));
        calls.apply_json(json!({"id": "x2", "type": "user.tool_confirmation", "tool_use_id": "d", "result": "deny"}));
        assert_eq!(calls.next_runnable(owns).unwrap().id, "b");
        calls.mark_started("b");
        assert!(
            calls.next_runnable(owns).is_none(),
            "a denied confirmation never runs"
        );
    }

    #[test]
    fn answered_unowned_and_dead_thread_calls_are_skipped_and_replays_are_harmless() {
        let mut calls = Calls::default();
        calls.apply_json(tool_use("a", "web_search", None));
        calls.apply_json(tool_use("b", "bash", None));
        calls.apply_json(json!({"id": "r", "type": "user.tool_result", "tool_use_id": "b"}));
        let mut child = tool_use("c", "read", None);
        child["session_thread_id"] = json!("thr_1");
        calls.apply_json(child);
        calls.apply_json(json!({"id": "t", "type": "session.thread_status_terminated", "session_thread_id": "thr_1"}));
        // History replayed after a reconnect changes nothing.
        calls.apply_json(tool_use("b", "bash", None));
        assert!(calls.next_runnable(owns).is_none());
    }

    #[test]
    fn answered_calls_are_forgotten_whichever_arrives_first() {
        let mut calls = Calls::default();
        for i in 0..1000 {
            let id = format!("call{i}");
            calls.apply_json(tool_use(&id, "bash", None));
            assert_eq!(calls.next_runnable(owns).unwrap().id, id);
            calls.mark_started(&id);
            calls.apply_json(
                json!({"id": format!("res{i}"), "type": "user.tool_result", "tool_use_id": id}),
            );
        }
        assert_eq!(calls.unanswered(), 0);
        // A result read before its call (history after a reconnect) keeps the call out.
        calls.apply_json(json!({"id": "early", "type": "user.tool_result", "tool_use_id": "late"}));
        calls.apply_json(tool_use("late", "bash", None));
        assert_eq!(calls.unanswered(), 0);
        assert!(calls.next_runnable(owns).is_none());
    }

    #[test]
    fn idle_countdown_and_termination() {
        let mut calls = Calls::default();
        calls.apply_json(json!({"id": "1", "type": "session.status_idle", "stop_reason": {"type": "requires_action"}}));
        assert!(!calls.is_idle_after_end_turn());
        calls.apply_json(
            json!({"id": "2", "type": "session.status_idle", "stop_reason": {"type": "end_turn"}}),
        );
        assert!(calls.is_idle_after_end_turn());
        calls.apply_json(json!({"id": "3", "type": "user.tool_confirmation", "tool_use_id": "z", "result": "allow"}));
        assert!(
            calls.is_idle_after_end_turn(),
            "confirmations leave the countdown alone"
        );
        calls.apply_json(json!({"id": "4", "type": "user.message"}));
        assert!(!calls.is_idle_after_end_turn());
        assert_eq!(calls.over(), None);
        calls.apply_json(json!({"id": "5", "type": "session.status_terminated"}));
        assert_eq!(calls.over(), Some(SessionOver::Terminated));
    }
}
