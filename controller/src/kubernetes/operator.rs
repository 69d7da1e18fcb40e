//! The operator: one supervisor per `WorkerPool`, started and stopped with
//! the resource, its status written with server-side apply. A reconcile
//! reads as the decision it makes: is the pool usable, does its supervisor
//! run with the key and spec it has now, and what does its status say.

use crate::core::config::Config;
use crate::core::metrics::{self, Metrics};
use crate::core::secret::Secret;
use crate::core::supervisor::{RunEnd, StartError, Stop, Supervisor};
use crate::kubernetes::crd::{self, WorkerPool, WorkerPoolStatus, SCHEMA_REVISION};
use crate::kubernetes::events::PoolEvents;
use crate::kubernetes::launcher::{pool_selector, HardeningReport, PodLauncher};
use crate::kubernetes::pod;
use crate::kubernetes::pods::PodStore;
use crate::kubernetes::status::{self, Observed, Problem, Progress};
use crate::kubernetes::sweep;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret as KubeSecret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use mango_protocol::QueueStats;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The field manager of the status this controller writes.
pub const FIELD_MANAGER: &str = "mango-controller";
/// How often a pool's status is refreshed while nothing changes.
pub const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How often orphans are swept and supervisors of deleted pools stopped.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Failure classes of a reconcile (the metric label is the variant).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
}

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    /// The api as the controller reaches it, when a pool names none.
    pub default_api_url: Option<String>,
    /// The api as sandboxes reach it, when a pool names neither its
    /// `sandboxApiUrl` nor its `apiUrl` (the api's sandbox listener).
    pub default_sandbox_api_url: Option<String>,
    pub default_sandbox_image: String,
    /// This replica's name in Events.
    pub instance: String,
    /// Compare the cluster's WorkerPool CRD with this controller's schema
    /// (needs `get` on `customresourcedefinitions/workerpools.mango.dev`).
    pub check_crd: bool,
}

/// How long shutting down waits for every pool's supervisor to detach.
const DETACH_ALL_BOUND: Duration = Duration::from_secs(45);

/// What one pool's supervisor was started with, to tell whether it still fits.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fit {
    uid: String,
    generation: i64,
    key_digest: String,
}

/// Ends once a supervisor's task has, and every earlier supervisor of its
/// pool it was waiting for has ended too.
type Ended = Shared<BoxFuture<'static, ()>>;

/// A pool's supervisor while it runs.
struct PoolRun {
    fit: Fit,
    stop: Option<oneshot::Sender<Stop>>,
    ended: Ended,
    metrics: Arc<Metrics>,
    state: Arc<Mutex<RunState>>,
    stats: mango_client::Client,
    environment_id: String,
    hardening: HardeningReport,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RunState {
    /// On its way, or running: what the status shows of it.
    At(Progress),
    Stopped(Problem),
}

/// One per process: the client, the settings, and each pool's supervisor.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    recorder: Recorder,
    reporter: Reporter,
    runs: Mutex<HashMap<String, PoolRun>>,
    /// Each pool's stopped supervisors that the next one has yet to wait
    /// for: it starts only once they have ended.
    stopping: Mutex<HashMap<String, Ended>>,
    /// The last verdict on the cluster's WorkerPool CRD (`None`: not checked).
    crd: Mutex<Option<Result<(), Problem>>>,
    /// The reason each pool's last Event gave, so an Event marks each change once.
    noted: Mutex<HashMap<String, String>>,
    pub reconciles: std::sync::atomic::AtomicU64,
    pub reconcile_failures: std::sync::atomic::AtomicU64,
}

impl Context {
    pub fn new(client: Client, settings: Settings) -> Arc<Context> {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(settings.instance.clone()),
        };
        let recorder = Recorder::new(client.clone(), reporter.clone());
        Arc::new(Context {
            client,
            settings,
            recorder,
            reporter,
            runs: Mutex::default(),
            stopping: Mutex::default(),
            crd: Mutex::default(),
            noted: Mutex::default(),
            reconciles: Default::default(),
            reconcile_failures: Default::default(),
        })
    }

    fn events(&self, pool: &WorkerPool) -> PoolEvents {
        PoolEvents::new(
            self.recorder.clone(),
            self.client.clone(),
            self.reporter.clone(),
            pool.object_ref(&()),
        )
    }

    /// Reads the cluster's WorkerPool CRD and keeps the verdict: no pool
    /// runs on a CRD older than this controller's schema (Helm never
    /// upgrades `crds/`, so after `helm upgrade` the old schema may still
    /// be served, pruning fields and admitting pools this controller
    /// refuses). A failure to reach the API keeps the previous verdict.
    pub async fn check_crd(&self) {
        if !self.settings.check_crd {
            *self.crd.lock().expect("crd lock") = Some(Ok(()));
            return;
        }
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let verdict = match crds.get(crd::CRD_NAME).await {
            Ok(served) => match crd::served_revision(&served) {
                Ok(revision) if revision >= SCHEMA_REVISION => {
                    if revision > SCHEMA_REVISION {
                        tracing::info!(revision, ours = SCHEMA_REVISION, "the cluster serves a newer WorkerPool CRD than this controller's");
                    }
                    Ok(())
                }
                Ok(revision) => Err(Problem::CrdOutdated(format!(
                    "the cluster serves the WorkerPool CRD at schema revision {revision}, older than this controller's {SCHEMA_REVISION}: apply the chart's CRD first (`kubectl apply --server-side -f charts/mango/crds/workerpool.yaml`; helm upgrade never updates it)"
                ))),
                Err(problem) => Err(Problem::CrdOutdated(problem)),
            },
            Err(kube::Error::Api(status)) if status.code == 403 => Err(Problem::CrdUnreadable(format!(
                "this ServiceAccount may not get customresourcedefinitions/{} (the chart's ClusterRole grants it with controller.checkCrd; or run with MANGO_CHECK_CRD=false): {}",
                crd::CRD_NAME, status.message
            ))),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(Problem::CrdOutdated(format!(
                "the WorkerPool CRD ({}) is not installed", crd::CRD_NAME
            ))),
            Err(err) => {
                tracing::warn!(error = %err, "could not read the WorkerPool CRD; keeping the last verdict");
                let mut kept = self.crd.lock().expect("crd lock");
                if kept.is_none() {
                    *kept = Some(Err(Problem::CrdUnreadable(format!(
                        "the WorkerPool CRD could not be read: {err}"
                    ))));
                }
                return;
            }
        };
        if let Err(problem) = &verdict {
            tracing::error!(reason = problem.reason(), error = %problem.message(), "no pool runs on this WorkerPool CRD");
        }
        *self.crd.lock().expect("crd lock") = Some(verdict);
    }

    fn crd_problem(&self) -> Option<Problem> {
        match &*self.crd.lock().expect("crd lock") {
            Some(Err(problem)) => Some(problem.clone()),
            _ => None,
        }
    }

    /// Every pool's supervisor metrics in one exposition.
    pub fn render_metrics(&self) -> String {
        let runs = self.runs.lock().expect("runs lock");
        let mut pools: Vec<(&String, &PoolRun)> = runs.iter().collect();
        pools.sort_by(|a, b| a.0.cmp(b.0));
        let labelled: Vec<(Option<&str>, &Metrics)> = pools
            .iter()
            .map(|(name, run)| (Some(name.as_str()), run.metrics.as_ref()))
            .collect();
        let mut out = metrics::render_pools(&labelled);
        use std::sync::atomic::Ordering::Relaxed;
        out.push_str(&format!(
            "# HELP mango_controller_reconciles_total WorkerPool reconciles.\n# TYPE mango_controller_reconciles_total counter\nmango_controller_reconciles_total {}\n# HELP mango_controller_reconcile_failures_total WorkerPool reconciles that failed.\n# TYPE mango_controller_reconcile_failures_total counter\nmango_controller_reconcile_failures_total {}\n",
            self.reconciles.load(Relaxed),
            self.reconcile_failures.load(Relaxed)
        ));
        out
    }

    /// Stops pool `name`'s supervisor, if one runs; the next one started
    /// for the pool waits until it has ended, and with it every earlier one
    /// it was still waiting for (stopped while it waited, it leaves them
    /// running).
    fn stop(&self, name: &str, how: Stop) {
        let Some(mut run) = self.runs.lock().expect("runs lock").remove(name) else {
            return;
        };
        tracing::info!(pool = %name, ?how, "stopping the pool's supervisor");
        // The run itself decides what the stop means: nothing to undo while
        // it still waits or checks its key, a drain or a detach once it
        // runs. Deciding here, from its state, raced its start.
        if let Some(stop) = run.stop.take() {
            let _ = stop.send(how);
        }
        // Driven here, so the watch ends with the task when no next one waits.
        tokio::spawn(run.ended.clone());
        let mut stopping = self.stopping.lock().expect("stopping lock");
        stopping.retain(|_, ended| ended.peek().is_none());
        // The run waited for what was stopping before it: its end covers theirs.
        stopping.insert(name.to_string(), run.ended);
    }

    /// What pool `name`'s next supervisor waits for before it starts.
    fn predecessors(&self, name: &str) -> Option<Ended> {
        self.stopping.lock().expect("stopping lock").remove(name)
    }

    /// Stops every supervisor (leadership lost, or shutting down) and
    /// returns once each has detached: their Pods keep running for the next
    /// leader to adopt. A supervisor detaches only after the hand-offs it
    /// has begun (each within its request bound), so the process must not
    /// exit before: a Pod cut off mid-hand-off never gets its secret, and
    /// the next leader removes it as one no supervisor handed off.
    pub async fn detach_all(&self) {
        let names: Vec<String> = self
            .runs
            .lock()
            .expect("runs lock")
            .keys()
            .cloned()
            .collect();
        for name in names {
            self.stop(&name, Stop::Detach);
        }
        let stopping: Vec<Ended> = self
            .stopping
            .lock()
            .expect("stopping lock")
            .values()
            .cloned()
            .collect();
        // Each detach is bounded (its request bound, or a drain's grace for
        // one whose key was refused); this bound keeps the whole inside the
        // Deployment's 60 s termination grace, so the Lease is still released.
        if tokio::time::timeout(DETACH_ALL_BOUND, futures::future::join_all(stopping))
            .await
            .is_err()
        {
            tracing::warn!(
                "some pool's supervisor had not detached within {DETACH_ALL_BOUND:?}; exiting all the same"
            );
        }
    }

    /// Stops the supervisors of pools that no longer exist.
    fn stop_deleted(&self, pools: &Store<WorkerPool>) {
        let live: HashMap<String, String> = pools
            .state()
            .iter()
            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
            .collect();
        let gone: Vec<String> = self
            .runs
            .lock()
            .expect("runs lock")
            .iter()
            .filter(|(name, run)| live.get(*name) != Some(&run.fit.uid))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            tracing::info!(pool = %name, "the pool was deleted; its Pods go with it");
            self.stop(&name, Stop::Detach);
        }
    }

    /// The orphan sweep's view of the pools.
    fn pool_bounds(&self, pools: &Store<WorkerPool>) -> sweep::Pools {
        pools
            .state()
            .iter()
            .map(|p| {
                let bounds = sweep::PoolBounds {
                    uid: p.uid().unwrap_or_default(),
                    start_bound: start_bound(p),
                    warm_wait: pod::warm::runner_wait(p),
                };
                (p.name_any(), bounds)
            })
            .collect()
    }
}

fn start_bound(pool: &WorkerPool) -> Duration {
    pool.spec.start_timeout()
}

/// The pool's Environment key, or why there is none to use.
async fn read_key(ctx: &Context, pool: &WorkerPool) -> Result<Secret, Problem> {
    let reference = &pool.spec.environment_key_secret;
    let namespace = pool
        .namespace()
        .unwrap_or_else(|| ctx.settings.namespace.clone());
    let secrets: Api<KubeSecret> = Api::namespaced(ctx.client.clone(), &namespace);
    let secret = match secrets.get_opt(&reference.name).await {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            return Err(Problem::SecretMissing(format!(
                "Secret {} does not exist in namespace {namespace}",
                reference.name
            )))
        }
        Err(kube::Error::Api(status)) if matches!(status.code, 401 | 403) => {
            return Err(Problem::SecretMissing(format!(
                "Secret {} cannot be read: {}",
                reference.name, status.message
            )))
        }
        Err(err) => {
            return Err(Problem::SecretUnreadable(format!(
                "Secret {} cannot be read now: {err}",
                reference.name
            )))
        }
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(reference.key()))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(reference.key()))
                .map(|s| s.trim().to_string())
        });
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Err(Problem::SecretMissing(format!(
            "Secret {} has no key {}",
            reference.name,
            reference.key()
        )));
    };
    if value.starts_with("mango_wsk_") {
        return Err(Problem::WorkspaceKey);
    }
    if !value.starts_with("mango_envk_") {
        return Err(Problem::NotAnEnvironmentKey);
    }
    Ok(Secret::new(value))
}

/// The api as the controller reaches it for `pool`: its `spec.apiUrl`,
/// else the controller's `--default-api-url`.
pub fn api_url(pool: &WorkerPool, default_api_url: Option<&str>) -> Result<String, Problem> {
    pool.spec
        .api_url
        .clone()
        .or_else(|| default_api_url.map(str::to_string))
        .ok_or_else(|| {
            Problem::InvalidSpec(
                "spec.apiUrl is not set and the controller has no --default-api-url".into(),
            )
        })
}

/// The api as `pool`'s sandboxes reach it: its own `sandboxApiUrl`; else,
/// for a pool that leaves the api to the controller, the controller's
/// default sandbox URL; else the api URL the pool uses.
pub fn sandbox_api_url(pool: &WorkerPool, default_sandbox: Option<&str>, api: &str) -> String {
    let spec = &pool.spec;
    spec.sandbox_api_url
        .clone()
        .or_else(|| {
            spec.api_url
                .is_none()
                .then(|| default_sandbox.map(str::to_string))
                .flatten()
        })
        .unwrap_or_else(|| api.to_string())
}

/// Starts pool `pool`'s supervisor for `fit`, detaching one that no longer fits.
fn start(ctx: &Arc<Context>, pool: &Arc<WorkerPool>, fit: Fit, key: Secret, api: String) {
    let name = pool.name_any();
    ctx.stop(&name, Stop::Detach);
    let namespace = pool
        .namespace()
        .unwrap_or_else(|| ctx.settings.namespace.clone());
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    // A valid pool (`usable`) has a valid selector.
    let Ok(selector) = pool_selector(&name) else {
        tracing::error!(pool = %name, "the pool's name is no label value; not started");
        return;
    };
    let predecessors = ctx.predecessors(&name);
    let (store, watch) = PodStore::watching(pods, &selector);
    let launcher = PodLauncher::new(
        ctx.client.clone(),
        pool.clone(),
        &ctx.settings.default_sandbox_image,
        store,
    )
    .with_events(ctx.events(pool));
    let hardening = launcher.hardening();
    let sandbox_api = sandbox_api_url(pool, ctx.settings.default_sandbox_api_url.as_deref(), &api);
    let launcher = launcher.with_warm(&sandbox_api);
    if let Some(egress) = pool.spec.egress.as_ref().filter(|e| e.allow_any) {
        let broad = egress
            .allowlist()
            .map(|list| list.broad())
            .unwrap_or_default();
        tracing::warn!(pool = %name, ?broad, "spec.egress.allowAny: egress wildcards over whole top-level domains or everything are admitted");
    }
    let mut config = Config::new(&pool.spec.environment_id, &sandbox_api);
    config.pool = name.clone();
    config.max_concurrency = pool.spec.max_concurrency as usize;
    config.hand_off_bound = start_bound(pool);
    config.warm = pool.spec.warm_replicas();
    config.keep_idle = pool.spec.keep_idle();
    config.worker_id = format!("{}/{}", ctx.settings.instance, name);
    let stats = mango_client::Client::new(&api, key.expose());
    let supervisor =
        Supervisor::new(config, launcher, &api, &key).with_observer(Arc::new(ctx.events(pool)));
    let metrics = supervisor.metrics();
    let state = Arc::new(Mutex::new(match predecessors {
        Some(_) => RunState::At(Progress::WaitingForPrevious),
        None => RunState::At(Progress::CheckingKey),
    }));
    let (stop_tx, mut stop_rx) = oneshot::channel::<Stop>();
    let task = tokio::spawn({
        let state = state.clone();
        let name = name.clone();
        let predecessors = predecessors.clone();
        async move {
            // The supervisors this one replaces (the pool was edited) detach
            // first: one still handing a Pod its secret would see this one
            // remove it as never handed off, and a warm pool's filler, still
            // running, would replace the warm Pods this one recycles, after
            // this one listed them, and those would be no supervisor's.
            let before_running = async {
                if let Some(predecessors) = predecessors {
                    predecessors.await;
                    *state.lock().expect("state lock") = RunState::At(Progress::CheckingKey);
                }
                // While the api cannot be reached this waits (backing off).
                supervisor.check_key(&key).await
            };
            // A stop before it runs ends it: nothing was launched yet.
            let checked = tokio::select! {
                checked = before_running => checked,
                _ = &mut stop_rx => return,
            };
            drop(key);
            if let Err(err) = checked {
                let problem = match err {
                    StartError::WorkspaceKey(_) => Problem::WorkspaceKey,
                    StartError::NotAnEnvironmentKey => Problem::NotAnEnvironmentKey,
                    StartError::Refused(e) => Problem::KeyRefused(e.to_string()),
                    StartError::WrongEnvironment { error, .. } => {
                        Problem::WrongEnvironment(error.to_string())
                    }
                };
                tracing::error!(pool = %name, error = %problem.message(), "the pool's supervisor does not start");
                *state.lock().expect("state lock") = RunState::Stopped(problem);
                return;
            }
            *state.lock().expect("state lock") = RunState::At(Progress::Running);
            let end = supervisor
                .run_until(async { stop_rx.await.unwrap_or(Stop::Detach) })
                .await;
            if let RunEnd::KeyRefused(why) = end {
                *state.lock().expect("state lock") = RunState::Stopped(Problem::KeyRefused(why));
            }
        }
    });
    let ended = async move {
        let _ = task.await;
        // The watch serves the supervisor only.
        watch.abort();
        if let Some(predecessors) = predecessors {
            predecessors.await;
        }
    }
    .boxed()
    .shared();
    ctx.runs.lock().expect("runs lock").insert(
        name.clone(),
        PoolRun {
            fit,
            stop: Some(stop_tx),
            ended,
            metrics,
            state,
            stats,
            environment_id: pool.spec.environment_id.clone(),
            hardening,
        },
    );
    tracing::info!(pool = %name, "the pool's supervisor starts");
}

/// The reconcile: make the pool's supervisor match the pool, then report.
pub async fn reconcile(pool: Arc<WorkerPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciles
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = pool.name_any();
    let problem = match usable(&ctx, &pool).await {
        Ok((key, api)) => {
            let fit = Fit {
                uid: pool.uid().unwrap_or_default(),
                generation: pool.metadata.generation.unwrap_or(0),
                key_digest: hex::encode(&Sha256::digest(key.expose().as_bytes())[..8]),
            };
            let fits = ctx
                .runs
                .lock()
                .expect("runs lock")
                .get(&name)
                // A supervisor that stopped on its key stays stopped until the
                // key or the spec changes: retrying the same key cannot help.
                .is_some_and(|run| run.fit == fit);
            if !fits {
                start(&ctx, &pool, fit, key, api);
            }
            None
        }
        // An overloaded or restarting API server fails a read now and then;
        // a supervisor already running on the key keeps it, as stopping
        // would only flap the pool and forget what it observed.
        Err(Problem::SecretUnreadable(why))
            if ctx.runs.lock().expect("runs lock").contains_key(&name) =>
        {
            tracing::warn!(pool = %name, error = %why, "could not read the pool's Secret; its supervisor keeps the key it has");
            None
        }
        Err(problem) => {
            ctx.stop(&name, Stop::Detach);
            Some(problem)
        }
    };
    let observed = observe(&ctx, &pool, problem).await;
    let status = status::status(pool.status.as_ref(), &observed);
    note_change(&ctx, &pool, &observed.problem, &status);
    let pools: Api<WorkerPool> = Api::namespaced(
        ctx.client.clone(),
        &pool
            .namespace()
            .unwrap_or_else(|| ctx.settings.namespace.clone()),
    );
    let patch = serde_json::json!({
        "apiVersion": WorkerPool::api_version(&()),
        "kind": WorkerPool::kind(&()),
        "status": status,
    });
    pools
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(Action::requeue(STATUS_EVERY))
}

/// The pool's key and api, or the problem that keeps it from running.
async fn usable(ctx: &Context, pool: &WorkerPool) -> Result<(Secret, String), Problem> {
    if let Some(problem) = ctx.crd_problem() {
        return Err(problem);
    }
    pod::validate(pool).map_err(|e| Problem::InvalidSpec(e.to_string()))?;
    let api = api_url(pool, ctx.settings.default_api_url.as_deref())?;
    let sandbox_api = sandbox_api_url(pool, ctx.settings.default_sandbox_api_url.as_deref(), &api);
    pod::egress_routing(pool, &sandbox_api).map_err(|e| Problem::InvalidSpec(e.to_string()))?;
    let key = read_key(ctx, pool).await?;
    Ok((key, api))
}

/// What the pool's supervisor shows now.
async fn observe(ctx: &Context, pool: &WorkerPool, problem: Option<Problem>) -> Observed {
    let name = pool.name_any();
    let (state, snapshot, stats, hardening) = {
        let runs = ctx.runs.lock().expect("runs lock");
        match runs.get(&name) {
            Some(run) => (
                Some(run.state.lock().expect("state lock").clone()),
                Some(run.metrics.snapshot()),
                Some((run.stats.clone(), run.environment_id.clone())),
                run.hardening.latest(),
            ),
            None => (None, None, None, None),
        }
    };
    let problem = problem.or(match &state {
        Some(RunState::Stopped(p)) => Some(p.clone()),
        _ => None,
    });
    let queue: Option<QueueStats> = match (&state, stats) {
        (Some(RunState::At(Progress::Running)), Some((client, env))) => {
            client.stats(&env).await.ok()
        }
        _ => None,
    };
    Observed {
        generation: pool.metadata.generation,
        progress: match state {
            Some(RunState::At(progress)) => progress,
            _ => Progress::CheckingKey,
        },
        problem,
        snapshot,
        queue,
        hardening,
        now: SystemTime::now(),
    }
}

/// An Event each time what the pool's status says changes: a problem that
/// stops it, a degradation (the api unreachable, launches failing), or
/// that it runs again.
fn note_change(
    ctx: &Context,
    pool: &WorkerPool,
    problem: &Option<Problem>,
    status: &WorkerPoolStatus,
) {
    let condition = |kind: &str| status.conditions.iter().find(|c| c.type_ == kind);
    let (type_, reason, note) = match (problem, condition("Degraded"), condition("Ready")) {
        (Some(p), _, _) => (EventType::Warning, p.reason().to_string(), p.message()),
        (None, Some(degraded), _) if degraded.status == "True" => (
            EventType::Warning,
            degraded.reason.clone(),
            degraded.message.clone(),
        ),
        (None, _, Some(ready)) if ready.status == "True" => (
            EventType::Normal,
            "Polling".to_string(),
            "the pool's supervisor runs with its Environment key".to_string(),
        ),
        _ => return,
    };
    let changed = {
        let mut noted = ctx.noted.lock().expect("noted lock");
        noted.insert(pool.name_any(), reason.clone()).as_ref() != Some(&reason)
    };
    if changed {
        ctx.events(pool)
            .publish(type_, &reason, "Reconcile", note, None);
    }
}

pub fn error_policy(_pool: Arc<WorkerPool>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.reconcile_failures
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(%error, "reconciling a WorkerPool failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the operator until `stop` is cancelled: the pools' reconciles,
/// the stop of deleted pools' supervisors, and the orphan sweep. On the
/// way out every supervisor detaches (its Pods stay for the next leader).
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    ctx.check_crd().await;
    let namespace = ctx.settings.namespace.clone();
    let pools: Api<WorkerPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let controller = Controller::new(pools, watcher::Config::default().any_semantic());
    let store = controller.store();
    let reconciling = controller
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "reconcile loop");
            }
        });
    let janitor = {
        let ctx = ctx.clone();
        let stop = stop.clone();
        async move {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.cancelled() => return,
                }
                if store.wait_until_ready().await.is_err() {
                    return;
                }
                ctx.check_crd().await;
                ctx.stop_deleted(&store);
                if let Err(err) = sweep::sweep(&pods, &ctx.pool_bounds(&store)).await {
                    tracing::warn!(error = %err, "the orphan sweep failed; retrying");
                }
            }
        }
    };
    tokio::join!(reconciling, janitor);
    ctx.detach_all().await;
}
