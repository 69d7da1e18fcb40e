//! Sending events takes the client's lean HTTP/1.1 path: against a scripted
//! server, what goes on the wire, connection reuse, and the retry policy.

use mango_client::{Client, RetryPolicy};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One answer of the scripted server, and whether it then closes the connection.
struct Reply {
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: Value,
    close: bool,
    /// Send half the body announced, then close.
    cut_short: bool,
}

impl Reply {
    fn ok(body: Value) -> Reply {
        Reply {
            status: 200,
            headers: &[],
            body,
            close: false,
            cut_short: false,
        }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    connection: usize,
    request_line: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 server that answers requests, in order, from `replies`.
struct Scripted {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    async fn start(replies: Vec<Reply>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/prefix", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let log = seen.clone();
        tokio::spawn(async move {
            let mut connection = 0;
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                connection += 1;
                tokio::spawn(serve(stream, connection, replies.clone(), log.clone()));
            }
        });
        Scripted { base, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    connection: usize,
    replies: Arc<Mutex<std::vec::IntoIter<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap().to_string();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_string(), v.trim().to_string())
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
        buf.drain(..head_end + length);
        seen.lock().unwrap().push(Seen {
            connection,
            request_line,
            headers,
            body,
        });
        let reply = replies.lock().unwrap().next().expect("a scripted reply");
        let payload = reply.body.to_string();
        let mut answer = format!(
            "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            reply.status,
            payload.len()
        );
        for (name, value) in reply.headers {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
        answer.push_str("\r\n");
        if reply.cut_short {
            answer.push_str(&payload[..payload.len() / 2]);
            stream.write_all(answer.as_bytes()).await.unwrap();
            return;
        }
        answer.push_str(&payload);
        stream.write_all(answer.as_bytes()).await.unwrap();
        if reply.close {
            return;
        }
    }
}

fn result_event(n: u32) -> Value {
    json!({"type": "user.tool_result", "tool_use_id": format!("sevt_{n}"), "content": [{"type": "text", "text": "ok"}]})
}

fn admitted(id: &str) -> Value {
    json!({"data": [{"id": id, "type": "user.tool_result"}]})
}

fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        first_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(20),
    }
}

#[tokio::test]
async fn events_go_over_one_kept_connection_with_the_clients_headers() {
    let server = Scripted::start(vec![Reply::ok(admitted("a")), Reply::ok(admitted("b"))]).await;
    let client = Client::new(&server.base, "tok_secret");
    for (n, id) in [(1, "a"), (2, "b")] {
        let data = client
            .send_events("sesn_1", vec![result_event(n)])
            .await
            .unwrap();
        assert_eq!(data[0]["id"], id);
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|s| s.connection == 1),
        "both requests on the first connection: {seen:?}"
    );
    for (s, n) in seen.iter().zip(1..) {
        assert_eq!(
            s.request_line,
            "POST /prefix/v1/sessions/sesn_1/events HTTP/1.1"
        );
        assert_eq!(s.header("authorization"), Some("Bearer tok_secret"));
        assert_eq!(
            s.header("anthropic-beta"),
            Some("managed-agents-2026-04-01")
        );
        assert_eq!(s.header("content-type"), Some("application/json"));
        assert_eq!(
            s.header("host"),
            server
                .base
                .strip_prefix("http://")
                .and_then(|h| h.strip_suffix("/prefix"))
        );
        assert_eq!(s.body, json!({"events": [result_event(n)]}));
    }
}

#[tokio::test]
async fn transient_answers_are_retried_and_final_ones_are_not() {
    let envelope = |kind: &str, code: &str| json!({"type": "error", "error": {"type": kind, "message": "no", "details": {"error_code": code}}});
    let server = Scripted::start(vec![
        // A 503 on a connection the server then closes, then success.
        Reply {
            status: 503,
            headers: &[],
            body: envelope("api_error", "unavailable"),
            close: true,
            cut_short: false,
        },
        Reply::ok(admitted("a")),
        // Final: a plain 400, and a 429 the server says not to retry.
        Reply {
            status: 400,
            headers: &[],
            body: envelope("invalid_request_error", "invalid_parameter"),
            close: false,
            cut_short: false,
        },
        Reply {
            status: 429,
            headers: &[("x-should-retry", "false")],
            body: envelope("rate_limit_error", "rate_limited"),
            close: false,
            cut_short: false,
        },
    ])
    .await;
    let client = Client::new(&server.base, "tok").with_retry(quick_retries());
    let data = client
        .send_events("sesn_1", vec![result_event(1)])
        .await
        .unwrap();
    assert_eq!(data[0]["id"], "a");
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "one retry after the 503");
    assert_eq!(seen[1].connection, 2, "the retry opened a fresh connection");

    let bad = client
        .send_events("sesn_1", vec![result_event(2)])
        .await
        .unwrap_err();
    assert_eq!(bad.status().map(|s| s.as_u16()), Some(400));
    assert_eq!(bad.error_code(), Some("invalid_parameter"));
    assert!(!bad.is_transient());
    let limited = client
        .send_events("sesn_1", vec![result_event(3)])
        .await
        .unwrap_err();
    assert_eq!(limited.status().map(|s| s.as_u16()), Some(429));
    assert!(!limited.is_transient(), "x-should-retry: false is final");
    assert_eq!(server.seen().len(), 4, "no retry of a final answer");
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced_without_back_off() {
    let server = Scripted::start(vec![
        Reply {
            close: true,
            ..Reply::ok(admitted("a"))
        },
        Reply::ok(admitted("b")),
    ])
    .await;
    let slow = RetryPolicy {
        attempts: 3,
        first_delay: Duration::from_secs(5),
        max_delay: Duration::from_secs(5),
    };
    let client = Client::new(&server.base, "tok").with_retry(slow);
    client
        .send_events("sesn_1", vec![result_event(1)])
        .await
        .unwrap();
    let started = Instant::now();
    let data = client
        .send_events("sesn_1", vec![result_event(2)])
        .await
        .unwrap();
    assert_eq!(data[0]["id"], "b");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no back-off for a connection closed while idle: {:?}",
        started.elapsed()
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the second event was sent once: {seen:?}");
    assert_eq!(seen[1].connection, 2);
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_error() {
    // A port nothing listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("http://127.0.0.1:{port}"), "tok_secret")
        .with_retry(RetryPolicy::none());
    let err = client
        .send_events("sesn_1", vec![result_event(1)])
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(!err.to_string().contains("tok_secret"), "{err}");
}

#[tokio::test]
async fn an_error_answer_cut_short_is_still_final() {
    let server = Scripted::start(vec![Reply {
        status: 400,
        cut_short: true,
        ..Reply::ok(json!({"type": "error", "error": {"type": "invalid_request_error", "message": "a long enough message"}}))
    }])
    .await;
    let client = Client::new(&server.base, "tok").with_retry(quick_retries());
    let err = client
        .send_events("sesn_1", vec![result_event(1)])
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(400));
    assert!(!err.is_transient());
    assert_eq!(server.seen().len(), 1, "not retried");
}

#[tokio::test]
async fn a_session_id_that_needs_encoding_is_encoded() {
    let server = Scripted::start(vec![Reply::ok(admitted("a"))]).await;
    let client = Client::new(&server.base, "tok");
    client
        .send_events("sesn 1?x", vec![result_event(1)])
        .await
        .unwrap();
    assert_eq!(
        server.seen()[0].request_line,
        "POST /prefix/v1/sessions/sesn%201%3Fx/events HTTP/1.1"
    );
}
