//! The persistent `bash` tool.
//!
//! One `bash --noprofile --norc` per session, started lazily in the
//! workspace, in its own session and process group, with a PTY as its
//! controlling terminal, stdout and stderr (so programs see a terminal) and a
//! pipe as its stdin (so the shell is non-interactive: no echo, no prompts,
//! no history expansion, no line-length limit). cwd, exports and background
//! jobs survive between calls.
//!
//! Framing: each command is sent as
//! `eval '<command>' </dev/null 99>&-; __mango_done '<hex>' "$?"`
//! (the `eval` builtin is the brace group: its redirection covers the whole
//! command; `eval` of a single-quoted string keeps an unbalanced quote or a
//! syntax error inside the call, where a raw `{ …\n}` group would let an open
//! quote swallow the framing). `__mango_done` writes the completion marker
//! `__MANGO_CMD_<hex>_DONE__<status>` to fd 99, the shell's own copy of the
//! PTY. Both are made by the shell's first line (`exec 99>&1`, and the
//! function, read-only so no command can redefine or unset it, calling
//! `builtin printf` so no command's function takes its place); fd 99 is
//! hidden from each command, which cannot inherit or replace it, so a command
//! that moves its own output (`exec >log 2>&1`) still ends promptly; what it
//! redirected stays redirected, as in any shell. bash reads a pipe one byte
//! per `read` so as not to consume input meant for its children, so the line
//! is kept short (the marker's `printf` written out in every line was half
//! of it), and a command longer than 4 KiB is
//! written to a file in a private (0700) directory instead and the shell is
//! sent `. '<dir>/command' …` (`.` runs it in the current shell with the same
//! containment: a syntax error makes `.` return 2); a 100 KB heredoc went from
//! 28 ms of reads to 8 ms. The marker's literal never appears in the written
//! text (the function assembles it), and its random part is fresh per call
//! (64 bits). Reading stops
//! at the sentinel; a missing sentinel (shell died) or garbage after it
//! closes the shell. Timeout, cancellation, shell death or corrupt framing
//! close the shell (SIGTERM to the group, SIGKILL after a short grace); the
//! next call starts a fresh shell and says so at the start of its output.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rand::RngCore;
use regex::Regex;
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::process::{Child, ChildStdin};
use tokio_util::sync::CancellationToken;

use super::{tool_env, Args, ToolContext, ToolOutput};

/// Output cap (bytes); the tail is kept.
pub const BASH_OUTPUT_LIMIT: usize = 100 * 1024;
/// Per-call timeout when `timeout_ms` is absent or zero.
pub const BASH_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Grace between SIGTERM and SIGKILL when closing the shell.
const KILL_GRACE: Duration = Duration::from_millis(300);
/// How long to keep draining the PTY after the shell process exited.
const EXIT_DRAIN: Duration = Duration::from_millis(200);
/// Longer commands go through the command file (see the framing): writing
/// and sourcing a file costs a few hundred microseconds, bash's byte-wise
/// pipe reads about 0.3 µs per byte.
const INLINE_COMMAND_LIMIT: usize = 4096;
/// The shell's copy of the PTY that completion markers are written to.
const SENTINEL_FD: u32 = 99;
const SENTINEL_PREFIX: &str = "__MANGO_CMD_";
const SENTINEL_SUFFIX: &str = "_DONE__";
/// The shell function that writes a call's completion marker (read-only, so a
/// command can neither redefine nor unset it).
const MARKER_FN: &str = "__mango_done";

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
    pgid: i32,
    stdin: ChildStdin,
    /// Where commands are written for the shell to source (see the framing).
    commands: Option<CommandDir>,
    master: AsyncFd<OwnedFd>,
    /// Exit status once reaped.
    exited: Option<i32>,
    /// The PTY reported end of file (no slave holders left).
    eof: bool,
    /// The shell has been sent `exec 99>&1` (with its first command).
    framing_ready: bool,
}

/// A private directory holding the command file, removed with the shell.
struct CommandDir {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl CommandDir {
    fn create() -> io::Result<CommandDir> {
        use std::os::unix::fs::DirBuilderExt;
        let mut id = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut id);
        let name: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("mango-bash-{name}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let file = dir.join("command");
        Ok(CommandDir { dir, file })
    }
}

impl Drop for CommandDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `text` as one single-quoted shell word.
fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

impl Drop for Shell {
    fn drop(&mut self) {
        if self.pgid > 0 {
            // SAFETY: plain syscall; the group is ours.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Opens a PTY pair: (master, slave), both close-on-exec.
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: straightforward libc calls; every returned fd is owned at once.
    unsafe {
        let m = cvt(libc::posix_openpt(
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?;
        let master = OwnedFd::from_raw_fd(m);
        cvt(libc::grantpt(m))?;
        cvt(libc::unlockpt(m))?;
        let mut name = [0 as libc::c_char; 128];
        let rc = libc::ptsname_r(m, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let s = cvt(libc::open(
            CStr::from_ptr(name.as_ptr()).as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?;
        let slave = OwnedFd::from_raw_fd(s);

        // No output post-processing (keep "\n" as "\n"), no echo.
        let mut t: libc::termios = std::mem::zeroed();
        cvt(libc::tcgetattr(s, &mut t))?;
        t.c_oflag &= !libc::OPOST;
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        cvt(libc::tcsetattr(s, libc::TCSANOW, &t))?;
        let ws = libc::winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        cvt(libc::ioctl(m, libc::TIOCSWINSZ, &ws))?;

        let flags = cvt(libc::fcntl(m, libc::F_GETFL))?;
        cvt(libc::fcntl(m, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
        Ok((master, slave))
    }
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl Shell {
    fn spawn(ctx: &ToolContext) -> io::Result<Shell> {
        let (master, slave) = open_pty()?;
        let bash = if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "bash"
        };
        let child = {
            let mut cmd = tokio::process::Command::new(bash);
            cmd.args(["--noprofile", "--norc"])
                .current_dir(&ctx.workspace)
                .env_clear()
                .envs(tool_env(&ctx.workspace))
                .stdin(Stdio::piped())
                .stdout(Stdio::from(slave.try_clone()?))
                .stderr(Stdio::from(slave))
                .kill_on_drop(true);
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // Make the PTY (already on fd 1) the controlling terminal.
                    libc::ioctl(1, libc::TIOCSCTTY as _, 0);
                    Ok(())
                });
            }
            cmd.spawn()?
            // `cmd` (holding the parent's slave copies) is dropped here, so
            // the PTY reports EOF once the shell and its jobs are gone.
        };
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        let mut child = child;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("no stdin pipe"))?;
        // SAFETY: `master` is an OwnedFd moved into the AsyncFd, so its fd
        // stays open and unchanged for the AsyncFd's whole life.
        let master = unsafe { AsyncFd::register_with_interest(master, Interest::READABLE) }
            .map_err(io::Error::from)?;
        let commands = match CommandDir::create() {
            Ok(dir) => Some(dir),
            Err(err) => {
                tracing::warn!(error = %err, "no private temporary directory for bash commands; sending them inline");
                None
            }
        };
        Ok(Shell {
            child,
            pgid,
            stdin,
            commands,
            master,
            exited: None,
            eof: false,
            framing_ready: false,
        })
    }

    /// Discards whatever background jobs printed since the last call.
    fn drain_pending(&mut self) {
        let mut buf = [0u8; 8192];
        while !self.eof {
            match read_fd(self.master.get_ref().as_raw_fd(), &mut buf) {
                Ok(0) => self.eof = true,
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EIO) => self.eof = true,
                Err(_) => break,
            }
        }
    }

    async fn execute(
        &mut self,
        command: &str,
        until: Instant,
        cancel: &CancellationToken,
    ) -> Outcome {
        self.drain_pending();
        let mut id = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut id);
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let sentinel = format!("{SENTINEL_PREFIX}{hex}{SENTINEL_SUFFIX}");
        let via_file = match &self.commands {
            Some(dir) if command.len() > INLINE_COMMAND_LIMIT => {
                std::fs::write(&dir.file, command).ok().map(|()| &dir.file)
            }
            _ => None,
        };
        let setup = if self.framing_ready {
            String::new()
        } else {
            format!(
                "exec {SENTINEL_FD}>&1; {MARKER_FN}() {{ builtin printf '{SENTINEL_PREFIX}%s{SENTINEL_SUFFIX}%d\\n' \"$1\" \"$2\" >&{SENTINEL_FD}; }}; readonly -f {MARKER_FN}\n"
            )
        };
        let run = match via_file {
            Some(file) => format!(". {}", single_quoted(&file.to_string_lossy())),
            None => format!("eval {}", single_quoted(command)),
        };
        let script =
            format!("{setup}{run} </dev/null {SENTINEL_FD}>&-; {MARKER_FN} '{hex}' \"$?\"\n");
        self.framing_ready = true;

        let mut out = OutputBuffer::default();
        let write = async {
            self.stdin.write_all(script.as_bytes()).await?;
            self.stdin.flush().await
        };
        // Writing can block if the shell is busy and the pipe is full.
        let write_result = tokio::select! {
            r = write => Some(r),
            _ = tokio::time::sleep_until(until.into()) => None,
            _ = cancel.cancelled() => return Outcome::Cancelled { output: String::new() },
        };
        match write_result {
            None => {
                return Outcome::TimedOut {
                    output: String::new(),
                }
            }
            Some(Err(_)) => {
                // Broken pipe: the shell is gone.
                return self.finish_exited(out).await;
            }
            Some(Ok(())) => {}
        }

        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match out.find_sentinel(sentinel.as_bytes()) {
                Sentinel::Found(code) => {
                    return Outcome::Done {
                        output: out.finish(),
                        code,
                    }
                }
                Sentinel::Corrupt => {
                    return Outcome::Broken {
                        output: out.finish(),
                        why: "corrupt output framing".into(),
                    }
                }
                Sentinel::Pending => {}
            }
            if self.eof {
                return self.finish_exited(out).await;
            }
            let Shell {
                master,
                child,
                exited,
                eof,
                ..
            } = &mut *self;
            let mut shell_exited = false;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    return Outcome::Cancelled { output: out.finish() };
                }
                _ = tokio::time::sleep_until(until.into()) => {
                    return Outcome::TimedOut { output: out.finish() };
                }
                r = read_chunk(master, &mut buf) => match r {
                    Ok(0) => *eof = true,
                    Ok(n) => out.push(&buf[..n]),
                    Err(_) => *eof = true,
                },
                status = child.wait(), if exited.is_none() => {
                    *exited = Some(status.map(exit_code).unwrap_or(-1));
                    shell_exited = true;
                }
            }
            if shell_exited {
                return self.finish_exited(out).await;
            }
        }
    }

    /// The shell died before the sentinel: drain what is left and report.
    async fn finish_exited(&mut self, mut out: OutputBuffer) -> Outcome {
        let drain_until = Instant::now() + EXIT_DRAIN;
        let mut buf = vec![0u8; 16 * 1024];
        while !self.eof {
            let r = tokio::time::timeout_at(drain_until.into(), read_chunk(&self.master, &mut buf))
                .await;
            match r {
                Ok(Ok(0)) | Ok(Err(_)) => self.eof = true,
                Ok(Ok(n)) => out.push(&buf[..n]),
                Err(_) => break,
            }
        }
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
        if self.pgid > 0 {
            // SAFETY: plain syscalls on our own process group.
            unsafe {
                libc::kill(-self.pgid, libc::SIGTERM);
            }
            if self.exited.is_none() {
                if let Ok(Ok(status)) = tokio::time::timeout(KILL_GRACE, self.child.wait()).await {
                    self.exited = Some(exit_code(status));
                }
            }
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
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
            self.pgid = 0;
        }
        // Drop closes the master and stdin.
    }
}

async fn read_chunk(master: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = master.readable().await?;
        match guard.try_io(|inner| read_fd(inner.get_ref().as_raw_fd(), buf)) {
            Ok(Ok(n)) => return Ok(n),
            // Linux reports EIO on the master once no slave holder is left.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

enum Sentinel {
    Found(i32),
    Pending,
    Corrupt,
}

/// Raw output of one call, bounded in memory (the tail is kept).
#[derive(Default)]
struct OutputBuffer {
    buf: Vec<u8>,
    /// Where the sentinel search resumes.
    scanned: usize,
    /// Where the sentinel starts, once seen.
    sentinel_at: Option<usize>,
    truncated: bool,
}

impl OutputBuffer {
    const KEEP: usize = 2 * BASH_OUTPUT_LIMIT;

    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        if self.sentinel_at.is_none() && self.buf.len() > 2 * Self::KEEP {
            let cut = self.buf.len() - Self::KEEP;
            self.buf.drain(..cut);
            self.scanned = self.scanned.saturating_sub(cut);
            self.truncated = true;
        }
    }

    fn find_sentinel(&mut self, sentinel: &[u8]) -> Sentinel {
        let start = match self.sentinel_at {
            Some(at) => at,
            None => {
                let from = self.scanned.saturating_sub(sentinel.len());
                let found = self.buf[from..]
                    .windows(sentinel.len())
                    .position(|w| w == sentinel)
                    .map(|p| p + from);
                match found {
                    Some(at) => {
                        self.sentinel_at = Some(at);
                        at
                    }
                    None => {
                        self.scanned = self.buf.len();
                        return Sentinel::Pending;
                    }
                }
            }
        };
        let rest = &self.buf[start + sentinel.len()..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        match rest.get(digits) {
            None if digits < 12 => Sentinel::Pending,
            Some(b'\n') | Some(b'\r') if digits > 0 => std::str::from_utf8(&rest[..digits])
                .ok()
                .and_then(|s| s.parse().ok())
                .map_or(Sentinel::Corrupt, Sentinel::Found),
            _ => Sentinel::Corrupt,
        }
    }

    fn finish(mut self) -> String {
        if let Some(at) = self.sentinel_at {
            self.buf.truncate(at);
        }
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
    let text = ansi_regex().replace_all(&text, "");
    let text = text.replace("\r\n", "\n");
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
