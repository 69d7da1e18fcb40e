//! Server-sent events: frames end at a blank line; `event:` names the frame,
//! `data:` lines are joined with newlines, `:` lines are comments. Pings are
//! returned so callers can tell a live idle stream from a dead one.

use crate::{ClientError, Result};
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use mango_protocol::events::Event;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum StreamFrame {
    /// A Session event (the `data` JSON, whose `type` the `event:` line repeats).
    Event(Event),
    Ping,
    /// A frame named `error`: the server reports a problem and the stream ends.
    Error(Value),
}

pub struct EventStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: BytesMut,
}

impl EventStream {
    pub(crate) fn new(resp: reqwest::Response) -> EventStream {
        EventStream {
            body: resp.bytes_stream().boxed(),
            buffer: BytesMut::new(),
        }
    }

    /// The next frame; `None` when the server closed the stream.
    pub async fn next(&mut self) -> Option<Result<StreamFrame>> {
        loop {
            if let Some(frame) = take_frame(&mut self.buffer) {
                match parse_frame(&frame) {
                    Some(parsed) => return Some(parsed),
                    None => continue, // comment-only or unnamed frame: skipped, as the SDK does
                }
            }
            match self.body.next().await? {
                Ok(chunk) => self.buffer.extend_from_slice(&chunk),
                Err(err) => return Some(Err(ClientError::Transport(err))),
            }
        }
    }
}

/// Removes one complete frame (up to a blank line) from the buffer.
fn take_frame(buffer: &mut BytesMut) -> Option<String> {
    let text = std::str::from_utf8(buffer).ok()?;
    let (end, sep) = ["\r\n\r\n", "\n\n", "\r\r"]
        .iter()
        .filter_map(|sep| text.find(sep).map(|i| (i, sep.len())))
        .min()?;
    let frame = text[..end].to_string();
    buffer.advance(end + sep);
    Some(frame)
}

fn parse_frame(frame: &str) -> Option<Result<StreamFrame>> {
    let mut name = None;
    let mut data: Vec<&str> = Vec::new();
    for line in frame.lines() {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line
            .split_once(':')
            .map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
        match field {
            "event" => name = Some(value),
            "data" => data.push(value),
            _ => {}
        }
    }
    let name = name?;
    if name == "ping" {
        return Some(Ok(StreamFrame::Ping));
    }
    let joined = data.join("\n");
    if joined.is_empty() {
        return None;
    }
    let value: Value = match serde_json::from_str(&joined) {
        Ok(v) => v,
        Err(e) => {
            return Some(Err(ClientError::Decode(format!(
                "stream frame {name}: {e}"
            ))))
        }
    };
    if name == "error" {
        return Some(Ok(StreamFrame::Error(value)));
    }
    Some(
        serde_json::from_value(value)
            .map(StreamFrame::Event)
            .map_err(|e| ClientError::Decode(format!("stream frame {name}: not an event: {e}"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(v: Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn frames_split_on_blank_lines_of_any_style() {
        let mut buf = BytesMut::from(
            &b"event: a\ndata: {\"x\":1}\n\nevent: ping\r\ndata: {}\r\n\r\nevent: b\ndata: {\"id\":\"e\",\"type\":\"y\""
                [..],
        );
        assert_eq!(take_frame(&mut buf).unwrap(), "event: a\ndata: {\"x\":1}");
        assert_eq!(take_frame(&mut buf).unwrap(), "event: ping\r\ndata: {}");
        assert_eq!(
            take_frame(&mut buf),
            None,
            "an incomplete frame waits for more bytes"
        );
        buf.extend_from_slice(b"}\n\n");
        assert_eq!(
            parse_frame(&take_frame(&mut buf).unwrap())
                .unwrap()
                .unwrap(),
            StreamFrame::Event(event(serde_json::json!({"id": "e", "type": "y"})))
        );
    }

    #[test]
    fn pings_comments_errors_and_unnamed_frames() {
        assert_eq!(
            parse_frame("event: ping\ndata: {}").unwrap().unwrap(),
            StreamFrame::Ping
        );
        assert!(parse_frame(": keep-alive").is_none());
        assert!(
            parse_frame("data: {\"x\":1}").is_none(),
            "frames without event: are dropped, as the SDK does"
        );
        assert!(matches!(
            parse_frame("event: error\ndata: {\"e\":1}")
                .unwrap()
                .unwrap(),
            StreamFrame::Error(_)
        ));
        assert_eq!(
            parse_frame("event: m\ndata: {\"id\": \"e\",\ndata: \"type\": \"session.deleted\"}")
                .unwrap()
                .unwrap(),
            StreamFrame::Event(event(
                serde_json::json!({"id": "e", "type": "session.deleted"})
            )),
            "data lines join with newlines"
        );
        assert!(parse_frame("event: m\ndata: not json").unwrap().is_err());
        assert!(
            parse_frame("event: m\ndata: {\"a\": 1}").unwrap().is_err(),
            "an event has an id and a type"
        );
    }
}
