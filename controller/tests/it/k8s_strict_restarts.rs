//! A pool restarted twice in quick succession through the operator, against
//! the strict fake API server: one `helm upgrade` may change the spec and
//! then the key, so the supervisor the first edit started is still waiting
//! for its predecessor to detach when the second edit replaces it. The
//! third supervisor must wait for the first all the same: until then the
//! first may still be handing a Pod its secret, and a supervisor that
//! starts removes every Pod of the pool not yet handed off.

use crate::k8s_strict::{self, Attaches, NS};
use crate::k8s_strict_operator::{condition, settings};
use crate::support::until_stopped;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::operator::{self, Context};
use mango_protocol::CheckStatus;
use mango_testkit::apiserver::{ApiServer, Options};
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const POOL: &str = "builders";

/// What this test's kubelet is told and what it saw.
#[derive(Default)]
struct Node {
    /// While set, new Pods stay Pending, as ones waiting for a node or an
    /// image pull do.
    pending: AtomicBool,
    /// Pods deleted before they ever ran.
    deleted_pending: Mutex<BTreeSet<String>>,
}

/// `k8s_strict::kubelet` with [`Node`]: each Pod runs (unless held
/// Pending), its runner gets what its attach delivered, and a deleted Pod
/// goes once nothing runs in it.
fn kubelet(
    fake: Arc<ApiServer>,
    volumes: PathBuf,
    attaches: Attaches,
    node: Arc<Node>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut started: HashSet<String> = HashSet::new();
        let running_now: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            let now: HashSet<String> = fake.pods().into_iter().collect();
            // A zero-grace delete removes a Pod at once, with no deletionTimestamp first.
            for gone in seen.difference(&now) {
                if !started.contains(gone) {
                    node.deleted_pending.lock().unwrap().insert(gone.clone());
                }
            }
            seen.clone_from(&now);
            for name in now {
                let Some(pod) = fake.pod(&name) else { continue };
                if !pod["metadata"]["deletionTimestamp"].is_null() {
                    if !started.contains(&name) {
                        node.deleted_pending.lock().unwrap().insert(name.clone());
                    }
                    if !running_now.lock().unwrap().contains(&name) {
                        fake.pod_terminated(&name);
                    }
                } else if !node.pending.load(Ordering::SeqCst)
                    && k8s_strict::claims_exist(&fake, &pod)
                    && started.insert(name.clone())
                {
                    fake.set_pod_status(&name, k8s_strict::running(&pod));
                }
            }
            // A poll interval of the fake's attach queue, as k8s_strict's kubelet.
            if let Some(attached) = fake.attached(Duration::from_millis(20)).await {
                attaches.lock().unwrap().push(attached.clone());
                if attached.stdin.is_empty() {
                    continue;
                }
                running_now.lock().unwrap().insert(attached.pod.clone());
                tokio::spawn(k8s_strict::run_container(
                    fake.clone(),
                    volumes.clone(),
                    attached,
                    Arc::default(),
                    None,
                    running_now.clone(),
                ));
            }
        }
    })
}

async fn edit_pool(fake: &ApiServer, spec: Value) -> i64 {
    let pools: Api<WorkerPool> = Api::namespaced(k8s_strict::client(fake).await, NS);
    let edited = pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .expect("the edit is admitted");
    edited.metadata.generation.unwrap()
}

fn ready_at(fake: &ApiServer, generation: i64) -> Option<Value> {
    condition(fake, POOL, "Ready").filter(|c| c["observedGeneration"].as_i64() == Some(generation))
}

/// The watches of the pool's Pods opened so far: one per supervisor started.
fn pod_watches(fake: &ApiServer) -> usize {
    fake.requests()
        .iter()
        .filter(|(method, uri)| {
            method == axum::http::Method::GET
                && uri.contains("/pods?")
                && uri.contains("watch=true")
                && uri.contains(POOL)
        })
        .count()
}

/// The Pods whose attach delivered something (a secret or an envelope).
fn delivered(attaches: &Attaches) -> Vec<String> {
    attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| !a.stdin.is_empty())
        .map(|a| a.pod.clone())
        .collect()
}

/// The Pods labelled with Work `work_id`.
fn pods_of(fake: &ApiServer, work_id: &str) -> Vec<String> {
    fake.pods()
        .into_iter()
        .filter(|p| {
            fake.pod(p)
                .is_some_and(|p| p["metadata"]["labels"]["mango.dev/work-id"] == work_id)
        })
        .collect()
}

/// The operator over the fake, its pool's supervisor handing a
/// healthcheck's Pod its secret: the Pod is held Pending, so the hand-off
/// waits, and so does the supervisor's detach (up to its request bound,
/// 15 s).
struct HandingOff {
    api: TestApp,
    fake: Arc<ApiServer>,
    node: Arc<Node>,
    attaches: Attaches,
    check: String,
    held: String,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    kubelet: tokio::task::JoinHandle<()>,
    _volumes: tempfile::TempDir,
}

async fn handing_off(db: sqlx::PgPool) -> HandingOff {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    k8s_strict::make_pool(&fake, &api, POOL, &api.env_key);
    let volumes = tempfile::tempdir().unwrap();
    let attaches = Attaches::default();
    let node = Arc::new(Node::default());
    let kubelet = kubelet(
        fake.clone(),
        volumes.path().to_path_buf(),
        attaches.clone(),
        node.clone(),
    );
    let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx, stop.clone()));
    crate::support::until("the pool Ready", Duration::from_secs(30), async || {
        condition(&fake, POOL, "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    node.pending.store(true, Ordering::SeqCst);
    let check = api.create_check().await;
    crate::support::until(
        "the check's Pod, Pending",
        Duration::from_secs(30),
        async || pods_of(&fake, &check).len() == 1,
    )
    .await;
    let held = pods_of(&fake, &check).remove(0);
    HandingOff {
        api,
        fake,
        node,
        attaches,
        check,
        held,
        stop,
        run,
        kubelet,
        _volumes: volumes,
    }
}

impl HandingOff {
    /// The check succeeds, served by the held Pod alone: it got the secret.
    async fn assert_the_held_pod_served_the_check(&self) {
        let work = until_stopped(&self.api, &self.check, Duration::from_secs(60)).await;
        let result = work.result.expect("a stopped check has a result");
        assert_eq!(result.status, CheckStatus::Succeeded, "{}", result.message);
        assert_eq!(
            delivered(&self.attaches),
            vec![self.held.clone()],
            "the held Pod served it"
        );
    }

    /// Until the operator has started its `n`th supervisor of the pool: each
    /// watches the pool's Pods at once (its status is no sign, as a pool
    /// whose supervisor waits is not Ready).
    async fn until_supervisors(&self, n: usize) {
        crate::support::until(
            &format!("supervisor {n} started"),
            Duration::from_secs(30),
            async || pod_watches(&self.fake) == n,
        )
        .await;
    }

    /// The latest supervisor waits for the first: for a while (well inside
    /// the first's detach bound; one that did not wait would check its key,
    /// list the pool's Pods and remove the one not handed off within a
    /// second or so) the Pending Pod stays and the pool is not Ready at
    /// `generation`. Then the Pod runs: the first supervisor hands it the
    /// secret, the check succeeds in it, and the latest supervisor adopts
    /// it, runs, and removes it once its runner exits.
    async fn assert_the_hand_off_finishes(self, generation: i64) {
        let fake = &self.fake;
        let window = Instant::now() + Duration::from_secs(4);
        let (mut ran_early, mut said_why) = (false, false);
        while Instant::now() < window {
            let ready = ready_at(fake, generation);
            ran_early |= ready.as_ref().is_some_and(|c| c["status"] == "True");
            said_why |= ready.as_ref().is_some_and(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("previous spec to detach"))
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            said_why,
            "Ready said why it waited: {:?}",
            ready_at(fake, generation)
        );
        let removed = self.node.deleted_pending.lock().unwrap().clone();
        assert!(
            !ran_early && removed.is_empty(),
            "the latest supervisor ran while the first still detached (Ready early: {ran_early}) \
             and removed the Pods being handed their secret: {removed:?}"
        );
        self.node.pending.store(false, Ordering::SeqCst);
        self.assert_the_held_pod_served_the_check().await;
        assert!(self.node.deleted_pending.lock().unwrap().is_empty());
        crate::support::until(
            "the latest supervisor Ready",
            Duration::from_secs(30),
            async || ready_at(fake, generation).is_some_and(|c| c["status"] == "True"),
        )
        .await;
        crate::support::until(
            "the check's Pod removed",
            Duration::from_secs(30),
            async || fake.pod(&self.held).is_none(),
        )
        .await;
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.run).await;
        self.kubelet.abort();
    }
}

/// Edited twice while the first supervisor hands a Pod its secret: the
/// supervisor of the second edit, stopped while it waited for the first,
/// leaves the third to wait for the first all the same.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_edited_twice_quickly_starts_its_last_supervisor_after_the_first_detached(
    db: sqlx::PgPool,
) {
    let live = handing_off(db).await;
    edit_pool(&live.fake, json!({"maxConcurrency": 3})).await;
    live.until_supervisors(2).await;
    let last = edit_pool(&live.fake, json!({"maxConcurrency": 4})).await;
    live.until_supervisors(3).await;
    live.assert_the_hand_off_finishes(last).await;
}

/// Stopped for a missing Secret while it hands a Pod its secret, and
/// started again once the Secret is back: the new supervisor waits for the
/// stopped one, as after an edit.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_stopped_for_its_secret_and_started_again_waits_for_the_stopped_supervisor(
    db: sqlx::PgPool,
) {
    let live = handing_off(db).await;
    let fake = &live.fake;
    let secrets: Api<Secret> = Api::namespaced(k8s_strict::client(fake).await, NS);
    secrets
        .delete("pool-key", &DeleteParams::default())
        .await
        .unwrap();
    // A reconcile now (the operator watches pools, not Secrets).
    edit_pool(fake, json!({"maxConcurrency": 3})).await;
    crate::support::until(
        "the pool stopped for its Secret",
        Duration::from_secs(30),
        async || warning_reasons(fake).contains("SecretMissing"),
    )
    .await;
    // On the status too, though the running supervisor had written a queue
    // that a stopped one cannot read.
    crate::support::until(
        "SecretMissing on the status",
        Duration::from_secs(30),
        async || condition(fake, POOL, "Ready").is_some_and(|c| c["reason"] == "SecretMissing"),
    )
    .await;
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": live.api.env_key}}))
        .expect("the Secret is admitted again");
    let last = edit_pool(fake, json!({"maxConcurrency": 4})).await;
    live.until_supervisors(2).await;
    live.assert_the_hand_off_finishes(last).await;
}

/// The reasons of the Warning Events published so far.
fn warning_reasons(fake: &ApiServer) -> BTreeSet<String> {
    fake.names("events", NS)
        .into_iter()
        .filter_map(|name| fake.object("events", NS, &name))
        .filter(|e| e["type"] == "Warning")
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

/// Shut down (SIGTERM, or leadership lost) while its supervisor hands a Pod
/// its secret: the operator returns only once that supervisor has detached,
/// after the hand-off, so the process does not exit with the Pod cut off
/// from its secret (the next leader would remove it unhanded).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_operator_shut_down_mid_hand_off_returns_only_once_its_supervisor_detached(
    db: sqlx::PgPool,
) {
    let mut live = handing_off(db).await;
    live.stop.cancel();
    // Well inside the supervisor's detach bound (its request bound, 15 s).
    let early = tokio::time::timeout(Duration::from_secs(3), &mut live.run).await;
    assert!(
        early.is_err(),
        "the operator returned while its supervisor still handed a Pod its secret"
    );
    live.node.pending.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(30), &mut live.run)
        .await
        .expect("the operator returns once the hand-off is done")
        .expect("the operator's task");
    live.assert_the_held_pod_served_the_check().await;
    live.kubelet.abort();
}
