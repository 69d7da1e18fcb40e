//! PID 1 of a sandbox. In a container (and in a Pod's container, which has
//! a PID namespace of its own) the runner binary is PID 1 itself: no
//! `docker-init`, nothing a tool can reach above the runner. PID 1 is the
//! process a tool would otherwise attack first: a dumpable init lets a tool
//! of the same uid open `/proc/1/fd/2` (the container's log stream, so it
//! can forge `docker logs` and make the engine burn CPU outside the
//! sandbox's limits), read `/proc/1/environ`, and ptrace it to swallow the
//! supervisor's SIGTERM.
//!
//! So, before anything else, PID 1 makes itself non-dumpable: `/proc/1/fd`,
//! `/proc/1/environ`, `/proc/1/mem` and `ptrace` are refused to every
//! process without `CAP_SYS_PTRACE`, which no sandbox has. Then it forks:
//! the child runs the item (non-dumpable too: the flag is inherited, and
//! the item sets it again), and PID 1 stays a single-threaded loop that
//! does only two things, so it can never be what holds the item up:
//! - reaps every process that ends in the sandbox (orphans are re-parented
//!   to it), and continues the runner when a tool stops it (SIGSTOP);
//! - passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to the runner.
//!
//! When the runner exits, PID 1 exits with its status, and the kernel ends
//! whatever else still runs in the sandbox. A tool cannot stop or kill PID
//! 1 from inside (the kernel drops SIGKILL and SIGSTOP sent to an init by
//! its own namespace); it can send it SIGTERM, which ends the item as the
//! supervisor's Stop would — as a tool could by signalling the runner.

use crate::exit::Exit;
use std::process::ExitCode;

/// What the process goes on to do.
pub enum Role {
    /// Run the item: not PID 1, or the runner PID 1 forked.
    Runner,
    /// PID 1, after the runner exited: exit with this.
    Exited(ExitCode),
}

static FORKED_BY_INIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is the runner a sandbox's PID 1 forked: then every
/// other process of its PID namespace is a tool's, and `/tmp` is the sandbox's own.
pub fn forked_by_init() -> bool {
    FORKED_BY_INIT.load(std::sync::atomic::Ordering::SeqCst)
}

/// Signals PID 1 takes over: waited for, never delivered to it.
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Called first in `main`. Outside PID 1 it does nothing; as PID 1 it
/// returns [`Role::Runner`] in the forked runner and [`Role::Exited`] in
/// PID 1 once the runner is gone. Call it while the process has one thread.
pub fn start() -> Role {
    if std::process::id() != 1 {
        return Role::Runner;
    }
    if let Err(err) = crate::secret::become_non_dumpable() {
        eprintln!("mango-runner: PID 1 cannot make itself non-dumpable: {err}");
        return Role::Exited(Exit::Unprotected.into());
    }
    match supervise() {
        Ok(role) => role,
        Err(err) => {
            eprintln!("mango-runner: PID 1 cannot start the runner: {err}");
            Role::Exited(Exit::Failed.into())
        }
    }
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in signals {
            libc::sigaddset(&mut set, *signal);
        }
        set
    }
}

fn check(result: libc::c_int) -> std::io::Result<libc::c_int> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Forks the runner, then reaps and forwards until it exits.
fn supervise() -> std::io::Result<Role> {
    let mut waited: Vec<libc::c_int> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let set = signal_set(&waited);
    let mut previous = signal_set(&[]);
    // Blocked before the fork, so no signal is lost between the fork and
    // the first wait: a blocked signal stays pending, and the kernel never
    // drops a blocked one as it drops an init's default-handled signals.
    // SAFETY: plain libc calls on sets initialised above.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, &mut previous) })?;
    // SAFETY: the process has one thread (the caller's contract), so the
    // child may run any code after the fork.
    let runner = check(unsafe { libc::fork() })?;
    if runner == 0 {
        // SAFETY: as above.
        check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) })?;
        FORKED_BY_INIT.store(true, std::sync::atomic::Ordering::SeqCst);
        return Ok(Role::Runner);
    }
    // Only the runner reads the Work secret.
    // SAFETY: closing a descriptor this process owns and never uses again.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
    }
    loop {
        // SAFETY: a zeroed siginfo is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is initialised; `info` is writable.
        let signal = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if signal < 0 {
            continue; // EINTR
        }
        if signal != libc::SIGCHLD {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(runner, signal) };
            continue;
        }
        if let Some(code) = reap(runner) {
            return Ok(Role::Exited(ExitCode::from(code)));
        }
    }
}

/// Reaps every child that ended; the runner's status once it has.
fn reap(runner: libc::pid_t) -> Option<u8> {
    let mut ended = None;
    loop {
        let mut status = 0;
        // SAFETY: `status` is writable.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        if pid <= 0 {
            return ended;
        }
        if pid != runner {
            continue;
        }
        if libc::WIFSTOPPED(status) {
            // A tool stopped the runner: it must go on answering.
            // SAFETY: signalling our own child.
            unsafe { libc::kill(runner, libc::SIGCONT) };
        } else if libc::WIFEXITED(status) {
            ended = Some(libc::WEXITSTATUS(status) as u8);
        } else if libc::WIFSIGNALED(status) {
            ended = Some(128u8.saturating_add(libc::WTERMSIG(status) as u8));
        }
    }
}
