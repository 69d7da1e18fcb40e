//! The persistent `bash` tool.
//!
//! One `bash --noprofile --norc` per session, started lazily in the
//! workspace, in its own session and process group, with a PTY as its
//! controlling terminal, stdout and stderr (so programs see a terminal),
//! /dev/null as its stdin and a file as its script (so the shell is
//! non-interactive: no echo, no prompts, no history expansion, no
//! line-length limit). cwd, exports and background jobs survive between
//! calls.
//!
//! Input: the shell's script is an in-memory file the runner appends to, so
//! bash reads it in blocks (bash reads a pipe one byte per `read`, so as not
//! to take input meant for its children: a call's line cost as many reads
//! as it had bytes, and long commands needed a file of their own). The shell
//! opens it as `/proc/self/fd/98` and reads it on a close-on-exec descriptor
//! of its own, closing the one it inherited, so commands neither see it nor
//! need their stdin moved off it: redirecting the descriptor bash reads
//! from makes it save and re-sync its input around every call, a third of
//! its work per call. (bash then names the script in its own error
//! messages: `/proc/self/fd/98: line 7: nope: command not found`; `$0` is
//! still the shell's path.) Where /proc is not mounted the file is the
//! shell's stdin and each call redirects stdin from /dev/null instead
//! ([`ScriptInput`]). A file read to its end would end the shell, so the
//! shell waits after each call for one byte on its framing socket (fd 99):
//! the runner appends the next line, then sends the byte. What the shell has
//! read is handed back to the kernel as it goes (the file's offsets stay,
//! its memory does not).
//!
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
//!
//! Wake-ups: until the marker arrives or [`QUIET_WINDOW`] passes, the runner
//! waits on the socket alone and then reads the PTY in one go (a PTY read
//! that finds nothing first lets the kernel pass on what the shell wrote, so
//! the output is complete). A quick command thus costs the runner one
//! wake-up instead of one per chunk the PTY passes on; a longer one has its
//! output streamed as before, so the PTY never fills for long.
//!
//! Timeout, cancellation, shell death or corrupt framing close the shell
//! (SIGTERM to the group, SIGKILL after a short grace); the next call starts
//! a fresh shell and says so at the start of its output.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use regex::Regex;
use rustix::fs::{FallocateFlags, MemfdFlags, Mode, OFlags};
use rustix::io::{Errno, FdFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::process::{Pid, Signal};
use rustix::pty::OpenptFlags;
use rustix::termios::{LocalModes, OptionalActions, OutputModes, Winsize};
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use super::{tool_env, Args, ToolContext, ToolOutput};

/// Output cap (bytes); the tail is kept.
pub const BASH_OUTPUT_LIMIT: usize = 100 * 1024;
/// Per-call timeout when `timeout_ms` is absent or zero.
pub const BASH_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Grace between SIGTERM and SIGKILL when closing the shell.
const KILL_GRACE: Duration = Duration::from_millis(300);
/// How long to wait for the exit status of a shell whose socket ended.
const EXIT_DRAIN: Duration = Duration::from_millis(200);
/// The shell's end of the framing socket: it writes each call's completion
/// marker there, then waits there for the byte that lets it read on.
const SENTINEL_FD: RawFd = 99;
/// Where the shell finds its script when it starts (see [`ScriptInput`]).
const SCRIPT_FD: RawFd = 98;
/// bash reads a seekable input in blocks of at most this many bytes, and
/// sizes its buffer from the input's size when it starts.
const SCRIPT_BUFFER: usize = 8192;
/// How much read script is left in memory before it is handed back.
const SCRIPT_FREE_EVERY: u64 = 64 * 1024;
/// How much one PTY read takes.
const PTY_READ_BUFFER: usize = 16 * 1024;
/// How long a call's output is left to collect in the PTY before the runner
/// watches it (see [`Shell::execute`]); what a command prints meanwhile
/// waits in the PTY's 64 KiB buffer.
const QUIET_WINDOW: Duration = Duration::from_millis(1);
const SENTINEL_PREFIX: &str = "__MANGO_CMD_";
const SENTINEL_SUFFIX: &str = "_DONE__";
/// The shell function that writes a call's completion marker and waits for
/// the next call's line (read-only, so a command can neither redefine nor
/// unset it).
const MARKER_FN: &str = "__mango_done";
/// How the shell waits for the byte that lets it read the next line.
const WAIT_FOR_NEXT: &str = "builtin read -r -u 99 -N 1 __mango_go";

/// How the shell reads its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScriptInput {
    /// As its script, opened through /proc on a close-on-exec descriptor of
    /// its own, with /dev/null as stdin for good.
    Path,
    /// As its stdin, where /proc is not mounted: each call moves the
    /// command's stdin to /dev/null.
    Stdin,
}

impl ScriptInput {
    /// [`ScriptInput::Path`] when this process can open `script` again
    /// through /proc/self/fd (the shell, in the same mount namespace and
    /// with the same credentials, then can too).
    fn for_script(script: &OwnedFd) -> ScriptInput {
        let path = format!("/proc/self/fd/{}", script.as_raw_fd());
        match std::fs::File::open(path) {
            Ok(_) => ScriptInput::Path,
            Err(_) => ScriptInput::Stdin,
        }
    }

    /// What each call's command is run with besides hiding fd 99.
    fn call_redirection(self) -> &'static str {
        match self {
            ScriptInput::Path => "",
            ScriptInput::Stdin => " </dev/null",
        }
    }
}

struct BashArgs {
    command: Option<String>,
    restart: bool,
    timeout_ms: Option<u64>,
}

impl BashArgs {
    fn parse(input: &Value) -> Result<Self, String> {
        let a = Args::new("bash", input, &["command", "restart", "timeout_ms"])?;
        Ok(Self {
            command: a.str_opt("command")?,
            restart: a.bool_opt("restart")?.unwrap_or(false),
            timeout_ms: a.u64_opt("timeout_ms")?,
        })
    }
}

/// The persistent shell of one session.
pub struct BashSession {
    ctx: Arc<ToolContext>,
    shell: Option<Shell>,
    /// Why the previous shell was closed abnormally (reported by the next call).
    closed_reason: Option<String>,
}

impl BashSession {
    pub fn new(ctx: Arc<ToolContext>) -> Self {
        Self {
            ctx,
            shell: None,
            closed_reason: None,
        }
    }

    /// Whether a shell process is currently running.
    pub fn is_running(&self) -> bool {
        self.shell.is_some()
    }

    pub async fn shutdown(&mut self) {
        if let Some(shell) = self.shell.take() {
            shell.close().await;
        }
    }

    async fn close(&mut self, reason: impl Into<String>) {
        self.shutdown().await;
        self.closed_reason = Some(reason.into());
    }

    pub async fn run(
        &mut self,
        input: &Value,
        deadline: Instant,
        cancel: CancellationToken,
    ) -> ToolOutput {
        let args = match BashArgs::parse(input) {
            Ok(a) => a,
            Err(msg) => return ToolOutput::error(msg),
        };
        let mut prefix = String::new();
        if args.restart {
            self.shutdown().await;
            self.closed_reason = None;
            match &args.command {
                Some(c) if !c.trim().is_empty() => prefix.push_str("bash session restarted\n"),
                _ => {
                    return match self.ensure_shell() {
                        Ok(()) => ToolOutput::ok("bash session restarted"),
                        Err(msg) => ToolOutput::error(msg),
                    }
                }
            }
        }
        let command = match args.command {
            Some(c) if !c.trim().is_empty() => c,
            _ => return ToolOutput::error("bash: command is required"),
        };
        if command.contains('\0') {
            return ToolOutput::error("bash: command contains a NUL byte");
        }

        // A shell that died between calls counts as closed.
        if let Some(shell) = self.shell.as_mut() {
            if let Ok(Some(status)) = shell.child.try_wait() {
                let code = exit_code(status);
                self.close(format!("shell exited with code {code}")).await;
            }
        }
        if self.shell.is_none() {
            if let Some(reason) = self.closed_reason.take() {
                prefix.push_str(&format!(
                    "[previous shell was closed ({reason}); started a fresh shell]\n"
                ));
            }
        }
        if let Err(msg) = self.ensure_shell() {
            return ToolOutput::error(format!("{prefix}{msg}"));
        }

        let per_call = match args.timeout_ms {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => BASH_DEFAULT_TIMEOUT,
        };
        let call_deadline = Instant::now() + per_call;
        let (until, by_tool_deadline) = if call_deadline < deadline {
            (call_deadline, false)
        } else {
            (deadline, true)
        };

        let shell = self.shell.as_mut().expect("shell started");
        let outcome = shell.execute(&command, until, &cancel).await;
        let (text, is_error) = match outcome {
            Outcome::Done { output, code } => {
                let mut text = output;
                if code != 0 {
                    push_line(&mut text, &format!("[exit code: {code}]"));
                }
                (text, code != 0)
            }
            Outcome::TimedOut { output } => {
                self.close("timed out").await;
                let msg = if by_tool_deadline {
                    "tool 'bash' timed out".to_string()
                } else {
                    format!(
                        "bash: bash command timed out after {}s",
                        per_call.as_secs_f64()
                    )
                };
                (join_msg(msg, output), true)
            }
            Outcome::Cancelled { output } => {
                self.close("cancelled").await;
                (join_msg("bash: command cancelled".into(), output), true)
            }
            Outcome::Exited { output, code } => {
                self.close(format!("shell exited with code {code}")).await;
                let mut text = output;
                push_line(
                    &mut text,
                    "[the shell exited; the next call starts a fresh shell]",
                );
                push_line(&mut text, &format!("[exit code: {code}]"));
                (text, true)
            }
            Outcome::Broken { output, why } => {
                self.close(why.clone()).await;
                (
                    join_msg(format!("bash: {why}; the shell was closed"), output),
                    true,
                )
            }
        };
        ToolOutput::text(format!("{prefix}{text}"), is_error)
    }

    fn ensure_shell(&mut self) -> Result<(), String> {
        if self.shell.is_none() {
            let shell = Shell::spawn(&self.ctx)
                .map_err(|e| format!("bash: could not start a shell: {e}"))?;
            self.shell = Some(shell);
        }
        Ok(())
    }
}

impl Drop for BashSession {
    fn drop(&mut self) {
        // Shell's own Drop SIGKILLs the process group.
        self.shell.take();
    }
}

fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(line);
}

fn join_msg(msg: String, output: String) -> String {
    if output.is_empty() {
        msg
    } else {
        format!("{msg}\n{output}")
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

enum Outcome {
    Done { output: String, code: i32 },
    TimedOut { output: String },
    Cancelled { output: String },
    Exited { output: String, code: i32 },
    Broken { output: String, why: String },
}

struct Shell {
    child: Child,
    /// The shell's process group, until the shell is reaped.
    pgid: Option<Pid>,
    /// The shell's input: an in-memory file the runner appends each call's
    /// line to, at `script_end`.
    script: OwnedFd,
    input: ScriptInput,
    script_end: u64,
    /// Up to where the script has been handed back to the kernel.
    script_freed: u64,
    /// The PTY's master side, non-blocking; watched by the runtime only while
    /// a call runs past [`QUIET_WINDOW`].
    master: OwnedFd,
    /// The runner's own copy of the PTY's slave side: the terminal stays up
    /// while a command has moved the shell's output elsewhere (`exec >log`),
    /// so `/dev/tty` still reaches the runner. The shell's end is told by
    /// its process and the framing socket instead.
    _slave: OwnedFd,
    /// The runner's end of the framing socket (the shell's is fd 99): markers
    /// come in, and one byte per call goes out to let the shell read on.
    markers: AsyncFd<OwnedFd>,
    /// Exit status once reaped.
    exited: Option<i32>,
    /// Reading the PTY failed. (It never reaches end of file while the
    /// runner holds its own slave copy; the shell's end is told by its
    /// process and the framing socket.)
    eof: bool,
    /// Where PTY reads land: allocated once, as a fresh zeroed buffer per
    /// call cost a 16 KiB clear (and the allocator a consolidation pass)
    /// on the way to every result.
    pty_buf: Box<[u8]>,
}

/// `text` as one single-quoted shell word.
fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
    }
}

/// Opens a PTY pair: (master, slave), both close-on-exec.
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
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
    set_nonblocking(&master)?;
    Ok((master, slave))
}

/// The framing socket pair, both ends close-on-exec. Sequenced packets, not
/// a stream: when the runner reads a marker, the kernel tells the shell's
/// end that it has room to write again, and a stream socket wakes every task
/// blocked reading on that end, so the shell, already waiting for its next
/// byte, was woken for nothing on every call (a context switch, often
/// another vCPU's, just as the runner posts the result). A packet socket's
/// reader is only woken for input.
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | OFlags::NONBLOCK)?;
    Ok(())
}

/// `fd` moved above the shell's fd 99 (close-on-exec).
fn above_inherited_fds(fd: OwnedFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, SENTINEL_FD + 1)?)
}

/// In the child, between fork and exec: `fd` duplicated onto the number
/// `target` without close-on-exec, so the shell finds it there. Only system
/// calls: no allocation, no lock.
fn inherit_as(fd: BorrowedFd<'_>, target: RawFd) -> io::Result<()> {
    // The lowest free number from `target` up: `target` itself when free.
    let copy = rustix::io::fcntl_dupfd_cloexec(fd, target)?;
    if copy.as_raw_fd() == target {
        rustix::io::fcntl_setfd(&copy, FdFlags::empty())?;
        // Left open for the shell.
        let _ = copy.into_raw_fd();
        return Ok(());
    }
    drop(copy);
    // SAFETY: F_DUPFD_CLOEXEC passed over `target`, so it is open: the
    // child's copy of one of the runner's close-on-exec descriptors. The
    // child is the fork's one thread and execs next, so nothing else uses or
    // closes it, and ManuallyDrop never closes it here: dup2 only makes the
    // number name `fd`'s file instead, without close-on-exec.
    let mut taken = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(target) });
    rustix::io::dup2(fd, &mut taken)?;
    Ok(())
}

/// The shell's input: an anonymous in-memory file, or where that is not
/// allowed an unnamed file in the temporary directory (close-on-exec; the
/// shell gets its own copy as stdin). Nothing of it is ever on a path.
fn script_file() -> io::Result<OwnedFd> {
    match rustix::fs::memfd_create(c"mango-bash-input", MemfdFlags::CLOEXEC) {
        Ok(memfd) => Ok(memfd),
        Err(_) => unnamed_temp_file(&std::env::temp_dir()),
    }
}

/// A file in `dir` that has no name (`O_TMPFILE`), close-on-exec.
fn unnamed_temp_file(dir: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?)
}

/// Writes all of `data` at `offset`; returns the offset after it.
fn write_at(fd: &OwnedFd, mut offset: u64, mut data: &[u8]) -> io::Result<u64> {
    while !data.is_empty() {
        match rustix::io::pwrite(fd, data, offset) {
            Ok(n) => {
                data = &data[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(offset)
}

/// What the shell reads first: when it reads a script by path, the closing
/// of the descriptor it found it on and `$0` as if it read stdin; the
/// read-only framing function; padding that makes bash size its input
/// buffer to the maximum (it sizes it from the file's size when it starts);
/// and the first wait for a call.
fn script_prologue(input: ScriptInput, program: &str) -> String {
    let mut head = match input {
        ScriptInput::Path => format!(
            "exec {SCRIPT_FD}<&-; BASH_ARGV0={}\n",
            single_quoted(program)
        ),
        ScriptInput::Stdin => String::new(),
    };
    head.push_str(&format!(
        "{MARKER_FN}() {{ builtin echo \"{SENTINEL_PREFIX}$1{SENTINEL_SUFFIX}$2\" >&{SENTINEL_FD}; {WAIT_FOR_NEXT}; }}; readonly -f {MARKER_FN}\n"
    ));
    let padding = "#".repeat(SCRIPT_BUFFER.saturating_sub(head.len()));
    format!("{head}{padding}\n{WAIT_FOR_NEXT}\n")
}

fn read_fd(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buf)?)
}

impl Shell {
    fn spawn(ctx: &ToolContext) -> io::Result<Shell> {
        let script = script_file()?;
        let input = ScriptInput::for_script(&script);
        Shell::spawn_reading(ctx, script, input)
    }

    fn spawn_reading(ctx: &ToolContext, script: OwnedFd, input: ScriptInput) -> io::Result<Shell> {
        let (master, slave) = open_pty()?;
        let (markers, shell_end) = socket_pair()?;
        set_nonblocking(&markers)?;
        let bash = if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "bash"
        };
        let script_end = write_at(&script, 0, script_prologue(input, bash).as_bytes())?;
        let slave_copy = slave.try_clone()?;
        let child = {
            let mut cmd = tokio::process::Command::new(bash);
            cmd.args(["--noprofile", "--norc"]);
            // Above the targets, so the dup2s below cannot be no-ops that
            // keep close-on-exec.
            let shell_end = above_inherited_fds(shell_end)?;
            let script_copy = match input {
                ScriptInput::Path => {
                    cmd.arg(format!("/proc/self/fd/{SCRIPT_FD}"))
                        .stdin(Stdio::null());
                    Some(above_inherited_fds(script.try_clone()?)?)
                }
                ScriptInput::Stdin => {
                    cmd.stdin(Stdio::from(script.try_clone()?));
                    None
                }
            };
            cmd.current_dir(&ctx.workspace)
                .env_clear()
                .envs(tool_env(&ctx.workspace))
                .stdout(Stdio::from(slave.try_clone()?))
                .stderr(Stdio::from(slave))
                .kill_on_drop(true);
            // SAFETY: the closure runs in the forked child, where only
            // async-signal-safe work is sound: it makes system calls through
            // rustix (no allocation, no lock, no libc state) on descriptors it
            // owns (moved in, dropped with `cmd`) or on the child's own
            // descriptor table.
            unsafe {
                cmd.pre_exec(move || {
                    rustix::process::setsid()?;
                    // Make the PTY (already on fd 1) the controlling terminal.
                    let _ = rustix::process::ioctl_tiocsctty(rustix::stdio::stdout());
                    // The socket becomes the shell's fd 99 (the copy loses
                    // close-on-exec; the original keeps it).
                    inherit_as(shell_end.as_fd(), SENTINEL_FD)?;
                    // The script by path: the shell opens it as fd 98.
                    if let Some(script) = &script_copy {
                        inherit_as(script.as_fd(), SCRIPT_FD)?;
                    }
                    Ok(())
                });
            }
            cmd.spawn()?
            // `cmd` and the originals drop here: only the shell holds its end
            // of the socket, so its death ends the socket too.
        };
        let pgid = child.id().and_then(|p| Pid::from_raw(p as i32));
        // SAFETY: the OwnedFd moves into the AsyncFd, so its fd stays open and
        // unchanged for the AsyncFd's whole life.
        let markers = unsafe { AsyncFd::register_with_interest(markers, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Shell {
            child,
            pgid,
            script,
            input,
            script_end,
            script_freed: 0,
            master,
            _slave: slave_copy,
            markers,
            exited: None,
            eof: false,
            pty_buf: vec![0u8; PTY_READ_BUFFER].into_boxed_slice(),
        })
    }

    /// Appends one call's line to the script and lets the shell read it.
    fn send(&mut self, line: &str) -> io::Result<()> {
        if self.script_end - self.script_freed >= SCRIPT_FREE_EVERY {
            // Everything before the end has been read: the shell waits at
            // the end of the previous line. Offsets stay; memory goes.
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if rustix::fs::fallocate(&self.script, punch, 0, self.script_end).is_ok() {
                self.script_freed = self.script_end;
            }
        }
        self.script_end = write_at(&self.script, self.script_end, line.as_bytes())?;
        match rustix::io::write(self.markers.get_ref(), b"x") {
            Ok(1) => Ok(()),
            Ok(_) => Err(io::ErrorKind::WriteZero.into()),
            Err(err) => Err(err.into()),
        }
    }

    /// Discards whatever background jobs printed since the last call.
    fn drain_pending(&mut self) {
        self.read_available(|_| {});
    }

    /// Reads the PTY until it has nothing more, handing each chunk to `take`.
    /// A PTY read that finds nothing first waits for the kernel to pass on
    /// what the shell already wrote (`n_tty_read` flushes the pending buffer
    /// work before it reports `EAGAIN`), so after the marker this returns all
    /// of the call's output.
    fn read_available(&mut self, mut take: impl FnMut(&[u8])) {
        while !self.eof {
            match rustix::io::read(&self.master, &mut self.pty_buf[..]) {
                Ok(0) => self.eof = true,
                Ok(n) => take(&self.pty_buf[..n]),
                Err(Errno::IO) => self.eof = true,
                Err(Errno::INTR) => continue,
                Err(_) => break,
            }
        }
    }

    /// The PTY registered with the runtime, for a call that streams output.
    /// Callers drop it before the shell (and with it `master`) goes away.
    fn watch_pty(&self) -> io::Result<AsyncFd<RawFd>> {
        // SAFETY: `master` is owned by this Shell and only closed when it is
        // dropped; every watcher is a local of a method borrowing the Shell.
        unsafe { AsyncFd::register_with_interest(self.master.as_raw_fd(), Interest::READABLE) }
            .map_err(io::Error::from)
    }

    async fn execute(
        &mut self,
        command: &str,
        until: Instant,
        cancel: &CancellationToken,
    ) -> Outcome {
        self.drain_pending();
        let hex = format!("{:016x}", rand::random::<u64>());
        let sentinel = format!("{SENTINEL_PREFIX}{hex}{SENTINEL_SUFFIX}");
        let line = format!(
            "eval {}{} {SENTINEL_FD}>&-; {MARKER_FN} '{hex}' \"$?\"\n",
            single_quoted(command),
            self.input.call_redirection()
        );
        let mut out = OutputBuffer::default();
        if self.send(&line).is_err() {
            // The socket is broken: the shell is gone.
            return self.finish_exited(out).await;
        }

        // Until the marker or QUIET_WINDOW, only the framing socket wakes the
        // runner: a quick command's output is read in one go after its
        // marker instead of costing a wake-up per chunk the PTY passes on.
        let quiet_until = Instant::now() + QUIET_WINDOW;
        let mut watched: Option<AsyncFd<RawFd>> = None;
        let mut marker = MarkerLine::default();
        let mut marker_buf = [0u8; 256];
        loop {
            match marker.status(sentinel.as_bytes()) {
                MarkerStatus::Pending => {}
                done => {
                    drop(watched);
                    self.read_available(|chunk| out.push(chunk));
                    return match done {
                        MarkerStatus::Found(code) => Outcome::Done {
                            output: out.finish(),
                            code,
                        },
                        _ => Outcome::Broken {
                            output: out.finish(),
                            why: "corrupt output framing".into(),
                        },
                    };
                }
            }
            if self.eof || marker.ended {
                drop(watched);
                return self.finish_exited(out).await;
            }
            let Shell {
                markers,
                child,
                exited,
                eof,
                pty_buf,
                master,
                ..
            } = &mut *self;
            let mut shell_exited = false;
            let mut start_watching = false;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    return Outcome::Cancelled { output: out.finish() };
                }
                _ = tokio::time::sleep_until(until.into()) => {
                    return Outcome::TimedOut { output: out.finish() };
                }
                r = read_chunk(markers, markers.get_ref().as_fd(), &mut marker_buf) => match r {
                    Ok(0) | Err(_) => marker.ended = true,
                    Ok(n) => marker.push(&marker_buf[..n]),
                },
                r = read_watched(watched.as_ref(), master, pty_buf) => match r {
                    Ok(0) | Err(_) => *eof = true,
                    Ok(n) => out.push(&pty_buf[..n]),
                },
                _ = tokio::time::sleep_until(quiet_until.into()), if watched.is_none() => {
                    start_watching = true;
                }
                status = child.wait(), if exited.is_none() => {
                    *exited = Some(status.map(exit_code).unwrap_or(-1));
                    shell_exited = true;
                }
            }
            if start_watching {
                match self.watch_pty() {
                    Ok(fd) => watched = Some(fd),
                    Err(err) => {
                        return Outcome::Broken {
                            output: out.finish(),
                            why: format!("cannot watch the terminal: {err}"),
                        }
                    }
                }
            }
            if shell_exited {
                drop(watched);
                return self.finish_exited(out).await;
            }
        }
    }

    /// The shell died before its marker: take what it printed and report.
    async fn finish_exited(&mut self, mut out: OutputBuffer) -> Outcome {
        self.read_available(|chunk| out.push(chunk));
        if self.exited.is_none() {
            if let Ok(Ok(status)) = tokio::time::timeout(EXIT_DRAIN, self.child.wait()).await {
                self.exited = Some(exit_code(status));
            }
        }
        match self.exited {
            Some(code) => Outcome::Exited {
                output: out.finish(),
                code,
            },
            None => Outcome::Broken {
                output: out.finish(),
                why: "output ended without the completion marker".into(),
            },
        }
    }

    /// SIGTERM to the group, a short grace, then SIGKILL; reaps the shell.
    async fn close(mut self) {
        if let Some(pgid) = self.pgid {
            let _ = rustix::process::kill_process_group(pgid, Signal::TERM);
            if self.exited.is_none() {
                if let Ok(Ok(status)) = tokio::time::timeout(KILL_GRACE, self.child.wait()).await {
                    self.exited = Some(exit_code(status));
                }
            }
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
        if self.exited.is_none() {
            if let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await
            {
                self.exited = Some(exit_code(status));
            }
        }
        if self.exited.is_some() {
            // Reaped: the group id may be reused, so Drop must not signal it.
            self.pgid = None;
        }
        // Drop closes the master and stdin.
    }
}

/// Waits until `fd` is readable and reads `from` (the descriptor `fd`
/// watches) into `buf`.
async fn read_chunk<T: AsRawFd>(
    fd: &AsyncFd<T>,
    from: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|_| read_fd(from, buf)) {
            Ok(Ok(n)) => return Ok(n),
            // Linux reports EIO on the master once no slave holder is left.
            Ok(Err(e)) if e.raw_os_error() == Some(Errno::IO.raw_os_error()) => return Ok(0),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// [`read_chunk`] of the PTY once it is watched; until then, never.
async fn read_watched(
    pty: Option<&AsyncFd<RawFd>>,
    master: &OwnedFd,
    buf: &mut [u8],
) -> io::Result<usize> {
    match pty {
        Some(fd) => read_chunk(fd, master.as_fd(), buf).await,
        None => std::future::pending().await,
    }
}

enum MarkerStatus {
    Found(i32),
    Pending,
    Corrupt,
}

/// What the framing socket carried during one call: exactly one
/// `<sentinel><status>\n` line, written by the marker function.
#[derive(Default)]
struct MarkerLine {
    bytes: Vec<u8>,
    /// The socket reported end of file: the shell is gone.
    ended: bool,
}

impl MarkerLine {
    /// Longer than any marker line: the rest is garbage.
    const LIMIT: usize = 128;
    /// An exit status has at most three digits; twelve is already garbage.
    const MAX_DIGITS: usize = 12;

    fn push(&mut self, data: &[u8]) {
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

/// Raw output of one call, bounded in memory (the tail is kept).
#[derive(Default)]
struct OutputBuffer {
    buf: Vec<u8>,
    truncated: bool,
}

impl OutputBuffer {
    const KEEP: usize = 2 * BASH_OUTPUT_LIMIT;

    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        if self.buf.len() > 2 * Self::KEEP {
            let cut = self.buf.len() - Self::KEEP;
            self.buf.drain(..cut);
            self.truncated = true;
        }
    }

    fn finish(self) -> String {
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

#[cfg(test)]
mod tests {
    use super::{
        script_file, unnamed_temp_file, write_at, MarkerLine, MarkerStatus, Outcome, ScriptInput,
        Shell,
    };
    use crate::tools::ToolContext;
    use std::time::{Duration, Instant};
    use tokio_util::sync::CancellationToken;

    async fn run(shell: &mut Shell, command: &str) -> (String, i32) {
        let until = Instant::now() + Duration::from_secs(20);
        match shell
            .execute(command, until, &CancellationToken::new())
            .await
        {
            Outcome::Done { output, code } => (output, code),
            _ => panic!("{command:?} did not complete"),
        }
    }

    /// Either way of reading calls (a script by path, or stdin where /proc
    /// is missing) keeps one shell's state between calls, gives commands
    /// /dev/null as stdin and keeps the shell's input out of their reach.
    #[tokio::test]
    async fn either_script_input_keeps_one_shell_and_hides_its_input() {
        for input in [ScriptInput::Path, ScriptInput::Stdin] {
            let dir = tempfile::tempdir().unwrap();
            let ctx = ToolContext::new(dir.path());
            let mut shell = Shell::spawn_reading(&ctx, script_file().unwrap(), input).unwrap();
            assert_eq!(
                run(&mut shell, "cd / && export KEPT=yes").await,
                (String::new(), 0)
            );
            let (output, code) = run(
                &mut shell,
                "echo \"$PWD $KEPT $0\"; cat; readlink /proc/self/fd/* | grep -c -e mango-bash-input -e socket",
            )
            .await;
            assert_eq!(output, "/ yes /bin/bash\n0", "{input:?}");
            assert_eq!(code, 1, "{input:?}: grep found nothing");
            assert_eq!(run(&mut shell, "(exit 7)").await, (String::new(), 7));
            shell.close().await;
        }
    }

    /// The shell gets the framing socket as fd 99 and its script as fd 98
    /// also where the runner already has descriptors of its own there.
    #[tokio::test]
    async fn the_shell_gets_fds_98_and_99_even_where_the_runner_has_them_open() {
        let null = std::fs::File::open("/dev/null").unwrap();
        // The lowest free numbers from 98 up: 98 and 99, unless taken already.
        let _held = [
            rustix::io::fcntl_dupfd_cloexec(&null, 98).unwrap(),
            rustix::io::fcntl_dupfd_cloexec(&null, 98).unwrap(),
        ];
        for fd in [98, 99] {
            assert!(std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_ok());
        }
        for input in [ScriptInput::Path, ScriptInput::Stdin] {
            let dir = tempfile::tempdir().unwrap();
            let ctx = ToolContext::new(dir.path());
            let mut shell = Shell::spawn_reading(&ctx, script_file().unwrap(), input).unwrap();
            assert_eq!(
                run(&mut shell, "echo ok").await,
                ("ok".to_string(), 0),
                "{input:?}"
            );
            let pid = shell.child.id().unwrap();
            let socket = std::fs::read_link(format!("/proc/{pid}/fd/99")).unwrap();
            assert!(
                socket.to_string_lossy().starts_with("socket:"),
                "{socket:?}"
            );
            shell.close().await;
        }
    }

    /// The fallback input, where memfd_create is not allowed: a file with no
    /// name that takes appends at any offset and can be read back.
    #[test]
    fn the_fallback_input_file_has_no_name_and_takes_appends() {
        let dir = tempfile::tempdir().unwrap();
        let fd = unnamed_temp_file(dir.path()).unwrap();
        let end = write_at(&fd, 0, b"first\n").unwrap();
        let end = write_at(&fd, end, b"second\n").unwrap();
        assert_eq!(end, 13);
        let mut buf = [0u8; 32];
        let n = rustix::io::pread(&fd, &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"first\nsecond\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

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
}
