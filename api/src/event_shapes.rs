//! What a client may send as Session events (`POST /v1/sessions/{id}/events`,
//! `initial_events`), beyond their types: the SDK's params (wire contract
//! §7.3) parsed by [`SentEvent::parse`], then the rules serde cannot say
//! (which content blocks an event takes, non-empty strings, placement of
//! `system.message`, sizes). Each refusal names the event index and field;
//! nothing is stored on refusal.

use crate::error::{ApiError, ApiResult};
use crate::extract::{field_error, no_nul};
use mango_protocol::content::{BlockKind, ContentBlock};
use mango_protocol::events::{Confirmation, Rubric, SentEvent, SentEventError, MAX_EVENT_BYTES};
use mango_protocol::strict::FieldError;
use mango_protocol::ErrorCode;
use serde_json::Value;

/// At most this many events in one request (the SDK's `initial_events` cap).
pub const MAX_EVENTS_PER_REQUEST: usize = 50;
/// `user.define_outcome.max_iterations` range.
const MAX_ITERATIONS: std::ops::RangeInclusive<u32> = 1..=20;

fn bad(index: usize, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_parameter(format!("events[{index}]: {message}"))
}

fn field(index: usize, path: &str, message: &str) -> ApiError {
    field_error(FieldError::new(path, message).within(&format!("events[{index}]")))
}

fn non_empty(index: usize, path: &str, value: &str) -> ApiResult<()> {
    if value.is_empty() {
        return Err(field(index, path, "must not be empty"));
    }
    Ok(())
}

/// Content blocks; `kinds` lists the block types this event accepts.
fn content(
    index: usize,
    blocks: &[ContentBlock],
    kinds: &[BlockKind],
    required: bool,
) -> ApiResult<()> {
    if required && blocks.is_empty() {
        return Err(field(index, "content", "must not be empty"));
    }
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("content[{i}]");
        if !kinds.contains(&block.kind()) {
            let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
            return Err(field(
                index,
                &format!("{at}.type"),
                &format!(
                    "{:?} is not one of {}",
                    block.kind().as_str(),
                    names.join(", ")
                ),
            ));
        }
        if let ContentBlock::SearchResult { source, title, .. } = block {
            non_empty(index, &format!("{at}.source"), source)?;
            non_empty(index, &format!("{at}.title"), title)?;
        }
    }
    Ok(())
}

/// Checks one event's fields (its sender's permission is `session_rules`').
pub fn check(index: usize, value: Value) -> ApiResult<SentEvent> {
    if serde_json::to_vec(&value).map(|b| b.len()).unwrap_or(0) > MAX_EVENT_BYTES {
        return Err(bad(
            index,
            format!("is larger than {MAX_EVENT_BYTES} bytes"),
        ));
    }
    no_nul(&value, &format!("events[{index}]"))?;
    let event = SentEvent::parse(value).map_err(|err| match err {
        SentEventError::NotAnEvent => bad(index, "must be an object"),
        SentEventError::NotSendable(t) => bad(
            index,
            format!("{t:?} events are produced by the agent loop, not sent by clients"),
        )
        .code(ErrorCode::EventNotSendable),
        SentEventError::UnknownType(t) => bad(
            index,
            format!(
                "unknown event type {t:?}; clients send one of {}",
                SentEvent::TYPES.join(", ")
            ),
        )
        .code(ErrorCode::UnknownEventType),
        SentEventError::Field(e) => field_error(e.within(&format!("events[{index}]"))),
    })?;
    use BlockKind::*;
    match &event {
        SentEvent::UserMessage(m) => {
            content(index, &m.content, &[Text, Image, Document, Redacted], true)?
        }
        SentEvent::UserInterrupt(_) => {}
        SentEvent::UserToolConfirmation(c) => {
            non_empty(index, "tool_use_id", &c.tool_use_id)?;
            if c.result == Confirmation::Allow && c.deny_message.is_some() {
                return Err(field(
                    index,
                    "deny_message",
                    "is only allowed with result \"deny\"",
                ));
            }
        }
        SentEvent::UserToolResult(r) => {
            non_empty(index, "tool_use_id", &r.tool_use_id)?;
            let blocks = r.content.as_deref().unwrap_or_default();
            content(index, blocks, &[Text, Image, Document, SearchResult], false)?;
        }
        SentEvent::UserCustomToolResult(r) => {
            non_empty(index, "custom_tool_use_id", &r.custom_tool_use_id)?;
            let blocks = r.content.as_deref().unwrap_or_default();
            content(index, blocks, &[Text, Image, Document, SearchResult], false)?;
        }
        SentEvent::UserDefineOutcome(o) => {
            non_empty(index, "description", &o.description)?;
            match &o.rubric {
                Rubric::Text { content } => non_empty(index, "rubric.content", content)?,
                Rubric::File { file_id } => non_empty(index, "rubric.file_id", file_id)?,
            }
            if o.max_iterations
                .is_some_and(|n| !MAX_ITERATIONS.contains(&n))
            {
                return Err(field(
                    index,
                    "max_iterations",
                    "must be an integer from 1 through 20",
                ));
            }
        }
        SentEvent::SystemMessage(m) => content(index, &m.content, &[Text], true)?,
    }
    Ok(event)
}

/// Checks a whole request: the count, each event, and `system.message`
/// placement (at most one, last, right after a user message or tool result).
pub fn check_all(events: Vec<Value>) -> ApiResult<Vec<SentEvent>> {
    if events.is_empty() {
        return Err(ApiError::invalid_parameter("events must not be empty"));
    }
    if events.len() > MAX_EVENTS_PER_REQUEST {
        return Err(ApiError::invalid_parameter(format!(
            "{} events in one request; at most {MAX_EVENTS_PER_REQUEST} are allowed",
            events.len()
        )));
    }
    let checked: Vec<SentEvent> = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| check(i, e))
        .collect::<ApiResult<_>>()?;
    for (i, e) in checked.iter().enumerate() {
        if let SentEvent::SystemMessage(_) = e {
            let name = e.type_name();
            let last = i + 1 == checked.len();
            let after_input = i > 0
                && matches!(
                    checked[i - 1],
                    SentEvent::UserMessage(_)
                        | SentEvent::UserToolResult(_)
                        | SentEvent::UserCustomToolResult(_)
                );
            if !last || !after_input {
                return Err(bad(
                    i,
                    format!(
                        "{name} must be the last event, right after a user message or tool result"
                    ),
                ));
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all(v: Value) -> ApiResult<Vec<SentEvent>> {
        let Value::Array(list) = v else {
            panic!("a list")
        };
        check_all(list)
    }

    fn err(v: Value) -> String {
        all(v).unwrap_err().message
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
        assert_eq!(all(ok).unwrap().len(), 8);
    }

    #[test]
    fn refuses_wrong_shapes_with_the_index_and_field() {
        assert!(err(json!([{"type": "user.message"}])).contains("events[0]"));
        assert!(err(json!([{"type": "user.message"}])).contains("content"));
        assert!(err(json!([{"type": "user.message", "content": []}])).contains("must not be empty"));
        assert!(
            err(json!([{"type": "user.message", "content": [{"type": "text"}]}]))
                .contains("events[0].content[0]")
        );
        assert!(
            err(json!([{"type": "user.message", "content": [{"type": "video"}]}]))
                .contains("video")
        );
        assert!(err(json!([{"type": "user.message", "content": "hi"}])).contains("content"));
        assert!(err(json!([{"type": "user.message", "content": [{"type": "text", "text": "x"}], "extra": 1}])).contains("events[0].extra: unknown field"));
        assert!(err(json!([{"type": "user.tool_result"}])).contains("tool_use_id"));
        assert!(
            err(json!([{"type": "user.tool_result", "tool_use_id": "x", "is_error": "yes"}]))
                .contains("is_error")
        );
        assert!(err(
            json!([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "maybe"}])
        )
        .contains("allow"));
        assert!(err(json!([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "allow", "deny_message": "n"}])).contains("deny_message"));
        assert!(err(json!([{"type": "user.message", "content": [{"type": "image", "source": {"type": "ftp"}}]}])).contains("content[0]"));
        assert!(err(json!([{"type": "system.message", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}])).contains("\"image\" is not one of text"));
        assert!(err(json!([])).contains("empty"));
        assert!(err(json!([1])).contains("events[0]: must be an object"));
        let agent = all(json!([{"type": "agent.message", "content": []}])).unwrap_err();
        assert_eq!(
            agent.details["error_code"],
            ErrorCode::EventNotSendable.as_str()
        );
        let unknown = all(json!([{"type": "user.bogus"}])).unwrap_err();
        assert_eq!(
            unknown.details["error_code"],
            ErrorCode::UnknownEventType.as_str()
        );
        let nul = err(
            json!([{"type": "user.message", "content": [{"type": "text", "text": "a\u{0}b"}]}]),
        );
        assert!(nul.contains("events[0].content[0].text"), "{nul}");
    }

    #[test]
    fn limits_hold_at_their_edges() {
        let one = json!({"type": "user.interrupt"});
        assert!(check_all(vec![one.clone(); 50]).is_ok());
        assert!(check_all(vec![one; 51])
            .unwrap_err()
            .message
            .contains("at most 50"));
        let overhead = serde_json::to_vec(
            &json!({"type": "user.message", "content": [{"type": "text", "text": ""}]}),
        )
        .unwrap()
        .len();
        let fits = json!({"type": "user.message", "content": [{"type": "text", "text": "a".repeat(MAX_EVENT_BYTES - overhead)}]});
        assert!(check(0, fits).is_ok());
        let over = json!({"type": "user.message", "content": [{"type": "text", "text": "a".repeat(MAX_EVENT_BYTES - overhead + 1)}]});
        assert!(check(0, over).is_err());
        let outcome = |n: u32| json!({"type": "user.define_outcome", "description": "d", "rubric": {"type": "text", "content": "c"}, "max_iterations": n});
        assert!(check(0, outcome(1)).is_ok() && check(0, outcome(20)).is_ok());
        assert!(check(0, outcome(0)).is_err() && check(0, outcome(21)).is_err());
    }

    #[test]
    fn system_message_placement() {
        let sys = json!({"type": "system.message", "content": [{"type": "text", "text": "s"}]});
        let msg = json!({"type": "user.message", "content": [{"type": "text", "text": "m"}]});
        assert!(all(json!([msg, sys])).is_ok());
        assert!(err(json!([sys])).contains("system.message must be the last"));
        assert!(err(json!([msg, sys, msg])).contains("system.message must be the last"));
        assert!(err(json!([{"type": "user.interrupt"}, sys])).contains("right after"));
    }
}
