//! A kept sandbox between two activations of one Session (spec §7.1): the
//! next activation must find no process, no `/tmp` file and no secret of
//! the last one; only the workspace's files carry over.
//!
//! Orphans of tools (a daemon, a `setsid`'ed process, a double fork) are
//! re-parented to the nearest subreaper: PID 1 in a sandbox, and the runner
//! itself once [`become_subreaper`] ran, so outside a sandbox too every
//! tool process stays a descendant the sweep can find.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the sweep waits for killed processes to leave `/proc`.
const SWEEP_BOUND: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error("cannot become a subreaper: {0}")]
    Subreaper(std::io::Error),
    #[error("tool processes still running after {SWEEP_BOUND:?}: {0:?}")]
    Survivors(Vec<i32>),
    #[error("cannot empty {path}: {error}")]
    Tmp { path: String, error: std::io::Error },
}

/// Makes orphaned tool processes the runner's children rather than PID 1's.
pub fn become_subreaper() -> Result<(), KeptError> {
    // SAFETY: a plain prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(KeptError::Subreaper(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Each process in `/proc` with its parent.
fn processes() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may hold spaces and parentheses: parse after its last `)`.
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// The processes to end: in a sandbox every one but PID 1 and the runner;
/// elsewhere the runner's descendants.
fn targets(whole_sandbox: bool) -> Vec<i32> {
    let me = std::process::id() as i32;
    let all = processes();
    if whole_sandbox {
        return all
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| *pid != 1 && *pid != me)
            .collect();
    }
    let mut tree: HashSet<i32> = HashSet::from([me]);
    loop {
        let before = tree.len();
        for (pid, ppid) in &all {
            if tree.contains(ppid) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
    tree.remove(&me);
    tree.into_iter().collect()
}

/// SIGKILLs every tool process and waits until `/proc` shows none (the
/// runner reaps those re-parented to it).
pub fn kill_tool_processes(whole_sandbox: bool) -> Result<(), KeptError> {
    let deadline = Instant::now() + SWEEP_BOUND;
    loop {
        let left = targets(whole_sandbox);
        if left.is_empty() {
            return Ok(());
        }
        for pid in &left {
            // SAFETY: kill(2) with a pid read from /proc; a gone one is ESRCH.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        // Between activations no child of the runner is anyone else's to wait for.
        // SAFETY: waitpid with a null status pointer.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        if Instant::now() >= deadline {
            return Err(KeptError::Survivors(left));
        }
        // A poll inside the deadline: killed processes take a moment to be reaped.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes everything inside `dir` (not `dir` itself), following no link.
pub fn empty_dir(dir: &Path) -> Result<(), KeptError> {
    let fail = |error| KeptError::Tmp {
        path: dir.display().to_string(),
        error,
    };
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        let path = entry.path();
        let is_dir = entry.file_type().map_err(fail)?.is_dir();
        let removed = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptying_keeps_the_dir_and_follows_no_link() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("kept"), "x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), "x").unwrap();
        std::fs::write(dir.path().join(".hidden"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        empty_dir(dir.path()).unwrap();
        assert!(dir.path().is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(outside.path().join("kept").exists());
    }
}
