//! Test harness: a real `mango` api (in-process, on 127.0.0.1:0) over the
//! fresh PostgreSQL database that `#[sqlx::test]` creates for each test.
//! `DATABASE_URL` must point at a server the tests may create databases on;
//! `make test` provides one.
#![allow(dead_code)]

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
        let ctx = ApiContext::new(db.clone(), settings);
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
        // Let the LISTEN connection come up before tests rely on wake-ups.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
