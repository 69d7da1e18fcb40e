//! Kubernetes: the supervisor core in this process with the Kubernetes
//! launcher (`PodLauncher`) against testkit's strict fake apiserver (real
//! HTTP on loopback, a real apiserver's admission), serving the bench's
//! api. A sample is the core's own stamps of one item, Ack → delivered:
//! for a cold item the PVC found or made, the Pod created and Running, the
//! secret over a stdin-only attach; for a warm one the Session's workspace
//! asked for, the warm Pod bound by a label patch, the envelope attached.
//! The kubelet is this module: it marks each new Pod Running as a watch
//! shows it, and ends deleted ones. No runner runs: once the secret is
//! delivered the bench deletes the Session, and the core removes the Pod.
//!
//! Wall time, so the fake's own work (it runs in this process) and the
//! kubelet's reaction are inside it: an upper bound of the controller's
//! own time. Cold and warm turns are interleaved, each a new Session.

use super::cases::until_warm;
use super::{Environment, Options, Spread};
use crate::harness::Bench;
use crate::supervisor::{config, InProcess};
use anyhow::{bail, Context};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use mango_controller::core::stages::Stage;
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::pod::ANNOTATION_HANDED_OFF;
use mango_controller::kubernetes::pods::PodStore;
use mango_testkit::apiserver::ApiServer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fake's namespace for the pools' Pods.
const NS: &str = "sandboxes";
/// The api as the Pods would reach it (no runner runs, so only a value).
const SANDBOX_BASE: &str = "http://mango-api.sandboxes.svc:8080";
/// An item's secret is delivered within this after its message is sent.
const DELIVERED_TIMEOUT: Duration = Duration::from_secs(30);
/// The core is done with an item (its Pod gone) within this after its
/// Session was deleted.
const DONE_TIMEOUT: Duration = Duration::from_secs(60);
/// Why there is no kept figure.
pub const KEPT_NA: &str = "not measured: a Pod is kept only after its runner's idle end, and this bench's kubelet runs no runner (k8s_strict_kept tests keeping with a real one)";

pub struct KubeResult {
    pub cold: Option<Spread>,
    pub warm: Option<Spread>,
    /// Measured warm turns that did not bind a warm Pod.
    pub warm_went_cold: usize,
}

/// One pool: its Environment, its WorkerPool in the fake, its core.
struct Pool {
    label: &'static str,
    env: Environment,
    running: InProcess,
    store_watch: tokio::task::JoinHandle<()>,
    warm: usize,
    delivered_ms: Vec<f64>,
    went_cold: usize,
}

/// The WorkerPool `name` (with `warm` Pods) and its key's Secret, stored
/// through the fake's admission, so owner references resolve.
fn worker_pool(
    fake: &ApiServer,
    name: &str,
    env: &Environment,
    warm: usize,
) -> anyhow::Result<Arc<WorkerPool>> {
    let secret = format!("{name}-key");
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret, "namespace": NS},
        "stringData": {"environment-key": env.key}}))
        .map_err(|e| anyhow::anyhow!("the fake refused the pool's Secret: {e:?}"))?;
    let mut spec = json!({"environmentId": env.id, "environmentKeySecret": {"name": secret},
        "maxConcurrency": 2});
    if warm > 0 {
        spec["warm"] = json!({"replicas": warm});
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
    async fn start(
        bench: &Bench,
        fake: &ApiServer,
        label: &'static str,
        warm: usize,
    ) -> anyhow::Result<Pool> {
        let env = Environment::new(bench, label).await;
        let name = crate::supervisor::pool(if warm == 0 { "k8s-cold" } else { "k8s-warm" });
        let pool = worker_pool(fake, &name, &env, warm)?;
        let client = client(fake)?;
        let (store, store_watch) = PodStore::watching(
            Api::<Pod>::namespaced(client.clone(), NS),
            &pool_selector(&name).map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        let mut launcher = PodLauncher::new(client, pool, "mango-sandbox:bench", store);
        if warm > 0 {
            launcher = launcher.with_warm(SANDBOX_BASE);
        }
        let mut config = config(bench, SANDBOX_BASE, &name, 2);
        config.environment_id = env.id.clone();
        config.warm = warm;
        // Stopped Work's Pods go sooner (between turns, not measured).
        config.claims_every = Duration::from_millis(500);
        let running = InProcess::start_with_key(bench, config, launcher, &env.key).await?;
        Ok(Pool {
            label,
            env,
            running,
            store_watch,
            warm,
            delivered_ms: Vec::new(),
            went_cold: 0,
        })
    }

    /// One new Session's first item: Ack → delivered, ms, and whether a
    /// warm Pod served it.
    async fn turn(
        &mut self,
        bench: &Bench,
        fake: &ApiServer,
        agent: &str,
        measured: bool,
    ) -> anyhow::Result<()> {
        if self.warm > 0 {
            until_warm(&self.running, self.warm, self.label).await?;
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
        let stamps = &record.stamps;
        let (Some(acked), Some(delivered)) =
            (stamps.get(Stage::Acked), stamps.get(Stage::Delivered))
        else {
            bail!(
                "{}: {work_id} has no acked or delivered stamp: {:?} ({:?})",
                self.label,
                stamps.offsets_ms(),
                record.error
            );
        };
        let ms = crate::measure::ms(delivered.saturating_duration_since(acked));
        let warm = stamps.get(Stage::Bound).is_some() && stamps.get(Stage::Created).is_none();
        println!(
            "ttfi: kubernetes {}: {} turn: Ack → delivered {ms:7.2} ms{}",
            self.label,
            if measured { "measured" } else { "warm-up" },
            if self.warm > 0 && !warm {
                " (no warm Pod bound: started cold)"
            } else {
                ""
            }
        );
        if measured {
            self.delivered_ms.push(ms);
            if self.warm > 0 && !warm {
                self.went_cold += 1;
            }
        }
        Ok(())
    }
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

/// The kubelet of every Pod in the fake: Running as soon as a watch shows
/// it, gone as soon as it is deleted (nothing runs in it); attaches are
/// taken and dropped (the fake answers them itself).
fn kubelet(fake: Arc<ApiServer>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let pods = Api::<Pod>::namespaced(client(&fake)?, NS);
    Ok(tokio::spawn(async move {
        let mut seen = watcher::watcher(pods, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            tokio::select! {
                pod = seen.next() => match pod {
                    Some(Ok(pod)) => play(&fake, &pod),
                    Some(Err(_)) => {} // the watcher resumes by itself
                    None => return,
                },
                _ = fake.attached(Duration::from_secs(3600)) => {}
            }
        }
    }))
}

fn play(fake: &ApiServer, pod: &Pod) {
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        fake.pod_terminated(&name);
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Running") {
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
    let kubelet = kubelet(fake.clone())?;
    let mut pools = vec![
        Pool::start(bench, &fake, "cold", 0).await?,
        Pool::start(bench, &fake, "warm", opts.warm).await?,
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
        warm_went_cold: 0,
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
        if pool.warm > 0 {
            result.warm = spread;
            result.warm_went_cold = pool.went_cold;
        } else {
            result.cold = spread;
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
    match r.warm {
        Some(w) => {
            let vs_cold = r
                .cold
                .map(|c| format!(" = {:.3}× cold's {:.2} ms", w.p50 / c.p50, c.p50))
                .unwrap_or_default();
            println!(
                "ttfi: kubernetes warm (strict fake): Ack → delivered {w}{vs_cold} (target p50 ≤ {target_p50_ms} ms: {}); {} of {} measured turns bound a warm Pod",
                super::verdict(w.p50 <= target_p50_ms),
                w.n - r.warm_went_cold,
                w.n
            );
        }
        None => println!("ttfi: kubernetes warm: no samples"),
    }
    println!("ttfi: kubernetes kept: n/a: {KEPT_NA}");
}
