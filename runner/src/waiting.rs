//! The waiting mode (`mango-runner --wait`, spec §7.1): a runner started
//! before its item is known, in a warm sandbox. Its environment holds only
//! the api's URL and the workspace; it becomes non-dumpable, then reads one
//! bounded envelope on stdin that names the item and carries its secret.
//! Bad input ends it with [`crate::exit::Exit::BadEnvelope`] and no
//! identity is used.

use crate::item::Identity;
use crate::{memory, session};
use mango_protocol::envelope::{Envelope, EnvelopeError, MAX_ENVELOPE_BYTES};
use std::io::Read;
use std::path::PathBuf;

/// What a waiting runner knows before its envelope.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    #[arg(long, env = "MANGO_BASE_URL")]
    pub base_url: String,
    #[arg(long, env = "MANGO_WORKSPACE", default_value = "/workspace")]
    pub workspace: PathBuf,
    #[arg(
        long,
        env = "MANGO_IDLE_AFTER_END_TURN_SECONDS",
        default_value_t = session::IDLE_AFTER_END_TURN.as_secs(),
        hide = true
    )]
    pub idle_after_end_turn_seconds: u64,
    #[arg(
        long,
        env = "MANGO_MEMORY_SYNC_INTERVAL_SECONDS",
        default_value_t = memory::SYNC_INTERVAL.as_secs(),
        hide = true
    )]
    pub memory_sync_interval_seconds: u64,
}

impl WaitArgs {
    /// The identity the envelope names, with this sandbox's settings.
    pub fn identity(&self, envelope: &Envelope) -> Identity {
        Identity {
            base_url: self.base_url.clone(),
            work_id: envelope.work_id.clone(),
            environment_id: envelope.environment_id.clone(),
            work_type: envelope.work_type.as_str().to_string(),
            session_id: envelope.session_id.clone(),
            workspace: self.workspace.clone(),
            secret_timeout_seconds: 0,
            idle_after_end_turn_seconds: self.idle_after_end_turn_seconds,
            memory_sync_interval_seconds: self.memory_sync_interval_seconds,
        }
    }
}

/// Reads one envelope line, a byte at a time so nothing past its newline
/// is taken (stdin stays open for the launcher, so reading beyond it would
/// block), at most [`MAX_ENVELOPE_BYTES`] before it. EOF before the newline
/// is a partial envelope (or an empty one), whatever came before it.
pub fn read_envelope(mut input: impl Read) -> Result<Envelope, EnvelopeError> {
    let mut line = Vec::with_capacity(1024);
    let mut byte = [0u8; 1];
    loop {
        match input.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => {
                line.push(b'\n');
                break;
            }
            Ok(_) if line.len() == MAX_ENVELOPE_BYTES => return Err(EnvelopeError::TooLong),
            Ok(_) => line.push(byte[0]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    Envelope::parse_line(&line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mango_protocol::WorkType;

    // {"sessions_token":"mango_st_secretvalue"}
    const SECRET: &str = "eyJzZXNzaW9uc190b2tlbiI6Im1hbmdvX3N0X3NlY3JldHZhbHVlIn0";

    fn envelope() -> Envelope {
        Envelope {
            work_id: "work_1".into(),
            environment_id: "env_1".into(),
            work_type: WorkType::Healthcheck,
            session_id: None,
            claim: 1,
            secret: SECRET.into(),
        }
    }

    #[test]
    fn reads_one_line_and_nothing_after_it() {
        let mut input = envelope().to_line().into_bytes();
        input.extend_from_slice(b"next line");
        let mut reader = &input[..];
        assert_eq!(read_envelope(&mut reader).unwrap(), envelope());
        assert_eq!(reader, b"next line", "not a byte past the newline");
    }

    #[test]
    fn partial_oversized_and_malformed_are_refused() {
        assert_eq!(read_envelope(&b""[..]), Err(EnvelopeError::Empty));
        let line = envelope().to_line();
        let cut = &line.as_bytes()[..line.len() - 1];
        assert_eq!(read_envelope(cut), Err(EnvelopeError::Partial));
        let huge = vec![b'x'; MAX_ENVELOPE_BYTES + 1];
        assert_eq!(read_envelope(&huge[..]), Err(EnvelopeError::TooLong));
        let mut exact = vec![b' '; MAX_ENVELOPE_BYTES];
        exact.push(b'\n');
        assert!(matches!(
            read_envelope(&exact[..]),
            Err(EnvelopeError::NotJson(_))
        ));
        assert!(matches!(
            read_envelope(&b"{}\n"[..]),
            Err(EnvelopeError::NotJson(_))
        ));
    }

    #[test]
    fn the_identity_is_the_envelope_s() {
        let args = WaitArgs {
            base_url: "http://api".into(),
            workspace: "/workspace".into(),
            idle_after_end_turn_seconds: 60,
            memory_sync_interval_seconds: 15,
        };
        let id = args.identity(&Envelope {
            work_type: WorkType::Session,
            session_id: Some("sesn_1".into()),
            ..envelope()
        });
        assert_eq!(
            (
                id.work_id.as_str(),
                id.work_type.as_str(),
                id.session_id.as_deref()
            ),
            ("work_1", "session", Some("sesn_1"))
        );
    }
}
