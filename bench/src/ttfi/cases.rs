//! The interleaved cases: each its own Environment (so no supervisor polls
//! another case's Work) and what serves it: the supervisor core in this
//! process with the Docker launcher (cold, with a warm pool, or keeping
//! Sessions' sandboxes) or the local one, or the bench dispatching each
//! item to the official Python SDK's `EnvironmentWorker.handle_item()` in a
//! new process, as the SDK's per-item mode (`ant worker poll --on-work`)
//! does.

use super::turn::{said, steps_of, Spread, Watched};
use super::Environment;
use crate::harness::Bench;
use crate::runner::{claim, clean_command, Scratch};
use crate::supervisor::{ms_between, Clock, InProcess};
use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use mango_controller::core::stages::{Stage, Stamps};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// The supervisor is done with an item (its sandbox gone) within this
/// after its Work was stopped.
const DONE_TIMEOUT: Duration = Duration::from_secs(60);
/// A warm pool refills within this (sandboxes made while others run).
const REFILL_TIMEOUT: Duration = Duration::from_secs(120);
/// An SDK worker exits within this after its Work was stopped.
const SDK_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// A kept case's last activation ends idle, and its sandbox is kept,
/// within this after the turn's end (the runner's idle end, then the
/// claims watch).
const KEPT_TIMEOUT: Duration =
    Duration::from_secs(super::kept_image::IDLE_AFTER_END_TURN_SECONDS + 60);

/// What serves a case's Work.
pub enum Server {
    /// The supervisor core in this process; `warm` sandboxes kept ready.
    Core { running: InProcess, warm: usize },
    /// The core keeping Sessions' sandboxes after an idle end: every turn
    /// is a follow-up of `session`, whose first turn (cold) is not a sample.
    Kept {
        running: InProcess,
        session: Option<String>,
    },
    /// The bench polls and acks, and starts `python driver` per item.
    Sdk { python: PathBuf, driver: PathBuf },
}

pub struct Case {
    pub label: &'static str,
    pub env: Environment,
    pub server: Server,
    /// TTFI of each measured turn, ms.
    pub ttfi: Vec<f64>,
    /// Poll → the runner's first heartbeat of each measured turn (the
    /// supervisor's `polled` stamp to the api's `started_at`), ms.
    pub first_beat: Vec<f64>,
    /// Measured turns of a warm or kept case that did not bind a warm or
    /// kept sandbox.
    pub went_cold: usize,
    /// Every Session this case made (their workspaces are removed at the end).
    pub sessions: Vec<String>,
    /// Each step from poll to the first heartbeat, with its measured
    /// turns' samples (the core's cases), ms.
    pub steps: Vec<(String, Vec<f64>)>,
}

/// One turn's figures.
struct Measured {
    ttfi_ms: f64,
    first_beat_ms: Option<f64>,
    /// A warm or kept sandbox served it.
    reused: bool,
    /// Poll to the first heartbeat, step by step (the core's cases).
    steps: Vec<(String, f64)>,
}

impl Case {
    pub fn new(label: &'static str, env: Environment, server: Server) -> Case {
        Case {
            label,
            env,
            server,
            ttfi: Vec::new(),
            first_beat: Vec::new(),
            went_cold: 0,
            sessions: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// One turn of a new Session (the kept case: a follow-up turn of its
    /// Session); with `measured`, its figures are kept.
    pub async fn turn(&mut self, bench: &Bench, agent: &str, measured: bool) -> anyhow::Result<()> {
        let (label, env, sessions) = (self.label, &self.env, &mut self.sessions);
        let figures = match &mut self.server {
            Server::Core { running, warm } => {
                core_turn(bench, agent, label, env, sessions, running, *warm).await?
            }
            Server::Kept { running, session } => {
                let session = match session {
                    Some(session) => session.clone(),
                    None => {
                        let first = first_of_kept(bench, agent, env, sessions).await?;
                        session.insert(first).clone()
                    }
                };
                kept_turn(bench, label, env, running, session).await?
            }
            Server::Sdk { python, driver } => {
                sdk_turn(bench, agent, label, env, sessions, python, driver).await?
            }
        };
        let reuses = match &self.server {
            Server::Core { warm, .. } => *warm > 0,
            Server::Kept { .. } => true,
            Server::Sdk { .. } => false,
        };
        println!(
            "ttfi: {}: {} turn: TTFI {:8.1} ms{}{}",
            self.label,
            if measured { "measured" } else { "warm-up" },
            figures.ttfi_ms,
            figures
                .first_beat_ms
                .map(|b| format!(", poll → first heartbeat {b:7.1} ms"))
                .unwrap_or_default(),
            if reuses && !figures.reused {
                " (no warm or kept sandbox bound: started cold)"
            } else {
                ""
            }
        );
        if measured {
            self.ttfi.push(figures.ttfi_ms);
            self.first_beat.extend(figures.first_beat_ms);
            if reuses && !figures.reused {
                self.went_cold += 1;
            }
            for (step, ms) in figures.steps {
                match self.steps.iter_mut().find(|(name, _)| *name == step) {
                    Some((_, samples)) => samples.push(ms),
                    None => self.steps.push((step, vec![ms])),
                }
            }
        }
        Ok(())
    }

    /// `ttfi: docker warm: p50 by step: polled→acked 2.1 ms, …`, where the
    /// case has steps: where its poll → first heartbeat goes.
    pub fn report_steps(&self) {
        if self.steps.is_empty() {
            return;
        }
        let p50s: Vec<(String, f64)> = self
            .steps
            .iter()
            .filter_map(|(step, samples)| Some((step.clone(), Spread::of(samples)?.p50)))
            .collect();
        println!("ttfi: {}: p50 by step: {}", self.label, said(&p50s));
    }
}

async fn core_turn(
    bench: &Bench,
    agent: &str,
    label: &str,
    env: &Environment,
    sessions: &mut Vec<String>,
    running: &InProcess,
    warm: usize,
) -> anyhow::Result<Measured> {
    if warm > 0 {
        until_warm(running, warm, label).await?;
    }
    let clock = Clock::now();
    let mut watched = Watched::open(bench, &env.api, agent, &env.id).await?;
    sessions.push(watched.session.clone());
    let outcome = async {
        let sent = watched.send(&env.api).await?;
        let ttfi_ms = watched.first_result(sent).await?;
        watched.until_idle().await?;
        anyhow::Ok(ttfi_ms)
    }
    .await;
    let session = watched.session.clone();
    watched.close(bench);
    let ttfi_ms = outcome?;
    let work_id = first_work(bench, &session).await?;
    env.api.force_stop(&work_id).await?;
    let (stamps, first_beat_ms, steps) =
        item_figures(bench, running, &work_id, &clock, DONE_TIMEOUT).await?;
    Ok(Measured {
        ttfi_ms,
        first_beat_ms,
        reused: stamps.get(Stage::Bound).is_some() && stamps.get(Stage::Created).is_none(),
        steps,
    })
}

/// Once the core is done with `work_id` (within `within`): its stamps,
/// poll → first heartbeat (the core's `polled` to the api's `started_at`),
/// and each step between them.
async fn item_figures(
    bench: &Bench,
    running: &InProcess,
    work_id: &str,
    clock: &Clock,
    within: Duration,
) -> anyhow::Result<(Stamps, Option<f64>, Vec<(String, f64)>)> {
    let record = running.collector.done_with(work_id, within).await?;
    let stamps = record.stamps;
    let started: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT started_at FROM work WHERE id = $1")
            .bind(work_id)
            .fetch_one(&bench.app.db)
            .await?;
    let first_beat_ms = match (stamps.get(Stage::Polled), started) {
        (Some(polled), Some(started)) => Some(ms_between(clock.wall(polled), started)),
        _ => None,
    };
    let mut steps = steps_of(&stamps, Stage::Polled);
    if let (Some(delivered), Some(started)) = (stamps.get(Stage::Delivered), started) {
        steps.push((
            "delivered→first heartbeat".into(),
            ms_between(clock.wall(delivered), started),
        ));
    }
    Ok((stamps, first_beat_ms, steps))
}

async fn sdk_turn(
    bench: &Bench,
    agent: &str,
    label: &str,
    env: &Environment,
    sessions: &mut Vec<String>,
    python: &std::path::Path,
    driver: &std::path::Path,
) -> anyhow::Result<Measured> {
    let mut watched = Watched::open(bench, &env.api, agent, &env.id).await?;
    let session = watched.session.clone();
    sessions.push(session.clone());
    let scratch = Scratch::new(&format!("{}_ttfi_sdk_{}", bench.db_name, sessions.len()))?;
    // The dispatcher long-polls before the message is sent, as a
    // standing `ant worker poll --on-work` would.
    let dispatch = {
        let (api, env_id, base) = (env.api.clone(), env.id.clone(), bench.app.base.clone());
        let (python, driver, workspace) = (
            python.to_path_buf(),
            driver.to_path_buf(),
            scratch.workspace(),
        );
        let log = scratch.log();
        let session = session.clone();
        tokio::spawn(async move {
            let work = claim(&api, &session).await?;
            let secret = work.secret.clone().context("Poll returned no secret")?;
            let child = clean_command(&python)
                .arg(&driver)
                .env("ANTHROPIC_BASE_URL", &base)
                .env("ANTHROPIC_WORK_ID", &work.id)
                .env("ANTHROPIC_ENVIRONMENT_ID", &env_id)
                .env("ANTHROPIC_SESSION_ID", &session)
                .env("ANTHROPIC_WORK_SECRET", &secret)
                .current_dir(&workspace)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?)
                .kill_on_drop(true)
                .spawn()
                .context("starting the SDK worker")?;
            anyhow::Ok((work.id, child))
        })
    };
    let outcome = async {
        let sent = watched.send(&env.api).await?;
        let ttfi_ms = watched.first_result(sent).await?;
        watched.until_idle().await?;
        anyhow::Ok(ttfi_ms)
    }
    .await;
    watched.close(bench);
    let (work_id, mut child) = dispatch.await.context("the SDK dispatcher panicked")??;
    let ttfi_ms = match outcome {
        Ok(ms) => ms,
        Err(err) => {
            let _ = child.kill().await;
            let log = std::fs::read_to_string(scratch.log()).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(err.context(format!("the SDK worker's log ends: {tail}")));
        }
    };
    env.api.force_stop(&work_id).await?;
    if tokio::time::timeout(SDK_EXIT_TIMEOUT, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
        println!(
                "ttfi: {}: the SDK worker did not exit within {SDK_EXIT_TIMEOUT:?} of its Work's stop; killed",
                label
            );
    }
    Ok(Measured {
        ttfi_ms,
        first_beat_ms: None,
        steps: Vec::new(),
        reused: false,
    })
}

/// The kept case's Session and its first turn (a cold sandbox, not a
/// sample), which ends at the runner's idle end with the sandbox kept.
async fn first_of_kept(
    bench: &Bench,
    agent: &str,
    env: &Environment,
    sessions: &mut Vec<String>,
) -> anyhow::Result<String> {
    let mut watched = Watched::open(bench, &env.api, agent, &env.id).await?;
    sessions.push(watched.session.clone());
    let outcome = async {
        let sent = watched.send(&env.api).await?;
        watched.first_result(sent).await?;
        watched.until_idle().await
    }
    .await;
    let session = watched.session.clone();
    watched.close(bench);
    outcome?;
    Ok(session)
}

/// A follow-up turn of `session` once its sandbox is kept, as a follow-up
/// that comes after the last activation's idle end finds it. Its Work is
/// left to end idle, so the sandbox is kept again for the next turn.
async fn kept_turn(
    bench: &Bench,
    label: &str,
    env: &Environment,
    running: &InProcess,
    session: String,
) -> anyhow::Result<Measured> {
    until_kept(running, label).await?;
    let reused_before = running.metrics.kept_reused.load(Relaxed);
    let clock = Clock::now();
    let mut watched = Watched::again(bench, session.clone());
    let outcome = async {
        let sent = watched.send(&env.api).await?;
        let ttfi_ms = watched.first_result(sent).await?;
        watched.until_idle().await?;
        anyhow::Ok(ttfi_ms)
    }
    .await;
    watched.close(bench);
    let ttfi_ms = outcome?;
    // Counted once the kept sandbox took the envelope, before any tool ran.
    let reused = running.metrics.kept_reused.load(Relaxed) > reused_before;
    // The activation ends at the runner's idle end, its sandbox kept.
    let within = KEPT_TIMEOUT;
    let (_, first_beat_ms, steps) = item_figures(
        bench,
        running,
        &last_work(bench, &session).await?,
        &clock,
        within,
    )
    .await?;
    Ok(Measured {
        ttfi_ms,
        first_beat_ms,
        steps,
        reused,
    })
}

/// Until the kept case's Session has its sandbox kept.
async fn until_kept(running: &InProcess, label: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    while running.metrics.kept.load(Relaxed) < 1 {
        if started.elapsed() > KEPT_TIMEOUT {
            bail!("{label}: no sandbox kept {KEPT_TIMEOUT:?} after the last turn");
        }
        // A poll interval inside the deadline above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The Work the Session's message made (its first).
async fn first_work(bench: &Bench, session: &str) -> anyhow::Result<String> {
    sqlx::query_scalar("SELECT id FROM work WHERE session_id = $1 ORDER BY created_at, id LIMIT 1")
        .bind(session)
        .fetch_optional(&bench.app.db)
        .await?
        .with_context(|| format!("{session} has no Work"))
}

async fn last_work(bench: &Bench, session: &str) -> anyhow::Result<String> {
    sqlx::query_scalar(
        "SELECT id FROM work WHERE session_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .bind(session)
    .fetch_optional(&bench.app.db)
    .await?
    .with_context(|| format!("{session} has no Work"))
}

/// Until the in-process core's warm pool is full: each warm turn starts
/// from the steady state, as the next Session on an idle pool would.
pub(super) async fn until_warm(
    running: &InProcess,
    target: usize,
    label: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while (running.metrics.warm_ready.load(Relaxed).max(0) as usize) < target {
        if started.elapsed() > REFILL_TIMEOUT {
            bail!(
                "{label}: the warm pool holds {} of {target} after {REFILL_TIMEOUT:?}",
                running.metrics.warm_ready.load(Relaxed)
            );
        }
        // A poll interval inside the refill deadline.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
