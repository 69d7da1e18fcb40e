//! The suite's processes: each a real binary whose stdout and stderr both
//! go, line for line, into one log file under the run's `logs/`, which the
//! secret check reads back whole.

use anyhow::Context;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    /// Starts `program args` with exactly `env` (over PATH and HOME only),
    /// appending to `logs/<name>.log`: a restarted process keeps one file.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
        logs: &Path,
    ) -> anyhow::Result<Proc> {
        let log = logs.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env(
                "HOME",
                std::env::var_os("HOME").unwrap_or_else(|| "/".into()),
            )
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
        })
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.id().map(|p| p as i32)
    }

    /// Sends `signal` (libc's number) to the process.
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .with_context(|| format!("{} has already exited", self.name))?;
        // SAFETY: kill(2) with a pid this process started and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            anyhow::bail!(
                "kill({pid}, {signal}) of {}: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Its exit status within `within`, or an error naming the process.
    pub async fn exit(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => anyhow::bail!(
                "{} still runs {within:?} after it was told to end",
                self.name
            ),
        }
    }

    /// Whether it has exited (and its status then).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL and reap: the end of a process the suite no longer needs.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// A free loopback port (bound, read and released: the caller binds it next).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
