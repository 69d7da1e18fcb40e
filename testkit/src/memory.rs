//! Memory Stores and their memories over HTTP, with the Workspace key
//! unless a call says otherwise.

use crate::{Reply, TestApp};
use reqwest::Method;
use serde_json::{json, Value};

/// Lowercase hex SHA-256 of `content`, as `content_sha256` is.
pub fn sha256_hex(content: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(content.as_bytes()))
}

impl TestApp {
    /// Creates a Memory Store; returns its id.
    pub async fn create_store(&self, name: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/memory_stores",
                Some(&self.ws_key),
                Some(json!({"name": name})),
            )
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// A call under `/v1/memory_stores/{store}` (`suffix` starts with `/` or `?`, or is empty).
    pub async fn store_call(
        &self,
        method: Method,
        store: &str,
        suffix: &str,
        credential: &str,
        body: Option<Value>,
    ) -> Reply {
        self.call(
            method,
            &format!("/v1/memory_stores/{store}{suffix}"),
            Some(credential),
            body,
        )
        .await
    }

    /// `POST …/memories` with `credential`.
    pub async fn create_memory_as(
        &self,
        store: &str,
        path: &str,
        content: &str,
        credential: &str,
    ) -> Reply {
        self.store_call(
            Method::POST,
            store,
            "/memories",
            credential,
            Some(json!({"path": path, "content": content})),
        )
        .await
    }

    /// Creates a memory with the Workspace key; returns it (`view=basic`).
    pub async fn create_memory(&self, store: &str, path: &str, content: &str) -> Value {
        let r = self
            .create_memory_as(store, path, content, &self.ws_key.clone())
            .await;
        r.expect(200);
        r.body
    }

    /// Every memory of a store (`view=basic`), following `next_page`.
    pub async fn all_memories(&self, store: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut page = String::new();
        loop {
            let r = self
                .store_call(
                    Method::GET,
                    store,
                    &format!("/memories?limit=100{page}"),
                    &self.ws_key.clone(),
                    None,
                )
                .await;
            r.expect(200);
            out.extend(r.body["data"].as_array().unwrap().iter().cloned());
            match r.body["next_page"].as_str() {
                Some(p) if !p.is_empty() => page = format!("&page={}", crate::urlencode(p)),
                _ => return out,
            }
        }
    }

    /// A Session of a new Agent (the scripted model, `tools`) attaching
    /// `resources`; returns the Session.
    pub async fn session_with_resources(&self, tools: Value, resources: Value) -> Value {
        let agent = self
            .call(
                Method::POST,
                "/v1/agents",
                Some(&self.ws_key),
                Some(json!({"name": "a", "model": "claude-scripted", "tools": tools})),
            )
            .await;
        agent.expect(200);
        let session = self
            .post_session(
                json!({"agent": agent.body["id"], "environment_id": self.env_id,
                                 "resources": resources}),
            )
            .await;
        session.expect(200);
        session.body
    }

    /// The memory at `path`, with its content, if the store has one.
    pub async fn memory_at(&self, store: &str, path: &str) -> Option<Value> {
        let listed = self.all_memories(store).await;
        let id = listed.iter().find(|m| m["path"] == path)?["id"]
            .as_str()?
            .to_string();
        let r = self
            .store_call(
                Method::GET,
                store,
                &format!("/memories/{id}"),
                &self.ws_key.clone(),
                None,
            )
            .await;
        r.expect(200);
        Some(r.body)
    }
}
