//! Test harness: a real `mango` api (in-process, on 127.0.0.1:0) over the
//! fresh PostgreSQL database that `#[sqlx::test]` creates for each test.
//! `DATABASE_URL` must point at a server the tests may create databases on;
//! `make test` provides one.
#![allow(dead_code)]

pub mod turns;

use base64::Engine;
use mango_api::store::keys;
use mango_api::{server, ApiContext, Settings};
use mango_protocol::time;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::PgPool;

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub db: PgPool,
    pub ctx: ApiContext,
    /// A Workspace key of `wrkspc_default`.
    pub ws_key: String,
    pub env_id: String,
    /// An Environment key bound to `env_id`.
    pub env_key: String,
    pub env_key_id: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    /// `details.error_code` of an error envelope.
    pub fn code(&self) -> Option<&str> {
        self.body["error"]["details"]["error_code"].as_str()
    }
    pub fn error_type(&self) -> Option<&str> {
        self.body["error"]["type"].as_str()
    }
    /// Asserts the status and that an error reply is a complete envelope.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.body
        );
        if status >= 400 {
            assert_eq!(self.body["type"], "error", "error envelope: {}", self.body);
            assert!(
                self.body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{}",
                self.body
            );
            assert!(
                self.body["request_id"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("req_")),
                "{}",
                self.body
            );
            assert_eq!(
                self.headers.get("request-id").and_then(|v| v.to_str().ok()),
                self.body["request_id"].as_str(),
                "request-id header matches the body"
            );
        }
        self
    }
}

/// A polled item: the Work JSON and the sessions token decoded from its secret.
pub struct Claim {
    pub work: Value,
    pub id: String,
    pub token: String,
}

impl TestApp {
    pub async fn start(db: PgPool) -> TestApp {
        Self::start_with(db, Settings::default()).await
    }

    pub async fn start_with(db: PgPool, settings: Settings) -> TestApp {
        // The server runs as `mango serve` does, as a named api process; the
        // test's own pool (`db`) writes as another process would.
        let pool = mango_api::db::api_pool(&db, 16).await.unwrap();
        let ctx = ApiContext::new(pool, settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let serve_ctx = ctx.clone();
        tokio::spawn(async move {
            server::serve(serve_ctx, listener, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        let (_, ws_key) = keys::create(&db, "wrkspc_default", None, "test operator", time::now())
            .await
            .unwrap();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let mut app = TestApp {
            base,
            http,
            db,
            ctx,
            ws_key,
            env_id: String::new(),
            env_key: String::new(),
            env_key_id: String::new(),
            _shutdown: tx,
        };
        app.env_id = app.create_environment("test env").await;
        let (key, secret) = app.environment_key(&app.env_id.clone()).await;
        app.env_key = secret;
        app.env_key_id = key;
        app.ctx.until_listening().await;
        app
    }

    pub async fn create_environment(&self, name: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/environments",
                Some(&self.ws_key),
                Some(json!({"name": name})),
            )
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// (key id, secret) of a new Environment key bound to `env`.
    pub async fn environment_key(&self, env: &str) -> (String, String) {
        let (row, secret) = keys::create(
            &self.db,
            "wrkspc_default",
            Some(env),
            "test supervisor",
            time::now(),
        )
        .await
        .unwrap();
        (row.id, secret)
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        credential: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = credential {
            req = req.bearer_auth(c);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        Self::reply(req.send().await.unwrap()).await
    }

    /// Sends `raw` bytes as the body with a JSON content type.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        credential: Option<&str>,
        raw: &str,
    ) -> Reply {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(raw.to_string());
        if let Some(c) = credential {
            req = req.bearer_auth(c);
        }
        Self::reply(req.send().await.unwrap()).await
    }

    async fn reply(resp: reqwest::Response) -> Reply {
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

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
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(secret)
        .expect("URL-safe base64 without padding");
    let payload: Value = serde_json::from_slice(&raw).expect("JSON payload");
    payload["sessions_token"]
        .as_str()
        .expect("sessions_token")
        .to_string()
}

pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

// ------------------------------------------------------------------ sessions

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

    /// Session `session` deleted in a transaction left open: it holds the
    /// Session's row (and its log's) until committed.
    pub async fn delete_session_uncommitted(
        &self,
        session: &str,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut deleting = self.db.begin().await.unwrap();
        assert!(
            mango_api::store::sessions::delete(&mut *deleting, "wrkspc_default", session)
                .await
                .unwrap()
        );
        deleting
    }

    /// Lets `racing`, a task that will wait for a row `holder` locks, through:
    /// waits until it is blocked, commits `holder`, and returns what `racing`
    /// returned (within 5 s; `what` names it in the failure).
    pub async fn commit_past<T>(
        &self,
        holder: sqlx::Transaction<'static, sqlx::Postgres>,
        racing: tokio::task::JoinHandle<T>,
        what: &str,
    ) -> T {
        self.until_a_lock_wait().await;
        holder.commit().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), racing)
            .await
            .unwrap_or_else(|_| panic!("{what} finishes once the row is free"))
            .unwrap()
    }

    /// Until some statement of this database waits for a row lock.
    pub async fn until_a_lock_wait(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&self.db)
                .await
                .unwrap();
                if waiting > 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a statement waits for a row lock");
    }

    /// Count of rows in `table` for `session` (`session_id` column).
    pub async fn count_for(&self, table: &str, session: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE session_id = $1"
        ))
        .bind(session)
        .fetch_one(&self.db)
        .await
        .unwrap()
    }

    /// (event rows, Work rows, outbox rows) of a Session.
    pub async fn session_counts(&self, session: &str) -> (i64, i64, i64) {
        (
            self.count_for("session_events", session).await,
            self.count_for("work", session).await,
            self.count_for("outbox", session).await,
        )
    }

    /// `(id, state)` of every Work row of a Session, oldest first.
    pub async fn session_work(&self, session: &str) -> Vec<(String, String)> {
        sqlx::query_as("SELECT id, state FROM work WHERE session_id = $1 ORDER BY created_at, id")
            .bind(session)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }

    /// Opens `GET /v1/sessions/{id}/events/stream` with `credential`.
    pub async fn open_stream(&self, session: &str, credential: &str) -> reqwest::Response {
        self.http
            .get(format!("{}/v1/sessions/{session}/events/stream", self.base))
            .bearer_auth(credential)
            .send()
            .await
            .unwrap()
    }
}

/// One SSE frame: its `event:` name (if any) and its joined `data:` lines.
#[derive(Debug, Clone)]
pub struct Frame {
    pub event: Option<String>,
    pub data: String,
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("frame data is not JSON ({e}): {:?}", self.data))
    }
}

/// Reads SSE frames from a response, splitting on blank lines.
pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
    done: bool,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> SseReader {
        SseReader {
            resp,
            buf: Vec::new(),
            done: false,
        }
    }

    fn take_frame(&mut self) -> Option<String> {
        // axum writes `\n` line endings; a frame ends at the first blank line.
        let at = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let frame = String::from_utf8_lossy(&self.buf[..at]).into_owned();
        self.buf.drain(..at + 2);
        Some(frame)
    }

    /// The next complete frame (comment-only frames skipped); `None` when the stream ends.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            while let Some(raw) = self.take_frame() {
                let mut event = None;
                let mut data: Vec<String> = Vec::new();
                let mut any = false;
                for line in raw.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    any = true;
                    let (field, value) = match line.split_once(':') {
                        Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                        None => (line, ""),
                    };
                    match field {
                        "event" => event = Some(value.to_string()),
                        "data" => data.push(value.to_string()),
                        _ => {}
                    }
                }
                if any {
                    return Some(Frame {
                        event,
                        data: data.join("\n"),
                    });
                }
            }
            if self.done {
                return None;
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.buf.extend_from_slice(&bytes),
                Ok(None) | Err(_) => self.done = true,
            }
        }
    }

    /// The next non-ping frame.
    pub async fn next_event(&mut self) -> Option<Frame> {
        loop {
            let f = self.next_frame().await?;
            if f.event.as_deref() != Some("ping") {
                return Some(f);
            }
        }
    }
}
