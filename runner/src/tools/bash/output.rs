//! A call's output: what the PTY passed on, bounded in memory while the call
//! runs, then cleaned for the model (ANSI escapes stripped, CRLF → LF,
//! trailing newlines stripped, the tail kept within [`BASH_OUTPUT_LIMIT`]).

use std::sync::OnceLock;

use regex::Regex;

use super::BASH_OUTPUT_LIMIT;

/// Raw output of one call, bounded in memory (the tail is kept).
#[derive(Default)]
pub(super) struct OutputBuffer {
    buf: Vec<u8>,
    truncated: bool,
}

impl OutputBuffer {
    const KEEP: usize = 2 * BASH_OUTPUT_LIMIT;

    pub(super) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        if self.buf.len() > 2 * Self::KEEP {
            let cut = self.buf.len() - Self::KEEP;
            self.buf.drain(..cut);
            self.truncated = true;
        }
    }

    pub(super) fn finish(self) -> String {
        clean_output(&self.buf, self.truncated)
    }
}

fn ansi_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\|\x1b[ -/]*[0-~]",
        )
        .expect("valid ANSI regex")
    })
}

/// ANSI escapes stripped, CRLF → LF, trailing newlines stripped, tail kept
/// within [`BASH_OUTPUT_LIMIT`] bytes.
pub fn clean_output(raw: &[u8], already_truncated: bool) -> String {
    let text = String::from_utf8_lossy(raw);
    // Every escape sequence starts with ESC; most output has none, and a
    // byte scan is far cheaper than the regex engine on a cold cache.
    let text = if raw.contains(&0x1b) {
        ansi_regex().replace_all(&text, "")
    } else {
        text
    };
    let text = if raw.contains(&b'\r') {
        std::borrow::Cow::Owned(text.replace("\r\n", "\n"))
    } else {
        text
    };
    let text = text.trim_end_matches(['\n', '\r']);
    let mut truncated = already_truncated;
    let mut tail = text;
    if tail.len() > BASH_OUTPUT_LIMIT {
        let mut cut = tail.len() - BASH_OUTPUT_LIMIT;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = &tail[cut..];
        truncated = true;
    }
    if truncated {
        format!("[output truncated]\n{tail}")
    } else {
        tail.to_string()
    }
}
