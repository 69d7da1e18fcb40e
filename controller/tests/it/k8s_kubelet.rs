//! The Kubernetes launcher over real HTTP to the lenient fake API server
//! (testkit's `FakeKubeApi`), with this test as a kubelet that can do what
//! the strict fake's tests do not play: containers that wait in an image
//! error or die before their hand-off, and attaches that close without a
//! status or say nothing at all. Everything else of the launcher runs
//! against the strict fake (`k8s_strict_launcher.rs`,
//! `k8s_strict_workspace.rs`).

use crate::support::{config, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use mango_controller::kubernetes::crd::{SecretKeyRef, WorkerPool, WorkerPoolSpec};
use mango_controller::kubernetes::launcher::PodLauncher;
use mango_controller::kubernetes::pods::{PodFeed, PodStore};
use mango_testkit::kube_api::{AttachEnd, Attached, FakeKubeApi};
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "sandboxes";

fn pool(api: &TestApp) -> Arc<WorkerPool> {
    let mut pool = WorkerPool::new(
        "builders",
        serde_json::from_value::<WorkerPoolSpec>(json!({
            "environmentId": api.env_id,
            "environmentKeySecret": SecretKeyRef { name: "pool-key".into(), key: None },
        }))
        .unwrap(),
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some("pool-uid".into());
    Arc::new(pool)
}

async fn kube_client(fake: &FakeKubeApi) -> kube::Client {
    let mut config = kube::Config::new(fake.url.parse().unwrap());
    config.default_namespace = NS.into();
    kube::Client::try_from(config).unwrap()
}

fn pod_of(value: Value) -> Pod {
    serde_json::from_value(value).expect("a Pod")
}

/// Plays the kubelet until aborted.
type Attaches = Arc<std::sync::Mutex<Vec<Attached>>>;

/// What the kubelet makes of each new Pod.
#[derive(Clone, Copy)]
enum Node {
    /// The container starts.
    Runs,
    /// The image cannot be pulled: the container waits in ErrImagePull.
    CannotPull,
    /// `imagePullPolicy: Never` and no image on the node: ErrImageNeverPull.
    NeverPulled,
    /// The container dies before anything attaches.
    DiesAtOnce,
}

fn first_state(node: Node) -> Value {
    match node {
        Node::Runs => json!({"phase": "Running", "containerStatuses": [{
            "name": "runner", "image": "mango-sandbox:test", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]}),
        Node::CannotPull => json!({"phase": "Pending", "containerStatuses": [{
            "name": "runner", "image": "mango-sandbox:missing", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull",
                "message": "pull access denied for mango-sandbox:missing"}}}]}),
        Node::NeverPulled => json!({"phase": "Pending", "containerStatuses": [{
            "name": "runner", "image": "mango-sandbox:absent", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ErrImageNeverPull",
                "message": "Container image \"mango-sandbox:absent\" is not present with pull policy of Never"}}}]}),
        Node::DiesAtOnce => {
            json!({"phase": "Failed", "message": "OOMKilled", "containerStatuses": [{
            "name": "runner", "image": "mango-sandbox:test", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
        }
    }
}

fn kubelet(
    fake: Arc<FakeKubeApi>,
    feed: PodFeed,
    volumes: PathBuf,
    attaches: Attaches,
    node: Node,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut known: HashSet<String> = HashSet::new();
        loop {
            let now: HashSet<String> = fake.pods().into_iter().collect();
            for name in now.difference(&known) {
                if let Some(pod) = fake.set_pod_status(name, first_state(node)) {
                    feed.apply(Event::Apply(pod_of(pod)));
                }
            }
            for name in known.difference(&now) {
                let mut gone = Pod::default();
                gone.metadata.name = Some(name.clone());
                feed.apply(Event::Delete(gone));
            }
            known = now;
            if let Some(attached) = fake.attached(Duration::from_millis(20)).await {
                attaches.lock().unwrap().push(attached.clone());
                tokio::spawn(run_container(
                    fake.clone(),
                    feed.clone(),
                    volumes.clone(),
                    attached,
                ));
            }
        }
    })
}

/// The container: the runner with the Pod's env, its stdin what the
/// attach delivered, killed when its Pod is deleted; then the Pod's
/// terminated state.
async fn run_container(
    fake: Arc<FakeKubeApi>,
    feed: PodFeed,
    volumes: PathBuf,
    attached: Attached,
) {
    let spec = &attached.manifest["spec"];
    let workspace = match spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
    {
        Some(claim) => volumes.join(claim),
        None => volumes.join(format!("empty-{}", attached.pod)),
    };
    std::fs::create_dir_all(&workspace).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mango-worker"));
    command
        .arg("item")
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true);
    for var in spec["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) {
            command.env(name, value);
        }
    }
    command.env("MANGO_WORKSPACE", &workspace);
    command.env("PATH", std::env::var("PATH").unwrap_or_default());
    let mut child = command.spawn().expect("the runner starts");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&attached.stdin).await.unwrap();
    }
    let deleted = async {
        while fake.pod(&attached.pod).is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let code = tokio::select! {
        status = child.wait() => status.unwrap().code().unwrap_or(137),
        _ = deleted => {
            let _ = child.kill().await;
            return;
        }
    };
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let ended = json!({"phase": phase, "containerStatuses": [{
        "name": "runner", "image": "mango-sandbox:test", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": "2026-12-01T00:00:01Z"}}}]});
    if let Some(pod) = fake.set_pod_status(&attached.pod, ended) {
        feed.apply(Event::Apply(pod_of(pod)));
    }
}

struct Cluster {
    fake: Arc<FakeKubeApi>,
    kubelet: tokio::task::JoinHandle<()>,
    running: Running,
    attaches: Attaches,
    _volumes: tempfile::TempDir,
}

async fn cluster_on(api: &TestApp, node: Node) -> Cluster {
    let fake = Arc::new(FakeKubeApi::start().await);
    let (store, feed) = PodStore::new();
    let launcher = PodLauncher::new(
        kube_client(&fake).await,
        pool(api),
        "mango-sandbox:test",
        store,
    );
    let mut config = config(api, 2);
    config.pool = "builders".into();
    let volumes = tempfile::tempdir().unwrap();
    let attaches = Attaches::default();
    let kubelet = kubelet(
        fake.clone(),
        feed,
        volumes.path().to_path_buf(),
        attaches.clone(),
        node,
    );
    let running = Running::start(api, config, launcher).await;
    Cluster {
        fake,
        kubelet,
        running,
        attaches,
        _volumes: volumes,
    }
}

/// The item's requests, in order, with the Pod's name written `{pod}`.
fn item_calls(fake: &FakeKubeApi, pod: &str) -> Vec<String> {
    fake.requests()
        .into_iter()
        .map(|(method, uri)| format!("{method} {}", uri.replace(pod, "{pod}")))
        .filter(|line| line.contains("{pod}") || line.starts_with("POST"))
        .collect()
}

/// A Pod that cannot start (its image does not pull) or that dies before
/// its hand-off is deleted at once, is never attached, and its item is
/// left to its lease (the secret was never sent, so another claim may run it).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pod_that_cannot_start_or_dies_first_is_deleted_unattached(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    for node in [Node::CannotPull, Node::NeverPulled, Node::DiesAtOnce] {
        let cluster = cluster_on(&api, node).await;
        let operator = mango_client::Client::new(&api.base, &api.ws_key);
        let check = operator.create_healthcheck(&api.env_id).await.unwrap();
        let pod = format!("mango-{}-1", check.id.replace('_', "-"));
        crate::support::until("the Pod created", Duration::from_secs(10), async || {
            cluster
                .fake
                .requests()
                .iter()
                .any(|(m, u)| m == "POST" && u.contains("/pods"))
        })
        .await;
        crate::support::until("the Pod deleted", Duration::from_secs(10), async || {
            cluster.fake.pods().is_empty()
        })
        .await;
        let calls = item_calls(&cluster.fake, &pod);
        assert_eq!(
            calls,
            vec![
                "POST /api/v1/namespaces/sandboxes/pods?".to_string(),
                "DELETE /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
            ],
            "no attach to a Pod that does not run"
        );
        assert!(cluster.attaches.lock().unwrap().is_empty());
        let metrics = cluster.running.metrics.render();
        assert!(
            metrics.contains("outcome=\"launch_failed\"} 1"),
            "the failure is counted: {metrics}"
        );
        let work = operator.work(&api.env_id, &check.id).await.unwrap();
        assert_ne!(
            work.state,
            mango_protocol::WorkState::Stopped,
            "left to its lease"
        );
        cluster
            .running
            .stop(mango_controller::core::supervisor::Stop::Detach)
            .await;
        cluster.kubelet.abort();
        api.stop_work(&check.id, true).await;
    }
}

/// From Kubernetes 1.30 the API server takes the attach's WebSocket before
/// it reaches the kubelet, so a kubelet that cannot attach (the container
/// gone, the node unreachable) shows only as a `Failure` status on the
/// error channel, after the secret was written into the void. That is no
/// hand-off: the Pod is deleted and never marked handed off (a new leader
/// would adopt it as healthy), and the item is left to its lease. So is an
/// attach that closes without saying how it ended, or says nothing within
/// the bound.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_attach_that_does_not_end_in_success_hands_nothing_off(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    for end in [
        AttachEnd::Failure {
            reason: "InternalError".into(),
            message: "error dialing backend: dial tcp 10.0.0.7:10250: connect: connection refused"
                .into(),
            code: 500,
        },
        AttachEnd::NoStatus,
        AttachEnd::Silent,
    ] {
        let cluster = cluster_on(&api, Node::Runs).await;
        cluster.fake.end_attaches(end.clone());
        let operator = mango_client::Client::new(&api.base, &api.ws_key);
        let check = operator.create_healthcheck(&api.env_id).await.unwrap();
        let pod = format!("mango-{}-1", check.id.replace('_', "-"));
        crate::support::until("the attach", Duration::from_secs(10), async || {
            cluster
                .fake
                .requests()
                .iter()
                .any(|(_, u)| u.contains("/attach"))
        })
        .await;
        // Silent: the status bound (10 s) runs out first.
        crate::support::until(
            "the Pod deleted",
            mango_controller::kubernetes::launcher::ATTACH_STATUS_BOUND + Duration::from_secs(5),
            async || cluster.fake.pods().is_empty(),
        )
        .await;
        assert_eq!(
            item_calls(&cluster.fake, &pod),
            vec![
                "POST /api/v1/namespaces/sandboxes/pods?".to_string(),
                "GET /api/v1/namespaces/sandboxes/pods/{pod}/attach?&stdin=true&container=runner"
                    .into(),
                "DELETE /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
            ],
            "{end:?}: no handed-off mark, the Pod deleted"
        );
        crate::support::until("the failure counted", Duration::from_secs(5), async || {
            cluster
                .running
                .metrics
                .render()
                .contains("outcome=\"launch_failed\"} 1")
        })
        .await;
        let work = operator.work(&api.env_id, &check.id).await.unwrap();
        assert_ne!(
            work.state,
            mango_protocol::WorkState::Stopped,
            "{end:?}: left to its lease"
        );
        cluster
            .running
            .stop(mango_controller::core::supervisor::Stop::Detach)
            .await;
        cluster.kubelet.abort();
        api.stop_work(&check.id, true).await;
    }
}
