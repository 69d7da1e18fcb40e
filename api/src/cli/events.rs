//! `mango sessions events ID [--follow]`: a Session's events, one readable
//! line each, and the stream followed across dropped connections.

use super::error::{Failure, OrFailure};
use super::table::short;
use mango_client::{Client, StreamFrame};
use mango_protocol::content::ContentBlock;
use mango_protocol::events::{Event, EventBody};
use serde_json::Value;
use std::collections::HashSet;
use std::time::Duration;

/// How often a dropped stream is reopened before the command gives up.
const RECONNECTS: u32 = 10;
/// Characters of a summary at most.
const SUMMARY: usize = 120;

/// Prints the Session's events; with `follow`, keeps printing new ones
/// until it goes idle at the end of a turn, terminates or is deleted.
pub async fn tail(client: &Client, id: &str, follow: bool, json: bool) -> Result<(), Failure> {
    if !follow {
        let history = client.all_events(id).await.or_fail(client)?;
        if json {
            return super::print_json(&history);
        }
        for event in &history {
            println!("{}", line(event));
        }
        return Ok(());
    }
    let mut printer = Printer {
        seen: HashSet::new(),
        json,
    };
    // The stream starts after what was committed when it opened: open it
    // first, then read the history, so nothing falls between the two.
    let mut stream = client.stream_events(id).await.or_fail(client)?;
    let history = client.all_events(id).await.or_fail(client)?;
    for event in &history {
        printer.print(event)?;
    }
    let session = client.session(id).await.or_fail(client)?;
    if session.status == mango_protocol::sessions::SessionStatus::Terminated {
        return Ok(());
    }
    let mut failures = 0;
    loop {
        match stream.next().await {
            Some(Ok(StreamFrame::Event(event))) => {
                failures = 0;
                if printer.print(&event)? && ends_following(&event.body) {
                    return Ok(());
                }
            }
            Some(Ok(StreamFrame::Ping)) => {}
            // A dropped or ended stream: reopen it, then catch up from the
            // history, skipping what was printed already.
            Some(Ok(StreamFrame::Error(_))) | Some(Err(_)) | None => {
                failures += 1;
                if failures > RECONNECTS {
                    return Err(Failure::other(format!(
                        "the event stream of {id} kept dropping ({RECONNECTS} reconnects)"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.min(5)))).await;
                stream = match client.stream_events(id).await {
                    Ok(s) => s,
                    Err(e) if e.is_transient() => continue,
                    Err(e) => return Err(Failure::from_client(e, client.base_url())),
                };
                let history = client.all_events(id).await.or_fail(client)?;
                for event in &history {
                    if printer.print(event)? && ends_following(&event.body) {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Prints each event once, by id.
struct Printer {
    seen: HashSet<String>,
    json: bool,
}

impl Printer {
    /// Prints `event` unless it was printed already; says whether it printed.
    fn print(&mut self, event: &Event) -> Result<bool, Failure> {
        if !self.seen.insert(event.id.clone()) {
            return Ok(false);
        }
        if self.json {
            let text = serde_json::to_string(event)
                .map_err(|e| Failure::other(format!("could not write JSON: {e}")))?;
            println!("{text}");
        } else {
            println!("{}", line(event));
        }
        Ok(true)
    }
}

/// Following stops where a person waiting on the Session would: the turn
/// is over (idle but not waiting on a tool), or the Session is gone.
fn ends_following(body: &EventBody) -> bool {
    match body {
        EventBody::SessionStatusIdle(idle) => idle.stop_reason.ends_turn(),
        EventBody::SessionStatusTerminated | EventBody::SessionDeleted => true,
        _ => false,
    }
}

/// One event as one line: its time, its type and what it says.
pub fn line(event: &Event) -> String {
    let when = event.processed_at.map_or_else(
        || "-".repeat(19),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    );
    let summary = summary(&event.body);
    let line = format!("{when}  {:<26}  {summary}", event.body.type_name());
    line.trim_end().to_string()
}

/// What an event says, in a few words: the text of a message, a tool's
/// name and input, a result's first line, an error.
pub fn summary(body: &EventBody) -> String {
    let text = match body {
        EventBody::UserMessage(m) => text_of(&m.content),
        EventBody::AgentMessage(m) => text_of(&m.content),
        EventBody::SystemMessage(m) => text_of(&m.content),
        EventBody::AgentToolUse(call) => {
            let mut text = format!("{}  {}", call.name, input_summary(&call.input));
            if let Some(reason) = &call.deny_reason {
                text.push_str(&format!("  (denied: {reason})"));
            }
            text
        }
        EventBody::AgentCustomToolUse(call) => {
            format!("{}  {}", call.name, input_summary(&call.input))
        }
        EventBody::UserToolResult(r) => result_summary(r.content.as_deref(), r.is_error),
        EventBody::UserCustomToolResult(r) => result_summary(r.content.as_deref(), r.is_error),
        EventBody::SessionError(e) => format!("{}: {}", wire_name(&e.error.kind), e.error.message),
        EventBody::SessionStatusIdle(idle) => wire_name(&idle.stop_reason),
        EventBody::ModelRequestEnd(end) => {
            let usage = &end.model_usage;
            let tokens = format!("{} in, {} out", usage.input_tokens, usage.output_tokens);
            if end.is_error == Some(true) {
                format!("failed ({tokens})")
            } else {
                tokens
            }
        }
        _ => String::new(),
    };
    short(&text, SUMMARY)
}

/// A serialized enum's wire name: the string, or an object's `type`.
fn wire_name(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(Value::Object(o)) => o
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

fn text_of(blocks: &[ContentBlock]) -> String {
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.trim()),
            _ => None,
        })
        .filter(|t| !t.is_empty())
        .collect();
    if texts.is_empty() && !blocks.is_empty() {
        return format!("({} non-text block(s))", blocks.len());
    }
    texts.join(" ")
}

/// A tool input by the field people recognise it by (a command, a path, a
/// pattern), or else as compact JSON.
fn input_summary(input: &Value) -> String {
    const TELLING: &[&str] = &["command", "path", "file_path", "pattern", "url", "query"];
    if let Some(fields) = input.as_object() {
        for name in TELLING {
            if let Some(text) = fields.get(*name).and_then(Value::as_str) {
                return text.to_string();
            }
        }
    }
    input.to_string()
}

fn result_summary(content: Option<&[ContentBlock]>, is_error: Option<bool>) -> String {
    let text = content.map(text_of).unwrap_or_default();
    let text = if text.is_empty() {
        "(no output)".to_string()
    } else {
        text
    };
    if is_error == Some(true) {
        format!("error: {text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> EventBody {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn summaries_say_what_each_event_says() {
        let tool = mango_protocol::events::types::AGENT_TOOL_USE;
        let cases = [
            (
                json!({"type": mango_protocol::events::types::USER_MESSAGE, "content": [{"type": "text", "text": "run ls\nplease"}]}),
                "run ls",
            ),
            (
                json!({"type": tool, "name": "bash", "input": {"command": "ls -la"}}),
                "bash  ls -la",
            ),
            (
                json!({"type": tool, "name": "glob", "input": {"n": 1}}),
                "glob  {\"n\":1}",
            ),
            (
                json!({"type": mango_protocol::events::types::USER_TOOL_RESULT, "tool_use_id": "t", "content": [{"type": "text", "text": "a.txt\nb.txt"}]}),
                "a.txt",
            ),
            (
                json!({"type": mango_protocol::events::types::USER_TOOL_RESULT, "tool_use_id": "t", "is_error": true, "content": []}),
                "error: (no output)",
            ),
            (
                json!({"type": mango_protocol::events::types::SESSION_ERROR, "error": {"type": "model_request_failed_error", "message": "no model", "retry_status": {"type": "terminal"}}}),
                "model_request_failed_error: no model",
            ),
            (
                json!({"type": mango_protocol::events::types::SESSION_STATUS_IDLE, "stop_reason": {"type": "end_turn"}}),
                "end_turn",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(summary(&body(event.clone())), expected, "{event}");
        }
        let long = "x".repeat(500);
        let cut = summary(&body(
            json!({"type": mango_protocol::events::types::AGENT_MESSAGE, "content": [{"type": "text", "text": long}]}),
        ));
        assert_eq!(cut.chars().count(), SUMMARY);
    }

    #[test]
    fn following_ends_with_the_turn_not_while_a_tool_is_awaited() {
        let idle = mango_protocol::events::types::SESSION_STATUS_IDLE;
        assert!(ends_following(&body(
            json!({"type": idle, "stop_reason": {"type": "end_turn"}})
        )));
        assert!(!ends_following(&body(
            json!({"type": idle, "stop_reason": {"type": "requires_action", "event_ids": ["e"]}})
        )));
        assert!(ends_following(&body(
            json!({"type": mango_protocol::events::types::SESSION_STATUS_TERMINATED})
        )));
        assert!(!ends_following(&body(
            json!({"type": mango_protocol::events::types::SESSION_STATUS_RUNNING})
        )));
    }
}
