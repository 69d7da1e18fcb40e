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
//! - [`shell`]: the shell's life: its start, one call, its end.
//! - [`script`]: input: the in-memory script the runner appends each call's
//!   line to, read by path (or as stdin where /proc is missing).
//! - [`framing`]: each call's line, its completion marker on a socket of its
//!   own (fd 99), and the byte that lets the shell read on.
//! - [`pty`]: the terminal, and when the runner watches it (wake-ups).
//! - [`output`]: a call's output, bounded and cleaned.
//!
//! Timeout, cancellation, shell death or corrupt framing close the shell
//! (SIGTERM to the group, SIGKILL after a short grace); the next call starts
//! a fresh shell and says so at the start of its output.

mod framing;
mod output;
mod pty;
mod script;
mod shell;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use super::{ToolContext, ToolOutput};
use mango_protocol::tools::BashInput;
pub use output::clean_output;

/// The PTY framing's marker line under arbitrary socket input (`crate::fuzzing`).
#[doc(hidden)]
pub fn fuzz_marker_line(data: &[u8]) {
    framing::fuzz_marker_line(data);
}
use shell::{Outcome, Shell};

/// Output cap (bytes); the tail is kept.
pub const BASH_OUTPUT_LIMIT: usize = 100 * 1024;
/// Per-call timeout when `timeout_ms` is absent or zero.
pub const BASH_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

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
        args: BashInput,
        deadline: Instant,
        cancel: CancellationToken,
    ) -> ToolOutput {
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
            if let Some(code) = shell.exited_meanwhile() {
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
            let shell = Shell::spawn(&self.ctx).map_err(|e| could_not_start(&self.ctx, &e))?;
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

/// Why no shell could start, in words the model can act on.
fn could_not_start(ctx: &ToolContext, err: &io::Error) -> String {
    if err.raw_os_error() == Some(Errno::AGAIN.raw_os_error()) {
        return format!(
            "bash: could not start a shell: {err}: the sandbox's process limit is reached; \
             processes started earlier (background jobs, their children) hold it until they end"
        );
    }
    format!(
        "bash: could not start a shell in {}: {err}",
        ctx.workspace.display()
    )
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

/// Waits until `fd` is readable and reads with `read` (the PTY's master or
/// the framing socket); EIO counts as end of file, as Linux reports it on the
/// master once no slave holder is left.
async fn read_when_ready<T: AsRawFd>(
    fd: &AsyncFd<T>,
    mut read: impl FnMut() -> rustix::io::Result<usize>,
) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|_| read().map_err(io::Error::from)) {
            Ok(Ok(n)) => return Ok(n),
            Ok(Err(e)) if e.raw_os_error() == Some(Errno::IO.raw_os_error()) => return Ok(0),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
