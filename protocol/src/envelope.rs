//! The envelope (spec §7.1): what a waiting runner reads on stdin, one line
//! of JSON of at most [`MAX_ENVELOPE_BYTES`], naming the item it is to run
//! and carrying its Work secret. A sandbox started before its item was
//! known learns its identity from it, never from its environment.

use serde::{Deserialize, Serialize};

/// The longest envelope line a runner accepts, its newline excluded.
pub const MAX_ENVELOPE_BYTES: usize = 16 * 1024;

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub work_id: String,
    pub environment_id: String,
    /// `session` or `healthcheck`; a type the runner does not know is its to refuse.
    pub work_type: String,
    /// Session Work only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub claim: i64,
    /// The Work secret, as Poll answered it.
    pub secret: String,
}

#[derive(Debug, PartialEq, Eq)]
pub enum EnvelopeError {
    /// More than [`MAX_ENVELOPE_BYTES`] before the newline.
    TooLarge,
    /// The stream ended before a whole line (or before any byte).
    Partial,
    /// Not the envelope's JSON; the reason names no value.
    Malformed(String),
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::TooLarge => {
                write!(f, "the envelope exceeds {MAX_ENVELOPE_BYTES} bytes")
            }
            EnvelopeError::Partial => f.write_str("the envelope ended before its newline"),
            EnvelopeError::Malformed(why) => write!(f, "the envelope is malformed: {why}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

impl Envelope {
    /// The line a launcher writes: the JSON and its newline.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("an envelope serializes");
        line.push('\n');
        line
    }

    /// One envelope from a line, with or without its newline. An error
    /// never quotes the input: it may hold the secret.
    pub fn parse_line(line: &[u8]) -> Result<Envelope, EnvelopeError> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.len() > MAX_ENVELOPE_BYTES {
            return Err(EnvelopeError::TooLarge);
        }
        let envelope: Envelope = serde_json::from_slice(line).map_err(|e| {
            EnvelopeError::Malformed(format!("{:?} at column {}", e.classify(), e.column()))
        })?;
        let empty = [
            ("work_id", &envelope.work_id),
            ("environment_id", &envelope.environment_id),
            ("work_type", &envelope.work_type),
            ("secret", &envelope.secret),
        ]
        .into_iter()
        .find(|(_, v)| v.is_empty());
        if let Some((field, _)) = empty {
            return Err(EnvelopeError::Malformed(format!("{field} is empty")));
        }
        if envelope.claim < 1 {
            return Err(EnvelopeError::Malformed("claim is not positive".into()));
        }
        Ok(envelope)
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("work_id", &self.work_id)
            .field("environment_id", &self.environment_id)
            .field("work_type", &self.work_type)
            .field("session_id", &self.session_id)
            .field("claim", &self.claim)
            .field("secret", &"..")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> Envelope {
        Envelope {
            work_id: "work_1".into(),
            environment_id: "env_1".into(),
            work_type: "session".into(),
            session_id: Some("sesn_1".into()),
            claim: 2,
            secret: "c2VjcmV0".into(),
        }
    }

    #[test]
    fn a_line_round_trips() {
        let line = envelope().to_line();
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert_eq!(Envelope::parse_line(line.as_bytes()).unwrap(), envelope());
        let check = Envelope {
            session_id: None,
            work_type: "healthcheck".into(),
            ..envelope()
        };
        assert!(!check.to_line().contains("session_id"));
        assert_eq!(
            Envelope::parse_line(check.to_line().as_bytes()).unwrap(),
            check
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let shown = format!("{:?}", envelope());
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(shown.contains("work_1"));
    }

    #[test]
    fn bad_lines_are_refused_without_quoting_them() {
        let mut oversized = envelope();
        oversized.secret = "s".repeat(MAX_ENVELOPE_BYTES);
        assert_eq!(
            Envelope::parse_line(oversized.to_line().as_bytes()),
            Err(EnvelopeError::TooLarge)
        );
        for bad in [
            &b"not json"[..],
            br#"{"work_id":"w"}"#,
            br#"{"work_id":"w","environment_id":"e","work_type":"session","claim":1,"secret":"topsecret","extra":1}"#,
            br#"{"work_id":"w","environment_id":"e","work_type":"session","claim":0,"secret":"topsecret"}"#,
            br#"{"work_id":"w","environment_id":"e","work_type":"session","claim":1,"secret":""}"#,
        ] {
            match Envelope::parse_line(bad) {
                Err(EnvelopeError::Malformed(why)) => assert!(!why.contains("topsecret"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_limit_is_exact() {
        let mut e = envelope();
        let base = e.to_line().len() - 1 - e.secret.len();
        e.secret = "s".repeat(MAX_ENVELOPE_BYTES - base);
        let line = e.to_line();
        assert_eq!(line.len() - 1, MAX_ENVELOPE_BYTES);
        assert!(Envelope::parse_line(line.as_bytes()).is_ok());
        e.secret.push('s');
        assert_eq!(
            Envelope::parse_line(e.to_line().as_bytes()),
            Err(EnvelopeError::TooLarge)
        );
    }
}
