//! The result event a call's output becomes, sized for the api. The api
//! refuses a sent event larger than [`MAX_EVENT_BYTES`] as JSON, and a call
//! whose result is refused stays open: its Session waits for ever. So the
//! event is measured as it will be sent (the whole event, JSON escapes and
//! base64 included: 100 KiB of control characters are 600 KiB as JSON)
//! and brought under the limit. An image or document that does not fit
//! becomes a short text saying so (and the result an error); text that
//! does not fit is cut in its middle, where a marker says how much was
//! left out, so both its start and its end (a shell's exit code) stay. A
//! result the api refuses anyway is answered by [`refused`].

use crate::tools::ToolOutput;
use mango_protocol::content::{ContentBlock, DocumentSource, ImageSource};
use mango_protocol::events::{SentEvent, UserToolResult, MAX_EVENT_BYTES};
use std::sync::OnceLock;

/// What bringing a result under the limit changed, for the log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fitted {
    /// Images or documents replaced by a note.
    pub media_left_out: usize,
    /// Bytes of text cut out.
    pub text_left_out: usize,
}

impl Fitted {
    pub fn changed(&self) -> bool {
        *self != Fitted::default()
    }
}

/// The result event for call `call_id` with `output`, at most
/// [`MAX_EVENT_BYTES`] as JSON.
pub fn result(call_id: &str, output: ToolOutput) -> (SentEvent, Fitted) {
    fit(call_id, output, MAX_EVENT_BYTES)
}

/// The short error that answers call `call_id` when the api refused its
/// result for `why` (a 4xx other than 401, 403 and 404): the call is
/// answered, and the model learns its output is lost.
pub fn refused(call_id: &str, why: &str) -> SentEvent {
    const WHY_CHARS: usize = 500;
    let short: String = why.chars().take(WHY_CHARS).collect();
    let why = if short.len() < why.len() {
        format!("{short}...")
    } else {
        short
    };
    let output = ToolOutput::error(format!(
        "the tool ran, but the api refused its result ({why}); none of its output could be delivered"
    ));
    fit(call_id, output, MAX_EVENT_BYTES).0
}

fn event(call_id: &str, content: Vec<ContentBlock>, is_error: bool) -> SentEvent {
    SentEvent::UserToolResult(UserToolResult {
        tool_use_id: call_id.to_string(),
        content: Some(content),
        is_error: Some(is_error),
        session_thread_id: None,
    })
}

/// Bytes of `value` serialized as JSON, as the client sends it.
fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// What one character costs inside a JSON string, as serde_json writes it:
/// ASCII from a table made by serde_json itself (`\n` is 2 bytes, U+0001
/// is 6), anything else its UTF-8 bytes, which JSON leaves unescaped.
fn escaped_len(c: char) -> usize {
    static ASCII: OnceLock<[u8; 128]> = OnceLock::new();
    let table = ASCII.get_or_init(|| {
        let mut table = [0u8; 128];
        for (byte, cost) in table.iter_mut().enumerate() {
            let quoted = serde_json::to_string(&char::from(byte as u8).to_string())
                .expect("a string serializes");
            *cost = (quoted.len() - 2) as u8;
        }
        table
    });
    if c.is_ascii() {
        table[c as usize] as usize
    } else {
        c.len_utf8()
    }
}

fn escaped_str_len(text: &str) -> usize {
    text.chars().map(escaped_len).sum()
}

/// `fit` with the limit as a parameter, so tests can take it to its edge.
fn fit(call_id: &str, output: ToolOutput, limit: usize) -> (SentEvent, Fitted) {
    let ToolOutput {
        mut content,
        mut is_error,
    } = output;
    let mut fitted = Fitted::default();
    // The event as JSON is its frame (with `[]` for content) plus its
    // blocks and the commas between them: measured so, no block is copied.
    let size = |content: &[ContentBlock], is_error: bool| {
        let blocks: usize = content.iter().map(json_len).sum();
        json_len(&event(call_id, Vec::new(), is_error)) + blocks + content.len().saturating_sub(1)
    };
    let mut current = size(&content, is_error);
    if current <= limit {
        return (event(call_id, content, is_error), fitted);
    }

    // Media first, largest first: a picture cut in half is no picture.
    let mut media: Vec<(usize, usize)> = content
        .iter()
        .enumerate()
        .filter(|(_, b)| b.as_text().is_none())
        .map(|(i, b)| (json_len(b), i))
        .collect();
    media.sort_unstable_by(|a, b| b.cmp(a));
    for (_, i) in media {
        if current <= limit {
            break;
        }
        content[i] = ContentBlock::text(media_note(&content[i], limit));
        is_error = true;
        fitted.media_left_out += 1;
        current = size(&content, is_error);
    }

    // Then text, longest first, each cut by what is still too much.
    let mut texts: Vec<(usize, usize)> = content
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_text().map(|t| (escaped_str_len(t), i)))
        .collect();
    texts.sort_unstable_by(|a, b| b.cmp(a));
    for (escaped, i) in texts {
        if current <= limit {
            break;
        }
        let budget = escaped.saturating_sub(current - limit);
        let text = content[i].as_text().unwrap_or_default();
        let (cut, left_out) = cut_middle(text, budget, limit);
        content[i] = ContentBlock::text(cut);
        fitted.text_left_out += left_out;
        current = size(&content, is_error);
    }

    let sent = event(call_id, content, is_error);
    let measured = json_len(&sent);
    debug_assert_eq!(measured, current, "the event is measured as it is sent");
    if measured <= limit {
        return (sent, fitted);
    }
    // Only an id or a block count past all reason gets here.
    let note = format!(
        "[the result was left out: it is {measured} bytes as JSON, and a tool result may be at most {limit}]"
    );
    (event(call_id, vec![ContentBlock::text(note)], true), fitted)
}

/// The text that stands in for an image or document too large to send.
fn media_note(block: &ContentBlock, limit: usize) -> String {
    let kind = block.kind().as_str();
    let media_type = match block {
        ContentBlock::Image {
            source: ImageSource::Base64 { media_type, .. },
        }
        | ContentBlock::Document {
            source: DocumentSource::Base64 { media_type, .. },
            ..
        } => format!(" ({media_type})"),
        _ => String::new(),
    };
    format!(
        "[the {kind}{media_type} was left out: it is {} bytes as JSON, and a tool result may be at most {limit}. Make a smaller copy (fewer pixels or pages, stronger compression) and read that.]",
        json_len(block)
    )
}

/// `text` cut in its middle so that it costs at most `budget` bytes inside
/// a JSON string, marker included; and how many bytes were left out.
fn cut_middle(text: &str, budget: usize, limit: usize) -> (String, usize) {
    let marker = |left_out: usize| {
        format!(
            "\n\n[... {left_out} bytes left out here: a tool result may be at most {limit} bytes as JSON ...]\n\n"
        )
    };
    // The marker's longest form: it never says more than the whole text.
    let widest = escaped_str_len(&marker(text.len()));
    let Some(keep) = budget.checked_sub(widest) else {
        return (marker(text.len()), text.len());
    };
    let head_end = prefix_within(text, keep / 2);
    let tail_budget = keep - escaped_str_len(&text[..head_end]);
    let tail_start = head_end + suffix_within(&text[head_end..], tail_budget);
    let left_out = tail_start - head_end;
    let mut cut = String::with_capacity(head_end + widest + text.len() - tail_start);
    cut.push_str(&text[..head_end]);
    cut.push_str(&marker(left_out));
    cut.push_str(&text[tail_start..]);
    (cut, left_out)
}

/// The end of the longest prefix of `text` that costs at most `budget`.
fn prefix_within(text: &str, budget: usize) -> usize {
    let mut spent = 0;
    for (at, c) in text.char_indices() {
        spent += escaped_len(c);
        if spent > budget {
            return at;
        }
    }
    text.len()
}

/// The start of the longest suffix of `text` that costs at most `budget`.
fn suffix_within(text: &str, budget: usize) -> usize {
    let mut spent = 0;
    for (at, c) in text.char_indices().rev() {
        spent += escaped_len(c);
        if spent > budget {
            return at + c.len_utf8();
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn text_of(event: &SentEvent) -> String {
        let SentEvent::UserToolResult(r) = event else {
            panic!("a tool result")
        };
        r.content
            .iter()
            .flatten()
            .filter_map(ContentBlock::as_text)
            .collect()
    }

    fn is_error(event: &SentEvent) -> bool {
        let SentEvent::UserToolResult(r) = event else {
            panic!("a tool result")
        };
        r.is_error == Some(true)
    }

    #[test]
    fn escape_costs_are_serde_jsons() {
        for c in [
            'a', '"', '\\', '\n', '\t', '\u{1}', '\u{1f}', '\u{7f}', 'é', '€', '🦀',
        ] {
            let quoted = serde_json::to_string(&c.to_string()).unwrap();
            assert_eq!(escaped_len(c), quoted.len() - 2, "{c:?}");
        }
        assert_eq!(escaped_str_len("\u{1}\u{1}"), 12);
    }

    #[test]
    fn a_result_that_fits_is_sent_as_it_is() {
        let output = ToolOutput::ok("hello");
        let (sent, fitted) = result("sevt_1", output.clone());
        assert!(!fitted.changed());
        assert_eq!(sent, event("sevt_1", output.content, false));
    }

    /// At the limit nothing changes; one byte over, the text is cut to fit.
    #[test]
    fn the_limit_holds_at_its_edge() {
        let limit = 4096;
        let overhead = json_len(&event("sevt_1", vec![ContentBlock::text("")], false));
        let exact = "x".repeat(limit - overhead);
        let (sent, fitted) = fit("sevt_1", ToolOutput::ok(exact.clone()), limit);
        assert_eq!((json_len(&sent), fitted.changed()), (limit, false));
        assert_eq!(text_of(&sent), exact);

        let over = format!("{exact}y");
        let (sent, fitted) = fit("sevt_1", ToolOutput::ok(over), limit);
        assert!(json_len(&sent) <= limit, "{}", json_len(&sent));
        assert!(fitted.text_left_out > 0);
        assert!(!is_error(&sent), "a cut text is still the tool's answer");
        assert!(text_of(&sent).contains("bytes left out here"));
    }

    /// Control characters cost six bytes each as JSON: the cut counts that,
    /// keeps the text's start and end, and lands on character boundaries.
    #[test]
    fn escaped_text_is_cut_in_the_middle_by_its_json_size() {
        let mut text = String::from("START\n");
        text.push_str(&"\u{1}\u{2}\u{1b}é\"\\".repeat(25_000));
        text.push_str("\n[exit code: 3]");
        assert!(text.len() < MAX_EVENT_BYTES && escaped_str_len(&text) > 2 * MAX_EVENT_BYTES);
        let (sent, fitted) = result("sevt_1", ToolOutput::error(text.clone()));
        let size = json_len(&sent);
        assert!(size <= MAX_EVENT_BYTES, "{size}");
        assert!(
            size > MAX_EVENT_BYTES - 64,
            "the cut uses the room there is: {size}"
        );
        let got = text_of(&sent);
        assert!(got.starts_with("START\n") && got.ends_with("[exit code: 3]"));
        assert!(is_error(&sent));
        let marker = format!(
            "\n\n[... {} bytes left out here: a tool result may be at most {MAX_EVENT_BYTES} bytes as JSON ...]\n\n",
            fitted.text_left_out
        );
        assert!(got.contains(&marker));
        assert_eq!(got.len() - marker.len() + fitted.text_left_out, text.len());
    }

    #[test]
    fn an_image_too_large_to_send_becomes_a_note() {
        let data = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 300_000]);
        let output = ToolOutput {
            content: vec![ContentBlock::Image {
                source: ImageSource::Base64 {
                    data,
                    media_type: "image/png".into(),
                },
            }],
            is_error: false,
        };
        let (sent, fitted) = result("sevt_1", output);
        assert_eq!(fitted.media_left_out, 1);
        assert!(json_len(&sent) < 1024);
        assert!(is_error(&sent), "the model did not get its image");
        let note = text_of(&sent);
        assert!(note.contains("image (image/png) was left out"), "{note}");
        assert!(note.contains("at most 262144"), "{note}");

        // One that fits is sent as it is.
        let small = ToolOutput {
            content: vec![ContentBlock::Image {
                source: ImageSource::Base64 {
                    data: "iVBORw0KGgo=".into(),
                    media_type: "image/png".into(),
                },
            }],
            is_error: false,
        };
        let (sent, fitted) = result("sevt_1", small.clone());
        assert!(!fitted.changed());
        assert_eq!(sent, event("sevt_1", small.content, false));
    }

    /// Only what does not fit goes: a large image with a short text keeps the text.
    #[test]
    fn media_go_before_text_and_only_as_many_as_needed() {
        let big = "A".repeat(MAX_EVENT_BYTES);
        let image = |data: String| ContentBlock::Image {
            source: ImageSource::Base64 {
                data,
                media_type: "image/gif".into(),
            },
        };
        let output = ToolOutput {
            content: vec![
                ContentBlock::text("caption"),
                image(big),
                image("R0lGOD".into()),
            ],
            is_error: false,
        };
        let (sent, fitted) = result("sevt_1", output);
        let SentEvent::UserToolResult(r) = &sent else {
            panic!()
        };
        let blocks = r.content.as_ref().unwrap();
        assert_eq!(
            fitted,
            Fitted {
                media_left_out: 1,
                text_left_out: 0
            }
        );
        assert_eq!(blocks[0].as_text(), Some("caption"));
        assert!(blocks[1]
            .as_text()
            .unwrap()
            .contains("image (image/gif) was left out"));
        assert_eq!(blocks[2], image("R0lGOD".into()));
    }

    #[test]
    fn a_refusal_is_answered_briefly() {
        let why =
            "422 Unprocessable Entity invalid_request_error: ".to_string() + &"x".repeat(5000);
        let sent = refused("sevt_1", &why);
        assert!(is_error(&sent));
        let text = text_of(&sent);
        assert!(
            text.contains("refused its result (422 Unprocessable Entity"),
            "{text}"
        );
        assert!(text.len() < 800, "{}", text.len());
        assert!(text_of(&refused("sevt_1", "400 Bad Request")).contains("(400 Bad Request)"));
    }
}
