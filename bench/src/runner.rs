//! `runner`: the item runner's tool round trip and memory, against the
//! official Python SDK's `EnvironmentWorker` on the same server in the same run.
//!
//! Per side: a Session with one `user.message`, its Work polled and acked with
//! the Environment key (as a supervisor does), then the worker process serving
//! that one item — `mango-runner` (built from the `runner` crate, found
//! next to this executable) or `EnvironmentWorker.handle_item()` in a Python
//! subprocess. The bench appends `agent.tool_use` `bash` `echo …` events
//! in-process through the agent loop's own path ([`emit`]), one at a time. A
//! sample is the round trip the worker is responsible for: from the
//! `agent.tool_use` admitted to its `user.tool_result` admitted, both stamped
//! as the api broadcasts the commit to the Session's streams (the feed's
//! publication observer, called in the committing task). After the measured calls the worker's peak RSS
//! (`VmHWM` of its own process, not of the shell it spawns) is read from
//! /proc; only then is `session.status_terminated` appended and the worker
//! waited for.
//!
//! Alongside, the floor under both: the same script with the bench itself
//! answering each call over HTTP (no worker process, no shell), i.e. what the
//! server and the transport cost; the p50 ratio of the totals cannot go
//! below floor / SDK, so the time above the floor is printed as well.
//!
//! All sides are started first and their measured calls are taken in
//! interleaved blocks: this machine's speed drifts by tens of percent over
//! minutes, and sides measured one after the other would compare machines.

use crate::chart::Chart;
use crate::events::frame_end;
use crate::harness::Bench;
use crate::http::Api;
use crate::measure::{ms, percentile};
use anyhow::{bail, Context};
use mango_api::service::admission::emit;
use mango_protocol::content::ContentBlock;
use mango_protocol::events::{
    types, AgentToolUse, EventBody, Permission, SentEvent, UserToolResult,
};
use mango_protocol::WorkData;
use mango_testkit::work::try_sessions_token;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

pub const TARGET_RSS_MIB: f64 = 20.0;
/// Ours must be at most this fraction of the SDK's (p50 round trip, peak RSS).
pub const TARGET_RATIO: f64 = 1.0 / 3.0;
/// The first call also covers the worker's start (Python imports included).
const FIRST_RESULT: Duration = Duration::from_secs(60);
const RESULT_TIMEOUT: Duration = Duration::from_secs(20);
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// The tool subprocesses' PATH, the same for both sides.
const TOOL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
pub(crate) const SDK_DRIVER: &str = include_str!("sdk_worker.py");

pub struct Options {
    pub calls: usize,
    pub warmup: usize,
}

pub struct Side {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rss_mib: f64,
    pub samples_ms: Vec<f64>,
}

pub struct RunnerResult {
    /// The bench answering the calls itself: server and transport only.
    pub floor: Side,
    pub runner: Side,
    pub sdk: Option<Side>,
}

impl RunnerResult {
    /// The round trips of this round's three sides.
    pub fn chart(&self) -> Chart {
        let mut chart = Chart::new(
            "runner",
            "runner: a bash tool call's round trip, mango-runner vs the SDK's worker",
        );
        chart.case("floor (the bench answers)", &self.floor.samples_ms);
        chart.case("mango-runner", &self.runner.samples_ms);
        match &self.sdk {
            Some(sdk) => chart.case("SDK EnvironmentWorker", &sdk.samples_ms),
            None => chart.case("SDK EnvironmentWorker (skipped)", &[]),
        }
        chart
    }

    /// Ours / the SDK's p50 round trip.
    pub fn p50_ratio(&self) -> Option<f64> {
        self.sdk.as_ref().map(|s| self.runner.p50_ms / s.p50_ms)
    }
    /// Ours / the SDK's peak RSS.
    pub fn rss_ratio(&self) -> Option<f64> {
        self.sdk.as_ref().map(|s| self.runner.rss_mib / s.rss_mib)
    }
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "MISSES"
    }
}

/// Which worker serves the item.
#[derive(Clone, Copy)]
pub(crate) enum Launch<'a> {
    Runner(&'a Path),
    Sdk { python: &'a Path, driver: &'a Path },
}

impl Launch<'_> {
    pub fn label(&self) -> &'static str {
        match self {
            Launch::Runner(_) => "runner",
            Launch::Sdk { .. } => "sdk",
        }
    }
}

/// `mango-runner` next to this executable (both are built into target/release).
pub(crate) fn locate_worker() -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()
        .context("cannot locate the bench executable")?
        .with_file_name("mango-runner");
    if !path.is_file() {
        bail!(
            "{} not found: build the runner next to the bench with \
             `cargo build --release -p mango-runner -p mango-bench`",
            path.display()
        );
    }
    Ok(path)
}

/// `MANGO_BENCH_PYTHON`, else `.venv/bin/python` of the repository (created
/// by `scripts/venv.sh`); `None`, with the reason printed (after `phase`),
/// if it cannot run `driver --check`.
pub(crate) async fn locate_python(driver: &Path, phase: &str) -> Option<PathBuf> {
    let python = match std::env::var_os("MANGO_BENCH_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(Path::new("."))
                .to_path_buf();
            let candidates = [
                repo.join(".venv/bin/python"),
                PathBuf::from(".venv/bin/python"),
            ];
            match candidates.into_iter().find(|p| p.is_file()) {
                Some(p) => p,
                None => {
                    println!(
                        "{phase}: SDK half skipped: no .venv/bin/python (create it with scripts/venv.sh, or set MANGO_BENCH_PYTHON)"
                    );
                    return None;
                }
            }
        }
    };
    let check = tokio::process::Command::new(&python)
        .arg(driver)
        .arg("--check")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await;
    match check {
        Ok(out) if out.status.success() => Some(python),
        Ok(out) => {
            println!(
                "{phase}: SDK half skipped: {} cannot import what the SDK driver needs (install with scripts/venv.sh): {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(err) => {
            println!(
                "{phase}: SDK half skipped: cannot run {}: {err}",
                python.display()
            );
            None
        }
    }
}

/// A scratch directory removed on drop.
pub(crate) struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> anyhow::Result<Scratch> {
        Scratch::new_in(&std::env::temp_dir(), name)
    }
    pub fn new_in(base: &Path, name: &str) -> anyhow::Result<Scratch> {
        let dir = base.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).ok();
        }
        std::fs::create_dir_all(dir.join("workspace"))
            .with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
    pub fn workspace(&self) -> PathBuf {
        self.0.join("workspace")
    }
    pub fn log(&self) -> PathBuf {
        self.0.join("worker.log")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

pub async fn run(bench: &Bench, opts: &Options) -> anyhow::Result<RunnerResult> {
    let worker = locate_worker()?;
    let scratch = Scratch::new(&format!("{}_sdk_driver", bench.db_name))?;
    let driver = scratch.0.join("sdk_worker.py");
    std::fs::write(&driver, SDK_DRIVER).context("writing the SDK driver")?;
    let python = locate_python(&driver, "runner").await;

    // Whatever earlier phases left queued would be polled instead of our items.
    bench.clear_live().await?;
    let started = Instant::now();
    match bench.settle().await {
        None => println!(
            "runner: settled the database first (VACUUM ANALYZE, CHECKPOINT: {:.1} s), so earlier phases' clean-up does not run while it measures",
            started.elapsed().as_secs_f64()
        ),
        Some(why) => println!("runner: could not settle the database first ({why}); earlier phases' clean-up may weigh on the numbers"),
    }
    let api = bench.api.with_new_client()?;
    let agent = api.create_agent("bench-runner").await?;

    let mut parts = vec![Participant::floor(bench, &api, &agent).await?];
    parts.push(Participant::worker(bench, &api, &agent, Launch::Runner(&worker)).await?);
    if let Some(python) = &python {
        let sdk = Launch::Sdk {
            python,
            driver: &driver,
        };
        parts.push(Participant::worker(bench, &api, &agent, sdk).await?);
    }
    let blocks = BLOCKS.clamp(1, opts.calls.max(1));
    println!(
        "runner: {} warm-up + {} measured sequential `bash echo` round trips (tool_use admitted → tool_result admitted) each, in {blocks} interleaved blocks so every side meets the same machine: {}",
        opts.warmup,
        opts.calls,
        parts
            .iter()
            .map(|p| p.describe())
            .collect::<Vec<_>>()
            .join("; ")
    );
    let measured = interleave(bench, &mut parts, opts, blocks).await;
    let mut sides = Vec::new();
    let mut failure = measured.err();
    for part in parts {
        let label = part.label;
        match part.finish(bench, failure.is_some()).await {
            Ok(side) => sides.push(side),
            Err(err) => {
                println!("  {label}: {err:#}");
                failure.get_or_insert(err);
            }
        }
    }
    if let Some(err) = failure {
        return Err(err);
    }
    let mut sides = sides.into_iter();
    let floor = sides.next().context("no floor")?;
    let runner = sides.next().context("no runner")?;
    let result = RunnerResult {
        floor,
        runner,
        sdk: sides.next(),
    };
    report(bench, &result);
    Ok(result)
}

/// Several rounds: prints each round's p50 ratio and how many meet the
/// target, and returns the round with the median ratio (the only round when
/// there is one; the middle round when the SDK half was skipped).
pub fn across_rounds(mut rounds: Vec<RunnerResult>) -> RunnerResult {
    let ratios: Option<Vec<f64>> = rounds.iter().map(RunnerResult::p50_ratio).collect();
    let Some(ratios) = ratios.filter(|r| r.len() > 1) else {
        return rounds.swap_remove(rounds.len() / 2);
    };
    let mut order: Vec<usize> = (0..ratios.len()).collect();
    order.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
    // With an even count, the upper of the two middle rounds.
    let median = order[ratios.len() / 2];
    let meeting = ratios.iter().filter(|r| **r <= TARGET_RATIO).count();
    println!(
        "runner: p50 ratio by round: {} (median {:.3}; {meeting} of {} rounds at or under {TARGET_RATIO:.3}; median {})",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        ratios[median],
        ratios.len(),
        verdict(ratios[median] <= TARGET_RATIO)
    );
    rounds.swap_remove(median)
}

/// Measured calls per side are split into this many blocks, taken in turn
/// (each block's order rotated), so a machine that speeds up or slows down
/// during the run weighs on every side alike.
const BLOCKS: usize = 10;

/// The warm-up (the first call also covers the worker's start), then the
/// measured calls block by block.
async fn interleave(
    bench: &Bench,
    parts: &mut [Participant],
    opts: &Options,
    blocks: usize,
) -> anyhow::Result<()> {
    for part in parts.iter_mut() {
        part.calls(bench, opts.warmup, false).await?;
    }
    let n = parts.len();
    for block in 0..blocks {
        let size = opts.calls * (block + 1) / blocks - opts.calls * block / blocks;
        for k in 0..n {
            parts[(block + k) % n].calls(bench, size, true).await?;
        }
    }
    Ok(())
}

fn report(bench: &Bench, result: &RunnerResult) {
    let metrics = &bench.app.ctx.metrics;
    println!(
        "runner: sends admitted by the fenced result path {}, under the Session lock {}",
        metrics
            .fenced_results
            .load(std::sync::atomic::Ordering::Relaxed),
        metrics
            .locked_admissions
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let floor = &result.floor;
    println!(
        "runner: floor (server + bench, no worker) p50 {:.2} ms, p99 {:.2} ms",
        floor.p50_ms, floor.p99_ms
    );
    let r = &result.runner;
    println!(
        "runner: round trip p50 {:.2} ms, p99 {:.2} ms; peak RSS {:.2} MiB (target ≤ {TARGET_RSS_MIB:.0}: {})",
        r.p50_ms,
        r.p99_ms,
        r.rss_mib,
        verdict(r.rss_mib <= TARGET_RSS_MIB)
    );
    match (&result.sdk, result.p50_ratio(), result.rss_ratio()) {
        (Some(s), Some(p50), Some(rss)) => {
            println!(
                "runner: SDK round trip p50 {:.2} ms, p99 {:.2} ms; peak RSS {:.2} MiB",
                s.p50_ms, s.p99_ms, s.rss_mib
            );
            println!(
                "runner: ours / SDK: p50 {p50:.3} (target ≤ 0.333: {}), peak RSS {rss:.3} (target ≤ 0.333: {})",
                verdict(p50 <= TARGET_RATIO),
                verdict(rss <= TARGET_RATIO)
            );
            println!(
                "runner: above the floor, p50: ours {:.2} ms, SDK {:.2} ms (ratio {:.3})",
                r.p50_ms - floor.p50_ms,
                s.p50_ms - floor.p50_ms,
                (r.p50_ms - floor.p50_ms) / (s.p50_ms - floor.p50_ms)
            );
        }
        _ => println!("runner: ours / SDK: n/a (SDK half skipped)"),
    }
}

/// An event seen on the stream: when its frame arrived, and the event.
pub(crate) type Arrival = (Instant, Value);

/// Who answers a side's calls.
enum Answerer {
    /// The floor under any worker: the bench itself reads `agent.tool_use`
    /// on a stream of the Session and POSTs the `user.tool_result` with the
    /// item's sessions token at once (no process, no shell): SSE delivery,
    /// one HTTP request and its admission, the path a worker's result takes.
    Bench {
        tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    },
    /// A worker process serving the Session's Work item.
    Process {
        child: Box<tokio::process::Child>,
        pid: u32,
        program: PathBuf,
        scratch: Scratch,
    },
}

/// One side of the comparison: its Session (Work claimed as a supervisor
/// would), the subscription that stamps its admissions, and its samples.
struct Participant {
    label: &'static str,
    session: String,
    answerer: Answerer,
    admissions: mpsc::UnboundedReceiver<Arrival>,
    reader: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Calls appended so far (numbers the echoed words).
    appended: usize,
    samples: Vec<f64>,
    /// Admissions seen before the bench knew which call they belong to, by call id.
    calls_seen: HashMap<String, Instant>,
    results_seen: HashMap<String, (Instant, Value)>,
}

impl Participant {
    /// A Session with one `user.message` whose Work is polled and acked,
    /// subscribed to before anyone answers, so no admission is missed.
    async fn open(
        bench: &Bench,
        api: &Api,
        agent: &str,
        label: &'static str,
    ) -> anyhow::Result<(Self, mango_protocol::Work)> {
        let session = api.create_session(agent, &bench.app.env_id).await?;
        api.send_message(&session, "go").await?;
        let work = claim(api, &session).await?;
        let (tx, rx) = mpsc::unbounded_channel::<Arrival>();
        let reader = admissions(
            bench,
            &session,
            &[types::AGENT_TOOL_USE, types::USER_TOOL_RESULT],
            tx,
        );
        let part = Participant {
            label,
            session,
            answerer: Answerer::Bench { tasks: Vec::new() },
            admissions: rx,
            reader,
            appended: 0,
            samples: Vec::with_capacity(1024),
            calls_seen: HashMap::new(),
            results_seen: HashMap::new(),
        };
        Ok((part, work))
    }

    async fn floor(bench: &Bench, api: &Api, agent: &str) -> anyhow::Result<Self> {
        let (mut part, work) = Self::open(bench, api, agent, "floor").await?;
        let secret = work.secret.as_deref().context("Poll returned no secret")?;
        let token = try_sessions_token(secret)?;
        let (call_tx, mut calls) = mpsc::unbounded_channel::<Arrival>();
        let call_reader = tokio::spawn(read_frames(
            api.open_stream(&part.session).await?,
            types::AGENT_TOOL_USE,
            call_tx,
        ));
        let responder = {
            let (api, session) = (api.clone(), part.session.clone());
            tokio::spawn(async move {
                while let Some((_, call)) = calls.recv().await {
                    let command = call["input"]["command"].as_str().unwrap_or_default();
                    let word = command.strip_prefix("echo ").unwrap_or(command);
                    let result = SentEvent::UserToolResult(UserToolResult {
                        tool_use_id: call["id"].as_str().unwrap_or_default().to_string(),
                        content: Some(vec![ContentBlock::Text {
                            text: word.to_string(),
                        }]),
                        is_error: Some(false),
                        session_thread_id: None,
                    });
                    api.send_events_as(&session, &token, vec![serde_json::to_value(result)?])
                        .await?;
                }
                anyhow::Ok(())
            })
        };
        part.answerer = Answerer::Bench {
            tasks: vec![call_reader, responder],
        };
        Ok(part)
    }

    async fn worker(
        bench: &Bench,
        api: &Api,
        agent: &str,
        launch: Launch<'_>,
    ) -> anyhow::Result<Self> {
        let (mut part, work) = Self::open(bench, api, agent, launch.label()).await?;
        let secret = work.secret.clone().context("Poll returned no secret")?;
        let scratch = Scratch::new(&format!("{}_{}", bench.db_name, part.label))?;
        let log = std::fs::File::create(scratch.log())?;
        let (mut command, program) = match &launch {
            Launch::Runner(worker) => (
                runner_command(worker, bench, &work.id, &part.session, &scratch.workspace()),
                worker.to_path_buf(),
            ),
            Launch::Sdk { python, driver } => {
                let mut c = clean_command(python);
                c.arg(driver)
                    .env("ANTHROPIC_BASE_URL", &bench.app.base)
                    .env("ANTHROPIC_WORK_ID", &work.id)
                    .env("ANTHROPIC_ENVIRONMENT_ID", &bench.app.env_id)
                    .env("ANTHROPIC_SESSION_ID", &part.session)
                    .env("ANTHROPIC_WORK_SECRET", &secret)
                    .stdin(Stdio::null());
                (c, python.to_path_buf())
            }
        };
        let mut child = command
            .current_dir(scratch.workspace())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the {} worker", part.label))?;
        if let Launch::Runner(_) = launch {
            hand_secret(&mut child, &secret).await?;
        }
        let pid = child.id().context("the worker has no pid")?;
        part.answerer = Answerer::Process {
            child: Box::new(child),
            pid,
            program,
            scratch,
        };
        Ok(part)
    }

    fn describe(&self) -> String {
        match &self.answerer {
            Answerer::Bench { .. } => "floor (the bench answers over HTTP, no worker)".into(),
            Answerer::Process { program, .. } => format!("{} ({})", self.label, program.display()),
        }
    }

    /// `n` calls, one at a time: append an `agent.tool_use` through the
    /// agent loop's own path ([`emit`]) and wait for its result; with
    /// `measured`, keep each round trip (ms).
    async fn calls(&mut self, bench: &Bench, n: usize, measured: bool) -> anyhow::Result<()> {
        for _ in 0..n {
            let i = self.appended;
            self.appended += 1;
            let label = self.label;
            let word = format!("bench-{label}-{i}");
            let call = append_bash_call(bench, &self.session, &format!("echo {word}")).await?;
            let limit = if i == 0 { FIRST_RESULT } else { RESULT_TIMEOUT };
            let deadline = tokio::time::Instant::now() + limit;
            let (admitted, answered, event) = loop {
                if let Some(&admitted) = self.calls_seen.get(&call) {
                    if let Some((answered, event)) = self.results_seen.remove(&call) {
                        self.calls_seen.remove(&call);
                        break (admitted, answered, event);
                    }
                }
                let child = match &mut self.answerer {
                    Answerer::Process { child, .. } => Some(&mut **child),
                    Answerer::Bench { .. } => None,
                };
                tokio::select! {
                    got = tokio::time::timeout_at(deadline, self.admissions.recv()) => match got {
                        Ok(Some((at, event))) if event["type"] == types::AGENT_TOOL_USE => {
                            let id = event["id"].as_str().unwrap_or_default().to_string();
                            self.calls_seen.insert(id, at);
                        }
                        Ok(Some((at, event))) => {
                            let id = event["tool_use_id"].as_str().unwrap_or_default().to_string();
                            self.results_seen.insert(id, (at, event));
                        }
                        Ok(None) => bail!("{label}: the Session's feed ended"),
                        Err(_) => bail!("{label}: no user.tool_result for call {i} ({call}) within {limit:?}"),
                    },
                    status = exited(child) => {
                        bail!("{label}: the worker exited ({}) before answering call {i}", status?);
                    }
                }
            };
            let text = result_text(&event);
            if event["is_error"] == true || !text.contains(&word) {
                bail!("{label}: unexpected result for call {i}: {event}");
            }
            if measured {
                self.samples.push(ms(answered.duration_since(admitted)));
            }
        }
        Ok(())
    }

    /// Reads a worker's peak RSS, then ends the Session (a worker should exit
    /// on its own) and summarises the samples.
    async fn finish(mut self, bench: &Bench, failed: bool) -> anyhow::Result<Side> {
        let label = self.label;
        let rss = match &self.answerer {
            Answerer::Process { pid, .. } => {
                let kib = proc_status_kib(*pid, "VmHWM")
                    .with_context(|| format!("{label}: cannot read VmHWM from /proc/{pid}/status"));
                Some((kib, children_rss_kib(*pid)))
            }
            Answerer::Bench { .. } => None,
        };
        let ended = emit(
            &bench.app.ctx,
            &self.session,
            vec![EventBody::SessionStatusTerminated],
        )
        .await;
        match &mut self.answerer {
            Answerer::Bench { tasks } => tasks.iter().for_each(|t| t.abort()),
            Answerer::Process { child, scratch, .. } => {
                match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
                    Ok(Ok(status)) if status.success() => {}
                    Ok(Ok(status)) => {
                        println!("  warning ({label}): the worker exited with {status}")
                    }
                    Ok(Err(err)) => println!("  warning ({label}): waiting for the worker: {err}"),
                    Err(_) => {
                        println!(
                            "  warning ({label}): the worker did not exit within {EXIT_TIMEOUT:?} of session.status_terminated; killed"
                        );
                        child.kill().await.ok();
                    }
                }
                if failed {
                    print_log_tail(&scratch.log(), label);
                }
            }
        }
        self.reader.abort();
        bench.forget_publications(&self.session);
        ended.map_err(|e| anyhow::anyhow!("terminating the session: {e:?}"))?;
        let samples = &mut self.samples;
        if samples.is_empty() {
            bail!("{label}: no measured round trips");
        }
        let (p50, p99, max) = (
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            percentile(samples, 100.0),
        );
        let line = format!(
            "  {label}: {} round trips p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms",
            samples.len()
        );
        let rss_mib = match rss {
            None => {
                println!("{line}");
                0.0
            }
            Some((kib, (n, child_kib))) => {
                let rss_mib = kib? as f64 / 1024.0;
                println!(
                    "{line}; peak RSS (VmHWM) {rss_mib:.2} MiB ({n} child processes, now {:.2} MiB RSS, not counted)",
                    child_kib as f64 / 1024.0
                );
                rss_mib
            }
        };
        Ok(Side {
            p50_ms: p50,
            p99_ms: p99,
            rss_mib,
            samples_ms: std::mem::take(&mut self.samples),
        })
    }
}

/// `mango-runner` serving Session `session`'s Work `work_id` in
/// `workspace`, as a supervisor starts it: identity in the environment, the
/// secret on stdin ([`hand_secret`]).
pub(crate) fn runner_command(
    worker: &Path,
    bench: &Bench,
    work_id: &str,
    session: &str,
    workspace: &Path,
) -> tokio::process::Command {
    let mut c = clean_command(worker);
    c.env("MANGO_BASE_URL", &bench.app.base)
        .env("MANGO_WORK_ID", work_id)
        .env("MANGO_ENVIRONMENT_ID", &bench.app.env_id)
        .env("MANGO_WORK_TYPE", "session")
        .env("MANGO_SESSION_ID", session)
        .env("MANGO_WORKSPACE", workspace)
        .stdin(Stdio::piped());
    c
}

/// Writes the Work secret to the runner's stdin, once, and closes it.
pub(crate) async fn hand_secret(
    child: &mut tokio::process::Child,
    secret: &str,
) -> anyhow::Result<()> {
    let mut stdin = child.stdin.take().context("no stdin")?;
    stdin.write_all(format!("{secret}\n").as_bytes()).await?;
    stdin.shutdown().await?;
    Ok(())
}

/// Appends an allowed `agent.tool_use` of `bash` running `command` to
/// `session` through the agent loop's own path ([`emit`]); returns its id.
pub(crate) async fn append_bash_call(
    bench: &Bench,
    session: &str,
    command: &str,
) -> anyhow::Result<String> {
    let stored = emit(
        &bench.app.ctx,
        session,
        vec![EventBody::AgentToolUse(AgentToolUse {
            name: "bash".into(),
            input: json!({ "command": command }),
            evaluated_permission: Some(Permission::Allow),
            evaluation: None,
            deny_reason: None,
            session_thread_id: None,
        })],
    )
    .await
    .map_err(|e| anyhow::anyhow!("appending a tool call: {e:?}"))?;
    Ok(stored
        .first()
        .context("the appended tool call has no id")?
        .id
        .clone())
}

/// No inherited environment (so no credential of ours) beyond PATH and HOME.
pub(crate) fn clean_command(program: &Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(program);
    c.env_clear().env("PATH", TOOL_PATH);
    if let Some(home) = std::env::var_os("HOME") {
        c.env("HOME", home);
    }
    c
}

/// Polls (with the Environment key) until the Work of `session` is handed out, and acks it.
pub(crate) async fn claim(api: &Api, session: &str) -> anyhow::Result<mango_protocol::Work> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(work) = api.poll_work("?block_ms=999", "bench-supervisor").await? {
            match &work.data {
                WorkData::Session { id } if id == session => {
                    api.ack(&work.id).await?;
                    return Ok(work);
                }
                other => bail!(
                    "polled {} ({other:?}) instead of the Work of {session}",
                    work.id
                ),
            }
        }
        if Instant::now() > deadline {
            bail!("the Work of {session} was not handed out within 10 s");
        }
    }
}

/// Every `agent.tool_use` and `user.tool_result` of `session`, stamped as
/// the api broadcasts its commit to the Session's streams (in the committing
/// task, before any stream or this bench is scheduled: a stamp taken when
/// this task woke would add the bench's own scheduling to every sample).
/// Subscribed before it returns, which also keeps the Session's feed alive,
/// so nothing admitted afterwards is missed.
/// The events of a Session the bench waits for: `kinds`, each stamped as
/// the api publishes it (the feed is held open meanwhile).
pub(crate) fn admissions(
    bench: &Bench,
    session: &str,
    kinds: &'static [&'static str],
    tx: mpsc::UnboundedSender<Arrival>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let mut feed = bench.app.ctx.events.subscribe(session);
    let mut published = bench.publications(session);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                publication = published.recv() => {
                    let Some((at, body)) = publication else { return Ok(()) };
                    let kind = body["type"].as_str().unwrap_or_default();
                    if kinds.contains(&kind) && tx.send((at, (*body).clone())).is_err()
                    {
                        return Ok(());
                    }
                }
                // Only held for the feed's sake; its events come as publications.
                received = feed.recv() => match received {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
                },
            }
        }
    })
}

/// The worker's exit, or never when there is no worker process.
async fn exited(
    child: Option<&mut tokio::process::Child>,
) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(child) => child.wait().await,
        None => std::future::pending().await,
    }
}

pub(crate) fn result_text(event: &Value) -> String {
    match &event["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Forwards every frame of the stream whose event type is `wanted`, stamped on arrival.
async fn read_frames(
    mut response: reqwest::Response,
    wanted: &'static str,
    tx: mpsc::UnboundedSender<Arrival>,
) -> anyhow::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    while let Some(chunk) = response.chunk().await? {
        let arrived = Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(end) = frame_end(&buf) {
            let frame: Vec<u8> = buf.drain(..end).collect();
            let text = std::str::from_utf8(&frame).context("frame is not UTF-8")?;
            let mut event = "message";
            let mut data = String::new();
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if event != wanted {
                continue;
            }
            let body: Value =
                serde_json::from_str(&data).with_context(|| format!("{wanted} frame data"))?;
            if tx.send((arrived, body)).is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A `kB` field (e.g. `VmHWM`) of /proc/<pid>/status.
pub(crate) fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Descendants of `pid` (the worker's shell and its children): count and current VmRSS.
fn children_rss_kib(pid: u32) -> (usize, u64) {
    let mut parents: HashMap<u32, u32> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(ppid) = proc_status_kib(p, "PPid") {
            parents.insert(p, ppid as u32);
        }
    }
    let descends = |mut p: u32| {
        while let Some(&pp) = parents.get(&p) {
            if pp == pid {
                return true;
            }
            if pp <= 1 {
                return false;
            }
            p = pp;
        }
        false
    };
    let kids: Vec<u32> = parents.keys().copied().filter(|&p| descends(p)).collect();
    let rss = kids
        .iter()
        .filter_map(|&p| proc_status_kib(p, "VmRSS"))
        .sum();
    (kids.len(), rss)
}

pub(crate) fn print_log_tail(path: &Path, label: &str) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(30);
    println!("  {label} worker log (last {} lines):", lines.len() - from);
    for line in &lines[from..] {
        println!("    {line}");
    }
}
