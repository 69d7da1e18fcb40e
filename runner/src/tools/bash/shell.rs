//! The shell's life: `bash --noprofile --norc` started in the workspace, in
//! its own session and process group, with the PTY ([`super::pty`]) as its
//! controlling terminal, stdout and stderr, /dev/null or the script as its
//! stdin ([`super::script`]) and the framing socket as fd 99
//! ([`super::framing`]); one call at a time; and its end: SIGTERM to the
//! group, SIGKILL after a short grace, or SIGKILL alone when dropped.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rustix::io::FdFlags;
use rustix::process::{Pid, Signal};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use super::framing::{Call, MarkerLine, MarkerStatus, Markers, SENTINEL_FD};
use super::output::OutputBuffer;
use super::pty::{Pty, QUIET_WINDOW};
use super::script::{Script, ScriptInput, SCRIPT_FD};
use crate::tools::{tool_env, ToolContext};

/// Grace between SIGTERM and SIGKILL when closing the shell.
const KILL_GRACE: Duration = Duration::from_millis(300);
/// How long to wait for the exit status of a shell whose socket ended.
const EXIT_DRAIN: Duration = Duration::from_millis(200);

/// How one call ended.
pub(super) enum Outcome {
    Done { output: String, code: i32 },
    TimedOut { output: String },
    Cancelled { output: String },
    Exited { output: String, code: i32 },
    Broken { output: String, why: String },
}

pub(super) struct Shell {
    child: Child,
    /// The shell's process group, until the shell is reaped.
    pgid: Option<Pid>,
    script: Script,
    pty: Pty,
    markers: Markers,
    /// Exit status once reaped.
    exited: Option<i32>,
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
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

impl Shell {
    pub(super) fn spawn(ctx: &ToolContext) -> io::Result<Shell> {
        Shell::spawn_reading(ctx, Script::new()?)
    }

    pub(super) fn spawn_reading(ctx: &ToolContext, mut script: Script) -> io::Result<Shell> {
        let (pty, slave) = Pty::open()?;
        let (markers, shell_end) = Markers::pair()?;
        let bash = if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "bash"
        };
        script.start(bash)?;
        let child = {
            let mut cmd = tokio::process::Command::new(bash);
            cmd.args(["--noprofile", "--norc"]);
            // Above the targets, so that placing one cannot overwrite the
            // other before it is placed.
            let shell_end = above_inherited_fds(shell_end)?;
            let script_copy = match script.input() {
                ScriptInput::Path => {
                    cmd.arg(format!("/proc/self/fd/{SCRIPT_FD}"))
                        .stdin(Stdio::null());
                    Some(above_inherited_fds(script.file().try_clone()?)?)
                }
                ScriptInput::Stdin => {
                    cmd.stdin(Stdio::from(script.file().try_clone()?));
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
        Ok(Shell {
            child,
            pgid,
            script,
            pty,
            markers,
            exited: None,
        })
    }

    /// The shell's exit code, if it has exited since the last call.
    pub(super) fn exited_meanwhile(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(exit_code(status)),
            _ => None,
        }
    }

    /// Appends one call's line to the script and lets the shell read it.
    fn send(&mut self, line: &str) -> io::Result<()> {
        self.script.append(line)?;
        self.markers.release()
    }

    /// Runs one command: its output and how it ended, by `until` at the
    /// latest. Until the marker or [`QUIET_WINDOW`], only the framing socket
    /// wakes the runner: a quick command's output is read in one go after
    /// its marker instead of costing a wake-up per chunk the PTY passes on.
    pub(super) async fn execute(
        &mut self,
        command: &str,
        until: Instant,
        cancel: &CancellationToken,
    ) -> Outcome {
        // Whatever background jobs printed since the last call goes.
        self.pty.read_available(|_| {});
        let call = Call::new(command, self.script.input().call_redirection());
        let mut out = OutputBuffer::default();
        if self.send(&call.line).is_err() {
            // The socket is broken: the shell is gone.
            return self.finish_exited(out).await;
        }

        let quiet_until = Instant::now() + QUIET_WINDOW;
        let mut marker = MarkerLine::default();
        let mut marker_buf = [0u8; 256];
        loop {
            match call.status(&marker) {
                MarkerStatus::Pending => {}
                done => {
                    self.pty.read_available(|chunk| out.push(chunk));
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
            if self.pty.eof() || marker.ended {
                return self.finish_exited(out).await;
            }
            let mut shell_exited = false;
            let mut start_watching = false;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.pty.unwatch();
                    return Outcome::Cancelled { output: out.finish() };
                }
                _ = tokio::time::sleep_until(until.into()) => {
                    self.pty.unwatch();
                    return Outcome::TimedOut { output: out.finish() };
                }
                r = self.markers.read(&mut marker_buf) => match r {
                    Ok(0) | Err(_) => marker.ended = true,
                    Ok(n) => marker.push(&marker_buf[..n]),
                },
                chunk = self.pty.read_watched() => {
                    if let Some(chunk) = chunk {
                        out.push(chunk);
                    }
                }
                _ = tokio::time::sleep_until(quiet_until.into()), if !self.pty.is_watched() => {
                    start_watching = true;
                }
                status = self.child.wait(), if self.exited.is_none() => {
                    self.exited = Some(status.map(exit_code).unwrap_or(-1));
                    shell_exited = true;
                }
            }
            if start_watching {
                if let Err(err) = self.pty.watch() {
                    return Outcome::Broken {
                        output: out.finish(),
                        why: format!("cannot watch the terminal: {err}"),
                    };
                }
            }
            if shell_exited {
                return self.finish_exited(out).await;
            }
        }
    }

    /// The shell died before its marker: take what it printed and report.
    async fn finish_exited(&mut self, mut out: OutputBuffer) -> Outcome {
        self.pty.read_available(|chunk| out.push(chunk));
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
    pub(super) async fn close(mut self) {
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

#[cfg(test)]
mod tests {
    use super::super::script::{script_file, Script, ScriptInput};
    use super::{Outcome, Shell};
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

    fn spawn(ctx: &ToolContext, input: ScriptInput) -> Shell {
        Shell::spawn_reading(ctx, Script::reading(script_file().unwrap(), input)).unwrap()
    }

    /// Either way of reading calls (a script by path, or stdin where /proc
    /// is missing) keeps one shell's state between calls, gives commands
    /// /dev/null as stdin and keeps the shell's input out of their reach.
    #[tokio::test]
    async fn either_script_input_keeps_one_shell_and_hides_its_input() {
        for input in [ScriptInput::Path, ScriptInput::Stdin] {
            let dir = tempfile::tempdir().unwrap();
            let ctx = ToolContext::new(dir.path());
            let mut shell = spawn(&ctx, input);
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
            let mut shell = spawn(&ctx, input);
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
}
