//! kube-rs's mock service (`tower-test`), as controller-rs's fixtures use
//! it: a `kube::Client` whose every request the test receives, checks
//! (method, exact URI, body) and answers as the API server would.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use std::time::Duration;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Responder = tower_test::mock::SendResponse<Response<Body>>;

pub struct ApiServer {
    handle: Handle,
}

/// A request the mock received: what the client sent.
pub struct Received {
    pub method: Method,
    pub uri: String,
    pub body: Value,
    respond: Responder,
}

impl Received {
    pub fn respond(self, status: u16, body: Value) {
        self.respond.send_response(
            Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
    }

    /// The API server's answer for a refusal (`Status` with `code`).
    pub fn refuse(self, code: u16, reason: &str, message: &str) {
        self.respond(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": reason, "code": code}),
        );
    }
}

/// What the client sent, read whole, with the means to answer it.
async fn received(request: Request<Body>, respond: Responder) -> Received {
    let method = request.method().clone();
    let uri = request.uri().to_string();
    let bytes: Bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Received {
        method,
        uri,
        body,
        respond,
    }
}

/// A client over the mock, and the mock's server end.
pub fn client() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer { handle })
}

impl ApiServer {
    /// The next request, which must come within 10 s.
    pub async fn next(&mut self) -> Received {
        let (request, respond) =
            tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
                .await
                .expect("the controller made the expected request within 10 s")
                .expect("the client is still there");
        received(request, respond).await
    }

    /// The next request, checked for method and exact URI.
    pub async fn expect(&mut self, method: Method, uri: &str) -> Received {
        let received = self.next().await;
        assert_eq!(
            (&received.method, received.uri.as_str()),
            (&method, uri),
            "body: {}",
            received.body
        );
        received
    }

    /// No request comes within `within`.
    pub async fn quiet(&mut self, within: Duration) {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(within, self.handle.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// A request the router saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub uri: String,
    pub body: Value,
}

/// How the router answers a request: a response, or none yet (a watch
/// that stays open).
pub type Answer = Option<(u16, Value)>;

/// The mock answering by rule in the background, for tests where the
/// order of concurrent requests (a watch, an Event, a status patch) is not
/// the point; it records every request.
pub struct Routed {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    pub fn route(mut self, answer: impl Fn(&Seen) -> Answer + Send + 'static) -> Routed {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut open = Vec::new();
                while let Some((request, respond)) = self.handle.next_request().await {
                    let received = received(request, respond).await;
                    let request = Seen {
                        method: received.method.clone(),
                        uri: received.uri.clone(),
                        body: received.body.clone(),
                    };
                    let reply = answer(&request);
                    seen.lock().unwrap().push(request);
                    match reply {
                        Some((status, body)) => received.respond(status, body),
                        None => open.push(received),
                    }
                }
            }
        });
        Routed { seen, task }
    }
}

impl Routed {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) for a request that `matches`; returns it.
    pub async fn until(&self, what: &str, matches: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(found) = self.seen().into_iter().find(|s| matches(s)) {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {what} within 10 s; seen: {:?}",
                self.seen()
                    .iter()
                    .map(|s| format!("{} {}", s.method, s.uri))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        self.task.abort();
    }
}
