//! Framing: each call is one line,
//! `eval '<command>' 99>&-; __mango_done '<hex>' "$?"`
//! (the `eval` builtin is the brace group: its redirection covers the whole
//! command; `eval` of a single-quoted string keeps an unbalanced quote or a
//! syntax error inside the call, where a raw `{ …\n}` group would let an open
//! quote swallow the framing). `__mango_done` writes the completion marker
//! `__MANGO_CMD_<hex>_DONE__<status>` to fd 99, the shell's end of a Unix
//! socket pair whose other end only the runner holds, then waits there for
//! the next line. It is defined before the first call, read-only so no
//! command can redefine or unset it, and calls builtins by `builtin` so no
//! command's `echo` or `read` takes their place. fd 99 is hidden from each
//! command, which cannot inherit or replace it (nor open it through /proc,
//! as it is a socket), so a command that moves its own output
//! (`exec >log 2>&1`) still ends promptly; what it redirected stays
//! redirected, as in any shell, and `/dev/tty` still reaches the runner,
//! which keeps its own copy of the terminal open. The marker line must be
//! exactly what the function writes (fresh 64-bit random part per call);
//! anything else on the socket is corrupt framing. Output never mixes with
//! the marker, so no output can end a call early.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::read_when_ready;

/// The shell's end of the framing socket: it writes each call's completion
/// marker there, then waits there for the byte that lets it read on.
pub(super) const SENTINEL_FD: RawFd = 99;
const SENTINEL_PREFIX: &str = "__MANGO_CMD_";
const SENTINEL_SUFFIX: &str = "_DONE__";
/// The shell function that writes a call's completion marker and waits for
/// the next call's line (read-only, so a command can neither redefine nor
/// unset it).
const MARKER_FN: &str = "__mango_done";
/// How the shell waits for the byte that lets it read the next line.
pub(super) const WAIT_FOR_NEXT: &str = "builtin read -r -u 99 -N 1 __mango_go";

/// `text` as one single-quoted shell word.
pub(super) fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The definition of the read-only marker function, as one line of script.
pub(super) fn marker_function() -> String {
    format!(
        "{MARKER_FN}() {{ builtin echo \"{SENTINEL_PREFIX}$1{SENTINEL_SUFFIX}$2\" >&{SENTINEL_FD}; {WAIT_FOR_NEXT}; }}; readonly -f {MARKER_FN}\n"
    )
}

/// One call's framing: the line the shell reads, and the marker that ends it.
pub(super) struct Call {
    pub(super) line: String,
    sentinel: String,
}

impl Call {
    /// `command` framed with a fresh random marker; `redirection` is what
    /// the command runs with besides hiding fd 99.
    pub(super) fn new(command: &str, redirection: &str) -> Call {
        let hex = format!("{:016x}", rand::random::<u64>());
        let sentinel = format!("{SENTINEL_PREFIX}{hex}{SENTINEL_SUFFIX}");
        let line = format!(
            "eval {}{redirection} {SENTINEL_FD}>&-; {MARKER_FN} '{hex}' \"$?\"\n",
            single_quoted(command),
        );
        Call { line, sentinel }
    }

    /// What the framing socket has carried so far means for this call.
    pub(super) fn status(&self, marker: &MarkerLine) -> MarkerStatus {
        marker.status(self.sentinel.as_bytes())
    }
}

/// The runner's end of the framing socket (the shell's is fd 99): markers
/// come in, and one byte per call goes out to let the shell read on.
pub(super) struct Markers {
    socket: AsyncFd<OwnedFd>,
}

impl Markers {
    /// The framing socket pair, both ends close-on-exec: the runner's end,
    /// non-blocking and registered with the runtime, and the shell's end.
    /// Sequenced packets, not a stream: when the runner reads a marker, the
    /// kernel tells the shell's end that it has room to write again, and a
    /// stream socket wakes every task blocked reading on that end, so the
    /// shell, already waiting for its next byte, was woken for nothing on
    /// every call (a context switch, often another vCPU's, just as the
    /// runner posts the result). A packet socket's reader is only woken for
    /// input.
    pub(super) fn pair() -> io::Result<(Markers, OwnedFd)> {
        let (ours, shell_end) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let flags = rustix::fs::fcntl_getfl(&ours)?;
        rustix::fs::fcntl_setfl(&ours, flags | rustix::fs::OFlags::NONBLOCK)?;
        // SAFETY: the OwnedFd moves into the AsyncFd, which owns it until it
        // is dropped; only `get_ref` reaches it, so it is neither closed nor
        // replaced, and its descriptor stays open and the same meanwhile.
        let socket = unsafe { AsyncFd::register_with_interest(ours, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok((Markers { socket }, shell_end))
    }

    /// Lets the shell read its next line: one byte on the socket.
    pub(super) fn release(&self) -> io::Result<()> {
        match rustix::io::write(self.socket.get_ref(), b"x")? {
            1 => Ok(()),
            _ => Err(io::ErrorKind::WriteZero.into()),
        }
    }

    /// What the shell writes next (0: the socket ended).
    pub(super) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        read_when_ready(&self.socket, || {
            rustix::io::read(self.socket.get_ref(), &mut *buf)
        })
        .await
    }
}

pub(super) enum MarkerStatus {
    Found(i32),
    Pending,
    Corrupt,
}

/// What the framing socket carried during one call: exactly one
/// `<sentinel><status>\n` line, written by the marker function.
#[derive(Default)]
pub(super) struct MarkerLine {
    bytes: Vec<u8>,
    /// The socket reported end of file: the shell is gone.
    pub(super) ended: bool,
}

impl MarkerLine {
    /// Longer than any marker line: the rest is garbage.
    const LIMIT: usize = 128;
    /// An exit status has at most three digits; twelve is already garbage.
    const MAX_DIGITS: usize = 12;

    pub(super) fn push(&mut self, data: &[u8]) {
        let room = Self::LIMIT.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&data[..data.len().min(room + 1)]);
    }

    fn status(&self, sentinel: &[u8]) -> MarkerStatus {
        let (line, complete) = match self.bytes.iter().position(|&b| b == b'\n') {
            Some(newline) if newline + 1 == self.bytes.len() => (&self.bytes[..newline], true),
            Some(_) => return MarkerStatus::Corrupt,
            None => (&self.bytes[..], false),
        };
        let seen = line.len().min(sentinel.len());
        if line[..seen] != sentinel[..seen] {
            return MarkerStatus::Corrupt;
        }
        let digits = &line[seen..];
        if digits.len() >= Self::MAX_DIGITS || !digits.iter().all(u8::is_ascii_digit) {
            return MarkerStatus::Corrupt;
        }
        if !complete {
            return MarkerStatus::Pending;
        }
        match std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse().ok())
        {
            Some(code) if seen == sentinel.len() => MarkerStatus::Found(code),
            _ => MarkerStatus::Corrupt,
        }
    }
}

/// For the fuzz target: `data` split at each 0xff byte and pushed chunk by
/// chunk, as the socket delivers it; after each chunk a status, and `Found`
/// only for the exact marker line `<sentinel><digits>\n`.
pub(super) fn fuzz_marker_line(data: &[u8]) {
    const SENTINEL: &[u8] = b"__MANGO_CMD_0123456789abcdef_DONE__";
    let mut line = MarkerLine::default();
    for chunk in data.split(|&b| b == 0xff) {
        line.push(chunk);
        if let MarkerStatus::Found(code) = line.status(SENTINEL) {
            let digits = line.bytes[..line.bytes.len() - 1]
                .strip_prefix(SENTINEL)
                .expect("a found marker starts with the sentinel");
            assert!(line.bytes.ends_with(b"\n"), "a found marker ends its line");
            assert!(!digits.is_empty() && digits.iter().all(u8::is_ascii_digit));
            assert_eq!(
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse().ok()),
                Some(code)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Call, MarkerLine, MarkerStatus};

    const SENTINEL: &[u8] = b"__MANGO_CMD_0123456789abcdef_DONE__";

    fn status(chunks: &[&[u8]]) -> MarkerStatus {
        let mut line = MarkerLine::default();
        for chunk in chunks {
            line.push(chunk);
        }
        line.status(SENTINEL)
    }

    #[test]
    fn a_marker_line_ends_the_call_with_its_status_even_in_pieces() {
        assert!(matches!(
            status(&[b"__MANGO_CMD_0123456789abcdef_DONE__0\n"]),
            MarkerStatus::Found(0)
        ));
        assert!(matches!(
            status(&[b"__MANGO_CMD_01234", b"56789abcdef_DONE__1", b"27\n"]),
            MarkerStatus::Found(127)
        ));
        assert!(matches!(status(&[]), MarkerStatus::Pending));
        assert!(matches!(
            status(&[b"__MANGO_CMD_0123456789abcdef_DONE__12"]),
            MarkerStatus::Pending
        ));
    }

    #[test]
    fn anything_else_on_the_framing_socket_is_corrupt_framing() {
        for bad in [
            &b"junk\n"[..],
            b"j",
            b"__MANGO_CMD_ffffffffffffffff_DONE__0\n",
            b"__MANGO_CMD_0123456789abcdef_DONE__\n",
            b"__MANGO_CMD_0123456789abcdef_DONE__1x\n",
            b"__MANGO_CMD_0123456789abcdef_DONE__-1\n",
            b"__MANGO_CMD_0123456789abcdef_DONE__999999999999\n",
            b"__MANGO_CMD_0123456789abcdef_DONE__0\nmore",
            b"__MANGO_CMD_0123456789abcdef_DONE__000000000000",
            b"__MANGO_CMD_0123456789abcdef_DONE__1 ",
        ] {
            assert!(
                matches!(status(&[bad]), MarkerStatus::Corrupt),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Without a newline, a line longer than any marker is garbage.
        let mut long = SENTINEL.to_vec();
        long.extend(std::iter::repeat_n(b'1', 200));
        assert!(matches!(status(&[&long]), MarkerStatus::Corrupt));
    }

    /// A call's line quotes its command as one word, hides fd 99 from it,
    /// and ends with the marker function given the call's own random part.
    #[test]
    fn a_call_line_frames_its_command_and_expects_its_own_marker() {
        let call = Call::new("echo 'it''s'", " </dev/null");
        let hex = call.sentinel["__MANGO_CMD_".len()..][..16].to_string();
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{hex}");
        assert_eq!(
            call.line,
            format!(
                "eval 'echo '\\''it'\\'''\\''s'\\''' </dev/null 99>&-; __mango_done '{hex}' \"$?\"\n"
            )
        );
        let mut marker = MarkerLine::default();
        marker.push(format!("__MANGO_CMD_{hex}_DONE__3\n").as_bytes());
        assert!(matches!(call.status(&marker), MarkerStatus::Found(3)));
        assert_ne!(Call::new("true", "").sentinel, call.sentinel);
    }
}
