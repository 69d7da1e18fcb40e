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
use crate::waiting::{self, WaitArgs};
use crate::{healthcheck, secret, session, signal, skills, threads};
use anyhow::Context;
use mango_client::Client;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Run one acknowledged Work item; the Work secret is read from stdin.
#[derive(Debug, Clone, clap::Args)]
pub struct Identity {
    #[arg(long, env = "MANGO_BASE_URL")]
    pub base_url: String,
    #[arg(long, env = "MANGO_WORK_ID")]
    pub work_id: String,
    #[arg(long, env = "MANGO_ENVIRONMENT_ID")]
    pub environment_id: String,
    /// `session` or `healthcheck`.
    #[arg(long, env = "MANGO_WORK_TYPE")]
    pub work_type: String,
    #[arg(long, env = "MANGO_SESSION_ID")]
    pub session_id: Option<String>,
    /// The workspace; a relative path is taken from the directory the
    /// runner starts in.
    #[arg(long, env = "MANGO_WORKSPACE", default_value = "/workspace")]
    pub workspace: PathBuf,
    /// How long to wait for the secret on stdin.
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

/// Where the item's identity and secret come from.
enum Start {
    /// The identity from the environment, the secret alone on stdin.
    Given(Identity),
    /// Nothing yet: one envelope on stdin names the item ([`waiting`]).
    Waiting(WaitArgs),
}

/// Runs the item `identity` names and exits: the whole process of
/// `mango-runner` (and of `mango-worker item`). The process becomes
/// non-dumpable first, before the secret exists in it.
pub fn run(identity: Identity) -> ExitCode {
    run_from(Start::Given(identity))
}

/// `mango-runner --wait`: waits for the envelope, then runs its item as
/// [`run`] does.
pub fn run_waiting(args: WaitArgs) -> ExitCode {
    run_from(Start::Waiting(args))
}

fn run_from(start: Start) -> ExitCode {
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
    let start = match start {
        Start::Given(identity) => identity.with_absolute_paths().map(Start::Given),
        Start::Waiting(mut args) => std::path::absolute(&args.workspace).map(|workspace| {
            args.workspace = workspace;
            Start::Waiting(args)
        }),
    };
    let start = match start {
        Ok(start) => start,
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
    let exit = match runtime.block_on(run_start(start)) {
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

async fn run_start(start: Start) -> anyhow::Result<Exit> {
    // From the start: as PID 1 of a container the runner would ignore them.
    let signalled = signal::listen();
    match start {
        Start::Given(identity) => run_item(identity, None, signalled).await,
        Start::Waiting(args) => {
            tracing::info!("waiting for an envelope");
            let reading =
                tokio::task::spawn_blocking(|| waiting::read_envelope(std::io::stdin().lock()));
            let read = tokio::select! {
                read = reading => read,
                _ = signalled.cancelled() => {
                    tracing::info!("asked to stop while waiting for an envelope");
                    return Ok(Exit::Signalled);
                }
            };
            let envelope = match read {
                Ok(Ok(envelope)) => envelope,
                Ok(Err(err)) => {
                    tracing::error!(error = %err, "no usable envelope; this sandbox is to be recycled");
                    return Ok(Exit::BadEnvelope);
                }
                Err(join) => anyhow::bail!("reading the envelope: {join}"),
            };
            let identity = args.identity(&envelope);
            tracing::info!(work_id = %identity.work_id, claim = envelope.claim, "envelope received");
            run_item(identity, Some(envelope.secret), signalled).await
        }
    }
}

/// After a stop signal the final Stop gets this long (the client's retries
/// included), so the exit stays inside [`signal::EXIT_BOUND`].
const SIGNAL_STOP_BOUND: Duration = Duration::from_secs(3);

/// The runner's own forced Stop of its Work; bounded after a stop signal.
async fn final_stop(client: &Client, id: &Identity, signalled: bool) {
    let stop = client.stop(&id.environment_id, &id.work_id, true);
    let stopped = if signalled {
        match tokio::time::timeout(SIGNAL_STOP_BOUND, stop).await {
            Ok(stopped) => stopped.map(|_| ()).map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {SIGNAL_STOP_BOUND:?}")),
        }
    } else {
        stop.await.map(|_| ()).map_err(|e| e.to_string())
    };
    if let Err(err) = stopped {
        tracing::warn!(work_id = %id.work_id, error = %err, "final stop failed");
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

/// One item; `given` is its secret when an envelope brought it, otherwise
/// it is read alone from stdin.
async fn run_item(
    id: Identity,
    given: Option<String>,
    signalled: CancellationToken,
) -> anyhow::Result<Exit> {
    let session_id = match (id.work_type.as_str(), id.session_id.clone()) {
        ("healthcheck", _) => None,
        ("session", Some(session)) => Some(session),
        ("session", None) => anyhow::bail!("MANGO_SESSION_ID is required for session Work"),
        // Left untouched before claiming its lease, so it expires and Poll
        // hands the item to a worker that can run it.
        (other, _) => {
            tracing::error!(work_id = %id.work_id, work_type = %other, "unknown Work type; leaving it to be reclaimed");
            return Ok(Exit::UnknownWorkType);
        }
    };
    let raw = match given {
        Some(raw) => raw,
        None => tokio::select! {
            raw = secret::read_stdin(Duration::from_secs(id.secret_timeout_seconds)) => {
                raw.context("reading the Work secret")?
            }
            _ = signalled.cancelled() => {
                tracing::info!(work_id = %id.work_id, "asked to stop before the secret came");
                return Ok(Exit::Signalled);
            }
        },
    };
    let token = secret::sessions_token(&raw).context("decoding the Work secret")?;
    drop(raw);
    let client = Client::new(&id.base_url, &token);
    drop(token);
    let keeper = HeartbeatKeeper {
        client: client.clone(),
        environment_id: id.environment_id.clone(),
        work_id: id.work_id.clone(),
    };

    let claimed = tokio::select! {
        claimed = keeper.claim() => claimed,
        _ = signalled.cancelled() => {
            tracing::info!(work_id = %id.work_id, "asked to stop before the lease was claimed; leaving it to expire");
            return Ok(Exit::Signalled);
        }
    };
    let first = match claimed {
        Ok(beat) => beat,
        Err(end) => {
            tracing::warn!(work_id = %id.work_id, end = ?end, "could not claim the lease");
            return Ok(Exit::LeftToExpire);
        }
    };
    tracing::info!(work_id = %id.work_id, ttl_seconds = first.ttl_seconds, "lease claimed");
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
        tracing::info!(work_id = %id.work_id, session_end = ?session_end, lease_end = ?lease_end, by_signal, "session work ended");
        if let SessionEnd::InvalidInput(why) = &session_end {
            let why = prepare::fail_message(why);
            // Fail stops the Work and terminates the Session in one step.
            return Ok(
                match client.fail(&id.environment_id, &id.work_id, &why).await {
                    Ok(_) => {
                        tracing::error!(work_id = %id.work_id, reason = %why, "the Session's input is invalid; the Work was failed");
                        Exit::InputFailed
                    }
                    Err(err) => {
                        // Not recorded: the lease expires and the next holder finds the same.
                        tracing::error!(work_id = %id.work_id, reason = %why, error = %err, "could not fail the Work");
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
            final_stop(&client, &id, signalled.is_cancelled()).await;
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
                final_stop(&client, &id, true).await;
            }
            tracing::info!(work_id = %id.work_id, end = ?end, "stop signal before the probe finished");
            return Ok(Exit::Signalled);
        }
        tracing::warn!(work_id = %id.work_id, end = ?end, "lease ended before the probe finished");
        return Ok(Exit::LeftToExpire);
    };
    let (succeeded, message) = match outcome {
        Ok(()) => (true, healthcheck::PASSED.to_string()),
        Err(reason) => (false, reason),
    };
    // The Result stores the outcome and stops the Work in one step.
    match client
        .result(&id.environment_id, &id.work_id, succeeded, &message)
        .await
    {
        Ok(_) => {
            tracing::info!(work_id = %id.work_id, succeeded, message = %message, "healthcheck reported");
            Ok(if succeeded { Exit::Done } else { Exit::Failed })
        }
        Err(err) => {
            tracing::error!(work_id = %id.work_id, error = %err, "could not report the healthcheck result");
            if end.may_stop() {
                let _ = client.stop(&id.environment_id, &id.work_id, true).await;
            }
            Ok(Exit::Unreported)
        }
    }
}
