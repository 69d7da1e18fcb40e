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
use kube::api::{Patch, PatchParams};
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

/// The pool's supervisor is handing a healthcheck's Pod its secret (the
/// Pod is Pending, so the hand-off waits and so does its detach) when the
/// pool is edited twice. The supervisor of the second edit starts only
/// once the first has detached: the Pending Pod is not removed under the
/// hand-off, the check is served by it, and the pool is Ready on the
/// last generation only after that.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_edited_twice_quickly_starts_its_last_supervisor_after_the_first_detached(
    db: sqlx::PgPool,
) {
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

    // Each supervisor the operator starts watches the pool's Pods at once
    // (its status is no sign: a pool whose supervisor waits is not Ready).
    edit_pool(&fake, json!({"maxConcurrency": 3})).await;
    crate::support::until(
        "the first edit's supervisor",
        Duration::from_secs(30),
        async || pod_watches(&fake) == 2,
    )
    .await;
    let last = edit_pool(&fake, json!({"maxConcurrency": 4})).await;
    crate::support::until(
        "the second edit's supervisor",
        Duration::from_secs(30),
        async || pod_watches(&fake) == 3,
    )
    .await;
    // A supervisor that did not wait would check its key, list the pool's
    // Pods and remove the one not handed off within a second or so; this
    // window is well inside the first one's detach bound (15 s).
    let window = Instant::now() + Duration::from_secs(4);
    let mut ran_early = false;
    while Instant::now() < window {
        ran_early |= ready_at(&fake, last).is_some_and(|c| c["status"] == "True");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let removed = node.deleted_pending.lock().unwrap().clone();
    assert!(
        !ran_early && removed.is_empty(),
        "the last supervisor ran while the first still detached (Ready early: {ran_early}) \
         and removed the Pods being handed their secret: {removed:?}"
    );

    node.pending.store(false, Ordering::SeqCst);
    let work = until_stopped(&api, &check, Duration::from_secs(60)).await;
    let result = work.result.expect("a stopped check has a result");
    assert_eq!(result.status, CheckStatus::Succeeded, "{}", result.message);
    let delivered: Vec<String> = attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| !a.stdin.is_empty())
        .map(|a| a.pod.clone())
        .collect();
    assert_eq!(
        delivered,
        vec![held.clone()],
        "the held Pod served the check"
    );
    assert!(node.deleted_pending.lock().unwrap().is_empty());
    crate::support::until(
        "the last supervisor Ready",
        Duration::from_secs(30),
        async || ready_at(&fake, last).is_some_and(|c| c["status"] == "True"),
    )
    .await;
    crate::support::until(
        "the check's Pod removed",
        Duration::from_secs(30),
        async || fake.pod(&held).is_none(),
    )
    .await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    kubelet.abort();
}
