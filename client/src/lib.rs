//! Typed client of the Mango API, one per credential: a Workspace key (operator
//! and tests), an Environment key (the supervisor), or a sessions token (the
//! item runner).
//!
//! Retry policy (spec §3, §8): transport errors, 408, 409, 429 and 5xx are
//! transient and retried with jittered exponential back-off; any other 4xx is
//! final, and so is an answer carrying `x-should-retry: false`.

mod memory;
mod sse;

pub use sse::{EventStream, StreamFrame};

use mango_protocol::events::{Event, SentEvent};
use mango_protocol::sessions::Session;
use mango_protocol::{
    DeletedSessions, Environment, ErrorCode, ErrorEnvelope, ErrorType, HeartbeatResponse, Page,
    QueueStats, Work, WorkClaims, WorkStopReason, NO_HEARTBEAT,
};
use rand::Rng;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::time::Duration;

/// The beta header every request carries.
const BETA_HEADER: &str = "managed-agents-2026-04-01";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error envelope.
    #[error("{status} {kind}: {message}")]
    Api {
        status: StatusCode,
        kind: String,
        message: String,
        error_code: Option<String>,
        details: Option<Value>,
        request_id: Option<String>,
        /// The server said a retry cannot change the answer.
        final_answer: bool,
    },
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("unexpected response: {0}")]
    Decode(String),
}

impl ClientError {
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn error_code(&self) -> Option<&str> {
        match self {
            ClientError::Api { error_code, .. } => error_code.as_deref(),
            _ => None,
        }
    }

    /// Worth retrying: transport failures, 408, 409, 429 and 5xx, unless the
    /// server said `x-should-retry: false`.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Decode(_) => false,
            ClientError::Api {
                status,
                final_answer,
                ..
            } => {
                !final_answer
                    && (status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 429))
            }
        }
    }

    /// A 412 `heartbeat_precondition_failed`: the lease belongs to someone else now.
    pub fn is_lease_lost(&self) -> bool {
        self.status() == Some(StatusCode::PRECONDITION_FAILED)
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// Jittered exponential back-off for transient failures.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub attempts: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Five retries after the first attempt, as the runner's contract says.
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// Delay before retry `n` (1-based): full jitter over an exponential ceiling.
    pub fn delay(&self, n: u32) -> Duration {
        let ceiling = self
            .first_delay
            .saturating_mul(1 << n.saturating_sub(1).min(16))
            .min(self.max_delay);
        let ms = ceiling.as_millis().max(1) as u64;
        Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms))
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// `base` parsed once, so a request only sets its path (parsing the
    /// whole URL, host included, was a few percent of the runner's CPU per
    /// tool call); `None` when it does not parse, and requests report that.
    base_url: Option<reqwest::Url>,
    credential: String,
    /// `Bearer <credential>`, marked sensitive so it never shows in a Debug string.
    authorization: Option<reqwest::header::HeaderValue>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for Client {
    // The credential is a secret: never in a Debug string, a log or a panic.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(base_url: &str, credential: &str) -> Client {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .expect("a plain HTTP client builds");
        let base = base_url.trim_end_matches('/').to_string();
        let authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {credential}"))
            .ok()
            .map(|mut value| {
                value.set_sensitive(true);
                value
            });
        let base_url = reqwest::Url::parse(&base)
            .ok()
            .filter(|u| !u.cannot_be_a_base());
        Client {
            http,
            base_url,
            base,
            credential: credential.to_string(),
            authorization,
            retry: RetryPolicy::default(),
        }
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Client {
        self.retry = retry;
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = match &self.base_url {
            Some(base) => {
                let mut url = base.clone();
                url.set_path(&format!("{}{path}", base.path().trim_end_matches('/')));
                self.http.request(method, url)
            }
            None => self.http.request(method, format!("{}{path}", self.base)),
        };
        let request = match &self.authorization {
            Some(value) => request.header(reqwest::header::AUTHORIZATION, value.clone()),
            None => request.bearer_auth(&self.credential),
        };
        request.header(
            "anthropic-beta",
            reqwest::header::HeaderValue::from_static(BETA_HEADER),
        )
    }

    /// Sends once; maps error envelopes to [`ClientError::Api`].
    async fn send_once(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response> {
        let mut req = self.request(method, path);
        if !query.is_empty() {
            // (An empty query still has reqwest re-serialise the URL.)
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(api_error(resp).await)
    }

    /// Sends with the retry policy.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response> {
        self.retrying(path, || self.send_once(method.clone(), path, query, body))
            .await
    }

    /// Makes `attempt` until it succeeds, fails for good, or the retry
    /// policy's attempts run out.
    async fn retrying<T, F, Fut>(&self, path: &str, attempt: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.retrying_when(path, ClientError::is_transient, attempt)
            .await
    }

    /// [`Client::retrying`], retrying only the errors `retry` picks.
    async fn retrying_when<T, F, Fut>(
        &self,
        path: &str,
        retry: fn(&ClientError) -> bool,
        attempt: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut n = 1;
        loop {
            match attempt().await {
                Err(err) if retry(&err) && n < self.retry.attempts => {
                    let delay = self.retry.delay(n);
                    tracing::debug!(%path, attempt = n, ?delay, error = %err, "retrying");
                    tokio::time::sleep(delay).await;
                    n += 1;
                }
                other => return other,
            }
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T> {
        let resp = self.send(method, path, query, body).await?;
        let bytes = resp.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(format!("{path}: {e}")))
    }

    // ------------------------------------------------------------ environments

    pub async fn create_environment(&self, name: &str) -> Result<Environment> {
        self.json(
            Method::POST,
            "/v1/environments",
            &[],
            Some(&json!({"name": name, "config": {"type": "self_hosted"}})),
        )
        .await
    }

    /// Every unarchived Environment of the workspace, newest first.
    pub async fn list_environments(&self) -> Result<Vec<Environment>> {
        self.all_pages("/v1/environments", 100).await
    }

    pub async fn environment(&self, id: &str) -> Result<Environment> {
        self.json(Method::GET, &format!("/v1/environments/{id}"), &[], None)
            .await
    }

    // ------------------------------------------------------------ work

    fn work_path(environment_id: &str, rest: &str) -> String {
        format!("/v1/environments/{environment_id}/work{rest}")
    }

    pub async fn create_healthcheck(&self, environment_id: &str) -> Result<Work> {
        self.json(
            Method::POST,
            &Self::work_path(environment_id, ""),
            &[],
            Some(&json!({"data": {"type": "healthcheck"}})),
        )
        .await
    }

    pub async fn work(&self, environment_id: &str, work_id: &str) -> Result<Work> {
        self.json(
            Method::GET,
            &Self::work_path(environment_id, &format!("/{work_id}")),
            &[],
            None,
        )
        .await
    }

    /// All pages of the Environment's Work, newest first.
    pub async fn list_work(&self, environment_id: &str) -> Result<Vec<Work>> {
        self.all_pages(&Self::work_path(environment_id, ""), 100)
            .await
    }

    /// One page of the Environment's Work, newest first: `limit` items at
    /// most (the api takes 1..=100), after the cursor `page` of an earlier one.
    pub async fn work_page(
        &self,
        environment_id: &str,
        limit: u32,
        page: Option<&str>,
    ) -> Result<Page<Work>> {
        self.page(&Self::work_path(environment_id, ""), limit, page, &[])
            .await
    }

    /// One page of `path` (`limit` and the cursor `page`, plus `extra` query
    /// parameters), with an empty `next_page` read as the last page.
    async fn page<T: DeserializeOwned>(
        &self,
        path: &str,
        limit: u32,
        page: Option<&str>,
        extra: &[(&str, String)],
    ) -> Result<Page<T>> {
        let mut query = vec![("limit", limit.to_string())];
        if let Some(p) = page {
            query.push(("page", p.to_string()));
        }
        query.extend(extra.iter().cloned());
        let mut got: Page<T> = self.json(Method::GET, path, &query, None).await?;
        got.next_page = got.next_page.filter(|p| !p.is_empty());
        Ok(got)
    }

    /// Follows `next_page` until the last page.
    async fn all_pages<T: DeserializeOwned>(&self, path: &str, limit: u32) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let got: Page<T> = self.page(path, limit, cursor.as_deref(), &[]).await?;
            out.extend(got.data);
            match got.next_page {
                Some(p) => cursor = Some(p),
                None => return Ok(out),
            }
        }
    }

    /// Poll (Environment key): `None` when nothing is available within `block_ms`.
    pub async fn poll(
        &self,
        environment_id: &str,
        block_ms: Option<u32>,
        worker_id: Option<&str>,
    ) -> Result<Option<Work>> {
        let mut query = Vec::new();
        if let Some(ms) = block_ms {
            query.push(("block_ms", ms.to_string()));
        }
        let path = Self::work_path(environment_id, "/poll");
        let mut attempt = 1;
        loop {
            let mut req = self.request(Method::GET, &path).query(&query);
            if let Some(w) = worker_id {
                req = req.header("anthropic-worker-id", w);
            }
            let result = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let bytes = resp.bytes().await?;
                    serde_json::from_slice::<Option<Work>>(&bytes)
                        .map_err(|e| ClientError::Decode(format!("poll: {e}")))
                }
                Ok(resp) => Err(api_error(resp).await),
                Err(e) => Err(e.into()),
            };
            match result {
                Err(err) if err.is_transient() && attempt < self.retry.attempts => {
                    tokio::time::sleep(self.retry.delay(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub async fn ack(&self, environment_id: &str, work_id: &str) -> Result<Work> {
        self.json(
            Method::POST,
            &Self::work_path(environment_id, &format!("/{work_id}/ack")),
            &[],
            None,
        )
        .await
    }

    /// Heartbeat (sessions token): `expected` is `None` on the first beat.
    pub async fn heartbeat(
        &self,
        environment_id: &str,
        work_id: &str,
        expected: Option<&str>,
        ttl_seconds: Option<u32>,
    ) -> Result<HeartbeatResponse> {
        let mut query = vec![(
            "expected_last_heartbeat",
            expected.unwrap_or(NO_HEARTBEAT).to_string(),
        )];
        if let Some(ttl) = ttl_seconds {
            query.push(("desired_ttl_seconds", ttl.to_string()));
        }
        self.json(
            Method::POST,
            &Self::work_path(environment_id, &format!("/{work_id}/heartbeat")),
            &query,
            None,
        )
        .await
    }

    /// Stop; an already-stopped item is not an error here (`Ok(false)`).
    pub async fn stop(&self, environment_id: &str, work_id: &str, force: bool) -> Result<bool> {
        self.stop_with(environment_id, work_id, json!({"force": force}))
            .await
    }

    /// The holder's forced Stop at its Session's idle end (`reason: idle`):
    /// the api records the item keepable, so its supervisor may keep the
    /// sandbox for the Session's next activation (spec §7.1). Sessions
    /// token only; `Ok(false)` when the item was already stopped.
    pub async fn stop_idle(&self, environment_id: &str, work_id: &str) -> Result<bool> {
        self.stop_with(
            environment_id,
            work_id,
            json!({"force": true, "reason": WorkStopReason::Idle}),
        )
        .await
    }

    async fn stop_with(&self, environment_id: &str, work_id: &str, body: Value) -> Result<bool> {
        let path = Self::work_path(environment_id, &format!("/{work_id}/stop"));
        match self.send(Method::POST, &path, &[], Some(&body)).await {
            Ok(_) => Ok(true),
            Err(err) if err.error_code() == Some(ErrorCode::WorkAlreadyStopped.as_str()) => {
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }

    pub async fn result(
        &self,
        environment_id: &str,
        work_id: &str,
        succeeded: bool,
        message: &str,
    ) -> Result<Work> {
        let status = if succeeded { "succeeded" } else { "failed" };
        let path = Self::work_path(environment_id, &format!("/{work_id}/result"));
        self.json(
            Method::POST,
            &path,
            &[],
            Some(&json!({"status": status, "message": message})),
        )
        .await
    }

    pub async fn fail(&self, environment_id: &str, work_id: &str, message: &str) -> Result<Work> {
        let path = Self::work_path(environment_id, &format!("/{work_id}/fail"));
        self.json(
            Method::POST,
            &path,
            &[],
            Some(&json!({"error": {"message": message}})),
        )
        .await
    }

    /// Where the items `ids` stand that this Environment key claimed
    /// (Mango's extension; the others are left out).
    pub async fn claims(&self, environment_id: &str, ids: &[String]) -> Result<WorkClaims> {
        let query: Vec<(&str, String)> = ids.iter().map(|id| ("ids[]", id.clone())).collect();
        self.json(
            Method::GET,
            &Self::work_path(environment_id, "/claims"),
            &query,
            None,
        )
        .await
    }

    /// Which of the Sessions `ids` no longer exist in the Environment
    /// (Mango's extension, Environment key).
    pub async fn deleted_sessions(
        &self,
        environment_id: &str,
        ids: &[String],
    ) -> Result<DeletedSessions> {
        let query: Vec<(&str, String)> = ids.iter().map(|id| ("ids[]", id.clone())).collect();
        self.json(
            Method::GET,
            &format!("/v1/environments/{environment_id}/sessions/deleted"),
            &query,
            None,
        )
        .await
    }

    pub async fn stats(&self, environment_id: &str) -> Result<QueueStats> {
        self.json(
            Method::GET,
            &Self::work_path(environment_id, "/stats"),
            &[],
            None,
        )
        .await
    }

    // ------------------------------------------------------------ sessions

    pub async fn session(&self, session_id: &str) -> Result<Session> {
        self.json(
            Method::GET,
            &format!("/v1/sessions/{session_id}"),
            &[],
            None,
        )
        .await
    }

    /// One page of the workspace's unarchived Sessions, newest first
    /// (`limit` 1..=100, `page` a `next_page` cursor of an earlier page).
    pub async fn sessions_page(&self, limit: u32, page: Option<&str>) -> Result<Page<Session>> {
        self.page("/v1/sessions", limit, page, &[]).await
    }

    /// The Session's newest event of type `type_name` (an
    /// `mango_protocol::events::types` name), if it has one.
    pub async fn latest_event(&self, session_id: &str, type_name: &str) -> Result<Option<Event>> {
        let path = format!("/v1/sessions/{session_id}/events");
        let extra = [
            ("order", "desc".to_string()),
            ("types[]", type_name.to_string()),
        ];
        let got: Page<Event> = self.page(&path, 1, None, &extra).await?;
        Ok(got.data.into_iter().next())
    }

    /// A custom Skill version (`version` may be `latest`), as a Session pins it.
    pub async fn skill_version(&self, skill_id: &str, version: &str) -> Result<Value> {
        self.json(
            Method::GET,
            &format!("/v1/skills/{skill_id}/versions/{version}"),
            &[],
            None,
        )
        .await
    }

    /// The archive of a Skill version (`GET …/versions/{version}/content`),
    /// its headers received, its body still to be read (streamed by the
    /// caller, which checks its length and digest). Transient failures
    /// before the headers are retried.
    pub async fn skill_content(&self, skill_id: &str, version: &str) -> Result<reqwest::Response> {
        let path = format!("/v1/skills/{skill_id}/versions/{version}/content");
        self.retrying(&path, || async {
            let resp = self
                .request(Method::GET, &path)
                .header(reqwest::header::ACCEPT, "application/binary")
                .send()
                .await?;
            if resp.status().is_success() {
                Ok(resp)
            } else {
                Err(api_error(resp).await)
            }
        })
        .await
    }

    /// A Memory Store a Session attaches.
    pub async fn memory_store(&self, memory_store_id: &str) -> Result<Value> {
        self.json(
            Method::GET,
            &format!("/v1/memory_stores/{memory_store_id}"),
            &[],
            None,
        )
        .await
    }

    /// Every event of the Session, oldest first, following `next_page`.
    pub async fn all_events(&self, session_id: &str) -> Result<Vec<Event>> {
        self.all_pages(&format!("/v1/sessions/{session_id}/events"), 1000)
            .await
    }

    /// Sends events; returns the stored (or, for a retried result, the original) events.
    pub async fn send_events(&self, session_id: &str, events: &[SentEvent]) -> Result<Vec<Event>> {
        #[derive(serde::Deserialize)]
        struct Sent {
            data: Option<Vec<Event>>,
        }
        let path = format!("/v1/sessions/{session_id}/events");
        let body = json!({ "events": events });
        let sent: Sent = self.json(Method::POST, &path, &[], Some(&body)).await?;
        Ok(sent.data.unwrap_or_default())
    }

    /// Opens the Session's event stream (no retry: callers reconnect and reconcile).
    pub async fn stream_events(&self, session_id: &str) -> Result<EventStream> {
        let resp = self
            .send_once(
                Method::GET,
                &format!("/v1/sessions/{session_id}/events/stream"),
                &[],
                None,
            )
            .await?;
        Ok(EventStream::new(resp))
    }
}

async fn api_error(resp: reqwest::Response) -> ClientError {
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap_or_default();
    error_from(status, &headers, &bytes)
}

/// An error answer as a [`ClientError::Api`], from its envelope if it has one.
fn error_from(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    bytes: &[u8],
) -> ClientError {
    let final_answer = headers
        .get("x-should-retry")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let header_id = headers
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match serde_json::from_slice::<ErrorEnvelope>(bytes) {
        Ok(env) => ClientError::Api {
            status,
            error_code: env.error_code().map(str::to_string),
            kind: env.error.kind,
            message: env.error.message,
            details: env.error.details.map(Value::Object),
            request_id: env.request_id.or(header_id),
            final_answer,
        },
        Err(_) => ClientError::Api {
            status,
            kind: ErrorType::ApiError.as_str().into(),
            message: String::from_utf8_lossy(bytes).chars().take(500).collect(),
            error_code: None,
            details: None,
            request_id: header_id,
            final_answer,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, final_answer: bool) -> ClientError {
        ClientError::Api {
            status: StatusCode::from_u16(status).unwrap(),
            kind: "x".into(),
            message: "m".into(),
            error_code: None,
            details: None,
            request_id: None,
            final_answer,
        }
    }

    fn built(client: &Client, path: &str) -> reqwest::Request {
        client.request(Method::GET, path).build().unwrap()
    }

    #[test]
    fn requests_go_under_the_base_url_with_the_credential() {
        for (base, expected) in [
            (
                "http://127.0.0.1:8080",
                "http://127.0.0.1:8080/v1/sessions/a%20b/events",
            ),
            (
                "http://api.example:9/",
                "http://api.example:9/v1/sessions/a%20b/events",
            ),
            (
                "http://h/prefix/",
                "http://h/prefix/v1/sessions/a%20b/events",
            ),
        ] {
            let client = Client::new(base, "tok");
            let request = built(&client, "/v1/sessions/a b/events");
            assert_eq!(request.url().as_str(), expected, "{base}");
            let auth = &request.headers()[reqwest::header::AUTHORIZATION];
            assert_eq!(auth, "Bearer tok");
            assert!(auth.is_sensitive());
            assert_eq!(
                request.headers()["anthropic-beta"],
                "managed-agents-2026-04-01"
            );
        }
        // A base that is not a URL fails the request, not the constructor.
        let client = Client::new("not a url", "tok");
        assert!(client.request(Method::GET, "/v1/x").build().is_err());
        assert!(!format!("{client:?}").contains("tok"));
    }

    #[test]
    fn transient_means_408_409_429_and_5xx_unless_the_server_says_final() {
        for s in [408, 409, 429, 500, 502, 503, 529] {
            assert!(api(s, false).is_transient(), "{s}");
            assert!(
                !api(s, true).is_transient(),
                "{s} with x-should-retry: false"
            );
        }
        for s in [400, 401, 403, 404, 412, 413, 422] {
            assert!(!api(s, false).is_transient(), "{s}");
        }
        assert!(api(412, false).is_lease_lost());
    }

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        let p = RetryPolicy {
            attempts: 10,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d1 = p.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = p.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            assert!(p.delay(30) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn error_answers_keep_their_envelope_or_become_api_errors() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("request-id", "req_1".parse().unwrap());
        let envelope = br#"{"type": "error", "error": {"type": "invalid_request_error",
            "message": "already stopped", "details": {"error_code": "work_already_stopped"}},
            "request_id": "req_2"}"#;
        let err = error_from(StatusCode::CONFLICT, &headers, envelope);
        assert_eq!(
            err.error_code(),
            Some(ErrorCode::WorkAlreadyStopped.as_str())
        );
        let ClientError::Api {
            kind, request_id, ..
        } = &err
        else {
            panic!("an api error: {err:?}")
        };
        assert_eq!(kind, "invalid_request_error");
        assert_eq!(request_id.as_deref(), Some("req_2"));
        // Not an envelope (a proxy's page): an `api_error` with the body's start.
        let err = error_from(
            StatusCode::BAD_GATEWAY,
            &headers,
            b"<html>bad gateway</html>",
        );
        let ClientError::Api {
            kind,
            message,
            error_code,
            request_id,
            ..
        } = &err
        else {
            panic!("an api error: {err:?}")
        };
        assert_eq!(kind, "api_error");
        assert_eq!(message, "<html>bad gateway</html>");
        assert_eq!(*error_code, None);
        assert_eq!(request_id.as_deref(), Some("req_1"));
    }

    #[test]
    fn debug_never_shows_the_credential() {
        let c = Client::new("http://x", "mango_st_secret");
        assert!(!format!("{c:?}").contains("secret"));
    }
}
