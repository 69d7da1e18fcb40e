//! The scenarios, one fault each, injected while the load runs; each ends
//! with the invariants (`invariants.rs`).

use super::cluster::Shutdown;
use super::invariants::{self, Promises, Verdict};
use super::load::{self, Spec};
use super::probe;
use super::system::{Launcher, System};
use super::watch::Watch;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type Fault = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Name {
    /// SIGKILL of one api process mid-load while the other serves.
    ApiKill,
    /// PostgreSQL restarted (fast, then immediate) mid-load.
    PgRestart,
    /// SIGKILL of both supervisors mid-activation, then a restart.
    SupervisorKill,
    /// SIGKILL of both supervisors mid-activation with 2 warm sandboxes.
    SupervisorKillWarm,
    /// SIGTERM of both supervisors mid-activation, then a restart: nothing interrupted.
    SupervisorTerm,
    /// SIGTERM of both supervisors mid-activation with 2 warm sandboxes.
    SupervisorTermWarm,
    /// The supervisors' Environment key revoked under load, then replaced.
    KeyRevoked,
    /// A runner's container cut off its network past its TTL, then healed.
    NetworkCut,
    /// The model endpoint stalls, answers 500 and drops the connection mid-body.
    ModelFaults,
    /// A forced Stop racing a Result, and racing a reclaim.
    StopRaces,
    /// A tool fills its Session's workspace, and one fills `/tmp`.
    DiskFull,
    /// A tool fills the sandbox's pids limit.
    PidsExhausted,
    /// Memory Stores larger than their mount, from the start and mid-turn.
    MemoryFull,
    /// A heartbeat just before its lease expires, and just after.
    HeartbeatEdge,
    /// SIGKILL of the Docker supervisor while Sessions' kept sandboxes wait.
    SupervisorKillKept,
    /// SIGTERM of the Docker supervisor while Sessions' kept sandboxes wait.
    SupervisorTermKept,
}

impl Name {
    pub fn all() -> Vec<Name> {
        <Name as clap::ValueEnum>::value_variants().to_vec()
    }
    pub fn label(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// What one scenario measured.
pub struct Outcome {
    pub verdict: Verdict,
    pub reclaims: Vec<(String, f64)>,
    pub seconds: f64,
}

pub fn spec(sessions: usize, calls: usize, command: &str) -> Spec {
    Spec {
        sessions,
        calls,
        command: command.to_string(),
        checks: 4,
        within: Duration::from_secs(150),
    }
}

pub async fn run(system: &Arc<System>, name: Name) -> anyhow::Result<Outcome> {
    let s = system.clone();
    match name {
        Name::ApiKill => {
            frame(
                system,
                spec(4, 2, "sleep 2; echo call {n}"),
                Promises::default(),
                Box::pin(async move {
                    until_calls_run(&s).await?;
                    s.end_api(0, libc::SIGKILL).await?;
                    // The window in which only the other process serves.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    s.start_api(0).await
                }),
            )
            .await
        }
        Name::PgRestart => {
            frame(
                system,
                spec(4, 2, "sleep 2; echo call {n}"),
                Promises::default(),
                Box::pin(async move {
                    until_calls_run(&s).await?;
                    s.cluster.restart(Shutdown::Fast).await?;
                    // Let the load take up again before the second restart.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    s.cluster.restart(Shutdown::Immediate).await
                }),
            )
            .await
        }
        Name::SupervisorKill | Name::SupervisorKillWarm => {
            with_warm(system, name == Name::SupervisorKillWarm, async {
                let s = system.clone();
                frame(
                    system,
                    spec(4, 1, "sleep 4; echo call {n}"),
                    Promises::default(),
                    Box::pin(async move { restart_supervisors(&s, libc::SIGKILL).await }),
                )
                .await
            })
            .await
        }
        Name::SupervisorTerm | Name::SupervisorTermWarm => {
            with_warm(system, name == Name::SupervisorTermWarm, async {
                let s = system.clone();
                let promises = Promises {
                    clean_results: true,
                    ..Promises::default()
                };
                frame(
                    system,
                    spec(4, 1, "sleep 4; echo call {n}"),
                    promises,
                    Box::pin(async move { restart_supervisors(&s, libc::SIGTERM).await }),
                )
                .await
            })
            .await
        }
        Name::KeyRevoked => key_revoked(system).await,
        Name::NetworkCut => super::network_cut::run(system).await,
        Name::ModelFaults => super::model_faults::run(system).await,
        Name::StopRaces => super::stop_races::run(system).await,
        Name::DiskFull => super::exhausted::run(system, &super::exhausted::DISK_CASES).await,
        Name::PidsExhausted => super::exhausted::run(system, &super::exhausted::PIDS_CASES).await,
        Name::MemoryFull => super::memory_full::run(system).await,
        Name::HeartbeatEdge => super::clock::run(system).await,
        Name::SupervisorKillKept => super::kept_kills::run(system, libc::SIGKILL).await,
        Name::SupervisorTermKept => super::kept_kills::run(system, libc::SIGTERM).await,
    }
}

/// Waits until a runner runs a call, then ends both supervisors with
/// `signal` and starts them again: a SIGTERM must end each within 5 s
/// (it detaches), leaving its sandboxes to the next one.
async fn restart_supervisors(system: &System, signal: i32) -> anyhow::Result<()> {
    until_calls_run(system).await?;
    for launcher in [Launcher::Docker, Launcher::Local] {
        let started = Instant::now();
        let status = system
            .end_worker(launcher, signal, Duration::from_secs(10))
            .await?;
        if signal == libc::SIGTERM {
            anyhow::ensure!(
                status.success() && started.elapsed() < Duration::from_secs(5),
                "the {launcher:?} supervisor ended {status} {:?} after SIGTERM",
                started.elapsed()
            );
        }
    }
    // Down for a moment, as a restart is.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for launcher in [Launcher::Docker, Launcher::Local] {
        system.start_worker(launcher).await?;
    }
    Ok(())
}

/// Runs `scenario` with the Docker supervisor keeping `2` warm sandboxes
/// (restarted with it before, and without after) when `warm`.
async fn with_warm<F: Future<Output = anyhow::Result<Outcome>>>(
    system: &System,
    warm: bool,
    scenario: F,
) -> anyhow::Result<Outcome> {
    if !warm {
        return scenario.await;
    }
    set_warm(system, 2).await?;
    let outcome = scenario.await;
    set_warm(system, 0).await?;
    outcome
}

async fn set_warm(system: &System, warm: u32) -> anyhow::Result<()> {
    *system.warm.lock().unwrap() = warm;
    system
        .end_worker(Launcher::Docker, libc::SIGTERM, Duration::from_secs(10))
        .await?;
    system.start_worker(Launcher::Docker).await
}

/// The supervisors' key revoked mid-load: they stop polling; running items
/// keep their leases (sessions tokens are not the key); the operator
/// replaces the supervisors with a new key; the old key gets 401.
async fn key_revoked(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let s = system.clone();
    let old_key = system.env_key.lock().unwrap().clone();
    let old_id = system.env_key_id.lock().unwrap().clone();
    let mut outcome = frame(
        system,
        spec(4, 1, "sleep 3; echo call {n}"),
        Promises::default(),
        Box::pin(async move {
            until_calls_run(&s).await?;
            let (key, id) = s.create_key(Some(&s.env_id)).await?;
            s.revoke_key(&old_id).await?;
            for launcher in [Launcher::Docker, Launcher::Local] {
                let name = match launcher {
                    Launcher::Docker => "worker-docker",
                    Launcher::Local => "worker-local",
                };
                let log = s.logs.join(format!("{name}.log"));
                // Logged when its poll is refused, or, when its claims watch
                // met the refusal first and its items ended, as it exits.
                until_logged(
                    &log,
                    &[
                        "refused the Environment key",
                        "no longer accepts MANGO_ENVIRONMENT_KEY",
                    ][..],
                    Duration::from_secs(30),
                )
                .await?;
            }
            // What the operator does: the old supervisors go (as a crash, so
            // their sandboxes stay), new ones start with the new key and adopt them.
            *s.env_key.lock().unwrap() = key;
            *s.env_key_id.lock().unwrap() = id;
            for launcher in [Launcher::Docker, Launcher::Local] {
                s.end_worker(launcher, libc::SIGKILL, Duration::from_secs(10))
                    .await?;
                s.start_worker(launcher).await?;
            }
            Ok(())
        }),
    )
    .await?;
    let path = format!("/v1/environments/{}/work/poll", system.env_id);
    let reply = system
        .call_with(
            reqwest::Method::GET,
            &path,
            &old_key,
            None,
            Duration::from_secs(30),
        )
        .await?;
    if reply.status != 401 {
        outcome.verdict.failures.push(format!(
            "old token: the revoked Environment key polled with {}",
            reply.status
        ));
    }
    Ok(outcome)
}

async fn until_logged(
    log: &std::path::Path,
    any_of: &[&str],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let seen = std::fs::read_to_string(log).unwrap_or_default();
        if seen
            .lines()
            .any(|l| any_of.iter().any(|text| l.contains(text)))
        {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} never logged any of {any_of:?}",
            log.display()
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until a call has begun and not yet been answered (in at least one
/// Session of the Environment): the fault lands mid-activation.
pub async fn until_calls_run(system: &System) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (running,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM session_events u JOIN sessions s ON s.id = u.session_id
             WHERE s.environment_id = $1 AND s.archived_at IS NULL AND u.type = 'agent.tool_use'
               AND NOT EXISTS (SELECT 1 FROM session_events r WHERE r.session_id = u.session_id
                               AND r.type = 'user.tool_result' AND r.body->>'tool_use_id' = u.id)",
        )
        .bind(&system.env_id)
        .fetch_one(&system.db)
        .await?;
        if running > 0 {
            // The call is in a runner's hands by now: it was posted, and
            // runners stream their Session's events.
            tokio::time::sleep(Duration::from_millis(700)).await;
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "no call began within 90 s");
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One scenario: the watch, the load, the probe's leases and the `fault`
/// at once; then the invariants.
pub async fn frame(
    system: &Arc<System>,
    spec: Spec,
    promises: Promises,
    fault: Fault,
) -> anyhow::Result<Outcome> {
    let s = system.clone();
    frame_with(system, move || load::start(s, spec), promises, fault).await
}

/// [`frame`] with a load of the scenario's own.
pub async fn frame_with(
    system: &Arc<System>,
    start_load: impl FnOnce() -> tokio::task::JoinHandle<load::Record>,
    promises: Promises,
    fault: Fault,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let watch = Watch::start(system.clone());
    let load = start_load();
    let probing = {
        let s = system.clone();
        tokio::spawn(async move { probe::cycle(&s, 4).await })
    };
    let injected = fault.await;
    let record = load.await?;
    let (held, probe_failures) = probing.await?;
    let observed = watch.finish();
    injected?;
    if let Some(stopped) = system.exited_workers().first() {
        anyhow::bail!("{stopped}");
    }

    let mut verdict = Verdict::default();
    invariants::check_sessions(system, &record, promises, &mut verdict).await?;
    invariants::check_tokens(system, &held, &mut verdict).await?;
    verdict
        .failures
        .extend(probe_failures.into_iter().map(|f| format!("probe: {f}")));
    verdict.failures.extend(observed.failures);
    let mut sessions: Vec<String> = record.turns.iter().map(|(s, _)| s.clone()).collect();
    // A Session sent two messages is ended once.
    sessions.sort();
    sessions.dedup();
    verdict
        .failures
        .extend(load::end_sessions(system, &sessions).await);
    let gone: HashSet<String> = sessions.into_iter().collect();
    invariants::check_leftovers(system, &gone, Duration::from_secs(30), &mut verdict).await;
    Ok(Outcome {
        verdict,
        reclaims: observed.reclaims,
        seconds: started.elapsed().as_secs_f64(),
    })
}
