//! What a supervisor does before it starts an item runner, and reading what
//! the runner wrote.

use crate::{user_message, TestApp};
use mango_protocol::Work;
use reqwest::Method;
use serde_json::{json, Value};

/// An agent, a Session with one `user.message`, and its Work polled and acked
/// with the Environment key, as a supervisor would before starting a runner.
pub async fn session_with_work(api: &TestApp) -> (String, Work) {
    session_with_work_for(api, json!({"name": "a", "model": "m"}), json!([])).await
}

/// [`session_with_work`] for an agent made from `agent` and a Session with `resources`.
pub async fn session_with_work_for(
    api: &TestApp,
    agent: Value,
    resources: Value,
) -> (String, Work) {
    let agent = api
        .call(Method::POST, "/v1/agents", Some(&api.ws_key), Some(agent))
        .await;
    agent.expect(200);
    let session = api
        .post_session(
            json!({"agent": agent.body["id"], "environment_id": api.env_id,
                             "resources": resources, "initial_events": [user_message("go")]}),
        )
        .await;
    session.expect(200);
    let claim = api.claim_session_work().await;
    let work: Work = serde_json::from_value(claim.work).expect("a Work item");
    (session.body["id"].as_str().unwrap().to_string(), work)
}

/// The text of an event's content blocks, joined by newlines.
pub fn text_of(event: &Value) -> String {
    event["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
