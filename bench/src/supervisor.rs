//! `supervisor`: the supervisor core (`mango-controller`'s [`Supervisor`])
//! in this process, with the Docker launcher and with the local launcher,
//! over the bench's api, and the bare cost of the same image beside it.
//!
//! Per launcher:
//! * **items**: healthchecks created one at a time (after a warm-up), each
//!   waited for until the supervisor is done with it. A sample is poll →
//!   first heartbeat: from the supervisor's `polled` stamp (the Poll's answer
//!   in hand) to the Work's `started_at`, which the api sets at the runner's
//!   first heartbeat; the two clocks are tied together (monotonic → wall)
//!   right before each item. Also: healthcheck create → `succeeded`
//!   (`created_at` → `result_committed_at`, both the api's), and the step
//!   between each of the supervisor's stage stamps (polled, acked, created,
//!   started, delivered, exited, gone);
//! * **concurrent**: 20 healthchecks created at once; all must succeed;
//! * **peak RSS**: the supervisor as its own process (`mango-worker docker`
//!   or `mango-worker local`, next to this executable) serving 20 Sessions
//!   whose runners stay live (their Sessions have a message and no model
//!   answers); `VmHWM` of that process, read with the 20 sandboxes up and
//!   again after they are gone. Measuring the in-process supervisor would
//!   count the bench and the api.
//!
//! The baseline (Docker only), interleaved with the Docker items: create,
//! attach stdin, start and wait for the exit of a `/bin/true` container of
//! the same image and the same configuration (the launcher's own container
//! body, hardening and network included) through the same client (bollard),
//! then remove it (not timed). Poll → first heartbeat must stay within 1.3×
//! its median.
//!
//! Without a Docker engine (or without the image) the Docker half is
//! reported as skipped and the local half still runs.

use crate::chart::Chart;
use crate::harness::Bench;
use crate::measure::{ms, percentile};
use anyhow::{bail, Context};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    RemoveVolumeOptions, StartContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use chrono::{DateTime, Utc};
use clap::Parser;
use futures::StreamExt;
use mango_controller::core::config::Config;
use mango_controller::core::launcher::{ItemIdentity, Launcher, SandboxSpec};
use mango_controller::core::metrics::{Metrics, Outcome};
use mango_controller::core::observer::{Happening, Observer};
use mango_controller::core::secret::Secret;
use mango_controller::core::stages::{Stage, Stamps};
use mango_controller::core::supervisor::{RunEnd, Stop, Supervisor};
use mango_controller::docker::{session_volume, DockerArgs, DockerLauncher};
use mango_controller::local::{LocalLauncher, RunnerCommand};
use mango_protocol::WorkType;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

/// Docker poll → first heartbeat, median, at most this many times the baseline's.
pub const TARGET_DOCKER_RATIO: f64 = 1.3;
pub const TARGET_LOCAL_FIRST_BEAT_MS: f64 = 25.0;
pub const TARGET_RSS_MIB: f64 = 25.0;
/// One item, from its creation to the supervisor being done with it.
const ITEM_TIMEOUT: Duration = Duration::from_secs(60);
/// Sandboxes starting together on a busy machine.
const LIVE_TIMEOUT: Duration = Duration::from_secs(180);

pub struct Options {
    /// Measured healthchecks, one at a time, per launcher.
    pub items: usize,
    /// Unmeasured ones before them.
    pub warmup: usize,
    /// Healthchecks created at once, per launcher; and the live Sessions of
    /// the peak-RSS measurement.
    pub concurrent: usize,
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "MISSES"
    }
}

// ------------------------------------------------------------------ the engine

/// The Docker engine, the sandbox image, and where sandboxes reach the host.
pub struct DockerEnv {
    pub(crate) docker: Docker,
    pub(crate) image: String,
    pub(crate) version: String,
    /// The fenced sandbox network's gateway (`host.docker.internal` in a
    /// sandbox): the api listens there too, for the sandboxes.
    pub gateway: IpAddr,
}

/// The engine and the image, or why the Docker half is skipped.
pub async fn docker_env(image: &str) -> Result<DockerEnv, String> {
    let docker =
        Docker::connect_with_local_defaults().map_err(|e| format!("no Docker engine ({e})"))?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| format!("no Docker engine answers ({e})"))?;
    let version = docker
        .version()
        .await
        .ok()
        .and_then(|v| v.version)
        .unwrap_or_else(|| "?".into());
    if let Err(err) = docker.inspect_image(image).await {
        return Err(format!(
            "the sandbox image {image} is missing ({err}): build it with \
             `MANGO_SANDBOX_IMAGE={image} scripts/sandbox-image.sh --release` \
             (`make bench-supervisor` does)"
        ));
    }
    // The default network's, as `mango-worker docker` makes it.
    let gateway = mango_controller::docker::fenced_network(&docker, "mango-sandboxes")
        .await
        .map(|network| IpAddr::V4(network.gateway))
        .map_err(|e| format!("cannot tell where sandboxes reach the host: {e}"))?;
    Ok(DockerEnv {
        docker,
        image: image.to_string(),
        version,
        gateway,
    })
}

/// The Docker launcher's arguments exactly as `mango-worker docker` would
/// parse them (its defaults for limits and network), with this image.
pub(crate) fn docker_args(image: &str, sandbox_base_url: &str) -> anyhow::Result<DockerArgs> {
    #[derive(Parser)]
    struct Worker {
        #[command(flatten)]
        docker: DockerArgs,
    }
    let parsed = Worker::try_parse_from([
        "mango-worker",
        "--sandbox-base-url",
        sandbox_base_url,
        "--image",
        image,
    ])
    .context("the Docker launcher's arguments")?;
    Ok(parsed.docker)
}

// ------------------------------------------------------------------ the results

/// Median and p90 of one figure, in ms.
#[derive(Clone, Copy)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
}

impl Spread {
    fn of(samples: &[f64]) -> Spread {
        let mut s = samples.to_vec();
        Spread {
            p50: percentile(&mut s, 50.0),
            p90: percentile(&mut s, 90.0),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "p50 {:.2} ms, p90 {:.2} ms", self.p50, self.p90)
    }
}

pub struct LauncherResult {
    pub first_beat: Spread,
    pub healthcheck: Spread,
    /// The samples behind the two spreads.
    pub first_beat_ms: Vec<f64>,
    pub healthcheck_ms: Vec<f64>,
    /// Healthchecks created at once that succeeded, of how many.
    pub concurrent_ok: (usize, usize),
    /// `VmHWM` of `mango-worker` with the live sandboxes up, and over its run.
    pub rss_live_mib: f64,
    pub rss_peak_mib: f64,
}

pub struct SupervisorResult {
    pub docker: Option<LauncherResult>,
    /// The bare container's create → exit, Docker only.
    pub floor: Option<Spread>,
    pub floor_ms: Vec<f64>,
    pub local: LauncherResult,
}

impl SupervisorResult {
    /// Each launcher's two figures, and the bare container beside Docker's.
    pub fn chart(&self) -> Chart {
        let mut chart = Chart::new(
            "supervisor",
            "supervisor: healthchecks one at a time, per launcher",
        );
        match &self.docker {
            Some(d) => {
                chart.case("docker: poll → first heartbeat", &d.first_beat_ms);
                chart.case("docker: bare container create → exit", &self.floor_ms);
                chart.case("docker: create → succeeded", &d.healthcheck_ms);
            }
            None => chart.case("docker (skipped)", &[]),
        }
        chart.case("local: poll → first heartbeat", &self.local.first_beat_ms);
        chart.case("local: create → succeeded", &self.local.healthcheck_ms);
        chart
    }

    pub fn docker_ratio(&self) -> Option<f64> {
        Some(self.docker.as_ref()?.first_beat.p50 / self.floor?.p50)
    }

    /// The larger peak of the launchers measured.
    pub fn rss_mib(&self) -> f64 {
        self.docker
            .iter()
            .chain([&self.local])
            .map(|r| r.rss_peak_mib)
            .fold(0.0, f64::max)
    }

    /// The launcher with the fewer successes of its concurrent healthchecks.
    pub fn concurrent_ok(&self) -> (usize, usize) {
        self.docker
            .iter()
            .chain([&self.local])
            .map(|r| r.concurrent_ok)
            .min_by_key(|(ok, of)| (*ok as i64) - (*of as i64))
            .unwrap_or((0, 0))
    }
}

// ------------------------------------------------------------------ watching the core

/// What the supervisor did with one item.
pub(crate) struct Record {
    pub(crate) stamps: Stamps,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) error: Option<String>,
}

/// What the core said of an item before it was done: its outcome, and why
/// its launch failed.
type Pending = HashMap<String, (Option<Outcome>, Option<String>)>;

#[derive(Default)]
struct Items {
    pending: Pending,
    /// Who waits for which item.
    waiting: HashMap<String, oneshot::Sender<Record>>,
    /// Items done before anyone waited for them.
    early: HashMap<String, Record>,
}

/// The core's observer: each finished item's stamps and outcome, by Work id.
#[derive(Default)]
pub(crate) struct Collector {
    items: Mutex<Items>,
}

impl Observer for Collector {
    fn observe(&self, happening: Happening<'_>) {
        let mut items = self.items.lock().expect("collector lock");
        match happening {
            Happening::Removed { sandbox, outcome } => {
                items
                    .pending
                    .entry(sandbox.item.work_id.clone())
                    .or_default()
                    .0 = Some(outcome);
            }
            Happening::LaunchFailed { item, error } => {
                items.pending.insert(
                    item.work_id.clone(),
                    (Some(Outcome::LaunchFailed), Some(error.to_string())),
                );
            }
            Happening::Done { item, stamps } => {
                let (outcome, error) = items.pending.remove(&item.work_id).unwrap_or_default();
                let record = Record {
                    stamps: stamps.clone(),
                    outcome,
                    error,
                };
                match items.waiting.remove(&item.work_id) {
                    Some(tx) => {
                        let _ = tx.send(record);
                    }
                    None => {
                        items.early.insert(item.work_id.clone(), record);
                    }
                }
            }
            _ => {}
        }
    }
}

impl Collector {
    /// Until the supervisor is done with Work `id` (at most `within`).
    pub(crate) async fn done_with(&self, id: &str, within: Duration) -> anyhow::Result<Record> {
        let rx = {
            let mut items = self.items.lock().expect("collector lock");
            if let Some(record) = items.early.remove(id) {
                return Ok(record);
            }
            let (tx, rx) = oneshot::channel();
            items.waiting.insert(id.to_string(), tx);
            rx
        };
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(record)) => Ok(record),
            Ok(Err(_)) => bail!("{id}: the supervisor stopped"),
            Err(_) => bail!("{id}: the supervisor was not done with it within {within:?}"),
        }
    }
}

/// Monotonic instants as the wall-clock times the api stamps rows with.
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    at: Instant,
    wall: DateTime<Utc>,
}

impl Clock {
    pub(crate) fn now() -> Clock {
        Clock {
            at: Instant::now(),
            wall: Utc::now(),
        }
    }

    pub(crate) fn wall(&self, instant: Instant) -> DateTime<Utc> {
        let delta = |d: Duration| chrono::Duration::from_std(d).unwrap_or_default();
        if instant >= self.at {
            self.wall + delta(instant - self.at)
        } else {
            self.wall - delta(self.at - instant)
        }
    }
}

pub(crate) fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// One healthcheck as the api recorded it.
struct Row {
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    result_committed_at: Option<DateTime<Utc>>,
    status: Option<String>,
    message: Option<String>,
}

async fn row(bench: &Bench, id: &str) -> anyhow::Result<Row> {
    type Cols = (
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        Option<String>,
        Option<String>,
    );
    let (created_at, started_at, result_committed_at, status, message): Cols = sqlx::query_as(
        "SELECT created_at, started_at, result_committed_at, result_status, result_message
         FROM work WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&bench.app.db)
    .await
    .with_context(|| format!("reading {id}"))?;
    Ok(Row {
        created_at,
        started_at,
        result_committed_at,
        status,
        message,
    })
}

/// One healthcheck through the supervisor.
struct Sample {
    first_beat_ms: f64,
    healthcheck_ms: f64,
    /// The step into each stage from the one before it, ms.
    steps: Vec<(Stage, f64)>,
    /// From the secret delivered to the runner's first heartbeat.
    delivered_to_beat_ms: Option<f64>,
    outcome: Option<Outcome>,
}

/// What the api and the supervisor say of healthcheck `id`; an error unless
/// it succeeded.
async fn sample(bench: &Bench, id: &str, record: Record, clock: Clock) -> anyhow::Result<Sample> {
    let row = row(bench, id).await?;
    if row.status.as_deref() != Some("succeeded") {
        bail!(
            "{id} did not succeed: {} ({}); the supervisor: {:?}{}",
            row.status.as_deref().unwrap_or("no result"),
            row.message.as_deref().unwrap_or(""),
            record.outcome,
            record
                .error
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default()
        );
    }
    let polled = record
        .stamps
        .get(Stage::Polled)
        .with_context(|| format!("{id}: no polled stamp"))?;
    let started = row
        .started_at
        .with_context(|| format!("{id} succeeded without a heartbeat"))?;
    let committed = row
        .result_committed_at
        .with_context(|| format!("{id} succeeded without a result time"))?;
    Ok(Sample {
        first_beat_ms: ms_between(clock.wall(polled), started),
        healthcheck_ms: ms_between(row.created_at, committed),
        steps: record
            .stamps
            .steps()
            .into_iter()
            .map(|(stage, s)| (stage, s * 1000.0))
            .collect(),
        delivered_to_beat_ms: record
            .stamps
            .get(Stage::Delivered)
            .map(|d| ms_between(clock.wall(d), started)),
        outcome: record.outcome,
    })
}

// ------------------------------------------------------------------ one run of the core

/// The supervisor core with `launcher`, in this process, until `stop`.
pub(crate) struct InProcess {
    pub(crate) collector: Arc<Collector>,
    pub(crate) metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<Stop>>,
    done: tokio::task::JoinHandle<RunEnd>,
}

impl InProcess {
    async fn start<L: Launcher>(
        bench: &Bench,
        config: Config,
        launcher: L,
    ) -> anyhow::Result<InProcess> {
        Self::start_with_key(bench, config, launcher, &bench.app.env_key).await
    }

    /// [`InProcess::start`] with the Environment key `env_key` (of `config`'s Environment).
    pub(crate) async fn start_with_key<L: Launcher>(
        bench: &Bench,
        config: Config,
        launcher: L,
        env_key: &str,
    ) -> anyhow::Result<InProcess> {
        let key = Secret::new(env_key.to_string());
        let collector = Arc::new(Collector::default());
        let supervisor = Supervisor::new(config, launcher, &bench.app.base, &key)
            .with_observer(collector.clone());
        let metrics = supervisor.metrics();
        supervisor
            .check_key(&key)
            .await
            .map_err(|e| anyhow::anyhow!("the supervisor refused to start: {e}"))?;
        let (stop, stopped) = oneshot::channel::<Stop>();
        let done =
            tokio::spawn(supervisor.run_until(async { stopped.await.unwrap_or(Stop::Drain) }));
        Ok(InProcess {
            collector,
            metrics,
            stop: Some(stop),
            done,
        })
    }

    /// SIGTERM's path: drain, then every sandbox is gone.
    pub(crate) async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Drain);
        }
        match tokio::time::timeout(Duration::from_secs(90), &mut self.done).await {
            Ok(Ok(RunEnd::Shutdown)) => Ok(()),
            Ok(Ok(other)) => bail!("the supervisor ended: {other:?}"),
            Ok(Err(err)) => bail!("the supervisor panicked: {err}"),
            Err(_) => {
                self.done.abort();
                bail!("the supervisor did not drain within 90 s")
            }
        }
    }
}

pub(crate) fn config(
    bench: &Bench,
    sandbox_base_url: &str,
    pool: &str,
    max_concurrency: usize,
) -> Config {
    let mut config = Config::new(&bench.app.env_id, sandbox_base_url);
    config.pool = pool.to_string();
    config.max_concurrency = max_concurrency;
    config.worker_id = format!("mango-bench-{pool}");
    config
}

pub(crate) fn pool(kind: &str) -> String {
    format!("bench-{kind}-{:08x}", rand::random::<u32>())
}

/// Sequential healthchecks (`warmup` unmeasured, then `items`), each
/// preceded by a sample of the bare container when there is a `floor` (the
/// Docker baseline, interleaved). Returns the samples and the floor's.
async fn items(
    bench: &Bench,
    running: &InProcess,
    label: &str,
    opts: &Options,
    mut floor: Option<&mut Floor>,
) -> anyhow::Result<(Vec<Sample>, Vec<f64>)> {
    let mut samples = Vec::with_capacity(opts.items);
    let mut floors = Vec::with_capacity(opts.items);
    for i in 0..opts.warmup + opts.items {
        let measured = i >= opts.warmup;
        let bare = match floor.as_deref_mut() {
            Some(f) => Some(f.sample().await?),
            None => None,
        };
        let clock = Clock::now();
        let id = bench.api.create_check().await?;
        let record = running.collector.done_with(&id, ITEM_TIMEOUT).await?;
        let sample = sample(bench, &id, record, clock).await?;
        if measured {
            println!(
                "supervisor: {label}: item {:>2}/{}: poll → first beat {:7.2} ms, create → succeeded {:7.2} ms{}",
                i - opts.warmup + 1,
                opts.items,
                sample.first_beat_ms,
                sample.healthcheck_ms,
                bare.map(|f| format!(", bare container {f:7.2} ms")).unwrap_or_default()
            );
            samples.push(sample);
            floors.extend(bare);
        } else {
            println!(
                "supervisor: {label}: warm-up {}/{}: poll → first beat {:.2} ms",
                i + 1,
                opts.warmup,
                sample.first_beat_ms
            );
        }
    }
    Ok((samples, floors))
}

/// `n` healthchecks created at once; how many succeeded, and their
/// create → succeeded spread.
async fn concurrent(
    bench: &Bench,
    running: &InProcess,
    label: &str,
    n: usize,
) -> anyhow::Result<(usize, Option<Spread>)> {
    let started = Instant::now();
    let creates = (0..n).map(|_| bench.api.create_check());
    let ids: Vec<String> = futures::future::try_join_all(creates).await?;
    let mut times = Vec::new();
    let mut failures = Vec::new();
    let mut outcomes = Vec::new();
    for id in &ids {
        let record = running.collector.done_with(id, ITEM_TIMEOUT).await?;
        outcomes.push(record.outcome);
        match sample(bench, id, record, Clock::now()).await {
            Ok(s) => times.push(s.healthcheck_ms),
            Err(err) => failures.push(format!("{err:#}")),
        }
    }
    let spread = (!times.is_empty()).then(|| Spread::of(&times));
    println!(
        "supervisor: {label}: {n} healthchecks at once: {}/{n} succeeded, all done in {:.0} ms{}",
        times.len(),
        ms(started.elapsed()),
        spread
            .map(|s| format!("; create → succeeded {s}"))
            .unwrap_or_default()
    );
    for failure in &failures {
        println!("supervisor: {label}:   FAILED {failure}");
    }
    println!(
        "supervisor: {label}: outcomes at once: {} (cancelled: its runner reported, but the sandbox did not exit within the finish grace)",
        outcome_counts(&outcomes)
    );
    Ok((times.len(), spread))
}

/// The items' poll → first beat and create → succeeded, in ms.
fn distributions(samples: &[Sample]) -> (Vec<f64>, Vec<f64>) {
    let first = samples.iter().map(|s| s.first_beat_ms).collect();
    let check = samples.iter().map(|s| s.healthcheck_ms).collect();
    (first, check)
}

/// Prints the items' figures; returns (poll → first beat, create → succeeded).
fn report(label: &str, samples: &[Sample]) -> (Spread, Spread) {
    let (first, check) = distributions(samples);
    let (first, check) = (Spread::of(&first), Spread::of(&check));
    println!(
        "supervisor: {label}: over {} items: poll → first heartbeat {first}; healthcheck create → succeeded {check}",
        samples.len()
    );
    println!("supervisor: {label}: stages, each from the one before (p50 / p90 ms):");
    for stage in &Stage::ALL[1..] {
        let steps: Vec<f64> = samples
            .iter()
            .filter_map(|s| s.steps.iter().find(|(st, _)| st == stage).map(|(_, v)| *v))
            .collect();
        if steps.is_empty() {
            continue;
        }
        let spread = Spread::of(&steps);
        println!(
            "supervisor: {label}:   {:<10} {:8.2} / {:8.2}{}",
            stage.as_str(),
            spread.p50,
            spread.p90,
            if steps.len() < samples.len() {
                format!("  (reached by {} of {})", steps.len(), samples.len())
            } else {
                String::new()
            }
        );
        if *stage == Stage::Delivered {
            let beats: Vec<f64> = samples
                .iter()
                .filter_map(|s| s.delivered_to_beat_ms)
                .collect();
            if !beats.is_empty() {
                let b = Spread::of(&beats);
                println!(
                    "supervisor: {label}:   {:<10} {:8.2} / {:8.2}  (the runner's first heartbeat, from delivered; the api's stamp)",
                    "beat", b.p50, b.p90
                );
            }
        }
    }
    let outcomes: Vec<Option<Outcome>> = samples.iter().map(|s| s.outcome).collect();
    println!(
        "supervisor: {label}: outcomes: {}",
        outcome_counts(&outcomes)
    );
    (first, check)
}

/// `finished 19, cancelled 1`.
fn outcome_counts(outcomes: &[Option<Outcome>]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for outcome in outcomes {
        *counts
            .entry(outcome.map_or("none".into(), |o| format!("{o:?}").to_lowercase()))
            .or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    counts.join(", ")
}

// ------------------------------------------------------------------ the baseline

/// The bare container: the launcher's own body for a healthcheck, with
/// `/bin/true` as its command.
struct Floor {
    docker: Docker,
    body: ContainerCreateBody,
    pool: String,
    n: usize,
}

impl Floor {
    fn new(env: &DockerEnv, launcher: &DockerLauncher, pool: &str) -> Floor {
        let item = ItemIdentity {
            work_id: "work_benchfloor".into(),
            claim: 1,
            environment_id: "env_bench".into(),
            work_type: WorkType::Healthcheck,
            session_id: None,
        };
        let spec = SandboxSpec {
            name: String::new(),
            item,
            labels: BTreeMap::from([("mango.dev/pool".to_string(), pool.to_string())]),
            env: Vec::new(),
        };
        let mut body = launcher.container(&spec, None);
        body.entrypoint = Some(vec!["/bin/true".into()]);
        body.cmd = Some(vec![]);
        Floor {
            docker: env.docker.clone(),
            body,
            pool: pool.to_string(),
            n: 0,
        }
    }

    /// Create, attach stdin, start, wait for the exit (timed); remove.
    async fn sample(&mut self) -> anyhow::Result<f64> {
        self.n += 1;
        let name = format!("{}-{}", self.pool, self.n);
        let t0 = Instant::now();
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    ..Default::default()
                }),
                self.body.clone(),
            )
            .await
            .with_context(|| format!("creating {name}"))?;
        let run = async {
            let attached = self
                .docker
                .attach_container(
                    &created.id,
                    Some(AttachContainerOptions {
                        stdin: true,
                        stream: true,
                        ..Default::default()
                    }),
                )
                .await?;
            self.docker
                .start_container(&created.id, None::<StartContainerOptions>)
                .await?;
            let mut input = attached.input;
            let _ = input.shutdown().await;
            drop(input);
            drop(attached.output);
            let mut waits = self.docker.wait_container(
                &created.id,
                Some(WaitContainerOptions {
                    condition: "not-running".into(),
                }),
            );
            match waits.next().await {
                Some(Ok(_))
                | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => {}
                Some(Err(err)) => return Err(err),
                None => {}
            }
            Ok(t0.elapsed())
        }
        .await;
        let removed = self
            .docker
            .remove_container(
                &created.id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        let elapsed = run.with_context(|| format!("running {name}"))?;
        removed.with_context(|| format!("removing {name}"))?;
        Ok(ms(elapsed))
    }
}

// ------------------------------------------------------------------ the supervisor as a process

/// A binary next to this executable (`make bench-supervisor` builds them there).
pub(crate) fn beside_me(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()
        .context("cannot locate the bench executable")?
        .with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} not found: build it next to the bench with \
             `cargo build --release -p mango-runner -p mango-controller -p mango-bench`",
            path.display()
        );
    }
    Ok(path)
}

/// A scratch directory removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).ok();
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// `VmHWM` (peak) and `VmRSS` of process `pid`, MiB.
pub(crate) fn rss_of(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Ok((
        field("VmHWM:").context("no VmHWM")?,
        field("VmRSS:").context("no VmRSS")?,
    ))
}

/// Reads `pid`'s `VmHWM` and `VmRSS` and raises `peak` to them. The
/// kernel's `VmHWM` is not strictly monotonic as read (the high-water mark is
/// folded in from per-thread counters lazily), so the peak is the largest of
/// every reading.
pub(crate) fn note_rss(pid: u32, peak: &mut f64) -> anyhow::Result<(f64, f64)> {
    let (hwm, rss) = rss_of(pid)?;
    *peak = peak.max(hwm).max(rss);
    Ok((hwm, rss))
}

async fn count_active_sessions(bench: &Bench) -> anyhow::Result<i64> {
    bench
        .count_rows("kind = 'session' AND state = 'active'")
        .await
}

/// `command` (`mango-worker <launcher>` with the launcher's own arguments)
/// serving `n` Sessions whose runners stay live: its peak RSS with them up,
/// and over the whole run (read every 100 ms). `gone` says when its
/// sandboxes are all removed.
async fn rss<G, Fut>(
    bench: &Bench,
    label: &str,
    n: usize,
    command: tokio::process::Command,
    log: &Path,
    mut gone: G,
) -> anyhow::Result<(f64, f64)>
where
    G: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let mut command = command;
    let log_file = std::fs::File::create(log)?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file.try_clone()?))
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .env("MANGO_ENVIRONMENT_KEY", &bench.app.env_key)
        .env("MANGO_ENVIRONMENT_ID", &bench.app.env_id)
        .env("MANGO_BASE_URL", &bench.app.base)
        .env("MANGO_MAX_CONCURRENCY", n.to_string())
        .env("MANGO_METRICS_ADDR", "127.0.0.1:0")
        .env("MANGO_SHUTDOWN_GRACE_SECONDS", "10")
        .env("MANGO_LOG", "warn");
    let mut child = command.spawn().context("starting mango-worker")?;
    let pid = child.id().context("mango-worker's pid")?;
    let mut peak = 0.0;
    let outcome = async {
        let agent = bench.api.create_agent("bench-supervisor").await?;
        let mut sessions = Vec::with_capacity(n);
        for _ in 0..n {
            let session = bench.api.create_session(&agent, &bench.app.env_id).await?;
            bench.api.send_message(&session, "stay").await?;
            sessions.push(session);
        }
        let started = Instant::now();
        let mut last = -1;
        loop {
            let active = count_active_sessions(bench).await?;
            if active != last {
                println!("supervisor: {label}: {active}/{n} Session sandboxes live");
                last = active;
            }
            note_rss(pid, &mut peak)?;
            if active as usize >= n {
                break;
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "mango-worker exited ({status}) with {active}/{n} live; its log: {}",
                    log.display()
                );
            }
            if started.elapsed() > LIVE_TIMEOUT {
                bail!(
                    "only {active}/{n} Session sandboxes live after {LIVE_TIMEOUT:?}; mango-worker's log: {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let the runners' first requests and the first claims checks settle.
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            note_rss(pid, &mut peak)?;
        }
        let (hwm, rss) = note_rss(pid, &mut peak)?;
        let live_peak = peak;
        println!(
            "supervisor: {label}: mango-worker with {n} live sandboxes: VmHWM {hwm:.2} MiB, VmRSS {rss:.2} MiB (peak so far {live_peak:.2} MiB)"
        );
        for session in &sessions {
            for (id, state) in bench.app.session_work(session).await {
                if state != "stopped" {
                    let r = bench
                        .app
                        .call(
                            reqwest::Method::POST,
                            &bench.app.work_path(&format!("/{id}/stop")),
                            Some(&bench.app.ws_key),
                            Some(serde_json::json!({"force": true})),
                        )
                        .await;
                    if r.status != reqwest::StatusCode::NO_CONTENT {
                        bail!("stopping {id}: {} {}", r.status, r.body);
                    }
                }
            }
        }
        let started = Instant::now();
        while !gone().await? {
            note_rss(pid, &mut peak)?;
            if started.elapsed() > LIVE_TIMEOUT {
                bail!("the stopped Sessions' sandboxes are still there after {LIVE_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        note_rss(pid, &mut peak)?;
        anyhow::Ok((live_peak, peak))
    }
    .await;
    // SIGTERM: the supervisor drains and exits.
    // SAFETY: kill(2) on our own child's pid, which it still is (not reaped).
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => println!(
            "supervisor: {label}: mango-worker exited {status}; its log: {}",
            log.display()
        ),
        _ => {
            let _ = child.kill().await;
            println!("supervisor: {label}: mango-worker did not exit on SIGTERM; killed");
        }
    }
    let (live, peak) = outcome?;
    println!(
        "supervisor: {label}: mango-worker peak RSS over the run (launch, {n} live, removal): {peak:.2} MiB"
    );
    Ok((live, peak))
}

// ------------------------------------------------------------------ the two launchers

async fn local(bench: &Bench, opts: &Options) -> anyhow::Result<LauncherResult> {
    let runner = beside_me("mango-runner")?;
    let worker = beside_me("mango-worker")?;
    let label = "local";
    let scratch = Scratch::new("mango-bench-supervisor-local")?;
    let pool = pool("local");
    println!(
        "supervisor: local: the core in this process, runner {}",
        runner.display()
    );
    let launcher = LocalLauncher::new(
        RunnerCommand::new(runner.clone()),
        scratch.0.join("root"),
        &pool,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let running = InProcess::start(
        bench,
        config(bench, &bench.app.base, &pool, opts.concurrent.max(1)),
        launcher,
    )
    .await?;
    let measured = async {
        let (samples, _) = items(bench, &running, label, opts, None).await?;
        let (ok, _) = concurrent(bench, &running, label, opts.concurrent).await?;
        anyhow::Ok((samples, ok))
    }
    .await;
    let stopped = running.shutdown().await;
    let (samples, ok) = measured?;
    stopped?;
    let (first_beat, healthcheck) = report(label, &samples);
    let (first_beat_ms, healthcheck_ms) = distributions(&samples);

    let root = scratch.0.join("rss-root");
    let mut command = tokio::process::Command::new(&worker);
    command
        .arg("local")
        .arg("--runner-bin")
        .arg(&runner)
        .arg("--root")
        .arg(&root)
        .env("MANGO_POOL", pool.replace("local", "local-rss"));
    let records = root.join("sandboxes");
    let (rss_live_mib, rss_peak_mib) = rss(
        bench,
        label,
        opts.concurrent,
        command,
        &scratch.0.join("mango-worker.log"),
        || {
            let records = records.clone();
            async move { Ok(std::fs::read_dir(&records).map_or(true, |d| d.count() == 0)) }
        },
    )
    .await?;
    Ok(LauncherResult {
        first_beat,
        healthcheck,
        first_beat_ms,
        healthcheck_ms,
        concurrent_ok: (ok, opts.concurrent),
        rss_live_mib,
        rss_peak_mib,
    })
}

/// The containers labelled with `pool`.
pub(crate) async fn containers(docker: &Docker, pool: &str) -> anyhow::Result<Vec<String>> {
    let listed = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("mango.dev/pool={pool}")],
            )])),
            ..Default::default()
        }))
        .await?;
    Ok(listed.into_iter().filter_map(|c| c.id).collect())
}

/// Removes what a pool left (after a failure) and the Sessions' volumes.
pub(crate) async fn clean(docker: &Docker, pools: &[&str], sessions: &[String]) {
    for pool in pools {
        for id in containers(docker, pool).await.unwrap_or_default() {
            let _ = docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
    }
    for session in sessions {
        let _ = docker
            .remove_volume(&session_volume(session), None::<RemoveVolumeOptions>)
            .await;
    }
}

async fn docker(
    bench: &Bench,
    opts: &Options,
    env: &DockerEnv,
) -> anyhow::Result<(LauncherResult, Vec<f64>)> {
    let label = "docker";
    let worker = beside_me("mango-worker")?;
    let port = bench
        .app
        .also
        .first()
        .context("the api does not listen for sandboxes")?
        .port();
    let sandbox_base = format!("http://host.docker.internal:{port}");
    let args = docker_args(&env.image, &sandbox_base)?;
    let pool = pool("docker");
    let floor_pool = format!("{pool}-floor");
    println!(
        "supervisor: docker: Docker Engine {}, image {}, sandboxes reach the api at {sandbox_base} (host-gateway {})",
        env.version, env.image, env.gateway
    );
    let launcher = DockerLauncher::connect(&args, &pool)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut floor = Floor::new(env, &launcher, &floor_pool);
    let running = InProcess::start(
        bench,
        config(bench, &sandbox_base, &pool, opts.concurrent.max(1)),
        launcher,
    )
    .await?;
    let measured = async {
        let (samples, floors) = items(bench, &running, label, opts, Some(&mut floor)).await?;
        let (ok, _) = concurrent(bench, &running, label, opts.concurrent).await?;
        anyhow::Ok((samples, floors, ok))
    }
    .await;
    let stopped = running.shutdown().await;
    if measured.is_err() || stopped.is_err() {
        clean(&env.docker, &[&pool, &floor_pool], &[]).await;
    }
    let (samples, floors, ok) = measured?;
    stopped?;
    let (first_beat, healthcheck) = report(label, &samples);
    let (first_beat_ms, healthcheck_ms) = distributions(&samples);
    let floor = Spread::of(&floors);
    println!(
        "supervisor: docker: baseline, the bare container (create, attach, start, exit /bin/true, same image and configuration): {floor}"
    );

    let rss_pool = format!("{pool}-rss");
    let mut command = tokio::process::Command::new(&worker);
    command
        .arg("docker")
        .env("MANGO_POOL", &rss_pool)
        .env("MANGO_DOCKER_BASE_URL", &sandbox_base)
        .env("MANGO_DOCKER_IMAGE", &env.image);
    let scratch = Scratch::new("mango-bench-supervisor-docker")?;
    let measured = rss(
        bench,
        label,
        opts.concurrent,
        command,
        &scratch.0.join("mango-worker.log"),
        || {
            let docker = env.docker.clone();
            let rss_pool = rss_pool.clone();
            async move { Ok(containers(&docker, &rss_pool).await?.is_empty()) }
        },
    )
    .await;
    // The Sessions' volumes go in any case (and anything a failure left).
    let sessions: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT session_id FROM work WHERE environment_id = $1 AND session_id IS NOT NULL",
    )
    .bind(&bench.app.env_id)
    .fetch_all(&bench.app.db)
    .await
    .unwrap_or_default();
    clean(&env.docker, &[&rss_pool], &sessions).await;
    if measured.is_err() {
        // Keep the supervisor's log for the reader.
        let kept = std::env::temp_dir().join("mango-bench-supervisor-docker.log");
        let _ = std::fs::copy(scratch.0.join("mango-worker.log"), &kept);
        println!(
            "supervisor: docker: mango-worker's log is kept at {}",
            kept.display()
        );
    }
    let (rss_live_mib, rss_peak_mib) = measured?;
    Ok((
        LauncherResult {
            first_beat,
            healthcheck,
            first_beat_ms,
            healthcheck_ms,
            concurrent_ok: (ok, opts.concurrent),
            rss_live_mib,
            rss_peak_mib,
        },
        floors,
    ))
}

pub async fn run(
    bench: &Bench,
    opts: &Options,
    docker_env: Option<Result<DockerEnv, String>>,
) -> anyhow::Result<SupervisorResult> {
    let (docker_result, floor_ms) = match &docker_env {
        Some(Ok(env)) => {
            let (result, floors) = docker(bench, opts, env).await?;
            (Some(result), floors)
        }
        Some(Err(why)) => {
            println!("supervisor: Docker part SKIPPED: {why}");
            (None, Vec::new())
        }
        None => (None, Vec::new()),
    };
    let local = local(bench, opts).await?;
    let result = SupervisorResult {
        docker: docker_result,
        floor: (!floor_ms.is_empty()).then(|| Spread::of(&floor_ms)),
        floor_ms,
        local,
    };
    if let (Some(d), Some(ratio)) = (&result.docker, result.docker_ratio()) {
        println!(
            "supervisor: docker poll → first heartbeat p50 {:.2} ms = {ratio:.3}× the bare container's {:.2} ms (target ≤ {TARGET_DOCKER_RATIO}×): {}",
            d.first_beat.p50,
            result.floor.map_or(f64::NAN, |f| f.p50),
            verdict(ratio <= TARGET_DOCKER_RATIO)
        );
    }
    println!(
        "supervisor: local poll → first heartbeat p50 {:.2} ms (target ≤ {TARGET_LOCAL_FIRST_BEAT_MS} ms): {}",
        result.local.first_beat.p50,
        verdict(result.local.first_beat.p50 <= TARGET_LOCAL_FIRST_BEAT_MS)
    );
    let rss = result.rss_mib();
    let each: Vec<String> = [
        ("docker", result.docker.as_ref()),
        ("local", Some(&result.local)),
    ]
    .into_iter()
    .filter_map(|(name, r)| {
        r.map(|r| {
            format!(
                "{name} {:.2} with them live, {:.2} over the run",
                r.rss_live_mib, r.rss_peak_mib
            )
        })
    })
    .collect();
    println!(
        "supervisor: supervisor peak RSS with {} live sandboxes {rss:.2} MiB (the larger of the launchers: {}; target ≤ {TARGET_RSS_MIB} MiB): {}",
        opts.concurrent,
        each.join("; "),
        verdict(rss <= TARGET_RSS_MIB)
    );
    let (ok, of) = result.concurrent_ok();
    println!(
        "supervisor: {of} concurrent healthchecks: {ok}/{of} succeeded (the fewer of the launchers; target all): {}",
        verdict(ok == of)
    );
    Ok(result)
}
