//! The `mango-worker` binary as operators run it: a process with a clean
//! environment, its stderr (the JSON log) in a file.

use mango_testkit::TestApp;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

pub struct Worker {
    pub child: Child,
    log: PathBuf,
}

/// `mango-worker <args>` with `env` over a clean environment, serving its
/// metrics on a free port.
pub fn command(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mango-worker"));
    command
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_METRICS_ADDR", "127.0.0.1:0")
        .env("MANGO_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

impl Worker {
    pub fn start(args: &[&str], env: &[(&str, String)], log: &Path) -> Worker {
        Worker::spawn(command(args, env), log)
    }

    /// Starts `command` with its stderr in `log`.
    pub fn spawn(mut command: Command, log: &Path) -> Worker {
        command.stderr(std::fs::File::create(log).unwrap());
        Worker {
            child: command.spawn().expect("mango-worker starts"),
            log: log.to_path_buf(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status within `within`.
    pub async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!("mango-worker still runs after {within:?}: {}", self.log()),
        }
    }

    pub fn terminate(&self) {
        let pid = self.child.id().expect("running") as i32;
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }

    /// Waits (at most `within`) until a line of its log contains `text`.
    pub async fn until_logged(&self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.contains(text)) {
                return line.to_string();
            }
            assert!(Instant::now() < deadline, "no {text:?} in: {log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub fn common_env(api: &TestApp, key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("MANGO_ENVIRONMENT_KEY", key.to_string()),
        ("MANGO_ENVIRONMENT_ID", api.env_id.clone()),
        ("MANGO_BASE_URL", api.base.clone()),
    ]
}
