//! Waiting mode's read of the activation envelope (spec §7.1): one line on
//! stdin, read with a bounded buffer, stopping at its newline so nothing of
//! a later line is consumed. The process is non-dumpable before it reads.

use mango_protocol::envelope::{Envelope, EnvelopeError, MAX_ENVELOPE_BYTES};
use std::io::BufRead;

/// Why no envelope could be taken from stdin.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    #[error("{0}")]
    Envelope(EnvelopeError),
    #[error("could not read stdin: {0}")]
    Io(String),
}

/// Reads one envelope line from `input`: at most `MAX_ENVELOPE_BYTES + 1`
/// bytes are held (the line and its newline); a longer line is refused
/// without reading it to its end.
pub fn read_one(input: &mut impl BufRead) -> Result<Envelope, ReadError> {
    let mut line = Vec::with_capacity(1024);
    loop {
        let available = match input.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e.kind().to_string())),
        };
        if available.is_empty() {
            break;
        }
        let (take, ended) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        let room = MAX_ENVELOPE_BYTES + 1 - line.len();
        if take > room {
            // The line cannot fit, newline included: refuse it here.
            return Err(ReadError::Envelope(EnvelopeError::TooLong));
        }
        line.extend_from_slice(&available[..take]);
        input.consume(take);
        if ended {
            break;
        }
    }
    Envelope::parse_line(&line).map_err(ReadError::Envelope)
}

/// Reads one envelope from the process's stdin (blocking).
pub fn read_stdin() -> Result<Envelope, ReadError> {
    read_one(&mut std::io::stdin().lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mango_protocol::WorkType;
    use std::io::{BufReader, Read};

    fn envelope(work_id: &str) -> Envelope {
        Envelope {
            work_id: work_id.into(),
            environment_id: "env_1".into(),
            work_type: WorkType::Healthcheck,
            session_id: None,
            claim: 1,
            secret: "eyJzZXNzaW9uc190b2tlbiI6Im1hbmdvX3N0X3gifQ".into(),
        }
    }

    /// Counts the bytes handed out, to show the reader stops early.
    struct Counted<R> {
        inner: R,
        read: usize,
    }

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }

    #[test]
    fn reads_exactly_one_line_and_leaves_the_next() {
        let (first, second) = (envelope("work_1"), envelope("work_2"));
        let both = format!("{}{}", first.to_line(), second.to_line());
        // A one-byte buffer: every read ends mid-line.
        let mut input = BufReader::with_capacity(1, both.as_bytes());
        assert_eq!(read_one(&mut input).unwrap(), first);
        assert_eq!(read_one(&mut input).unwrap(), second);
        assert_eq!(
            read_one(&mut input),
            Err(ReadError::Envelope(EnvelopeError::Empty))
        );
    }

    #[test]
    fn an_oversized_line_is_refused_without_reading_it_all() {
        let endless = std::io::repeat(b'a').take(10 * MAX_ENVELOPE_BYTES as u64);
        let mut input = BufReader::with_capacity(
            512,
            Counted {
                inner: endless,
                read: 0,
            },
        );
        assert_eq!(
            read_one(&mut input),
            Err(ReadError::Envelope(EnvelopeError::TooLong))
        );
        assert!(input.get_ref().read <= MAX_ENVELOPE_BYTES + 1 + 512);
    }

    #[test]
    fn the_limit_counts_the_line_without_its_newline() {
        let mut exact = envelope("w");
        let base = exact.to_line().len() - 1 - 1;
        exact.work_id = "w".repeat(MAX_ENVELOPE_BYTES - base);
        let line = exact.to_line();
        assert_eq!(line.len(), MAX_ENVELOPE_BYTES + 1);
        assert_eq!(read_one(&mut line.as_bytes()).unwrap(), exact);
        let mut over = exact.clone();
        over.work_id.push('w');
        assert_eq!(
            read_one(&mut over.to_line().as_bytes()),
            Err(ReadError::Envelope(EnvelopeError::TooLong))
        );
    }

    #[test]
    fn end_of_input_is_empty_or_partial() {
        assert_eq!(
            read_one(&mut &b""[..]),
            Err(ReadError::Envelope(EnvelopeError::Empty))
        );
        let line = envelope("w").to_line();
        assert_eq!(
            read_one(&mut line.trim_end().as_bytes()),
            Err(ReadError::Envelope(EnvelopeError::Partial))
        );
    }
}
