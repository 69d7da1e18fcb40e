//! The local launcher (development only): each item's runner is a
//! subprocess of the supervisor's user, with a workspace folder per Session
//! (kept across activations) and a fresh one per healthcheck. It is NOT a
//! security boundary: tools run as this user, with this machine's network
//! and files (`mango-worker local` says so when it starts).
//!
//! Each sandbox is a record file `<root>/sandboxes/<name>.json`, created
//! exclusively (so one claim makes one), holding the item, the workspace and,
//! once started, the runner's pid: a restarted supervisor finds and adopts
//! what an earlier run left. A runner depends on its supervisor for nothing
//! once its secret is delivered: it leads a session of its own (no signal
//! for the supervisor's terminal or process group reaches it), writes to a
//! log file, and its stdin is closed, so it outlives a supervisor that
//! exits or is killed.

use crate::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec,
};
use crate::core::naming;
use crate::core::secret::Secret;
use rustix::process::{kill_process, kill_process_group, test_kill_process, Pid, Signal};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

const ENGINE: &str = "local system";
/// How often an adopted runner (not this process's child) is checked.
const ADOPTED_POLL: Duration = Duration::from_millis(200);

/// How to start a runner: `mango-runner`, or `mango-worker item` (the same code).
#[derive(Debug, Clone)]
pub struct RunnerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl RunnerCommand {
    pub fn new(program: PathBuf) -> RunnerCommand {
        RunnerCommand {
            program,
            args: Vec::new(),
        }
    }
}

pub struct LocalLauncher {
    runner: RunnerCommand,
    /// What `/proc/<pid>/cmdline` of a runner it started begins with.
    runner_cmdline: Vec<u8>,
    root: PathBuf,
    pool: String,
    /// Exit statuses of the runners this process started, by sandbox name.
    exits: Mutex<HashMap<String, watch::Receiver<Option<i64>>>>,
}

/// What the record file of a sandbox holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    labels: BTreeMap<String, String>,
    env: Vec<(String, String)>,
    workspace: PathBuf,
    /// The runner's pid, once started (also its process group).
    pid: Option<i32>,
    /// The workspace goes with the sandbox (a healthcheck's).
    ephemeral: bool,
}

impl LocalLauncher {
    /// `runner`: how to start a runner; `root`: where workspaces and
    /// records live. Relative paths are taken from the current directory
    /// now, once: a runner starts in its workspace, where they would mean
    /// something else.
    pub fn new(
        mut runner: RunnerCommand,
        root: PathBuf,
        pool: &str,
    ) -> Result<LocalLauncher, LaunchError> {
        runner.program = absolute_program(&runner.program);
        if !runner.program.is_file() {
            return Err(LaunchError::Missing(format!(
                "the runner binary {} does not exist (build it with `cargo build -p mango-runner`, or set MANGO_RUNNER_BIN)",
                runner.program.display()
            )));
        }
        for dir in ["sandboxes", "sessions", "checks", "logs"] {
            std::fs::create_dir_all(root.join(dir)).map_err(|e| {
                LaunchError::Workspace(format!("{}: {e}", root.join(dir).display()))
            })?;
        }
        let root = std::fs::canonicalize(&root)
            .map_err(|e| LaunchError::Workspace(format!("{}: {e}", root.display())))?;
        let mut runner_cmdline = Vec::new();
        for part in std::iter::once(runner.program.as_os_str())
            .chain(runner.args.iter().map(|a| std::ffi::OsStr::new(a.as_str())))
        {
            runner_cmdline.extend_from_slice(part.as_encoded_bytes());
            runner_cmdline.push(0);
        }
        Ok(LocalLauncher {
            runner,
            runner_cmdline,
            root,
            pool: pool.to_string(),
            exits: Mutex::default(),
        })
    }

    /// Where workspaces and records live (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.root.join("sandboxes").join(format!("{name}.json"))
    }

    fn read_record(&self, name: &str) -> Result<Record, LaunchError> {
        let path = self.record_path(name);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LaunchError::NotFound(name.to_string()),
            _ => LaunchError::Failed(format!("{}: {e}", path.display())),
        })?;
        serde_json::from_str(&text)
            .map_err(|e| LaunchError::Failed(format!("{}: {e}", path.display())))
    }

    fn write_record(
        &self,
        name: &str,
        record: &Record,
        exclusive: bool,
    ) -> Result<(), LaunchError> {
        let path = self.record_path(name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true);
        if exclusive {
            options.create_new(true);
        } else {
            options.create(true).truncate(true);
        }
        let mut file = options.open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => LaunchError::AlreadyExists(name.to_string()),
            _ => LaunchError::Failed(format!("{}: {e}", path.display())),
        })?;
        let text = serde_json::to_string(record).expect("a record serializes");
        file.write_all(text.as_bytes())
            .map_err(|e| LaunchError::Failed(format!("{}: {e}", path.display())))
    }

    /// Whether `pid` is a live runner started as this launcher starts them
    /// (a pid can be reused; a runner that exited unreaped, its supervisor
    /// gone, has an empty command line).
    fn is_runner(&self, pid: i32) -> bool {
        let Some(pid_t) = Pid::from_raw(pid) else {
            return false;
        };
        if test_kill_process(pid_t).is_err() {
            return false;
        }
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|cmd| cmd.starts_with(&self.runner_cmdline))
            .unwrap_or(false)
    }
}

fn sandbox_of(name: &str, record: &Record) -> Option<Sandbox> {
    Some(Sandbox {
        name: name.to_string(),
        handle: record.pid.map_or_else(String::new, |p| p.to_string()),
        item: naming::item_of(&record.labels)?,
    })
}

impl Launcher for LocalLauncher {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        let dir = self.root.join("sandboxes");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| LaunchError::Failed(format!("{}: {e}", dir.display())))?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let Ok(record) = self.read_record(name) else {
                continue;
            };
            if record.labels.get(naming::LABEL_POOL) != Some(&self.pool) {
                continue;
            }
            let Some(sandbox) = sandbox_of(name, &record) else {
                continue;
            };
            let running = record.pid.is_some_and(|pid| self.is_runner(pid));
            found.push(Found { sandbox, running });
        }
        Ok(found)
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        let (workspace, ephemeral) = match &spec.item.session_id {
            Some(session) => (self.root.join("sessions").join(session), false),
            None => (self.root.join("checks").join(&spec.name), true),
        };
        let record = Record {
            labels: spec.labels.clone(),
            env: spec.env.clone(),
            workspace: workspace.clone(),
            pid: None,
            ephemeral,
        };
        self.write_record(&spec.name, &record, true)?;
        if let Err(e) = std::fs::create_dir_all(&workspace) {
            let _ = std::fs::remove_file(self.record_path(&spec.name));
            return Err(LaunchError::Workspace(format!(
                "{}: {e}",
                workspace.display()
            )));
        }
        Ok(Sandbox {
            name: spec.name.clone(),
            handle: String::new(),
            item: spec.item.clone(),
        })
    }

    async fn hand_off(&self, sandbox: &Sandbox, secret: Secret) -> Result<HandOff, LaunchError> {
        let mut record = self.read_record(&sandbox.name)?;
        let log_path = self.root.join("logs").join(format!("{}.log", sandbox.name));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| LaunchError::Failed(format!("{}: {e}", log_path.display())))?;
        let mut command = tokio::process::Command::new(&self.runner.program);
        command
            .args(&self.runner.args)
            .env_clear()
            .envs(allowed_env())
            .env("HOME", &record.workspace)
            .envs(record.env.iter().cloned())
            .env("MANGO_WORKSPACE", &record.workspace)
            .current_dir(&record.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(
                log.try_clone()
                    .map_err(|e| LaunchError::Failed(e.to_string()))?,
            ))
            .stderr(Stdio::from(log))
            .kill_on_drop(false);
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe work is sound: one system call through
        // rustix (no allocation, no lock, no libc state).
        unsafe {
            // A session of its own, hence its own process group: removal
            // reaches everything it started there, and nothing meant for the
            // supervisor (Ctrl-C in its terminal, a hang-up, a signal to its
            // group) reaches the runner.
            command.pre_exec(|| {
                rustix::process::setsid()?;
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|e| {
            LaunchError::Failed(format!("starting {}: {e}", self.runner.program.display()))
        })?;
        let started = Instant::now();
        let pid = child.id().map(|p| p as i32);
        record.pid = pid;
        self.write_record(&sandbox.name, &record, false)?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let wrote = async {
            stdin.write_all(secret.expose().as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.shutdown().await
        }
        .await;
        drop(stdin);
        drop(secret);
        let delivered = Instant::now();
        let (tx, rx) = watch::channel(None);
        self.exits
            .lock()
            .expect("exits lock")
            .insert(sandbox.name.clone(), rx);
        tokio::spawn(async move {
            let code = match child.wait().await {
                Ok(status) => status.code().map_or(-1, i64::from),
                Err(_) => -1,
            };
            let _ = tx.send(Some(code));
        });
        wrote.map_err(|e| LaunchError::Failed(format!("writing the secret to the runner: {e}")))?;
        Ok(HandOff { started, delivered })
    }

    async fn wait(&self, sandbox: &Sandbox) -> Result<SandboxExit, LaunchError> {
        let exit = self
            .exits
            .lock()
            .expect("exits lock")
            .get(&sandbox.name)
            .cloned();
        if let Some(mut exit) = exit {
            let code = exit
                .wait_for(Option::is_some)
                .await
                .map(|c| c.unwrap_or(-1))
                .unwrap_or(-1);
            return Ok(SandboxExit::Exited(code));
        }
        // Adopted: not this process's child, so its status is not ours to read.
        let record = self.read_record(&sandbox.name)?;
        let Some(pid) = record.pid else {
            return Ok(SandboxExit::Gone);
        };
        while self.is_runner(pid) {
            tokio::time::sleep(ADOPTED_POLL).await;
        }
        Ok(SandboxExit::Gone)
    }

    /// SIGTERM to the runner's process only (not its group: the runner ends
    /// its own tools first, then flushes).
    async fn signal_stop(&self, sandbox: &Sandbox, _grace: Duration) -> Result<(), LaunchError> {
        let record = match self.read_record(&sandbox.name) {
            Ok(record) => record,
            Err(LaunchError::NotFound(_)) => return Ok(()),
            Err(err) => return Err(err),
        };
        let Some(pid) = record.pid.filter(|pid| self.is_runner(*pid)) else {
            return Ok(());
        };
        match Pid::from_raw(pid).map(|p| kill_process(p, Signal::TERM)) {
            Some(Ok(())) | Some(Err(rustix::io::Errno::SRCH)) | None => Ok(()),
            Some(Err(e)) => Err(LaunchError::Unavailable {
                engine: ENGINE,
                message: format!("signalling runner {pid}: {e}"),
            }),
        }
    }

    async fn remove(&self, sandbox: &Sandbox) -> Result<(), LaunchError> {
        let record = match self.read_record(&sandbox.name) {
            Ok(record) => record,
            Err(LaunchError::NotFound(_)) => return Ok(()),
            Err(err) => return Err(err),
        };
        if let Some(pid) = record.pid.filter(|pid| self.is_runner(*pid)) {
            if let Some(group) = Pid::from_raw(pid) {
                match kill_process_group(group, Signal::KILL) {
                    Ok(()) | Err(rustix::io::Errno::SRCH) => {}
                    Err(e) => {
                        return Err(LaunchError::Unavailable {
                            engine: ENGINE,
                            message: format!("killing runner {pid}: {e}"),
                        })
                    }
                }
            }
            // Ours: wait until it is reaped; adopted: until it is gone.
            let exit = self
                .exits
                .lock()
                .expect("exits lock")
                .get(&sandbox.name)
                .cloned();
            match exit {
                Some(mut exit) => {
                    let _ = exit.wait_for(Option::is_some).await;
                }
                None => {
                    while self.is_runner(pid) {
                        tokio::time::sleep(ADOPTED_POLL).await;
                    }
                }
            }
        }
        self.exits.lock().expect("exits lock").remove(&sandbox.name);
        if record.ephemeral {
            remove_dir(&record.workspace)?;
        }
        match std::fs::remove_file(self.record_path(&sandbox.name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LaunchError::Failed(format!("{}: {e}", sandbox.name))),
        }
    }

    /// Every Session folder under `<root>/sessions` (a root serves one
    /// Environment).
    async fn workspaces(&self, _environment_id: &str) -> Result<Vec<String>, LaunchError> {
        let dir = self.root.join("sessions");
        let entries = std::fs::read_dir(&dir).map_err(|e| LaunchError::Unavailable {
            engine: ENGINE,
            message: format!("{}: {e}", dir.display()),
        })?;
        Ok(entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        remove_dir(&self.root.join("sessions").join(session_id))
    }
}

/// `program` with its folder made absolute and resolved (`..`, symlinks),
/// its own name kept: a symlink to the binary stays the name runners are
/// started and recognised by, across an upgrade that moves the link.
fn absolute_program(program: &Path) -> PathBuf {
    let (Some(folder), Some(name)) = (program.parent(), program.file_name()) else {
        return program.to_path_buf();
    };
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    match std::fs::canonicalize(folder) {
        Ok(folder) => folder.join(name),
        // Missing: `new` says so, by the name it was given.
        Err(_) => program.to_path_buf(),
    }
}

fn remove_dir(dir: &Path) -> Result<(), LaunchError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LaunchError::Workspace(format!(
            "removing {}: {e}",
            dir.display()
        ))),
    }
}

/// What of the supervisor's own environment a runner may see: never a
/// credential, never a `MANGO_*` setting of the supervisor.
fn allowed_env() -> Vec<(String, String)> {
    ["PATH", "LANG", "LC_ALL", "TZ"]
        .into_iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `path` (absolute) as a path relative to the current directory.
    fn relative(path: &Path) -> PathBuf {
        let cwd = std::env::current_dir().unwrap();
        let mut rel = PathBuf::new();
        for _ in 1..cwd.components().count() {
            rel.push("..");
        }
        rel.join(path.strip_prefix("/").unwrap())
    }

    #[test]
    fn relative_paths_are_taken_from_the_starting_directory_once() {
        let dir = tempfile::tempdir().unwrap();
        let dir_path = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(dir_path.join("bin")).unwrap();
        std::fs::write(dir_path.join("bin/runner"), "").unwrap();
        std::os::unix::fs::symlink("runner", dir_path.join("bin/link")).unwrap();
        let launcher = LocalLauncher::new(
            RunnerCommand::new(relative(&dir_path.join("bin/link"))),
            relative(&dir_path.join("root")),
            "default",
        )
        .unwrap();
        assert_eq!(launcher.root(), dir_path.join("root"));
        assert!(launcher.root().join("sandboxes").is_dir());
        // The link's own name, in an absolute folder with no `..`.
        assert_eq!(launcher.runner.program, dir_path.join("bin/link"));
        let mut cmdline = dir_path
            .join("bin/link")
            .into_os_string()
            .into_encoded_bytes();
        cmdline.push(0);
        assert_eq!(launcher.runner_cmdline, cmdline);
    }

    #[test]
    fn a_missing_runner_is_named_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let err = LocalLauncher::new(
            RunnerCommand::new("no/such/mango-runner".into()),
            dir.path().join("root"),
            "default",
        )
        .err()
        .expect("refused");
        assert!(
            err.to_string()
                .contains("no/such/mango-runner does not exist"),
            "{err}"
        );
    }
}
