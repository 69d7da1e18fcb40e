//! The Work secret hand-off: one line on stdin, read once, bounded, decoded,
//! and kept only in this process's memory. The process makes itself
//! non-dumpable first, so same-UID tool processes cannot read it via /proc.

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use std::io::Read;
use std::time::Duration;

/// Larger than any secret Mango issues, small enough that a runaway writer can't hurt.
pub const MAX_SECRET_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("no Work secret arrived on stdin")]
    Empty,
    #[error("the Work secret on stdin exceeds {MAX_SECRET_BYTES} bytes")]
    TooLarge,
    #[error("no Work secret arrived on stdin within {0:?}")]
    TimedOut(Duration),
    #[error("the Work secret is not URL-safe base64")]
    NotBase64,
    #[error("the Work secret does not decode to a JSON object")]
    NotJson,
    #[error("the Work secret has no sessions_token")]
    NoToken,
    #[error("could not read stdin: {0}")]
    Io(String),
}

/// Makes the process non-dumpable (no core dumps, no ptrace or /proc/<pid>/mem
/// or /environ access by other processes of the same user). Linux only.
pub fn become_non_dumpable() -> std::io::Result<()> {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    // prctl(PR_SET_DUMPABLE, SUID_DUMP_DISABLE).
    set_dumpable_behavior(DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// Reads the first line from `input` (the launcher closes stdin after it).
pub fn read_line(mut input: impl Read) -> Result<String, SecretError> {
    let mut buf = Vec::with_capacity(512);
    let mut byte = [0u8; 1024];
    loop {
        let n = input
            .read(&mut byte)
            .map_err(|e| SecretError::Io(e.to_string()))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&byte[..n]);
        if let Some(end) = buf.iter().position(|b| *b == b'\n') {
            buf.truncate(end);
            break;
        }
        if buf.len() > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge);
        }
    }
    if buf.len() > MAX_SECRET_BYTES {
        return Err(SecretError::TooLarge);
    }
    let line = String::from_utf8(buf).map_err(|_| SecretError::NotBase64)?;
    let line = line.trim();
    if line.is_empty() {
        return Err(SecretError::Empty);
    }
    Ok(line.to_string())
}

/// Reads the secret line from stdin, giving up after `timeout`.
pub async fn read_stdin(timeout: Duration) -> Result<String, SecretError> {
    let reading = tokio::task::spawn_blocking(|| read_line(std::io::stdin().lock()));
    match tokio::time::timeout(timeout, reading).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(SecretError::Io(join.to_string())),
        Err(_) => Err(SecretError::TimedOut(timeout)),
    }
}

/// Overwrites a secret's bytes before its memory is freed, so a kept
/// sandbox's next activation cannot find the last one's in the heap.
pub fn zero(mut secret: String) {
    // SAFETY: NUL bytes are valid UTF-8.
    let bytes = unsafe { secret.as_bytes_mut() };
    bytes.fill(0);
    std::hint::black_box(&secret);
}

/// The sessions token inside a Work secret (URL-safe base64, padding optional, of JSON).
pub fn sessions_token(secret: &str) -> Result<String, SecretError> {
    let raw = URL_SAFE_NO_PAD
        .decode(secret.trim_end_matches('='))
        .or_else(|_| URL_SAFE.decode(secret))
        .map_err(|_| SecretError::NotBase64)?;
    let payload: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|_| SecretError::NotJson)?;
    let object = payload.as_object().ok_or(SecretError::NotJson)?;
    match object.get("sessions_token").and_then(|t| t.as_str()) {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => Err(SecretError::NoToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(json: &str) -> String {
        URL_SAFE_NO_PAD.encode(json)
    }

    #[test]
    fn decodes_with_or_without_padding() {
        let json = r#"{"sessions_token":"mango_st_abc"}"#;
        assert_eq!(sessions_token(&encode(json)).unwrap(), "mango_st_abc");
        assert_eq!(
            sessions_token(&URL_SAFE.encode(json)).unwrap(),
            "mango_st_abc"
        );
    }

    #[test]
    fn bad_secrets_are_named_precisely() {
        assert_eq!(
            sessions_token("!!!not base64!!!"),
            Err(SecretError::NotBase64)
        );
        assert_eq!(
            sessions_token(&encode("not json")),
            Err(SecretError::NotJson)
        );
        assert_eq!(sessions_token(&encode("[1,2]")), Err(SecretError::NotJson));
        assert_eq!(
            sessions_token(&encode(r#"{"other":"x"}"#)),
            Err(SecretError::NoToken)
        );
        assert_eq!(
            sessions_token(&encode(r#"{"sessions_token":""}"#)),
            Err(SecretError::NoToken)
        );
        assert_eq!(
            sessions_token(&encode(r#"{"sessions_token":5}"#)),
            Err(SecretError::NoToken)
        );
    }

    /// Run in a child of the test binary, so the test process stays dumpable.
    #[test]
    fn the_process_becomes_non_dumpable() {
        use rustix::process::{dumpable_behavior, DumpableBehavior};
        const CHILD: &str = "MANGO_TEST_NON_DUMPABLE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(dumpable_behavior().unwrap(), DumpableBehavior::Dumpable);
            become_non_dumpable().unwrap();
            assert_eq!(dumpable_behavior().unwrap(), DumpableBehavior::NotDumpable);
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "secret::tests::the_process_becomes_non_dumpable"])
            .args(["--test-threads", "1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    #[test]
    fn reads_one_bounded_line() {
        assert_eq!(read_line(&b"abc\nrest"[..]).unwrap(), "abc");
        assert_eq!(read_line(&b"abc"[..]).unwrap(), "abc", "EOF ends the line");
        assert_eq!(read_line(&b"\n"[..]), Err(SecretError::Empty));
        assert_eq!(read_line(&b""[..]), Err(SecretError::Empty));
        let exact = "a".repeat(MAX_SECRET_BYTES);
        assert_eq!(read_line(exact.as_bytes()).unwrap().len(), MAX_SECRET_BYTES);
        let over = "a".repeat(MAX_SECRET_BYTES + 1);
        assert_eq!(read_line(over.as_bytes()), Err(SecretError::TooLarge));
        assert_eq!(
            read_line(&[0xff, 0xfe, b'\n'][..]),
            Err(SecretError::NotBase64)
        );
    }
}
