//! The suite's model endpoint: stateless, so any api process may call it
//! and a retried call gets the same kind of answer. A user message
//! `fault <marker> calls=<n> cmd=<command>` makes the turn call `bash` with
//! `<command>` `n` times, one call per reply, then end. With
//! `model=<fault>x<k>` in it, the first `k` requests of that message meet
//! the fault instead ([`Fault`]): the only state the endpoint keeps.

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a stalled request is held: past the api's model timeout
/// (`MANGO_MODEL_TIMEOUT_SECONDS`, 20 s in the suite).
pub const STALL: Duration = Duration::from_secs(30);

/// What a faulted request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// No answer until [`STALL`] has passed.
    Stall,
    /// `500 Internal Server Error`.
    Error500,
    /// A 200 whose body stops half-way: the connection is dropped mid-stream.
    Drop,
}

impl Fault {
    fn parse(word: &str) -> Option<(Fault, u32)> {
        let (kind, times) = word.split_once('x')?;
        let fault = match kind {
            "stall" => Fault::Stall,
            "500" => Fault::Error500,
            "drop" => Fault::Drop,
            _ => return None,
        };
        Some((fault, times.parse().ok()?))
    }
}

/// Requests served per message marker, across every api process.
type Served = Arc<Mutex<HashMap<String, u32>>>;

pub struct Model {
    pub base: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Model {
    pub async fn start() -> anyhow::Result<Model> {
        let served: Served = Arc::default();
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(messages))
            .with_state(served);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Model {
            base,
            _shutdown: tx,
        })
    }
}

async fn messages(
    axum::extract::State(served): axum::extract::State<Served>,
    Json(body): Json<Value>,
) -> Response {
    match fault_of(&body, &served) {
        None => Json(next_reply(&body)).into_response(),
        Some(Fault::Error500) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"type": "error", "error": {"type": "api_error", "message": "scripted failure"}})),
        )
            .into_response(),
        Some(Fault::Stall) => {
            // The fault itself: an endpoint that holds the request open.
            tokio::time::sleep(STALL).await;
            Json(next_reply(&body)).into_response()
        }
        Some(Fault::Drop) => {
            let half = b"{\"id\": \"msg_dropped\", \"type\": \"mess".to_vec();
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
                Ok(half),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "scripted drop",
                )),
            ];
            Response::builder()
                .header("content-type", "application/json")
                .body(axum::body::Body::from_stream(futures::stream::iter(chunks)))
                .expect("a response")
        }
    }
}

/// The fault this request meets: its instruction asks for one, and fewer
/// than that many of its message's requests met it so far.
fn fault_of(body: &Value, served: &Served) -> Option<Fault> {
    let messages = body["messages"].as_array()?;
    let instruction = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user" && text_of(m).contains("fault "))
        .map(|m| last_instruction(&text_of(m)))?;
    let (fault, times) = field(&instruction, "model=").and_then(Fault::parse)?;
    let marker = instruction.split_whitespace().nth(1)?.to_string();
    let mut served = served.lock().unwrap();
    let count = served.entry(marker).or_default();
    *count += 1;
    (*count <= times).then_some(fault)
}

/// The text of a message's content (a string, or its text blocks).
fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The last `fault` line of a user message's text: the api joins the
/// messages a Session was sent while no turn ran (after a failed one, say)
/// into one user message, whose last line is the newest instruction.
fn last_instruction(text: &str) -> String {
    text.lines()
        .rev()
        .find_map(|l| l.find("fault ").map(|at| l[at..].to_string()))
        .unwrap_or_default()
}

/// The instruction of the turn: the last user message with a `fault` line,
/// and the tool calls the assistant made since.
fn next_reply(body: &Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let start = messages
        .iter()
        .rposition(|m| m["role"] == "user" && text_of(m).contains("fault "));
    let Some(start) = start else {
        return reply(
            json!([{"type": "text", "text": "nothing to do"}]),
            "end_turn",
        );
    };
    let instruction = last_instruction(&text_of(&messages[start]));
    let calls: usize = field(&instruction, "calls=")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let command = instruction
        .split_once(" cmd=")
        .map_or("true".to_string(), |(_, c)| c.trim().to_string());
    let made = messages[start..]
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_use")
        .count();
    if made >= calls {
        return reply(json!([{"type": "text", "text": "done"}]), "end_turn");
    }
    let id = format!("toolu_{:016x}", rand::random::<u64>());
    reply(
        json!([{"type": "tool_use", "id": id, "name": "bash",
                "input": {"command": command.replace("{n}", &(made + 1).to_string())}}]),
        "tool_use",
    )
}

fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.split_whitespace().find_map(|w| w.strip_prefix(name))
}

fn reply(content: Value, stop_reason: &str) -> Value {
    json!({
        "id": format!("msg_{:016x}", rand::random::<u64>()), "type": "message",
        "role": "assistant", "model": "faults-scripted",
        "content": content, "stop_reason": stop_reason,
        "usage": {"input_tokens": 10, "output_tokens": 5}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": text}]})
    }

    #[test]
    fn a_turn_makes_its_calls_one_by_one_then_ends() {
        let first = next_reply(&json!({"messages": [user("fault m1 calls=2 cmd=echo {n}")]}));
        assert_eq!(first["stop_reason"], "tool_use");
        assert_eq!(first["content"][0]["input"]["command"], "echo 1");
        let after_one = json!({"messages": [
            user("fault m1 calls=2 cmd=echo {n}"),
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}]},
        ]});
        let second = next_reply(&after_one);
        assert_eq!(second["content"][0]["input"]["command"], "echo 2");
        let mut done = after_one["messages"].as_array().unwrap().clone();
        done.push(json!({"role": "assistant", "content": second["content"]}));
        done.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "y", "content": "2"}]}));
        assert_eq!(
            next_reply(&json!({"messages": done}))["stop_reason"],
            "end_turn"
        );
    }

    #[test]
    fn a_fault_meets_the_first_requests_of_its_message_only() {
        let served = Served::default();
        let body = |m: &str| json!({"messages": [user(&format!("fault {m} model=500x2 calls=1 cmd=true"))]});
        assert_eq!(fault_of(&body("m1"), &served), Some(Fault::Error500));
        assert_eq!(fault_of(&body("m1"), &served), Some(Fault::Error500));
        assert_eq!(fault_of(&body("m1"), &served), None);
        assert_eq!(fault_of(&body("m2"), &served), Some(Fault::Error500));
        let plain = json!({"messages": [user("fault m3 calls=1 cmd=true")]});
        assert_eq!(fault_of(&plain, &served), None);
        assert_eq!(Fault::parse("stallx1"), Some((Fault::Stall, 1)));
        assert_eq!(Fault::parse("dropx3"), Some((Fault::Drop, 3)));
        assert_eq!(Fault::parse("sometimes"), None);
    }

    #[test]
    fn of_two_messages_joined_into_one_the_newer_instructs() {
        let served = Served::default();
        let joined = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "fault m1 model=500x9 calls=1 cmd=a"},
            {"type": "text", "text": "fault m2 calls=1 cmd=b"},
        ]}]});
        assert_eq!(fault_of(&joined, &served), None);
        assert_eq!(next_reply(&joined)["content"][0]["input"]["command"], "b");
    }

    #[test]
    fn a_later_instruction_starts_its_own_count() {
        let reply = next_reply(&json!({"messages": [
            user("fault m1 calls=1 cmd=a"),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            user("fault m2 calls=1 cmd=b"),
        ]}));
        assert_eq!(reply["content"][0]["input"]["command"], "b");
    }
}
