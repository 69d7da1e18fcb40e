//! Kubernetes: the supervisor core in this process with the Kubernetes
//! launcher (`PodLauncher`) against testkit's strict fake apiserver (real
//! HTTP on loopback, a real apiserver's admission), serving the bench's
//! api. A sample is the core's own stamps of one item, Ack → delivered:
//! * cold: the Session's PVC found or made, the Pod created and Running,
//!   the secret over a stdin-only attach;
//! * warm: the Session's workspace asked for, the warm Pod and its PVC
//!   bound by label patches, the envelope attached;
//! * kept: a follow-up turn of one Session whose Pod was kept after its
//!   runner's idle end: the Pod rebound by a label patch, the envelope
//!   over a second attach to the runner already waiting in it.
//!
//! The kubelet is this module: it marks each new Pod Running as a watch
//! shows it, and ends deleted ones. In the cold and warm pools no runner
//! runs: once the secret is delivered the bench deletes the Session, and
//! the core removes the Pod. In the kept pool the kubelet runs the real
//! `mango-runner` of each Pod (testkit's `container`, as the
//! `k8s_strict_kept` tests do), so the Session's activation ends at the
//! runner's idle end and its Pod is kept; the runner ends an activation
//! [`IDLE_AFTER_END_TURN_SECONDS`] after an end of turn (its hidden test
//! knob), between turns, never inside a sample.
//!
//! Wall time, so the fake's own work (it runs in this process) and the
//! kubelet's reaction are inside it: an upper bound of the controller's
//! own time. The three pools' turns are interleaved.

use super::cases::until_warm;
use super::kept_image::IDLE_AFTER_END_TURN_SECONDS;
use super::turn::{said, steps_of};
use super::{Environment, Options, Spread};
use crate::harness::Bench;
use crate::runner::Scratch;
use crate::supervisor::{beside_me, config, InProcess};
use anyhow::{bail, Context};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use mango_controller::core::naming;
use mango_controller::core::stages::{Stage, Stamps};
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::pod::ANNOTATION_HANDED_OFF;
use mango_controller::kubernetes::pods::PodStore;
use mango_testkit::apiserver::container::{self, Runner};
use mango_testkit::apiserver::{ApiServer, Attached};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The fake's namespace for the pools' Pods.
const NS: &str = "sandboxes";
/// The api as the cold and warm Pods would reach it (no runner runs in
/// them, so only a value).
const SANDBOX_BASE: &str = "http://mango-api.sandboxes.svc:8080";
/// An item's secret is delivered within this after its message is sent.
const DELIVERED_TIMEOUT: Duration = Duration::from_secs(30);
/// The core is done with an item (its Pod gone, or kept) within this
/// after its Session was deleted, or after its turn ended.
const DONE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the kept pool's Pods wait for their Session's next envelope:
/// far longer than a round of the other pools.
const KEEP_IDLE_SECONDS: u64 = 300;

pub struct KubeResult {
    pub cold: Option<Spread>,
    pub warm: Option<Spread>,
    pub kept: Option<Spread>,
    /// Measured warm turns that did not bind a warm Pod.
    pub warm_went_cold: usize,
    /// Measured kept turns that were not served by the Session's kept Pod.
    pub kept_went_cold: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cold,
    /// With this many warm Pods.
    Warm(usize),
    Kept,
}

/// One pool: its Environment, its WorkerPool in the fake, its core.
struct Pool {
    label: &'static str,
    kind: Kind,
    env: Environment,
    running: InProcess,
    store_watch: tokio::task::JoinHandle<()>,
    /// The kept pool's one Session, once its first turn (not a sample) ended.
    session: Option<String>,
    delivered_ms: Vec<f64>,
    went_cold: usize,
}

/// The WorkerPool `name` with `extra` in its spec, and its key's Secret,
/// stored through the fake's admission, so owner references resolve.
fn worker_pool(
    fake: &ApiServer,
    name: &str,
    env: &Environment,
    extra: Value,
) -> anyhow::Result<Arc<WorkerPool>> {
    let secret = format!("{name}-key");
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret, "namespace": NS},
        "stringData": {"environment-key": env.key}}))
        .map_err(|e| anyhow::anyhow!("the fake refused the pool's Secret: {e:?}"))?;
    let mut spec = json!({"environmentId": env.id, "environmentKeySecret": {"name": secret},
        "maxConcurrency": 2});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    let stored = fake
        .create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}),
        )
        .map_err(|e| anyhow::anyhow!("the fake refused the WorkerPool: {e:?}"))?;
    Ok(Arc::new(
        serde_json::from_value(stored).context("the stored WorkerPool")?,
    ))
}

fn client(fake: &ApiServer) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::new(fake.url.parse()?);
    config.default_namespace = NS.into();
    Ok(kube::Client::try_from(config)?)
}

impl Pool {
    /// The pool `name` of `kind`.
    async fn start(
        bench: &Bench,
        fake: &ApiServer,
        label: &'static str,
        kind: Kind,
        name: &str,
    ) -> anyhow::Result<Pool> {
        let env = Environment::new(bench, label).await;
        let (spec, base) = match kind {
            Kind::Cold => (json!({}), SANDBOX_BASE),
            Kind::Warm(n) => (json!({"warm": {"replicas": n}}), SANDBOX_BASE),
            // Its runners reach the bench's api.
            Kind::Kept => (
                json!({"keepIdle": KEEP_IDLE_SECONDS}),
                bench.app.base.as_str(),
            ),
        };
        let pool = worker_pool(fake, name, &env, spec)?;
        let client = client(fake)?;
        let (store, store_watch) = PodStore::watching(
            Api::<Pod>::namespaced(client.clone(), NS),
            &pool_selector(name).map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        // As the operator makes it: warm Pods (when the pool has any) and
        // the template a kept Pod is compared with reach the api at `base`.
        let launcher =
            PodLauncher::new(client, pool.clone(), "mango-sandbox:bench", store).with_warm(base);
        let mut config = config(bench, base, name, 2);
        config.environment_id = env.id.clone();
        config.warm = match kind {
            Kind::Warm(n) => n,
            _ => 0,
        };
        config.keep_idle = pool.spec.keep_idle();
        // Stopped Work's Pods go, and an idle end is read, sooner (between
        // turns, not measured).
        config.claims_every = Duration::from_millis(500);
        let running = InProcess::start_with_key(bench, config, launcher, &env.key).await?;
        Ok(Pool {
            label,
            kind,
            env,
            running,
            store_watch,
            session: None,
            delivered_ms: Vec::new(),
            went_cold: 0,
        })
    }

    async fn turn(
        &mut self,
        bench: &Bench,
        fake: &ApiServer,
        agent: &str,
        measured: bool,
    ) -> anyhow::Result<()> {
        let stamps = match self.kind {
            Kind::Kept => self.kept_turn(bench, agent).await?,
            _ => self.new_session_turn(bench, fake, agent).await?,
        };
        let (Some(acked), Some(delivered)) =
            (stamps.get(Stage::Acked), stamps.get(Stage::Delivered))
        else {
            bail!(
                "{}: an item has no acked or delivered stamp: {:?}",
                self.label,
                stamps.offsets_ms()
            );
        };
        let ms = crate::measure::ms(delivered.saturating_duration_since(acked));
        // Warm and kept bind what exists; cold creates.
        let reused = stamps.get(Stage::Bound).is_some() && stamps.get(Stage::Created).is_none();
        let reuses = self.kind != Kind::Cold;
        println!(
            "ttfi: kubernetes {}: {} turn: Ack → delivered {ms:7.2} ms ({}){}",
            self.label,
            if measured { "measured" } else { "warm-up" },
            said(&steps_of(&stamps, Stage::Acked)),
            if reuses && !reused {
                " (no warm or kept Pod bound: started cold)"
            } else {
                ""
            }
        );
        if measured {
            self.delivered_ms.push(ms);
            if reuses && !reused {
                self.went_cold += 1;
            }
        }
        Ok(())
    }

    /// One new Session's first item (cold or warm), its stamps.
    async fn new_session_turn(
        &mut self,
        bench: &Bench,
        fake: &ApiServer,
        agent: &str,
    ) -> anyhow::Result<Stamps> {
        if let Kind::Warm(n) = self.kind {
            until_warm(&self.running, n, self.label).await?;
        }
        let api = &self.env.api;
        let session = api.create_session(agent, &self.env.id).await?;
        api.send_message(&session, "run one command").await?;
        let work_id = until_delivered(bench, fake, &session).await?;
        // No runner answers the tool call: a stopped Work would leave it
        // waiting, and the api would start the Session again (a Pod outside
        // the samples, holding a slot or a warm Pod). A deleted Session is
        // started no more, and its Work is gone: the core's claims watch
        // ends the item and removes its Pod.
        api.delete_session(&session).await?;
        let record = self
            .running
            .collector
            .done_with(&work_id, DONE_TIMEOUT)
            .await?;
        if record.stamps.get(Stage::Delivered).is_none() {
            bail!(
                "{}: {work_id} was not delivered: {:?}",
                self.label,
                record.error
            );
        }
        Ok(record.stamps)
    }

    /// A follow-up turn of the kept pool's Session, sent once its Pod is
    /// kept; its stamps once the turn ended idle (the Pod kept again).
    async fn kept_turn(&mut self, bench: &Bench, agent: &str) -> anyhow::Result<Stamps> {
        let session = match &self.session {
            Some(session) => session.clone(),
            None => {
                // Its first turn starts a cold Pod: not a sample.
                let session = self.env.api.create_session(agent, &self.env.id).await?;
                self.activation(bench, &session).await?;
                self.session.insert(session).clone()
            }
        };
        until_kept(&self.running, self.label).await?;
        self.activation(bench, &session).await
    }

    /// Sends `session` a message; the stamps of the item it made, once
    /// that ended at the runner's idle end.
    async fn activation(&self, bench: &Bench, session: &str) -> anyhow::Result<Stamps> {
        let before: HashSet<String> = work_of(bench, session).await.into_iter().collect();
        self.env
            .api
            .send_message(session, "run one command")
            .await?;
        let started = Instant::now();
        let work_id = loop {
            if let Some(new) = work_of(bench, session)
                .await
                .into_iter()
                .find(|id| !before.contains(id))
            {
                break new;
            }
            if started.elapsed() > DELIVERED_TIMEOUT {
                bail!(
                    "{}: {session} made no Work within {DELIVERED_TIMEOUT:?}",
                    self.label
                );
            }
            // A poll interval inside the deadline above (not inside a
            // sample: the figure is the core's own stamps).
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let within = DONE_TIMEOUT + Duration::from_secs(IDLE_AFTER_END_TURN_SECONDS);
        let record = self.running.collector.done_with(&work_id, within).await?;
        if record.stamps.get(Stage::Delivered).is_none() || record.error.is_some() {
            bail!(
                "{}: {work_id} ended without serving its turn: {:?} ({:?})",
                self.label,
                record.outcome,
                record.error
            );
        }
        Ok(record.stamps)
    }
}

async fn work_of(bench: &Bench, session: &str) -> Vec<String> {
    bench
        .app
        .session_work(session)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Until the kept pool's Session has its Pod kept.
async fn until_kept(running: &InProcess, label: &str) -> anyhow::Result<()> {
    let within = DONE_TIMEOUT + Duration::from_secs(IDLE_AFTER_END_TURN_SECONDS);
    let started = Instant::now();
    while running.metrics.kept.load(Relaxed) < 1 {
        if started.elapsed() > within {
            bail!("{label}: no Pod kept {within:?} after the last turn");
        }
        // A poll interval inside the deadline above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Until the Pod of `session`'s Work is marked handed off (its secret or
/// envelope delivered); the Work's id.
async fn until_delivered(bench: &Bench, fake: &ApiServer, session: &str) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let handed: Option<String> = fake.pods().into_iter().find_map(|name| {
            let pod = fake.pod(&name)?;
            let labels = &pod["metadata"]["labels"];
            (labels["mango.dev/session-id"] == session
                && !pod["metadata"]["annotations"][ANNOTATION_HANDED_OFF].is_null())
            .then(|| labels["mango.dev/work-id"].as_str().map(String::from))
            .flatten()
        });
        if let Some(work_id) = handed {
            return Ok(work_id);
        }
        if started.elapsed() > DELIVERED_TIMEOUT {
            let work = bench.app.session_work(session).await;
            bail!("{session}: no Pod handed off within {DELIVERED_TIMEOUT:?}; its Work: {work:?}");
        }
        // A poll interval inside the deadline above (not inside a sample:
        // the figure is the core's own stamps).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The containers of the kept pool's Pods: a real runner each, started by
/// its Pod's first attach and fed its later ones.
struct Containers {
    pool: String,
    runner: Arc<Runner>,
    volumes: Scratch,
    /// The runner's hidden test knob: its idle end comes sooner.
    extra: Arc<Vec<(String, String)>>,
    /// The open stdin of each Pod's runner (`stdinOnce: false`).
    stdins: Mutex<HashMap<String, mpsc::UnboundedSender<Vec<u8>>>>,
    /// Pods whose runner runs: deleted, they end once it was stopped.
    running_now: Arc<Mutex<HashSet<String>>>,
}

impl Containers {
    fn new(bench: &Bench, pool: String) -> anyhow::Result<Containers> {
        Ok(Containers {
            pool,
            runner: Arc::new(Runner {
                program: beside_me("mango-runner")?,
                args: Vec::new(),
            }),
            volumes: Scratch::new(&format!("{}_ttfi_k8s", bench.db_name))?,
            extra: Arc::new(vec![(
                "MANGO_IDLE_AFTER_END_TURN_SECONDS".into(),
                IDLE_AFTER_END_TURN_SECONDS.to_string(),
            )]),
            stdins: Mutex::default(),
            running_now: Arc::default(),
        })
    }

    fn runs(&self, pod: &str) -> bool {
        self.running_now.lock().expect("running lock").contains(pod)
    }

    /// What an attach delivered to a kept-pool Pod: to its runner's open
    /// stdin, or to a runner it starts.
    fn attached(&self, fake: &Arc<ApiServer>, attached: Attached) {
        let ours = attached.manifest["metadata"]["labels"][naming::LABEL_POOL] == self.pool;
        if !ours || !attached.reached || attached.stdin.is_empty() {
            return;
        }
        let mut stdins = self.stdins.lock().expect("stdins lock");
        if let Some(open) = stdins.get(&attached.pod) {
            if open.send(attached.stdin.clone()).is_ok() {
                return;
            }
        }
        let (tx, later) = mpsc::unbounded_channel();
        stdins.insert(attached.pod.clone(), tx);
        self.running_now
            .lock()
            .expect("running lock")
            .insert(attached.pod.clone());
        let (fake, runner, volumes, extra, running_now): (_, _, PathBuf, _, _) = (
            fake.clone(),
            self.runner.clone(),
            self.volumes.0.clone(),
            self.extra.clone(),
            self.running_now.clone(),
        );
        tokio::spawn(async move {
            let pod = attached.pod.clone();
            container::run_container(
                fake.clone(),
                runner,
                volumes,
                attached,
                extra,
                Some(later),
                running_now,
            )
            .await;
            // Stopped by its Pod's deletion: nothing runs in it any more.
            if container::terminating(&fake, &pod) {
                fake.pod_terminated(&pod);
            }
        });
    }
}

/// The kubelet of every Pod in the fake: Running as soon as a watch shows
/// it, gone as soon as it is deleted and nothing runs in it; attaches go
/// to `containers` (the fake answers them itself).
fn kubelet(
    fake: Arc<ApiServer>,
    containers: Arc<Containers>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let pods = Api::<Pod>::namespaced(client(&fake)?, NS);
    Ok(tokio::spawn(async move {
        let mut seen = watcher::watcher(pods, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            tokio::select! {
                pod = seen.next() => match pod {
                    Some(Ok(pod)) => play(&fake, &containers, &pod),
                    Some(Err(_)) => {} // the watcher resumes by itself
                    None => return,
                },
                attached = fake.attached(Duration::from_secs(3600)) => {
                    if let Some(attached) = attached {
                        containers.attached(&fake, attached);
                    }
                }
            }
        }
    }))
}

fn play(fake: &ApiServer, containers: &Containers, pod: &Pod) {
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        if !containers.runs(&name) {
            fake.pod_terminated(&name);
        }
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Pending") {
        // Running, or ended (its runner's exit): not started again.
        return;
    }
    let Some(stored) = fake.pod(&name) else {
        return;
    };
    fake.set_pod_status(&name, running(&stored));
}

/// A Running status for each of `pod`'s containers.
fn running(pod: &Value) -> Value {
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}})
        })
        .collect();
    json!({"phase": "Running", "containerStatuses": statuses})
}

pub async fn run(bench: &Bench, agent: &str, opts: &Options) -> anyhow::Result<KubeResult> {
    let fake = Arc::new(ApiServer::start().await);
    let kept = crate::supervisor::pool("k8s-kept");
    let kubelet = kubelet(
        fake.clone(),
        Arc::new(Containers::new(bench, kept.clone())?),
    )?;
    let pool = crate::supervisor::pool;
    let mut pools = vec![
        Pool::start(bench, &fake, "cold", Kind::Cold, &pool("k8s-cold")).await?,
        Pool::start(
            bench,
            &fake,
            "warm",
            Kind::Warm(opts.warm),
            &pool("k8s-warm"),
        )
        .await?,
        Pool::start(bench, &fake, "kept", Kind::Kept, &kept).await?,
    ];
    let mut outcome = Ok(());
    'rounds: for round in 0..opts.warmup + opts.turns {
        let measured = round >= opts.warmup;
        let n = pools.len();
        for i in 0..n {
            let pool = &mut pools[(round + i) % n];
            if let Err(err) = pool.turn(bench, &fake, agent, measured).await {
                outcome = Err(err);
                break 'rounds;
            }
        }
    }
    let mut result = KubeResult {
        cold: None,
        warm: None,
        kept: None,
        warm_went_cold: 0,
        kept_went_cold: 0,
    };
    for pool in pools {
        if let Err(err) = pool.running.shutdown().await {
            println!("ttfi: kubernetes {}: {err:#}", pool.label);
            if outcome.is_ok() {
                outcome = Err(err);
            }
        }
        pool.store_watch.abort();
        let spread = Spread::of(&pool.delivered_ms);
        match pool.kind {
            Kind::Cold => result.cold = spread,
            Kind::Warm(_) => (result.warm, result.warm_went_cold) = (spread, pool.went_cold),
            Kind::Kept => (result.kept, result.kept_went_cold) = (spread, pool.went_cold),
        }
    }
    kubelet.abort();
    outcome?;
    Ok(result)
}

pub fn report(r: &KubeResult, target_p50_ms: f64) {
    match r.cold {
        Some(c) => println!("ttfi: kubernetes cold (strict fake): Ack → delivered {c}"),
        None => println!("ttfi: kubernetes cold: no samples"),
    }
    let against_cold = |p50: f64| {
        r.cold
            .map(|c| format!(" = {:.3}× cold's {:.2} ms", p50 / c.p50, c.p50))
            .unwrap_or_default()
    };
    for (label, spread, went_cold, what) in [
        ("warm", r.warm, r.warm_went_cold, "bound a warm Pod"),
        (
            "kept",
            r.kept,
            r.kept_went_cold,
            "were served by the Session's kept Pod",
        ),
    ] {
        match spread {
            Some(s) => println!(
                "ttfi: kubernetes {label} (strict fake): Ack → delivered {s}{} (target p50 ≤ {target_p50_ms} ms: {}); {} of {} measured turns {what}",
                against_cold(s.p50),
                super::verdict(s.p50 <= target_p50_ms),
                s.n - went_cold,
                s.n
            ),
            None => println!("ttfi: kubernetes {label}: no samples"),
        }
    }
}
