//! The shell's terminal: a PTY whose slave side is the shell's controlling
//! terminal, stdout and stderr (so programs see a terminal), with no output
//! post-processing and no echo; the runner reads its master side.
//!
//! Wake-ups: until the marker arrives or [`QUIET_WINDOW`] passes, the runner
//! waits on the framing socket alone and then reads the PTY in one go (a PTY
//! read that finds nothing first lets the kernel pass on what the shell
//! wrote, so the output is complete). A quick command thus costs the runner
//! one wake-up instead of one per chunk the PTY passes on; a longer one has
//! its output streamed ([`Pty::watch`]), so the PTY never fills for long.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::pty::OpenptFlags;
use rustix::termios::{LocalModes, OptionalActions, OutputModes, Winsize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::read_when_ready;

/// How long a call's output is left to collect in the PTY before the runner
/// watches it; what a command prints meanwhile waits in the PTY's 64 KiB
/// buffer.
pub(super) const QUIET_WINDOW: Duration = Duration::from_millis(1);
/// How much one PTY read takes.
const READ_BUFFER: usize = 16 * 1024;

pub(super) struct Pty {
    /// The master registered with the runtime, only while a call runs past
    /// [`QUIET_WINDOW`]. Declared before `master`, so it is dropped first.
    watched: Option<AsyncFd<RawFd>>,
    /// The master side, non-blocking.
    master: OwnedFd,
    /// The runner's own copy of the slave side: the terminal stays up while
    /// a command has moved the shell's output elsewhere (`exec >log`), so
    /// `/dev/tty` still reaches the runner. The shell's end is told by its
    /// process and the framing socket instead.
    _slave: OwnedFd,
    /// Where reads land: allocated once, as a fresh zeroed buffer per call
    /// cost a 16 KiB clear (and the allocator a consolidation pass) on the
    /// way to every result.
    buf: Box<[u8]>,
    /// Reading failed. (The PTY never reaches end of file while the runner
    /// holds its own slave copy; the shell's end is told by its process and
    /// the framing socket.)
    eof: bool,
}

impl Pty {
    /// Opens a PTY pair, 200 columns by 50 rows: the runner's side, and the
    /// slave (close-on-exec) for the shell's stdout and stderr.
    pub(super) fn open() -> io::Result<(Pty, OwnedFd)> {
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = rustix::pty::openpt(flags)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let slave = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;

        // No output post-processing (keep "\n" as "\n"), no echo.
        let mut t = rustix::termios::tcgetattr(&slave)?;
        t.output_modes.remove(OutputModes::OPOST);
        t.local_modes.remove(LocalModes::ECHO | LocalModes::ECHONL);
        rustix::termios::tcsetattr(&slave, OptionalActions::Now, &t)?;
        let ws = Winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(&master, ws)?;
        let flags = rustix::fs::fcntl_getfl(&master)?;
        rustix::fs::fcntl_setfl(&master, flags | OFlags::NONBLOCK)?;

        let pty = Pty {
            watched: None,
            master,
            _slave: slave.try_clone()?,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            eof: false,
        };
        Ok((pty, slave))
    }

    /// Reading the PTY failed: the shell's output is over.
    pub(super) fn eof(&self) -> bool {
        self.eof
    }

    /// Reads the PTY until it has nothing more, handing each chunk to
    /// `take`, and stops watching it. A PTY read that finds nothing first
    /// waits for the kernel to pass on what the shell already wrote
    /// (`n_tty_read` flushes the pending buffer work before it reports
    /// `EAGAIN`), so after the marker this returns all of the call's output.
    pub(super) fn read_available(&mut self, mut take: impl FnMut(&[u8])) {
        self.unwatch();
        while !self.eof {
            match rustix::io::read(&self.master, &mut self.buf[..]) {
                Ok(0) => self.eof = true,
                Ok(n) => take(&self.buf[..n]),
                Err(Errno::IO) => self.eof = true,
                Err(Errno::INTR) => continue,
                Err(_) => break,
            }
        }
    }

    /// Whether the runtime watches the PTY (see [`Pty::watch`]).
    pub(super) fn is_watched(&self) -> bool {
        self.watched.is_some()
    }

    /// Registers the PTY with the runtime, for a call that streams output:
    /// [`Pty::read_watched`] then takes it as it comes, until
    /// [`Pty::unwatch`] or [`Pty::read_available`].
    pub(super) fn watch(&mut self) -> io::Result<()> {
        // SAFETY: the registration lives in `self.watched`, which is emptied
        // by `unwatch` or dropped before `self.master` (field order);
        // `master` is private to this Pty and never closed or replaced while
        // it lives, so the descriptor stays open and names the same file for
        // the AsyncFd's whole life.
        let watched =
            unsafe { AsyncFd::register_with_interest(self.master.as_raw_fd(), Interest::READABLE) }
                .map_err(io::Error::from)?;
        self.watched = Some(watched);
        Ok(())
    }

    /// Stops watching the PTY: the runtime is not woken by its output.
    pub(super) fn unwatch(&mut self) {
        self.watched = None;
    }

    /// The next chunk of output once the PTY is watched (never before);
    /// `None` when reading failed or ended, which marks the PTY at its end.
    pub(super) async fn read_watched(&mut self) -> Option<&[u8]> {
        let Some(watched) = self.watched.as_ref() else {
            return std::future::pending().await;
        };
        let master = self.master.as_fd();
        let buf = &mut self.buf[..];
        match read_when_ready(watched, || rustix::io::read(master, &mut *buf)).await {
            Ok(n) if n > 0 => Some(&self.buf[..n]),
            _ => {
                self.eof = true;
                None
            }
        }
    }
}
