//! A scripted stand-in for a Messages API endpoint, for the agent loop.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One queued reply: status, body and how long to wait before answering.
type Scripted = (u16, Value, Duration);
type Replies = Arc<Mutex<VecDeque<Scripted>>>;
type Requests = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

/// Answers `POST /v1/messages` with the queued replies in order (status,
/// body) and records every request; once the script is exhausted, a 500.
pub struct ScriptedModel {
    pub base: String,
    replies: Replies,
    requests: Requests,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl ScriptedModel {
    pub async fn start(replies: Vec<(u16, Value)>) -> ScriptedModel {
        let queue: Replies = Arc::new(Mutex::new(
            replies
                .into_iter()
                .map(|(status, body)| (status, body, Duration::ZERO))
                .collect(),
        ));
        let seen: Requests = Arc::default();
        let app = axum::Router::new()
            .route(
                "/v1/messages",
                axum::routing::post(
                    |State((queue, seen)): State<(Replies, Requests)>, headers: HeaderMap, body: Json<Value>| async move {
                        seen.lock().expect("requests lock").push((headers, body.0));
                        let next = queue.lock().expect("script lock").pop_front();
                        let (status, reply, delay) = next.unwrap_or((
                            500,
                            json!({"type": "error", "error": {"type": "api_error", "message": "script exhausted"}}),
                            Duration::ZERO,
                        ));
                        tokio::time::sleep(delay).await;
                        (StatusCode::from_u16(status).expect("a status"), Json(reply))
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
    pub fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.requests.lock().expect("requests lock").clone()
    }

    pub fn push_reply(&self, status: u16, body: Value) {
        self.push_delayed_reply(Duration::ZERO, status, body);
    }

    /// Queues a reply that is sent `delay` after its request arrives (the
    /// request is recorded at once), to hold a model call in flight.
    pub fn push_delayed_reply(&self, delay: Duration, status: u16, body: Value) {
        self.replies
            .lock()
            .expect("script lock")
            .push_back((status, body, delay));
    }
}

/// A Messages API reply with `content` blocks and a stop reason.
pub fn model_reply(content: Value, stop_reason: &str) -> Value {
    json!({
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": "scripted",
        "content": content, "stop_reason": stop_reason,
        "usage": {"input_tokens": 12, "output_tokens": 7}
    })
}
