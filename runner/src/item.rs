//! One acknowledged Work item in its sandbox (spec §8): identity from the
//! environment, the Work secret once on stdin, the first heartbeat before
//! any tool runs, then the Session's tools or the healthcheck probe, and a
//! final Stop, Result or Fail. SIGTERM or SIGINT ([`crate::signal`]) ends
//! the item as a graceful Stop does, within the supervisor's grace.

use crate::exit::Exit;
use crate::heartbeat::{HeartbeatKeeper, KeeperEnd};
use crate::memory::{self, Mounted, END_BOUND, SIGNAL_FLUSH_BOUND};
use crate::prepare::{self, PrepareError};
use crate::tools::{ToolContext, Toolset};
use crate::{envelope, healthcheck, kept, secret, session, signal, skills, threads};
use anyhow::Context;
use mango_client::Client;
use mango_protocol::envelope::EnvelopeError;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Run one acknowledged Work item; the Work secret is read from stdin.
#[derive(Debug, Clone, clap::Args)]
pub struct Identity {
    #[arg(long, env = "MANGO_BASE_URL")]
    pub base_url: String,
    #[arg(long, env = "MANGO_WORK_ID", required_unless_present = "wait")]
    pub work_id: Option<String>,
    #[arg(long, env = "MANGO_ENVIRONMENT_ID", required_unless_present = "wait")]
    pub environment_id: Option<String>,
    /// `session` or `healthcheck`.
    #[arg(long, env = "MANGO_WORK_TYPE", required_unless_present = "wait")]
    pub work_type: Option<String>,
    #[arg(long, env = "MANGO_SESSION_ID")]
    pub session_id: Option<String>,
    /// Start before the Work is known (a warm sandbox, spec §7.1): the
    /// identity and the secret arrive together as one envelope line on
    /// stdin; the identity options and variables above are not read.
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up after this long with no envelope (exit 10).
    /// Without it the runner waits until its stdin closes.
    #[arg(long, requires = "wait")]
    pub wait_timeout_seconds: Option<u64>,
    /// With `--wait`: after a Session activation that ended idle, stay up
    /// to this long for the same Session's next envelope (spec §7.1 kept
    /// sandboxes). 0: exit after one activation.
    #[arg(
        long,
        env = "MANGO_KEEP_IDLE_SECONDS",
        default_value_t = 0,
        requires = "wait"
    )]
    pub keep_idle_seconds: u64,
    /// The directory emptied between kept activations. Hidden: a sandbox's
    /// is `/tmp`; outside one (tests) nothing is emptied unless it is given.
    #[arg(long, env = "MANGO_KEPT_TMP_DIR", hide = true)]
    pub kept_tmp_dir: Option<PathBuf>,
    /// The workspace; a relative path is taken from the directory the
    /// runner starts in.
    #[arg(long, env = "MANGO_WORKSPACE", default_value = "/workspace")]
    pub workspace: PathBuf,
    /// How long to wait for the secret on stdin (not in waiting mode).
    #[arg(long, default_value_t = 30)]
    pub secret_timeout_seconds: u64,
    /// How long to stay after an end-of-turn idle before exiting (spec §8:
    /// 60 s). Hidden: only tests shorten it.
    #[arg(
        long,
        env = "MANGO_IDLE_AFTER_END_TURN_SECONDS",
        default_value_t = session::IDLE_AFTER_END_TURN.as_secs(),
        hide = true
    )]
    pub idle_after_end_turn_seconds: u64,
    /// The least time between Memory Store syncs after tool calls (spec §9:
    /// 15 s). Hidden: only tests shorten it.
    #[arg(
        long,
        env = "MANGO_MEMORY_SYNC_INTERVAL_SECONDS",
        default_value_t = memory::SYNC_INTERVAL.as_secs(),
        hide = true
    )]
    pub memory_sync_interval_seconds: u64,
}

impl Identity {
    /// The path settings made absolute, from the directory the runner
    /// starts in, once: the shell's directory, the file tools' roots, the
    /// Skills and the probe all see the one workspace, wherever a later
    /// step runs. So is the `HOME` the tools get (a relative one would
    /// move with every `cd`). Call it before any thread exists.
    pub fn with_absolute_paths(mut self) -> std::io::Result<Identity> {
        self.workspace = std::path::absolute(&self.workspace)?;
        if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            let home = PathBuf::from(home);
            if home.is_relative() {
                // Sound: the process has one thread yet (see above).
                std::env::set_var("HOME", std::path::absolute(&home)?);
            }
        }
        Ok(self)
    }
}

/// Runs the item `identity` names and exits: the whole process of
/// `mango-runner` (and of `mango-worker item`). The process becomes
/// non-dumpable first, before the secret exists in it.
pub fn run(identity: Identity) -> ExitCode {
    if let Err(err) = secret::become_non_dumpable() {
        eprintln!("mango-runner: cannot make the process non-dumpable: {err}");
        return Exit::Unprotected.into();
    }
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("MANGO_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // Before any thread exists, and before anything reads them.
    let identity = match identity.with_absolute_paths() {
        Ok(identity) => identity,
        Err(err) => {
            tracing::error!(error = %err, "cannot make the runner's paths absolute");
            return Exit::Failed.into();
        }
    };
    let runtime = match threads::runtime() {
        Ok(runtime) => runtime,
        Err(err) => {
            // Before the secret: the lease expires and the item is reclaimed.
            tracing::error!(error = %err, "cannot make the runner's threads");
            return Exit::Failed.into();
        }
    };
    let exit = match runtime.block_on(run_item(identity)) {
        Ok(exit) => exit,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "item runner failed");
            Exit::Failed
        }
    };
    // A blocking read of stdin abandoned (a stop signal before the secret
    // came) must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(500));
    tracing::info!(exit = exit.as_str(), code = exit as u8, "runner exiting");
    exit.into()
}

/// After a stop signal the final Stop gets this long (the client's retries
/// included), so the exit stays inside [`signal::EXIT_BOUND`].
const SIGNAL_STOP_BOUND: Duration = Duration::from_secs(3);

/// The runner's own forced Stop of its Work; bounded after a stop signal.
/// `idle`: the Session's activation ended idle, which the api records as a
/// keepable end (spec §7.1).
async fn final_stop(client: &Client, id: &Activation, signalled: bool, idle: bool) -> bool {
    let stop = async {
        if idle {
            client.stop_idle(&id.environment_id, &id.work_id).await
        } else {
            client.stop(&id.environment_id, &id.work_id, true).await
        }
    };
    let stopped = if signalled {
        match tokio::time::timeout(SIGNAL_STOP_BOUND, stop).await {
            Ok(stopped) => stopped.map(|_| ()).map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {SIGNAL_STOP_BOUND:?}")),
        }
    } else {
        stop.await.map(|_| ()).map_err(|e| e.to_string())
    };
    match stopped {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(work_id = %id.work_id, error = %err, "final stop failed");
            false
        }
    }
}

/// Before any tool runs: the snapshot's pinned inputs checked, its Skills
/// materialized under `skills/` of the workspace, and its Memory Stores
/// downloaded to their mount paths.
async fn prepare_inputs(
    client: &Client,
    session_id: &str,
    workspace: &std::path::Path,
    sync_interval: Duration,
) -> Result<(Option<skills::SkillsTree>, Mounted), PrepareError> {
    let session = prepare::check_pinned_inputs(client, session_id).await?;
    let skills =
        skills::materialize(client, &session, workspace, skills::Limits::default()).await?;
    // The Memory Stores from the same snapshot: one fetch, one view of the resources.
    match Mounted::download(client, &session, workspace, sync_interval).await {
        Ok(mounted) => Ok((skills, mounted)),
        Err(err) => {
            if let Some(tree) = skills {
                tree.remove().await;
            }
            Err(err)
        }
    }
}

/// The Work an activation runs, from the environment or an envelope.
struct Activation {
    work_id: String,
    environment_id: String,
    session_id: Option<String>,
}

/// The cold start's identity (options or environment) and its secret on
/// stdin; the Work type is checked before the secret is read.
async fn from_environment(
    id: &Identity,
    signalled: &CancellationToken,
) -> anyhow::Result<Result<(Activation, String), Exit>> {
    let (Some(work_id), Some(environment_id), Some(work_type)) =
        (&id.work_id, &id.environment_id, &id.work_type)
    else {
        anyhow::bail!("MANGO_WORK_ID, MANGO_ENVIRONMENT_ID and MANGO_WORK_TYPE are required");
    };
    let session_id = match (work_type.as_str(), id.session_id.clone()) {
        ("healthcheck", _) => None,
        ("session", Some(session)) => Some(session),
        ("session", None) => anyhow::bail!("MANGO_SESSION_ID is required for session Work"),
        // Left untouched before claiming its lease, so it expires and Poll
        // hands the item to a worker that can run it.
        (other, _) => {
            tracing::error!(work_id = %work_id, work_type = %other, "unknown Work type; leaving it to be reclaimed");
            return Ok(Err(Exit::UnknownWorkType));
        }
    };
    let raw = tokio::select! {
        raw = secret::read_stdin(Duration::from_secs(id.secret_timeout_seconds)) => {
            raw.context("reading the Work secret")?
        }
        _ = signalled.cancelled() => {
            tracing::info!(work_id = %work_id, "asked to stop before the secret came");
            return Ok(Err(Exit::Signalled));
        }
    };
    let item = Activation {
        work_id: work_id.clone(),
        environment_id: environment_id.clone(),
        session_id,
    };
    Ok(Ok((item, raw)))
}

/// Waiting mode: nothing is known and nothing is contacted until one
/// envelope parses; each way of not getting one has its own exit.
async fn from_envelope(
    wait_timeout_seconds: Option<u64>,
    signalled: &CancellationToken,
) -> Result<(Activation, String), Exit> {
    tracing::info!("waiting for an activation envelope on stdin");
    let reading = tokio::task::spawn_blocking(envelope::read_stdin);
    let timeout = async {
        match wait_timeout_seconds {
            Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
            None => std::future::pending().await,
        }
    };
    let read = tokio::select! {
        read = reading => read,
        _ = timeout => {
            tracing::info!("no envelope within the wait timeout");
            return Err(Exit::WaitTimedOut);
        }
        _ = signalled.cancelled() => {
            tracing::info!("asked to stop before an envelope came");
            return Err(Exit::Signalled);
        }
    };
    let envelope = match read {
        Ok(Ok(envelope)) => envelope,
        Ok(Err(envelope::ReadError::Envelope(EnvelopeError::Empty))) => {
            tracing::info!("stdin closed before an envelope: recycled");
            return Err(Exit::Recycled);
        }
        Ok(Err(err)) => {
            tracing::error!(error = %err, "refusing the activation envelope");
            return Err(Exit::EnvelopeRefused);
        }
        Err(join) => {
            tracing::error!(error = %join, "the envelope reader failed");
            return Err(Exit::EnvelopeRefused);
        }
    };
    tracing::info!(work_id = %envelope.work_id, claim = envelope.claim, "activation envelope accepted");
    let item = Activation {
        work_id: envelope.work_id,
        environment_id: envelope.environment_id,
        session_id: envelope.session_id,
    };
    Ok((item, envelope.secret))
}

async fn run_item(id: Identity) -> anyhow::Result<Exit> {
    // From the start: as PID 1 of a container the runner would ignore them.
    let signalled = signal::listen();
    let started = if id.wait {
        from_envelope(id.wait_timeout_seconds, &signalled).await
    } else {
        from_environment(&id, &signalled).await?
    };
    let (mut item, mut raw) = match started {
        Ok(started) => started,
        Err(exit) => return Ok(exit),
    };
    let keep = id.wait && id.keep_idle_seconds > 0;
    // In a sandbox PID 1 reaps orphans and the sweep ends every process;
    // elsewhere the runner adopts its tools' orphans to find them. Not in a
    // sandbox too: orphans that exit would wait as the runner's zombies,
    // against the pids limit, until the next sweep.
    if keep && !crate::init::forked_by_init() {
        kept::become_subreaper()?;
    }
    loop {
        let mut idle_stopped = false;
        let exit = run_activation(&id, &signalled, &item, raw, &mut idle_stopped).await?;
        let Some(session_id) = item.session_id.clone().filter(|_| keep && idle_stopped) else {
            return Ok(exit);
        };
        tracing::info!(session_id = %session_id, seconds = id.keep_idle_seconds, "activation ended idle; kept for Session {session_id} up to {} s", id.keep_idle_seconds);
        between_activations(&id)?;
        let (next, next_raw) = match from_envelope(Some(id.keep_idle_seconds), &signalled).await {
            Ok(next) => next,
            Err(Exit::WaitTimedOut) => {
                tracing::info!(session_id = %session_id, "no next envelope while kept");
                return Ok(Exit::KeptExpired);
            }
            Err(exit) => return Ok(exit),
        };
        if next.session_id.as_deref() != Some(session_id.as_str())
            || next.environment_id != item.environment_id
        {
            drop(next_raw);
            tracing::error!(work_id = %next.work_id, "kept for Session {session_id}: refusing an envelope for another Session, Work type or Environment");
            return Ok(Exit::ForeignEnvelope);
        }
        tracing::info!(work_id = %next.work_id, "kept: next envelope for Work {}", next.work_id);
        (item, raw) = (next, next_raw);
    }
}

/// Between kept activations: no tool process, no `/tmp` file of the last
/// one. Its secret, client, shell, Skills and Memory Stores went with
/// [`run_activation`]'s scope.
fn between_activations(id: &Identity) -> anyhow::Result<()> {
    let in_sandbox = crate::init::forked_by_init();
    kept::kill_tool_processes(in_sandbox)?;
    let tmp = match (&id.kept_tmp_dir, in_sandbox) {
        (Some(dir), _) => Some(dir.clone()),
        (None, true) => Some(PathBuf::from("/tmp")),
        (None, false) => None,
    };
    if let Some(tmp) = tmp {
        kept::empty_dir(&tmp)?;
    }
    Ok(())
}

/// One activation: its secret is consumed and dropped here.
/// `idle_stopped`: a Session activation ended idle and its idle Stop was accepted.
async fn run_activation(
    id: &Identity,
    signalled: &CancellationToken,
    item: &Activation,
    raw: String,
    idle_stopped: &mut bool,
) -> anyhow::Result<Exit> {
    let signalled = signalled.clone();
    let session_id = item.session_id.clone();
    let token = secret::sessions_token(&raw).context("decoding the Work secret")?;
    secret::zero(raw);
    let client = Client::new(&id.base_url, &token);
    secret::zero(token);
    let keeper = HeartbeatKeeper {
        client: client.clone(),
        environment_id: item.environment_id.clone(),
        work_id: item.work_id.clone(),
    };

    let claimed = tokio::select! {
        claimed = keeper.claim() => claimed,
        _ = signalled.cancelled() => {
            tracing::info!(work_id = %item.work_id, "asked to stop before the lease was claimed; leaving it to expire");
            return Ok(Exit::Signalled);
        }
    };
    let first = match claimed {
        Ok(beat) => beat,
        Err(end) => {
            tracing::warn!(work_id = %item.work_id, end = ?end, "could not claim the lease");
            return Ok(Exit::LeftToExpire);
        }
    };
    tracing::info!(work_id = %item.work_id, ttl_seconds = first.ttl_seconds, "lease claimed");
    let (done, lost) = (CancellationToken::new(), CancellationToken::new());
    // Work ends when the lease does, or at a stop signal: no call is taken
    // after it and the running one is cancelled, as for a Stop.
    let halt = lost.child_token();
    tokio::spawn({
        let (signalled, halt) = (signalled.clone(), halt.clone());
        async move {
            signalled.cancelled().await;
            halt.cancel();
        }
    });
    let kept = keeper.keep(first, done.clone(), lost.clone(), signalled.clone());
    if let Some(session_id) = session_id {
        let mut toolset = Toolset::new(ToolContext::new(&id.workspace));
        let mut memory = Mounted::none();
        let sync_interval = Duration::from_secs(id.memory_sync_interval_seconds);
        let work = async {
            let prepared = tokio::select! {
                prepared = prepare_inputs(&client, &session_id, &id.workspace, sync_interval) => Some(prepared),
                _ = halt.cancelled() => None,
            };
            let end = match prepared {
                None => session::SessionEnd::LeaseEnded,
                Some(Err(PrepareError::Permanent(why))) => session::SessionEnd::InvalidInput(why),
                Some(Err(PrepareError::Transient(why))) => {
                    session::SessionEnd::PreparationUnavailable(why)
                }
                Some(Err(PrepareError::Rejected(why))) => session::SessionEnd::Rejected(why),
                Some(Ok((skills, mounted))) => {
                    memory = mounted;
                    // The file tools reach the stores' roots; read-only ones refuse writes.
                    toolset = Toolset::new(ToolContext {
                        allowed_roots: memory.roots(),
                        read_only_roots: memory.read_only_roots(),
                        ..ToolContext::new(&id.workspace)
                    });
                    let end = session::run(
                        &client,
                        &session_id,
                        &mut toolset,
                        Duration::from_secs(id.idle_after_end_turn_seconds),
                        &halt,
                        &mut memory,
                    )
                    .await;
                    if let Some(tree) = skills {
                        tree.remove().await;
                    }
                    end
                }
            };
            // The shell first, so nothing writes while the last syncs read.
            toolset.shutdown().await;
            // After a stop signal the flush must fit inside the supervisor's grace.
            let bound = if signalled.is_cancelled() {
                SIGNAL_FLUSH_BOUND
            } else {
                END_BOUND
            };
            memory.end_within(end.is_clean(), bound).await;
            done.cancel();
            end
        };
        let (lease_end, session_end) = tokio::join!(kept, work);
        use session::SessionEnd;
        // Ended by the stop signal (not by something that came before it).
        let by_signal = signalled.is_cancelled() && session_end == SessionEnd::LeaseEnded;
        tracing::info!(work_id = %item.work_id, session_end = ?session_end, lease_end = ?lease_end, by_signal, "session work ended");
        if let SessionEnd::InvalidInput(why) = &session_end {
            let why = prepare::fail_message(why);
            // Fail stops the Work and terminates the Session in one step.
            return Ok(
                match client.fail(&item.environment_id, &item.work_id, &why).await {
                    Ok(_) => {
                        tracing::error!(work_id = %item.work_id, reason = %why, "the Session's input is invalid; the Work was failed");
                        Exit::InputFailed
                    }
                    Err(err) => {
                        // Not recorded: the lease expires and the next holder finds the same.
                        tracing::error!(work_id = %item.work_id, reason = %why, error = %err, "could not fail the Work");
                        Exit::Unreported
                    }
                },
            );
        }
        // Ordinary exits force-Stop; a lost or unreachable lease, an
        // undelivered result or an unavailable input is left to expire, and
        // so is an item a signal ended with no Stop asked for (the sandbox
        // shut down from outside): Poll hands it out again.
        let leave_to_expire = matches!(
            session_end,
            SessionEnd::ResultUndelivered(_) | SessionEnd::PreparationUnavailable(_)
        ) || (by_signal && lease_end == KeeperEnd::Interrupted);
        if lease_end.may_stop() && !leave_to_expire {
            let idle = session_end == SessionEnd::IdleAfterTurn && !signalled.is_cancelled();
            let accepted = final_stop(&client, item, signalled.is_cancelled(), idle).await;
            *idle_stopped = idle && accepted;
        }
        if by_signal {
            return Ok(Exit::Signalled);
        }
        return Ok(match session_end {
            SessionEnd::Rejected(_)
            | SessionEnd::ResultUndelivered(_)
            | SessionEnd::PreparationUnavailable(_) => Exit::LeftToExpire,
            _ => Exit::Done,
        });
    }
    let probe = async {
        let outcome = tokio::select! {
            outcome = healthcheck::probe(&id.workspace) => Some(outcome),
            _ = halt.cancelled() => None,
        };
        done.cancel();
        outcome
    };
    let (end, outcome) = tokio::join!(kept, probe);
    let Some(outcome) = outcome else {
        if signalled.is_cancelled() {
            // A Stop asked for is honoured; otherwise the check is reclaimed.
            if end == KeeperEnd::StopRequested {
                final_stop(&client, item, true, false).await;
            }
            tracing::info!(work_id = %item.work_id, end = ?end, "stop signal before the probe finished");
            return Ok(Exit::Signalled);
        }
        tracing::warn!(work_id = %item.work_id, end = ?end, "lease ended before the probe finished");
        return Ok(Exit::LeftToExpire);
    };
    let (succeeded, message) = match outcome {
        Ok(()) => (true, healthcheck::PASSED.to_string()),
        Err(reason) => (false, reason),
    };
    // The Result stores the outcome and stops the Work in one step.
    match client
        .result(&item.environment_id, &item.work_id, succeeded, &message)
        .await
    {
        Ok(_) => {
            tracing::info!(work_id = %item.work_id, succeeded, message = %message, "healthcheck reported");
            Ok(if succeeded { Exit::Done } else { Exit::Failed })
        }
        Err(err) => {
            tracing::error!(work_id = %item.work_id, error = %err, "could not report the healthcheck result");
            if end.may_stop() {
                let _ = client.stop(&item.environment_id, &item.work_id, true).await;
            }
            Ok(Exit::Unreported)
        }
    }
}
