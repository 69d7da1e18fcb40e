//! Session event streams (`GET /v1/sessions/{id}/events/stream`), read frame by frame.

use crate::TestApp;
use serde_json::Value;

impl TestApp {
    /// Opens `GET /v1/sessions/{id}/events/stream` with `credential`.
    pub async fn open_stream(&self, session: &str, credential: &str) -> reqwest::Response {
        self.http
            .get(format!("{}/v1/sessions/{session}/events/stream", self.base))
            .bearer_auth(credential)
            .send()
            .await
            .unwrap()
    }
}

/// One SSE frame: its `event:` name (if any) and its joined `data:` lines.
#[derive(Debug, Clone)]
pub struct Frame {
    pub event: Option<String>,
    pub data: String,
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("frame data is not JSON ({e}): {:?}", self.data))
    }
}

/// Reads SSE frames from a response, splitting on blank lines.
pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
    done: bool,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> SseReader {
        SseReader {
            resp,
            buf: Vec::new(),
            done: false,
        }
    }

    fn take_frame(&mut self) -> Option<String> {
        // axum writes `\n` line endings; a frame ends at the first blank line.
        let at = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let frame = String::from_utf8_lossy(&self.buf[..at]).into_owned();
        self.buf.drain(..at + 2);
        Some(frame)
    }

    /// The next complete frame (comment-only frames skipped); `None` when the stream ends.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            while let Some(raw) = self.take_frame() {
                let mut event = None;
                let mut data: Vec<String> = Vec::new();
                let mut any = false;
                for line in raw.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    any = true;
                    let (field, value) = match line.split_once(':') {
                        Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                        None => (line, ""),
                    };
                    match field {
                        "event" => event = Some(value.to_string()),
                        "data" => data.push(value.to_string()),
                        _ => {}
                    }
                }
                if any {
                    return Some(Frame {
                        event,
                        data: data.join("\n"),
                    });
                }
            }
            if self.done {
                return None;
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.buf.extend_from_slice(&bytes),
                Ok(None) | Err(_) => self.done = true,
            }
        }
    }

    /// The next non-ping frame.
    pub async fn next_event(&mut self) -> Option<Frame> {
        loop {
            let f = self.next_frame().await?;
            if f.event.as_deref() != Some("ping") {
                return Some(f);
            }
        }
    }
}
