//! Helpers shared by the runner's tests.
#![allow(dead_code)]

use mango_api::fixtures::LiveApi;
use mango_client::Client;
use mango_protocol::Work;
use serde_json::{json, Value};

/// An agent, a Session with one `user.message`, and its Work polled and acked
/// with the Environment key, as a supervisor would before starting a runner.
pub async fn session_with_work(api: &LiveApi) -> (String, Work) {
    session_with_work_for(api, json!({"name": "a", "model": "m"}), json!([])).await
}

/// [`session_with_work`] for an agent made from `agent` and a Session with `resources`.
pub async fn session_with_work_for(
    api: &LiveApi,
    agent: Value,
    resources: Value,
) -> (String, Work) {
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{}{path}", api.base))
            .bearer_auth(&api.workspace_key)
            .json(&body)
            .send()
    };
    let agent: Value = post("/v1/agents", agent)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session: Value = post(
        "/v1/sessions",
        json!({"agent": agent["id"], "environment_id": api.environment_id, "resources": resources,
               "initial_events": [{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let supervisor = Client::new(&api.base, &api.environment_key);
    let work = supervisor
        .poll(&api.environment_id, None, None)
        .await
        .unwrap()
        .expect("session work");
    supervisor.ack(&api.environment_id, &work.id).await.unwrap();
    (session["id"].as_str().unwrap().to_string(), work)
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
