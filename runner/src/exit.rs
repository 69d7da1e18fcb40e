//! What the runner's exit status tells the supervisor that started it. The
//! supervisor removes the sandbox whatever the status; the status says why
//! the activation ended, for its logs and metrics.

use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// The item ran to its end: a healthcheck passed, or a Session
    /// activation ended (terminated, idle, stopped) and the Work was stopped.
    Done = 0,
    /// A healthcheck's probe failed (its Result says why), or the runner
    /// could not start the item (a missing identity, an unreadable secret,
    /// no threads to run it on).
    Failed = 1,
    /// The process could not make itself non-dumpable, so it read no secret.
    Unprotected = 2,
    /// A Work type this runner does not know: its lease was left untouched,
    /// for a worker that knows it.
    UnknownWorkType = 3,
    /// The lease was lost, refused or left to expire (a result that could
    /// not be delivered, an input that could not be fetched now): Poll will
    /// hand the item out again.
    LeftToExpire = 4,
    /// The outcome could not be reported (Result or Fail refused): the
    /// lease expires and the next holder finds the same.
    Unreported = 5,
    /// The Session's pinned input is invalid: the Work was Failed, which
    /// terminated the Session.
    InputFailed = 6,
    /// SIGTERM or SIGINT ended the item: its supervisor relaying a Stop, or
    /// the sandbox shut down from outside (an eviction, `docker stop`). No
    /// tool call was taken after it, the running one was cancelled, the
    /// Memory Stores were flushed (push-only, bounded) and their folders and
    /// `skills/` removed. The Work was stopped if a Stop was asked for;
    /// otherwise its lease is left to expire, so Poll hands the item out again.
    Signalled = 7,
    /// Waiting mode (`--wait`): the envelope on stdin was refused (too long,
    /// not UTF-8, not JSON, cut off before its newline, or invalid). Nothing
    /// was contacted; no Work was touched.
    EnvelopeRefused = 8,
    /// Waiting mode: stdin closed before any envelope byte, the supervisor
    /// recycling a sandbox it no longer needs. A clean end.
    Recycled = 9,
    /// Waiting mode: `--wait-timeout-seconds` passed with no envelope.
    WaitTimedOut = 10,
    /// Kept mode (`--keep-idle-seconds`): the next envelope named another
    /// Session, Work type or Environment; it was not used, nothing was contacted.
    ForeignEnvelope = 11,
    /// Kept mode: no next envelope within `--keep-idle-seconds`.
    KeptExpired = 12,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

impl Exit {
    /// A short name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Exit::Done => "done",
            Exit::Failed => "failed",
            Exit::Unprotected => "unprotected",
            Exit::UnknownWorkType => "unknown_work_type",
            Exit::LeftToExpire => "left_to_expire",
            Exit::Unreported => "unreported",
            Exit::InputFailed => "input_failed",
            Exit::Signalled => "signalled",
            Exit::EnvelopeRefused => "envelope_refused",
            Exit::Recycled => "recycled",
            Exit::WaitTimedOut => "wait_timed_out",
            Exit::ForeignEnvelope => "foreign_envelope",
            Exit::KeptExpired => "kept_expired",
        }
    }

    /// The exit a status code means, for a supervisor reading one.
    pub fn from_code(code: i32) -> Option<Exit> {
        use Exit::*;
        [
            Done,
            Failed,
            Unprotected,
            UnknownWorkType,
            LeftToExpire,
            Unreported,
            InputFailed,
            Signalled,
            EnvelopeRefused,
            Recycled,
            WaitTimedOut,
            ForeignEnvelope,
            KeptExpired,
        ]
        .into_iter()
        .find(|e| *e as i32 == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for code in 0..=12 {
            assert_eq!(Exit::from_code(code).map(|e| e as i32), Some(code));
        }
        assert_eq!(Exit::from_code(13), None);
        assert_eq!(Exit::from_code(-1), None);
    }
}
