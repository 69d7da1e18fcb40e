//! Waiting on the agent loop's turns: a Session of an agent with tools, the
//! operator's input, and the events a turn leaves.

use crate::{user_message, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A Session of a new agent with `tools`, on the scripted model.
pub async fn session_with_tools(app: &TestApp, tools: Value) -> String {
    let agent = app
        .call(
            Method::POST,
            "/v1/agents",
            Some(&app.ws_key),
            Some(json!({"name": "a", "model": "claude-scripted", "system": "be brief", "tools": tools})),
        )
        .await;
    agent.expect(200);
    let s = app
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&app.ws_key),
            Some(json!({"agent": agent.body["id"], "environment_id": app.env_id})),
        )
        .await;
    s.expect(200);
    s.body["id"].as_str().unwrap().to_string()
}

/// The operator sends one `user.message`.
pub async fn say(app: &TestApp, session: &str, text: &str) {
    app.send(session, json!([user_message(text)]))
        .await
        .expect(200);
}

/// Waits (at most 20 s) until the Session's events satisfy `done`.
pub async fn until(
    app: &TestApp,
    session: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let e = app.all_events(session).await;
        if done(&e) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            types(&e)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The last event is an idle with this stop reason.
pub fn idle_with(events: &[Value], reason: &str) -> bool {
    events
        .last()
        .is_some_and(|e| e["type"] == "session.status_idle" && e["stop_reason"]["type"] == reason)
}
