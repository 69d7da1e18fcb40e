//! A scripted stand-in for a Messages API endpoint, for the agent loop.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One queued reply: status, extra headers, the raw body with its content
/// type, how long to wait before answering, and what it waits for first.
struct Scripted {
    status: u16,
    headers: Vec<(String, String)>,
    content_type: &'static str,
    body: Vec<u8>,
    delay: Duration,
    held_until: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Scripted {
    fn json(status: u16, body: &Value, delay: Duration) -> Scripted {
        Scripted {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: body.to_string().into_bytes(),
            delay,
            held_until: None,
        }
    }

    fn into_response(self) -> Response {
        let mut response = (
            StatusCode::from_u16(self.status).expect("a status"),
            [(axum::http::header::CONTENT_TYPE, self.content_type)],
            self.body,
        )
            .into_response();
        for (name, value) in self.headers {
            response.headers_mut().insert(
                HeaderName::try_from(name).expect("a header name"),
                HeaderValue::try_from(value).expect("a header value"),
            );
        }
        response
    }
}

type Replies = Arc<Mutex<VecDeque<Scripted>>>;
type Requests = Arc<Mutex<Vec<(HeaderMap, Value)>>>;
type Arrivals = Arc<Mutex<Vec<Instant>>>;
/// How many requests have been recorded, for those who wait for one.
type Asked = Arc<tokio::sync::watch::Sender<usize>>;
/// What answers a request when no reply is queued: (status, body) from
/// the request's body.
pub type Answer = Arc<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

/// Answers `POST /v1/messages` with the queued replies in order (status,
/// body) and records every request; once the script is exhausted, its
/// [`Answer`] ([`ScriptedModel::start_answering`]), else a 500.
pub struct ScriptedModel {
    pub base: String,
    replies: Replies,
    requests: Requests,
    arrivals: Arrivals,
    asked: Asked,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl ScriptedModel {
    pub async fn start(replies: Vec<(u16, Value)>) -> ScriptedModel {
        Self::serve(replies, None).await
    }

    /// A model that answers every request with `answer`, whatever came
    /// before it, so any number of Sessions can use it at once (queued
    /// replies still go first).
    pub async fn start_answering(answer: Answer) -> ScriptedModel {
        Self::serve(Vec::new(), Some(answer)).await
    }

    async fn serve(replies: Vec<(u16, Value)>, answer: Option<Answer>) -> ScriptedModel {
        let queue: Replies = Arc::new(Mutex::new(
            replies
                .iter()
                .map(|(status, body)| Scripted::json(*status, body, Duration::ZERO))
                .collect(),
        ));
        let seen: Requests = Arc::default();
        let arrivals: Arrivals = Arc::default();
        let asked: Asked = Arc::new(tokio::sync::watch::Sender::new(0));
        let app = axum::Router::new()
            .route(
                "/v1/messages",
                axum::routing::post(
                    |State((queue, seen, arrivals, asked, answer)): State<(Replies, Requests, Arrivals, Asked, Option<Answer>)>,
                     headers: HeaderMap,
                     body: Json<Value>| async move {
                        arrivals.lock().expect("arrivals lock").push(Instant::now());
                        let answered = answer.as_ref().map(|answer| {
                            let (status, reply) = answer(&body.0);
                            Scripted::json(status, &reply, Duration::ZERO)
                        });
                        let count = {
                            let mut seen = seen.lock().expect("requests lock");
                            seen.push((headers, body.0));
                            seen.len()
                        };
                        asked.send_replace(count);
                        let next = queue.lock().expect("script lock").pop_front().or(answered);
                        let reply = next.unwrap_or_else(|| {
                            Scripted::json(
                                500,
                                &json!({"type": "error", "error": {"type": "api_error", "message": "script exhausted"}}),
                                Duration::ZERO,
                            )
                        });
                        let mut reply = reply;
                        if let Some(release) = reply.held_until.take() {
                            let _ = release.await;
                        }
                        tokio::time::sleep(reply.delay).await;
                        reply.into_response()
                    },
                ),
            )
            .with_state((queue.clone(), seen.clone(), arrivals.clone(), asked.clone(), answer));
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
            arrivals,
            asked,
            _shutdown: tx,
        }
    }

    /// Every request so far: its headers and JSON body.
    pub fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.requests.lock().expect("requests lock").clone()
    }

    /// Waits (at most 20 s) until the model has been asked `n` times.
    pub async fn until_asked(&self, n: usize) {
        let mut asked = self.asked.subscribe();
        let reached = tokio::time::timeout(Duration::from_secs(20), asked.wait_for(|k| *k >= n));
        assert!(
            matches!(reached.await, Ok(Ok(_))),
            "the model was not asked {n} times"
        );
    }

    /// When each request arrived, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().expect("arrivals lock").clone()
    }

    pub fn push_reply(&self, status: u16, body: Value) {
        self.push_delayed_reply(Duration::ZERO, status, body);
    }

    /// Queues a reply that is sent `delay` after its request arrives (the
    /// request is recorded at once), to hold a model call in flight.
    pub fn push_delayed_reply(&self, delay: Duration, status: u16, body: Value) {
        self.push(Scripted::json(status, &body, delay));
    }

    /// Queues a reply that is sent only once the returned sender fires (or
    /// is dropped): its request stays in flight for as long as a test needs.
    pub fn push_held_reply(&self, status: u16, body: Value) -> tokio::sync::oneshot::Sender<()> {
        let (release, held_until) = tokio::sync::oneshot::channel();
        let mut reply = Scripted::json(status, &body, Duration::ZERO);
        reply.held_until = Some(held_until);
        self.push(reply);
        release
    }

    /// Queues a JSON reply with extra response headers (`retry-after`, …).
    pub fn push_reply_with_headers(&self, status: u16, headers: &[(&str, &str)], body: Value) {
        let mut reply = Scripted::json(status, &body, Duration::ZERO);
        reply.headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.push(reply);
    }

    /// Queues a reply whose body is `body` as it is, of `content_type` (an
    /// HTML error page, a truncated body …).
    pub fn push_raw_reply(&self, status: u16, content_type: &'static str, body: &str) {
        self.push(Scripted {
            status,
            headers: Vec::new(),
            content_type,
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
            held_until: None,
        });
    }

    fn push(&self, reply: Scripted) {
        self.replies.lock().expect("script lock").push_back(reply);
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

/// The [`Answer`] of a model that asks for one `bash` call running
/// `command` at once, and ends the turn once the request carries a tool
/// result: a turn is exactly one tool call (`mango-bench ttfi`; the kind
/// test's `kind-tests/model/model.py` answers the same way).
pub fn one_bash_call(command: &str) -> Answer {
    let command = command.to_string();
    Arc::new(move |body: &Value| {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| &m["content"]);
        let has_result = last
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
        if has_result {
            return (
                200,
                model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
            );
        }
        let id = format!("toolu_{:016x}", rand_id());
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}]),
                "tool_use",
            ),
        )
    })
}

/// A tool-use id unique within the process (the agent loop keys results by it).
fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ NEXT.fetch_add(1, Ordering::Relaxed).rotate_left(40)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ask(model: &ScriptedModel, messages: Value) -> Value {
        reqwest::Client::new()
            .post(format!("{}/v1/messages", model.base))
            .json(&json!({"model": "m", "max_tokens": 1, "messages": messages}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn one_bash_call_asks_once_then_ends_the_turn() {
        let model = ScriptedModel::start_answering(one_bash_call("echo hi")).await;
        let first = ask(&model, json!([{"role": "user", "content": "go"}])).await;
        assert_eq!(first["stop_reason"], "tool_use", "{first}");
        let call = &first["content"][0];
        assert_eq!(call["name"], "bash");
        assert_eq!(call["input"]["command"], "echo hi");
        let again = ask(
            &model,
            json!([{"role": "user", "content": [{"type": "text", "text": "go"}]}]),
        )
        .await;
        assert_ne!(
            again["content"][0]["id"], call["id"],
            "each call its own id"
        );
        let after = ask(
            &model,
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "hi"}]}
            ]),
        )
        .await;
        assert_eq!(after["stop_reason"], "end_turn", "{after}");
        assert_eq!(model.requests().len(), 3, "every request recorded");
    }

    #[tokio::test]
    async fn queued_replies_go_before_the_answer() {
        let model = ScriptedModel::start_answering(one_bash_call("true")).await;
        model.push_reply(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
        );
        let first = ask(&model, json!([{"role": "user", "content": "go"}])).await;
        assert_eq!(first["error"]["type"], "overloaded_error");
        let second = ask(&model, json!([{"role": "user", "content": "go"}])).await;
        assert_eq!(second["stop_reason"], "tool_use");
    }
}
