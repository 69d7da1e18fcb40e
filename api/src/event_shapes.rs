//! Shape checks for events a client sends (`POST /v1/sessions/{id}/events`,
//! `initial_events`), following the SDK's params (wire contract §7.3). Each
//! refusal names the event index and field, and nothing is stored on refusal.

use crate::error::{ApiError, ApiResult};
use serde_json::{Map, Value};

/// At most this many events in one request (the SDK's `initial_events` cap).
pub const MAX_EVENTS_PER_REQUEST: usize = 50;
/// One event, serialized, may not exceed this (a tool result with a large output fits).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

fn bad(index: usize, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_parameter(format!("events[{index}]: {message}"))
}

fn only(index: usize, obj: &Map<String, Value>, allowed: &[&str], what: &str) -> ApiResult<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(bad(index, format!("unknown field {k:?} in {what}"))),
        None => Ok(()),
    }
}

fn string<'a>(
    index: usize,
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> ApiResult<&'a str> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(Value::String(_)) => Err(bad(index, format!("{what}.{key} must not be empty"))),
        _ => Err(bad(
            index,
            format!("{what}.{key} is required and must be a string"),
        )),
    }
}

fn source(index: usize, value: Option<&Value>, what: &str, text_ok: bool) -> ApiResult<()> {
    let Some(Value::Object(src)) = value else {
        return Err(bad(
            index,
            format!("{what}.source is required and must be an object"),
        ));
    };
    let here = format!("{what}.source");
    match src.get("type").and_then(Value::as_str) {
        Some("base64") => {
            only(index, src, &["type", "data", "media_type"], &here)?;
            string(index, src, "data", &here)?;
            string(index, src, "media_type", &here)?;
        }
        Some("text") if text_ok => {
            only(index, src, &["type", "data", "media_type"], &here)?;
            string(index, src, "data", &here)?;
        }
        Some("url") => {
            only(index, src, &["type", "url"], &here)?;
            string(index, src, "url", &here)?;
        }
        Some("file") => {
            only(index, src, &["type", "file_id"], &here)?;
            string(index, src, "file_id", &here)?;
        }
        other => {
            return Err(bad(
                index,
                format!("{here}.type {other:?} is not a source type"),
            ))
        }
    }
    Ok(())
}

/// Content blocks; `kinds` lists the block types this event accepts.
fn content(index: usize, value: Option<&Value>, kinds: &[&str], required: bool) -> ApiResult<()> {
    let blocks = match value {
        None | Some(Value::Null) if !required => return Ok(()),
        Some(Value::Array(blocks)) if !blocks.is_empty() || !required => blocks,
        Some(Value::Array(_)) => return Err(bad(index, "content must not be empty")),
        _ => {
            return Err(bad(
                index,
                "content is required and must be an array of blocks",
            ))
        }
    };
    for (i, block) in blocks.iter().enumerate() {
        let what = format!("content[{i}]");
        let Value::Object(b) = block else {
            return Err(bad(index, format!("{what} must be an object")));
        };
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        if !kinds.contains(&kind) {
            return Err(bad(
                index,
                format!("{what}.type {kind:?} is not one of {}", kinds.join(", ")),
            ));
        }
        match kind {
            "text" => {
                only(index, b, &["type", "text"], &what)?;
                if !b.get("text").is_some_and(Value::is_string) {
                    return Err(bad(
                        index,
                        format!("{what}.text is required and must be a string"),
                    ));
                }
            }
            "image" => {
                only(index, b, &["type", "source"], &what)?;
                source(index, b.get("source"), &what, false)?;
            }
            "document" => {
                only(index, b, &["type", "source", "title", "context"], &what)?;
                source(index, b.get("source"), &what, true)?;
            }
            "search_result" => {
                only(
                    index,
                    b,
                    &["type", "source", "title", "content", "citations"],
                    &what,
                )?;
                string(index, b, "source", &what)?;
                string(index, b, "title", &what)?;
                content(index, b.get("content"), &["text"], true)?;
            }
            _ => only(index, b, &["type"], &what)?, // redacted
        }
    }
    Ok(())
}

fn is_error(index: usize, e: &Map<String, Value>) -> ApiResult<()> {
    match e.get("is_error") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => Ok(()),
        _ => Err(bad(index, "is_error must be a boolean or null")),
    }
}

/// Checks one event's shape (its type's permission is `session_rules::may_send`'s job).
pub fn check(index: usize, event: &Value) -> ApiResult<Map<String, Value>> {
    let Value::Object(e) = event else {
        return Err(bad(index, "must be an object"));
    };
    if serde_json::to_vec(event).map(|b| b.len()).unwrap_or(0) > MAX_EVENT_BYTES {
        return Err(bad(
            index,
            format!("is larger than {MAX_EVENT_BYTES} bytes"),
        ));
    }
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
    let what = kind;
    match kind {
        "user.message" => {
            only(index, e, &["type", "content"], what)?;
            content(
                index,
                e.get("content"),
                &["text", "image", "document", "redacted"],
                true,
            )?;
        }
        "user.interrupt" => {
            only(index, e, &["type", "session_thread_id"], what)?;
            if !matches!(
                e.get("session_thread_id"),
                None | Some(Value::Null) | Some(Value::String(_))
            ) {
                return Err(bad(index, "session_thread_id must be a string"));
            }
        }
        "user.tool_confirmation" => {
            only(
                index,
                e,
                &["type", "tool_use_id", "result", "deny_message"],
                what,
            )?;
            string(index, e, "tool_use_id", what)?;
            match e.get("result").and_then(Value::as_str) {
                Some("allow") if e.get("deny_message").is_some_and(|v| !v.is_null()) => {
                    return Err(bad(
                        index,
                        "deny_message is only allowed with result \"deny\"",
                    ))
                }
                Some("allow" | "deny") => {}
                _ => return Err(bad(index, "result must be \"allow\" or \"deny\"")),
            }
            if !matches!(
                e.get("deny_message"),
                None | Some(Value::Null) | Some(Value::String(_))
            ) {
                return Err(bad(index, "deny_message must be a string"));
            }
        }
        "user.tool_result" | "user.custom_tool_result" => {
            let id_key = if kind == "user.tool_result" {
                "tool_use_id"
            } else {
                "custom_tool_use_id"
            };
            only(index, e, &["type", id_key, "content", "is_error"], what)?;
            string(index, e, id_key, what)?;
            content(
                index,
                e.get("content"),
                &["text", "image", "document", "search_result"],
                false,
            )?;
            is_error(index, e)?;
        }
        "user.define_outcome" => {
            only(
                index,
                e,
                &["type", "description", "rubric", "max_iterations"],
                what,
            )?;
            string(index, e, "description", what)?;
            match e.get("rubric") {
                Some(Value::Object(r)) if r.get("type").and_then(Value::as_str) == Some("text") => {
                    only(index, r, &["type", "content"], "rubric")?;
                    string(index, r, "content", "rubric")?;
                }
                Some(Value::Object(r)) if r.get("type").and_then(Value::as_str) == Some("file") => {
                    only(index, r, &["type", "file_id"], "rubric")?;
                    string(index, r, "file_id", "rubric")?;
                }
                _ => return Err(bad(index, "rubric must be {\"type\":\"text\",\"content\"} or {\"type\":\"file\",\"file_id\"}")),
            }
            match e.get("max_iterations") {
                None | Some(Value::Null) => {}
                Some(Value::Number(n)) if n.as_u64().is_some_and(|n| (1..=20).contains(&n)) => {}
                _ => {
                    return Err(bad(
                        index,
                        "max_iterations must be an integer from 1 through 20",
                    ))
                }
            }
        }
        "system.message" => {
            only(index, e, &["type", "content"], what)?;
            content(index, e.get("content"), &["text"], true)?;
        }
        // Types outside the sendable set are refused by the rules with a clearer message.
        _ => {}
    }
    Ok(e.clone())
}

/// Checks a whole request: the count, each shape, and `system.message` placement
/// (at most one, last, right after a user message or tool result).
pub fn check_all(events: &Value) -> ApiResult<Vec<Map<String, Value>>> {
    let Value::Array(list) = events else {
        return Err(ApiError::invalid_parameter("events must be an array"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid_parameter("events must not be empty"));
    }
    if list.len() > MAX_EVENTS_PER_REQUEST {
        return Err(ApiError::invalid_parameter(format!(
            "{} events in one request; at most {MAX_EVENTS_PER_REQUEST} are allowed",
            list.len()
        )));
    }
    let checked: Vec<_> = list
        .iter()
        .enumerate()
        .map(|(i, e)| check(i, e))
        .collect::<ApiResult<_>>()?;
    let type_of = |e: &Map<String, Value>| {
        e.get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (i, e) in checked.iter().enumerate() {
        if type_of(e) == "system.message" {
            let last = i + 1 == checked.len();
            let after_input = i > 0
                && matches!(
                    type_of(&checked[i - 1]).as_str(),
                    "user.message" | "user.tool_result" | "user.custom_tool_result"
                );
            if !last || !after_input {
                return Err(bad(i, "system.message must be the last event, right after a user message or tool result"));
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        check_all(&v).unwrap_err().message
    }

    #[test]
    fn accepts_what_the_sdk_sends() {
        let ok = json!([
            {"type": "user.message", "content": [{"type": "text", "text": "hi"},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                {"type": "document", "source": {"type": "text", "data": "d", "media_type": "text/plain"}, "title": "t"}]},
            {"type": "user.tool_result", "tool_use_id": "sevt_1", "is_error": false, "content": [{"type": "text", "text": "(no output)"}]},
            {"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_2"},
            {"type": "user.tool_confirmation", "tool_use_id": "sevt_3", "result": "deny", "deny_message": "no"},
            {"type": "user.interrupt"},
            {"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}, "max_iterations": 3},
            {"type": "user.message", "content": [{"type": "text", "text": "again"}]},
            {"type": "system.message", "content": [{"type": "text", "text": "note"}]}
        ]);
        assert_eq!(check_all(&ok).unwrap().len(), 8);
    }

    #[test]
    fn refuses_wrong_shapes_with_the_index_and_field() {
        assert!(err(json!([{"type": "user.message"}])).contains("events[0]: content is required"));
        assert!(err(json!([{"type": "user.message", "content": []}])).contains("must not be empty"));
        assert!(
            err(json!([{"type": "user.message", "content": [{"type": "text"}]}]))
                .contains("content[0].text")
        );
        assert!(
            err(json!([{"type": "user.message", "content": [{"type": "video"}]}]))
                .contains("content[0].type \"video\"")
        );
        assert!(err(json!([{"type": "user.message", "content": "hi"}])).contains("array"));
        assert!(err(json!([{"type": "user.message", "content": [{"type": "text", "text": "x"}], "extra": 1}])).contains("unknown field \"extra\""));
        assert!(err(json!([{"type": "user.tool_result"}])).contains("tool_use_id is required"));
        assert!(
            err(json!([{"type": "user.tool_result", "tool_use_id": "x", "is_error": "yes"}]))
                .contains("is_error")
        );
        assert!(err(
            json!([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "maybe"}])
        )
        .contains("allow"));
        assert!(err(json!([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "allow", "deny_message": "n"}])).contains("deny_message"));
        assert!(err(json!([{"type": "user.message", "content": [{"type": "image", "source": {"type": "ftp"}}]}])).contains("source"));
        assert!(err(json!("nope")).contains("array"));
        assert!(err(json!([])).contains("empty"));
        assert!(err(json!([1])).contains("events[0]: must be an object"));
    }

    #[test]
    fn limits_hold_at_their_edges() {
        let one = json!({"type": "user.interrupt"});
        assert!(check_all(&Value::Array(vec![one.clone(); 50])).is_ok());
        assert!(err(Value::Array(vec![one; 51])).contains("at most 50"));
        let overhead = serde_json::to_vec(
            &json!({"type": "user.message", "content": [{"type": "text", "text": ""}]}),
        )
        .unwrap()
        .len();
        let fits = json!({"type": "user.message", "content": [{"type": "text", "text": "a".repeat(MAX_EVENT_BYTES - overhead)}]});
        assert!(check(0, &fits).is_ok());
        let over = json!({"type": "user.message", "content": [{"type": "text", "text": "a".repeat(MAX_EVENT_BYTES - overhead + 1)}]});
        assert!(check(0, &over).is_err());
    }

    #[test]
    fn system_message_placement() {
        let sys = json!({"type": "system.message", "content": [{"type": "text", "text": "s"}]});
        let msg = json!({"type": "user.message", "content": [{"type": "text", "text": "m"}]});
        assert!(check_all(&json!([msg, sys])).is_ok());
        assert!(err(json!([sys])).contains("system.message must be the last"));
        assert!(err(json!([msg, sys, msg])).contains("system.message must be the last"));
        assert!(err(json!([{"type": "user.interrupt"}, sys])).contains("right after"));
    }
}
