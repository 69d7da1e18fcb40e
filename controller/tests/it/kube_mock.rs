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
