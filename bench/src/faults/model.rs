//! The suite's model endpoint: stateless, so any api process may call it
//! and a retried call gets the same kind of answer. A user message
//! `fault <marker> calls=<n> cmd=<command>` makes the turn call `bash` with
//! `<command>` `n` times, one call per reply, then end.

use axum::Json;
use serde_json::{json, Value};

pub struct Model {
    pub base: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Model {
    pub async fn start() -> anyhow::Result<Model> {
        let app = axum::Router::new().route("/v1/messages", axum::routing::post(messages));
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

async fn messages(Json(body): Json<Value>) -> Json<Value> {
    Json(next_reply(&body))
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
    let instruction = text_of(&messages[start]);
    let calls: usize = field(&instruction, "calls=")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let command = instruction
        .split_once("cmd=")
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
