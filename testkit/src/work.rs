//! The Work lease calls: a supervisor's (Poll, Ack with the Environment key),
//! a worker's (heartbeats with the sessions token) and an operator's.

use crate::{urlencode, Reply, TestApp};
use anyhow::Context;
use base64::Engine;
use mango_protocol::WorkSecret;
use reqwest::Method;
use serde_json::{json, Value};

/// A polled item: the Work JSON and the sessions token decoded from its secret.
pub struct Claim {
    pub work: Value,
    pub id: String,
    pub token: String,
}

pub fn claim_of(work: Value) -> Claim {
    let secret = work["secret"].as_str().expect("Poll returns a secret");
    let token = sessions_token(secret);
    Claim {
        id: work["id"].as_str().unwrap().to_string(),
        work,
        token,
    }
}

/// Decodes a Work secret the way the SDK does.
pub fn sessions_token(secret: &str) -> String {
    try_sessions_token(secret).unwrap_or_else(|err| panic!("{err:#}"))
}

/// [`sessions_token`], or why `secret` is not a Work secret.
pub fn try_sessions_token(secret: &str) -> anyhow::Result<String> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(secret)
        .context("URL-safe base64 without padding")?;
    let payload: WorkSecret =
        serde_json::from_slice(&raw).context("a JSON payload with a sessions_token")?;
    Ok(payload.sessions_token)
}

impl TestApp {
    pub fn work_path(&self, suffix: &str) -> String {
        format!("/v1/environments/{}/work{suffix}", self.env_id)
    }

    /// Creates a healthcheck with the Workspace key; returns its id.
    pub async fn create_check(&self) -> String {
        let r = self
            .call(
                Method::POST,
                &self.work_path(""),
                Some(&self.ws_key),
                Some(json!({"data": {"type": "healthcheck"}})),
            )
            .await;
        r.expect(201);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// Non-blocking Poll with the Environment key; `None` on an empty queue.
    pub async fn poll(&self) -> Option<Claim> {
        self.poll_query("").await
    }

    pub async fn poll_query(&self, query: &str) -> Option<Claim> {
        let r = self
            .call(
                Method::GET,
                &self.work_path(&format!("/poll{query}")),
                Some(&self.env_key),
                None,
            )
            .await;
        r.expect(200);
        if r.body.is_null() {
            return None;
        }
        Some(claim_of(r.body))
    }

    pub async fn ack(&self, id: &str) -> Reply {
        self.call(
            Method::POST,
            &self.work_path(&format!("/{id}/ack")),
            Some(&self.env_key),
            None,
        )
        .await
    }

    pub async fn heartbeat(&self, id: &str, token: &str, expected: &str) -> Reply {
        let q = format!(
            "/{id}/heartbeat?expected_last_heartbeat={}",
            urlencode(expected)
        );
        self.call(Method::POST, &self.work_path(&q), Some(token), None)
            .await
    }

    /// Poll → Ack → first heartbeat: an active lease. Returns the claim and its last_heartbeat.
    pub async fn active_check(&self) -> (Claim, String) {
        self.create_check().await;
        let claim = self.poll().await.expect("an item to claim");
        self.ack(&claim.id).await.expect(200);
        let hb = self
            .heartbeat(&claim.id, &claim.token, "NO_HEARTBEAT")
            .await;
        hb.expect(200);
        let last = hb.body["last_heartbeat"].as_str().unwrap().to_string();
        (claim, last)
    }

    pub async fn get_work(&self, id: &str) -> Value {
        let r = self
            .call(
                Method::GET,
                &self.work_path(&format!("/{id}")),
                Some(&self.ws_key),
                None,
            )
            .await;
        r.expect(200);
        r.body
    }

    /// Poll → Ack for the Session Work in the queue; returns the claim.
    pub async fn claim_session_work(&self) -> Claim {
        let claim = self.poll().await.expect("session Work to claim");
        assert_eq!(claim.work["data"]["type"], "session", "{}", claim.work);
        self.ack(&claim.id).await.expect(200);
        claim
    }

    /// Stops a Work item with the Workspace key (`force`: at once, not by lease).
    pub async fn stop_work(&self, work_id: &str, force: bool) {
        self.call(
            Method::POST,
            &self.work_path(&format!("/{work_id}/stop")),
            Some(&self.ws_key),
            Some(json!({ "force": force })),
        )
        .await
        .expect(204);
    }
}
