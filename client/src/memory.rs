//! The memory calls of a Session's runner (`/v1/memory_stores/{id}/memories`):
//! listing a store, reading a memory, and writing with `content_sha256`
//! preconditions. A lost precondition or a taken path comes back as a 409
//! with `x-should-retry: false`, so it is never retried. A write refused
//! for the token's write rate (429) is not retried either: the runner's
//! sync leaves the rest of its pass to a later one instead of waiting.

use crate::{Client, ClientError, Result};
use mango_protocol::memory::{Memory, MemoryListItem, MemoryPrecondition, MemoryView};
use mango_protocol::Page;
use reqwest::Method;
use serde_json::{json, Value};

fn memories(store: &str) -> String {
    format!("/v1/memory_stores/{store}/memories")
}

/// Retried like any call, except a 429.
fn retry_write(err: &ClientError) -> bool {
    err.is_transient() && err.status() != Some(reqwest::StatusCode::TOO_MANY_REQUESTS)
}

impl Client {
    /// One page of a store's memories (all of them, in path order).
    pub async fn list_memories(
        &self,
        store: &str,
        view: MemoryView,
        limit: u32,
        page: Option<&str>,
    ) -> Result<Page<MemoryListItem>> {
        let mut query = vec![
            ("view", view.as_str().to_string()),
            ("limit", limit.to_string()),
        ];
        if let Some(page) = page {
            query.push(("page", page.to_string()));
        }
        self.json(Method::GET, &memories(store), &query, None).await
    }

    /// A memory with its content.
    pub async fn memory(&self, store: &str, id: &str) -> Result<Memory> {
        self.json(
            Method::GET,
            &format!("{}/{id}", memories(store)),
            &[("view", "full".to_string())],
            None,
        )
        .await
    }

    /// A memory write: sent with the retry policy, a 429 excepted.
    async fn write(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response> {
        self.retrying_when(path, retry_write, || {
            self.send_once(method.clone(), path, query, body)
        })
        .await
    }

    async fn write_json(&self, path: &str, body: &Value) -> Result<Memory> {
        let resp = self.write(Method::POST, path, &[], Some(body)).await?;
        let bytes = resp.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(format!("{path}: {e}")))
    }

    pub async fn create_memory(&self, store: &str, path: &str, content: &str) -> Result<Memory> {
        let body = json!({"path": path, "content": content});
        self.write_json(&memories(store), &body).await
    }

    /// New content for memory `id`, only if it still has `expected_sha256`.
    pub async fn update_memory(
        &self,
        store: &str,
        id: &str,
        content: &str,
        expected_sha256: &str,
    ) -> Result<Memory> {
        let body = json!({"content": content,
                          "precondition": MemoryPrecondition::content_sha256(expected_sha256)});
        self.write_json(&format!("{}/{id}", memories(store)), &body)
            .await
    }

    /// Deletes memory `id`, only if it still has `expected_sha256`.
    pub async fn delete_memory(&self, store: &str, id: &str, expected_sha256: &str) -> Result<()> {
        self.write(
            Method::DELETE,
            &format!("{}/{id}", memories(store)),
            &[("expected_content_sha256", expected_sha256.to_string())],
            None,
        )
        .await?;
        Ok(())
    }
}
