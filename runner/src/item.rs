//! One acknowledged Work item in its sandbox (spec §8): identity from the
//! environment, the Work secret once on stdin, the first heartbeat before
//! any tool runs, then the Session's tools or the healthcheck probe, and a
//! final Stop, Result or Fail.

use crate::exit::Exit;
use crate::heartbeat::HeartbeatKeeper;
use crate::memory::{self, Mounted};
use crate::prepare::{self, PrepareError};
use crate::tools::{ToolContext, Toolset};
use crate::{healthcheck, secret, session, skills};
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run_item(identity)) {
        Ok(exit) => exit.into(),
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "item runner failed");
            Exit::Failed.into()
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

async fn run_item(id: Identity) -> anyhow::Result<Exit> {
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
    let raw = secret::read_stdin(Duration::from_secs(id.secret_timeout_seconds))
        .await
        .context("reading the Work secret")?;
    let token = secret::sessions_token(&raw).context("decoding the Work secret")?;
    drop(raw);
    let client = Client::new(&id.base_url, &token);
    drop(token);
    let keeper = HeartbeatKeeper {
        client: client.clone(),
        environment_id: id.environment_id.clone(),
        work_id: id.work_id.clone(),
    };

    let first = match keeper.claim().await {
        Ok(beat) => beat,
        Err(end) => {
            tracing::warn!(work_id = %id.work_id, end = ?end, "could not claim the lease");
            return Ok(Exit::LeftToExpire);
        }
    };
    tracing::info!(work_id = %id.work_id, ttl_seconds = first.ttl_seconds, "lease claimed");
    let (done, lost) = (CancellationToken::new(), CancellationToken::new());
    let kept = keeper.keep(first, done.clone(), lost.clone());
    if let Some(session_id) = session_id {
        let mut toolset = Toolset::new(ToolContext::new(&id.workspace));
        let mut memory = Mounted::none();
        let sync_interval = Duration::from_secs(id.memory_sync_interval_seconds);
        let work = async {
            let prepared = tokio::select! {
                prepared = prepare_inputs(&client, &session_id, &id.workspace, sync_interval) => Some(prepared),
                _ = lost.cancelled() => None,
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
                        &lost,
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
            memory.end(end.is_clean()).await;
            done.cancel();
            end
        };
        let (lease_end, session_end) = tokio::join!(kept, work);
        tracing::info!(work_id = %id.work_id, session_end = ?session_end, lease_end = ?lease_end, "session work ended");
        use session::SessionEnd;
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
        // undelivered result or an unavailable input is left to expire.
        let leave_to_expire = matches!(
            session_end,
            SessionEnd::ResultUndelivered(_) | SessionEnd::PreparationUnavailable(_)
        );
        if lease_end.may_stop() && !leave_to_expire {
            if let Err(err) = client.stop(&id.environment_id, &id.work_id, true).await {
                tracing::warn!(work_id = %id.work_id, error = %err, "final stop failed");
            }
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
            _ = lost.cancelled() => None,
        };
        done.cancel();
        outcome
    };
    let (end, outcome) = tokio::join!(kept, probe);
    let Some(outcome) = outcome else {
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
