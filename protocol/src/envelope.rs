//! The activation envelope: the one line a supervisor writes to a waiting
//! runner's stdin (spec §7.1, warm and kept sandboxes). It carries the
//! identity a cold runner reads from its environment plus the Work secret,
//! so a sandbox can be started before its Work is known.
//!
//! The parser is strict and its errors name only the class of the fault:
//! neither the secret nor the raw line ever appears in an error or a Debug.

use crate::WorkType;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The longest envelope line, its newline excluded.
pub const MAX_ENVELOPE_BYTES: usize = 16 * 1024;

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub work_id: String,
    pub environment_id: String,
    pub work_type: WorkType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The claim number of this activation's lease (1 for the first claim).
    pub claim: i64,
    /// The Work secret: URL-safe base64 of a JSON object with a `sessions_token`.
    pub secret: String,
}

/// Why a line is not an envelope. No variant holds input bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// Longer than [`MAX_ENVELOPE_BYTES`] before its newline.
    TooLong,
    /// Not UTF-8.
    NotUtf8,
    /// Not a JSON envelope object; the text is serde's category and position.
    NotJson(String),
    /// The input ended before a newline: the writer stopped mid-line.
    Partial,
    /// The input ended before any byte: the supervisor closed stdin.
    Empty,
    /// A field has a value the envelope refuses; names the field and why.
    Invalid(&'static str),
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::TooLong => {
                write!(f, "the envelope exceeds {MAX_ENVELOPE_BYTES} bytes")
            }
            EnvelopeError::NotUtf8 => write!(f, "the envelope is not UTF-8"),
            EnvelopeError::NotJson(why) => write!(f, "the envelope is not valid JSON: {why}"),
            EnvelopeError::Partial => write!(f, "the envelope ended before its newline"),
            EnvelopeError::Empty => write!(f, "stdin closed before an envelope arrived"),
            EnvelopeError::Invalid(why) => write!(f, "the envelope is invalid: {why}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("work_id", &self.work_id)
            .field("environment_id", &self.environment_id)
            .field("work_type", &self.work_type)
            .field("session_id", &self.session_id)
            .field("claim", &self.claim)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Envelope {
    /// The envelope as one JSON line, newline-terminated.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("an envelope always serializes");
        line.push('\n');
        line
    }

    /// Parses one envelope from `input`: exactly one line, its newline
    /// included; bytes after the newline are refused too, so a writer that
    /// sends two lines at once is caught. `Empty` for no bytes at all,
    /// `Partial` for bytes without a newline.
    pub fn parse_line(input: &[u8]) -> Result<Envelope, EnvelopeError> {
        if input.is_empty() {
            return Err(EnvelopeError::Empty);
        }
        let Some(end) = input.iter().position(|b| *b == b'\n') else {
            return Err(if input.len() > MAX_ENVELOPE_BYTES {
                EnvelopeError::TooLong
            } else {
                EnvelopeError::Partial
            });
        };
        if end > MAX_ENVELOPE_BYTES {
            return Err(EnvelopeError::TooLong);
        }
        if end + 1 != input.len() {
            return Err(EnvelopeError::Invalid(
                "bytes follow the envelope's newline",
            ));
        }
        let line = std::str::from_utf8(&input[..end]).map_err(|_| EnvelopeError::NotUtf8)?;
        let envelope: Envelope = serde_json::from_str(line).map_err(|e| {
            // serde's message may quote input (an unknown variant, a string
            // where a number belongs); keep only the field path and position.
            EnvelopeError::NotJson(describe(&e))
        })?;
        envelope.validate()?;
        Ok(envelope)
    }

    fn validate(&self) -> Result<(), EnvelopeError> {
        use EnvelopeError::Invalid;
        if self.work_id.is_empty() {
            return Err(Invalid("work_id is empty"));
        }
        if self.environment_id.is_empty() {
            return Err(Invalid("environment_id is empty"));
        }
        match (&self.work_type, &self.session_id) {
            (WorkType::Session, None) => {
                return Err(Invalid("a session Work needs session_id"));
            }
            (WorkType::Session, Some(id)) if id.is_empty() => {
                return Err(Invalid("session_id is empty"));
            }
            (WorkType::Healthcheck, Some(_)) => {
                return Err(Invalid("a healthcheck Work has no session_id"));
            }
            _ => {}
        }
        if self.claim < 1 {
            return Err(Invalid("claim must be at least 1"));
        }
        if !is_work_secret(&self.secret) {
            return Err(Invalid("secret is not a Work secret"));
        }
        Ok(())
    }
}

/// The error's category and position, never its message (which can quote input).
fn describe(error: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let class = match error.classify() {
        Category::Io => "unreadable",
        Category::Syntax => "syntax error",
        Category::Data => "a field is missing, unknown or of the wrong type",
        Category::Eof => "truncated JSON",
    };
    format!("{class} at column {}", error.column())
}

/// A Work secret: URL-safe base64 (padding optional) of a JSON object whose
/// `sessions_token` is a non-empty string.
fn is_work_secret(secret: &str) -> bool {
    let Ok(raw) = URL_SAFE_NO_PAD
        .decode(secret.trim_end_matches('='))
        .or_else(|_| URL_SAFE.decode(secret))
    else {
        return false;
    };
    let Ok(serde_json::Value::Object(object)) = serde_json::from_slice(&raw) else {
        return false;
    };
    matches!(object.get("sessions_token"), Some(serde_json::Value::String(t)) if !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "eyJzZXNzaW9uc190b2tlbiI6Im1hbmdvX3N0X3NlY3JldHZhbHVlIn0"; // {"sessions_token":"mango_st_secretvalue"}

    fn session() -> Envelope {
        Envelope {
            work_id: "work_1".into(),
            environment_id: "env_1".into(),
            work_type: WorkType::Session,
            session_id: Some("sesn_1".into()),
            claim: 1,
            secret: SECRET.into(),
        }
    }

    fn healthcheck() -> Envelope {
        Envelope {
            work_type: WorkType::Healthcheck,
            session_id: None,
            ..session()
        }
    }

    fn json_line(value: serde_json::Value) -> Vec<u8> {
        let mut line = serde_json::to_vec(&value).unwrap();
        line.push(b'\n');
        line
    }

    fn good_json() -> serde_json::Value {
        serde_json::to_value(session()).unwrap()
    }

    fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
        let mut json = good_json();
        json[field] = value;
        json_line(json)
    }

    /// An envelope exactly `len` bytes long (newline excluded), padded in work_id.
    fn envelope_of_len(len: usize) -> Vec<u8> {
        let base = session().to_line().len() - 1 - "work_1".len();
        let mut envelope = session();
        envelope.work_id = "w".repeat(len - base);
        let line = envelope.to_line().into_bytes();
        assert_eq!(line.len(), len + 1);
        line
    }

    #[test]
    fn round_trips_both_work_types() {
        for envelope in [session(), healthcheck()] {
            let line = envelope.to_line();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(Envelope::parse_line(line.as_bytes()).unwrap(), envelope);
        }
        assert!(!healthcheck().to_line().contains("session_id"));
    }

    #[test]
    fn the_length_limit_holds_at_its_edge() {
        let exact = envelope_of_len(MAX_ENVELOPE_BYTES);
        assert!(Envelope::parse_line(&exact).is_ok());
        let over = envelope_of_len(MAX_ENVELOPE_BYTES + 1);
        assert_eq!(Envelope::parse_line(&over), Err(EnvelopeError::TooLong));
        let over_without_newline = &over[..over.len() - 1];
        assert_eq!(
            Envelope::parse_line(over_without_newline),
            Err(EnvelopeError::TooLong)
        );
    }

    #[test]
    fn framing_faults_have_their_own_class() {
        assert_eq!(Envelope::parse_line(b""), Err(EnvelopeError::Empty));
        let line = session().to_line();
        let unterminated = line.trim_end().as_bytes();
        assert_eq!(
            Envelope::parse_line(unterminated),
            Err(EnvelopeError::Partial)
        );
        assert_eq!(
            Envelope::parse_line(&[0xff, 0xfe, b'\n']),
            Err(EnvelopeError::NotUtf8)
        );
        let mut two = line.clone();
        two.push_str(&line);
        assert!(matches!(
            Envelope::parse_line(two.as_bytes()),
            Err(EnvelopeError::Invalid(_))
        ));
        assert!(matches!(
            Envelope::parse_line(b"\n"),
            Err(EnvelopeError::NotJson(_))
        ));
        assert!(matches!(
            Envelope::parse_line(b"{\"work_id\":\n"),
            Err(EnvelopeError::NotJson(_))
        ));
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused() {
        let cases = [
            with("extra", serde_json::json!(1)),
            with("claim", serde_json::json!("1")),
            with("claim", serde_json::json!(1.5)),
            with("work_id", serde_json::json!(7)),
            with("work_type", serde_json::json!("batch")),
            with("secret", serde_json::json!(null)),
            json_line(serde_json::json!([1, 2])),
        ];
        for line in cases {
            assert!(
                matches!(Envelope::parse_line(&line), Err(EnvelopeError::NotJson(_))),
                "{}",
                String::from_utf8_lossy(&line)
            );
        }
        let mut missing = good_json();
        missing.as_object_mut().unwrap().remove("claim");
        assert!(matches!(
            Envelope::parse_line(&json_line(missing)),
            Err(EnvelopeError::NotJson(_))
        ));
    }

    #[test]
    fn invalid_values_name_the_field() {
        let invalid = |line: Vec<u8>| match Envelope::parse_line(&line) {
            Err(EnvelopeError::Invalid(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(invalid(with("work_id", "".into())).contains("work_id"));
        assert!(invalid(with("environment_id", "".into())).contains("environment_id"));
        assert!(invalid(with("session_id", "".into())).contains("session_id"));
        assert!(invalid(with("claim", 0.into())).contains("claim"));
        assert!(invalid(with("claim", (-3).into())).contains("claim"));
        let mut no_session = good_json();
        no_session.as_object_mut().unwrap().remove("session_id");
        assert!(invalid(json_line(no_session)).contains("session_id"));
        let mut healthcheck_with_session = good_json();
        healthcheck_with_session["work_type"] = "healthcheck".into();
        assert!(invalid(json_line(healthcheck_with_session)).contains("session_id"));
        for secret in [
            "",
            "not base64 at all!",
            "bm90IGpzb24",                  // "not json"
            "eyJvdGhlciI6IngifQ",           // {"other":"x"}
            "eyJzZXNzaW9uc190b2tlbiI6IiJ9", // {"sessions_token":""}
        ] {
            assert!(invalid(with("secret", secret.into())).contains("secret"));
        }
    }

    #[test]
    fn no_secret_or_raw_input_in_errors_or_debug() {
        let canary = "CANARY_d0_not_leak";
        let token_secret = URL_SAFE_NO_PAD.encode(format!(r#"{{"sessions_token":"{canary}"}}"#));
        let mut envelope = session();
        envelope.secret = token_secret.clone();
        let debug = format!("{envelope:?}");
        assert!(!debug.contains(&token_secret) && debug.contains("redacted"));
        let lines = [
            with("secret", canary.into()),
            with("work_type", canary.into()),
            with("claim", canary.into()),
            with(canary, 1.into()),
            format!("{{\"secret\":\"{canary}\"\n").into_bytes(),
            format!("{canary}\n").into_bytes(),
            {
                let mut e = good_json();
                e["secret"] = token_secret.clone().into();
                e["claim"] = 0.into();
                json_line(e)
            },
        ];
        for line in lines {
            let error = Envelope::parse_line(&line).unwrap_err();
            for shown in [format!("{error}"), format!("{error:?}")] {
                assert!(!shown.contains(canary), "{shown}");
                assert!(!shown.contains(&token_secret), "{shown}");
            }
        }
    }
}
