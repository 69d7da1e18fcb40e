//! The HTTP calls of a simulated worker and operator, lean on purpose: the
//! client's own CPU is part of what `lease` and `events` measure.

use anyhow::{bail, Context};
use mango_protocol::content::ContentBlock;
use mango_protocol::events::{SentEvent, UserMessage};
use mango_testkit::work::try_sessions_token;
use mango_testkit::{urlencode, TestApp};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

/// A polled item: its id and the sessions token decoded from its secret.
pub struct Claim {
    pub id: String,
    pub token: String,
}

#[derive(Deserialize)]
struct Polled {
    id: String,
    secret: Option<String>,
}

#[derive(Deserialize)]
struct Beat {
    last_heartbeat: String,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

pub fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()?)
}

/// The HTTP calls of a worker and an operator.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// `{base}/v1/environments/{env_id}/work`
    work_url: String,
    ws_key: String,
    env_key: String,
}

impl Api {
    /// The calls against `app`'s Environment, with its keys, over `http`.
    pub fn new(http: reqwest::Client, app: &TestApp) -> Api {
        Api {
            http,
            work_url: format!("{}/v1/environments/{}/work", app.base, app.env_id),
            ws_key: app.ws_key.clone(),
            env_key: app.env_key.clone(),
        }
    }

    /// The same calls over a client of their own, whose connections are
    /// driven by whichever runtime first uses it.
    pub fn with_new_client(&self) -> anyhow::Result<Api> {
        Ok(Api {
            http: http_client()?,
            ..self.clone()
        })
    }

    /// The same calls against Environment `env_id`, with its key `env_key`.
    pub fn on_environment(&self, env_id: &str, env_key: &str) -> Api {
        Api {
            work_url: format!("{}/environments/{env_id}/work", self.v1()),
            env_key: env_key.to_string(),
            ..self.clone()
        }
    }

    pub fn env_key(&self) -> &str {
        &self.env_key
    }

    /// Poll with the Environment key; `query` is e.g. `""` or `"?block_ms=999"`.
    pub async fn poll(&self, query: &str, worker_id: &str) -> anyhow::Result<Option<Claim>> {
        let reply = self
            .http
            .get(format!("{}/poll{query}", self.work_url))
            .bearer_auth(&self.env_key)
            .header("Anthropic-Worker-ID", worker_id)
            .send()
            .await?;
        let status = reply.status();
        let bytes = reply.bytes().await?;
        if status != StatusCode::OK {
            bail!("poll: {status} {}", String::from_utf8_lossy(&bytes));
        }
        let Some(polled) = serde_json::from_slice::<Option<Polled>>(&bytes)? else {
            return Ok(None);
        };
        let secret = polled.secret.context("Poll returned no secret")?;
        Ok(Some(Claim {
            id: polled.id,
            token: try_sessions_token(&secret)?,
        }))
    }

    /// Poll with the Environment key, as a supervisor does: the whole item,
    /// secret included; `query` is e.g. `"?block_ms=999"`.
    pub async fn poll_work(
        &self,
        query: &str,
        worker_id: &str,
    ) -> anyhow::Result<Option<mango_protocol::Work>> {
        let reply = self
            .http
            .get(format!("{}/poll{query}", self.work_url))
            .bearer_auth(&self.env_key)
            .header("Anthropic-Worker-ID", worker_id)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, "poll").await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub async fn ack(&self, id: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/{id}/ack", self.work_url))
            .bearer_auth(&self.env_key)
            .send()
            .await?;
        expect(reply, StatusCode::OK, "ack").await.map(drop)
    }

    /// One beat; returns the `last_heartbeat` to echo next time.
    pub async fn heartbeat(&self, claim: &Claim, expected: &str) -> anyhow::Result<String> {
        let expected = urlencode(expected);
        let reply = self
            .http
            .post(format!(
                "{}/{}/heartbeat?expected_last_heartbeat={expected}",
                self.work_url, claim.id
            ))
            .bearer_auth(&claim.token)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, "heartbeat").await?;
        Ok(serde_json::from_slice::<Beat>(&bytes)?.last_heartbeat)
    }

    /// The holder's own final, forced Stop.
    pub async fn stop(&self, claim: &Claim) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/{}/stop", self.work_url, claim.id))
            .bearer_auth(&claim.token)
            .json(&json!({"force": true}))
            .send()
            .await?;
        expect(reply, StatusCode::NO_CONTENT, "stop")
            .await
            .map(drop)
    }

    /// `{base}/v1`, derived from the Work URL.
    fn v1(&self) -> &str {
        let end = self.work_url.find("/v1/").map_or(0, |i| i + 3);
        &self.work_url[..end]
    }

    /// POST `{base}/v1/{path}` with the Workspace key; returns the new `id`.
    async fn create(&self, path: &str, body: Value) -> anyhow::Result<String> {
        let reply = self
            .http
            .post(format!("{}/{path}", self.v1()))
            .bearer_auth(&self.ws_key)
            .json(&body)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, path).await?;
        Ok(serde_json::from_slice::<Created>(&bytes)?.id)
    }

    /// Creates an Agent; returns its id.
    pub async fn create_agent(&self, name: &str) -> anyhow::Result<String> {
        self.create("agents", json!({"name": name, "model": "m"}))
            .await
    }

    /// Creates an Agent of model `model` with the agent toolset (`bash`
    /// and the other workspace tools); returns its id.
    pub async fn create_agent_with_tools(&self, name: &str, model: &str) -> anyhow::Result<String> {
        self.create(
            "agents",
            json!({"name": name, "model": model,
                   "tools": [{"type": "agent_toolset_20260401"}]}),
        )
        .await
    }

    /// Stops Work `id` at once (`force`), with the Workspace key.
    pub async fn force_stop(&self, id: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/{id}/stop", self.work_url))
            .bearer_auth(&self.ws_key)
            .json(&json!({"force": true}))
            .send()
            .await?;
        expect(reply, StatusCode::NO_CONTENT, "stop")
            .await
            .map(drop)
    }

    /// Deletes Session `session`, and with it its Work: none is made for it
    /// again.
    pub async fn delete_session(&self, session: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .delete(format!("{}/sessions/{session}", self.v1()))
            .bearer_auth(&self.ws_key)
            .send()
            .await?;
        expect(reply, StatusCode::OK, "delete session")
            .await
            .map(drop)
    }

    /// Creates an idle Session of `agent` in `environment_id`; returns its id.
    pub async fn create_session(
        &self,
        agent: &str,
        environment_id: &str,
    ) -> anyhow::Result<String> {
        self.create(
            "sessions",
            json!({"agent": agent, "environment_id": environment_id}),
        )
        .await
    }

    /// Creates an idle Session of `agent` attaching Memory Store `store`
    /// read-write; returns its id and the store's `mount_path`.
    pub async fn create_session_attaching(
        &self,
        agent: &str,
        environment_id: &str,
        store: &str,
    ) -> anyhow::Result<(String, String)> {
        let reply = self
            .http
            .post(format!("{}/sessions", self.v1()))
            .bearer_auth(&self.ws_key)
            .json(&json!({"agent": agent, "environment_id": environment_id,
                "resources": [{"type": "memory_store", "memory_store_id": store, "access": "read_write"}]}))
            .send()
            .await?;
        let session: Value =
            serde_json::from_slice(&expect(reply, StatusCode::OK, "sessions").await?)?;
        let id = session["id"].as_str().context("a Session without id")?;
        let mount = session["resources"][0]["mount_path"]
            .as_str()
            .context("the attached store has no mount_path")?;
        Ok((id.to_string(), mount.to_string()))
    }

    /// Sends one `user.message` carrying `text` to Session `session` with the Workspace key.
    pub async fn send_message(&self, session: &str, text: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/sessions/{session}/events", self.v1()))
            .bearer_auth(&self.ws_key)
            .json(&json!({"events": [SentEvent::UserMessage(UserMessage {
                content: vec![ContentBlock::Text { text: text.to_string() }],
            })]}))
            .send()
            .await?;
        expect(reply, StatusCode::OK, "send events").await.map(drop)
    }

    /// Sends `events` to Session `session` with `credential` (e.g. a sessions token).
    pub async fn send_events_as(
        &self,
        session: &str,
        credential: &str,
        events: Vec<Value>,
    ) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/sessions/{session}/events", self.v1()))
            .bearer_auth(credential)
            .json(&json!({ "events": events }))
            .send()
            .await?;
        expect(reply, StatusCode::OK, "send events").await.map(drop)
    }

    /// Opens Session `session`'s event stream with the Workspace key; the
    /// response headers have arrived (the server subscribed before answering).
    pub async fn open_stream(&self, session: &str) -> anyhow::Result<reqwest::Response> {
        let reply = self
            .http
            .get(format!("{}/sessions/{session}/events/stream", self.v1()))
            .bearer_auth(&self.ws_key)
            .send()
            .await?;
        let status = reply.status();
        if status != StatusCode::OK {
            let bytes = reply.bytes().await.unwrap_or_default();
            bail!("stream: {status} {}", String::from_utf8_lossy(&bytes));
        }
        Ok(reply)
    }

    /// Creates a healthcheck with the Workspace key; returns its id.
    pub async fn create_check(&self) -> anyhow::Result<String> {
        let reply = self
            .http
            .post(&self.work_url)
            .bearer_auth(&self.ws_key)
            .json(&json!({"data": {"type": "healthcheck"}}))
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::CREATED, "create").await?;
        Ok(serde_json::from_slice::<Created>(&bytes)?.id)
    }
}

async fn expect(reply: reqwest::Response, want: StatusCode, what: &str) -> anyhow::Result<Vec<u8>> {
    let status = reply.status();
    let bytes = reply.bytes().await?;
    if status != want {
        bail!(
            "{what}: expected {want}, got {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    Ok(bytes.to_vec())
}
