//! Agents, Sessions and their events over HTTP, with the Workspace key
//! unless a call says otherwise.

use crate::{urlencode, Reply, TestApp};
use reqwest::Method;
use serde_json::{json, Value};

/// A text `user.message` event.
pub fn user_message(text: &str) -> Value {
    json!({"type": "user.message", "content": [{"type": "text", "text": text}]})
}

/// The `id`s of a list page's `data`.
pub fn data_ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap_or_else(|| panic!("expected a page, got {page}"))
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

impl TestApp {
    /// Creates an Agent with the Workspace key; returns its id.
    pub async fn create_agent(&self, name: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/agents",
                Some(&self.ws_key),
                Some(json!({"name": name, "model": "m"})),
            )
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// `POST /v1/sessions` with the Workspace key.
    pub async fn post_session(&self, body: Value) -> Reply {
        self.call(Method::POST, "/v1/sessions", Some(&self.ws_key), Some(body))
            .await
    }

    /// Creates a Session of a new Agent on `env_id`; returns its id.
    pub async fn create_session(&self) -> String {
        let agent = self.create_agent("session agent").await;
        self.create_session_for(&agent).await
    }

    pub async fn create_session_for(&self, agent: &str) -> String {
        let r = self
            .post_session(json!({"agent": agent, "environment_id": self.env_id}))
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// Deletes Session `id` with the Workspace key (it must have no live Work).
    pub async fn delete_session(&self, id: &str) {
        self.call(
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            Some(&self.ws_key),
            None,
        )
        .await
        .expect(200);
    }

    /// `POST /v1/sessions/{id}/events` with `credential`.
    pub async fn send_as(&self, session: &str, credential: &str, events: Value) -> Reply {
        self.call(
            Method::POST,
            &format!("/v1/sessions/{session}/events"),
            Some(credential),
            Some(json!({ "events": events })),
        )
        .await
    }

    /// `POST /v1/sessions/{id}/events` with the Workspace key.
    pub async fn send(&self, session: &str, events: Value) -> Reply {
        self.send_as(session, &self.ws_key.clone(), events).await
    }

    /// `GET /v1/sessions/{id}/events{query}` with the Workspace key.
    pub async fn list_events(&self, session: &str, query: &str) -> Reply {
        self.call(
            Method::GET,
            &format!("/v1/sessions/{session}/events{query}"),
            Some(&self.ws_key),
            None,
        )
        .await
    }

    /// Every event of a Session, ascending, following `next_page`.
    pub async fn all_events(&self, session: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let q = match &page {
                Some(p) => format!("?limit=1000&page={}", urlencode(p)),
                None => "?limit=1000".to_string(),
            };
            let r = self.list_events(session, &q).await;
            r.expect(200);
            out.extend(r.body["data"].as_array().unwrap().iter().cloned());
            match r.body["next_page"].as_str() {
                Some(p) if !p.is_empty() => page = Some(p.to_string()),
                _ => return out,
            }
        }
    }
}
