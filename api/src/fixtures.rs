//! A real api for other crates' tests: served in-process on 127.0.0.1 over a
//! database the test owns, with a Workspace key, an Environment and its key.

use crate::store::keys;
use crate::{server, ApiContext, Settings};
use mango_protocol::time;
use sqlx::PgPool;

pub struct LiveApi {
    pub base: String,
    pub db: PgPool,
    pub workspace_key: String,
    pub environment_id: String,
    pub environment_key: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl LiveApi {
    pub async fn start(db: PgPool) -> LiveApi {
        Self::start_with(db, Settings::default()).await
    }

    pub async fn start_with(db: PgPool, settings: Settings) -> LiveApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // The server runs as `mango serve` does, as a named api process; the
        // test's own pool (`db`) writes as another process would.
        let pool = crate::db::api_pool(&db, 16)
            .await
            .expect("an api pool on the test database");
        let ctx = ApiContext::new(pool, settings);
        let ready = ctx.clone();
        tokio::spawn(async move {
            let _ = server::serve(ctx, listener, async {
                let _ = rx.await;
            })
            .await;
        });
        let (_, workspace_key) =
            keys::create(&db, "wrkspc_default", None, "fixture operator", time::now())
                .await
                .expect("a workspace key");
        let env: serde_json::Value = reqwest::Client::new()
            .post(format!("{base}/v1/environments"))
            .bearer_auth(&workspace_key)
            .json(&serde_json::json!({"name": "fixture"}))
            .send()
            .await
            .expect("the api answers")
            .json()
            .await
            .expect("an Environment");
        let environment_id = env["id"].as_str().expect("an Environment id").to_string();
        let (_, environment_key) = keys::create(
            &db,
            "wrkspc_default",
            Some(&environment_id),
            "fixture supervisor",
            time::now(),
        )
        .await
        .expect("an Environment key");
        ready.until_listening().await;
        LiveApi {
            base,
            db,
            workspace_key,
            environment_id,
            environment_key,
            _shutdown: tx,
        }
    }
}

/// A scripted stand-in for a Messages API endpoint: answers `POST /v1/messages`
/// with the queued replies in order (status, body) and records every request.
/// One queued reply: status, body and how long to wait before answering.
type Scripted = (u16, serde_json::Value, std::time::Duration);

pub struct ScriptedModel {
    pub base: String,
    replies: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Scripted>>>,
    requests: std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, serde_json::Value)>>>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl ScriptedModel {
    pub async fn start(replies: Vec<(u16, serde_json::Value)>) -> ScriptedModel {
        use axum::extract::State;
        type Shared = (
            std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Scripted>>>,
            std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, serde_json::Value)>>>,
        );
        let queue = std::sync::Arc::new(std::sync::Mutex::new(
            replies
                .into_iter()
                .map(|(status, body)| (status, body, std::time::Duration::ZERO))
                .collect(),
        ));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route(
                "/v1/messages",
                axum::routing::post(
                    |State((queue, seen)): State<Shared>, headers: axum::http::HeaderMap, body: axum::Json<serde_json::Value>| async move {
                        seen.lock().expect("requests lock").push((headers, body.0));
                        let next = queue.lock().expect("script lock").pop_front();
                        let (status, reply, delay) = next.unwrap_or((
                            500,
                            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": "script exhausted"}}),
                            std::time::Duration::ZERO,
                        ));
                        tokio::time::sleep(delay).await;
                        (axum::http::StatusCode::from_u16(status).expect("a status"), axum::Json(reply))
                    },
                ),
            )
            .with_state((queue.clone(), seen.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        ScriptedModel {
            base,
            replies: queue,
            requests: seen,
            _shutdown: tx,
        }
    }

    /// Every request so far: its headers and JSON body.
    pub fn requests(&self) -> Vec<(axum::http::HeaderMap, serde_json::Value)> {
        self.requests.lock().expect("requests lock").clone()
    }

    pub fn push_reply(&self, status: u16, body: serde_json::Value) {
        self.push_delayed_reply(std::time::Duration::ZERO, status, body);
    }

    /// Queues a reply that is sent `delay` after its request arrives (the
    /// request is recorded at once), to hold a model call in flight.
    pub fn push_delayed_reply(
        &self,
        delay: std::time::Duration,
        status: u16,
        body: serde_json::Value,
    ) {
        self.replies
            .lock()
            .expect("script lock")
            .push_back((status, body, delay));
    }
}

/// A Messages API reply with `content` blocks and a stop reason.
pub fn model_reply(content: serde_json::Value, stop_reason: &str) -> serde_json::Value {
    serde_json::json!({
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": "scripted",
        "content": content, "stop_reason": stop_reason,
        "usage": {"input_tokens": 12, "output_tokens": 7}
    })
}
