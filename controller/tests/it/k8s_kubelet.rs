//! The Kubernetes launcher end to end, over real HTTP to a fake API server
//! (testkit's `FakeKubeApi`, which speaks the v5 attach protocol) with
//! this test as the kubelet: it marks each created Pod Running, runs the
//! real runner (`mango-worker item`) with the Pod's env and the stdin the
//! attach delivered, with the Pod's PVC as a host folder, and reports its
//! exit. So a healthcheck succeeds and a Session's second activation sees
//! the files of its first, with the exact API calls asserted.

use crate::support::{config, end_activation, healthcheck, turn, two_bash_turns, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::kubernetes::crd::{SecretKeyRef, WorkerPool, WorkerPoolSpec};
use mango_controller::kubernetes::launcher::PodLauncher;
use mango_controller::kubernetes::pods::{PodFeed, PodStore};
use mango_protocol::CheckStatus;
use mango_testkit::kube_api::{AttachEnd, Attached, FakeKubeApi};
use mango_testkit::{ScriptedModel, TestApp};
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

async fn cluster(api: &TestApp) -> Cluster {
    cluster_on(api, Node::Runs).await
}

async fn cluster_on(api: &TestApp, node: Node) -> Cluster {
    cluster_with(api, node, |_| {}).await
}

async fn cluster_with(
    api: &TestApp,
    node: Node,
    configure: impl FnOnce(&mut mango_controller::core::config::Config),
) -> Cluster {
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
    configure(&mut config);
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

fn assert_attach_is_stdin_only(attached: &Attached) {
    let query: Vec<&str> = attached.query.split('&').collect();
    assert!(query.contains(&"stdin=true"), "{}", attached.query);
    assert!(query.contains(&"container=runner"), "{}", attached.query);
    assert!(
        !attached.query.contains("stdout=true") && !attached.query.contains("stderr=true"),
        "stdout and stderr stay off: {}",
        attached.query
    );
    assert!(
        attached.stdin.ends_with(b"\n") && attached.stdin.len() > 20,
        "the secret and a newline"
    );
    let secret = String::from_utf8_lossy(&attached.stdin).trim().to_string();
    assert!(
        !attached.manifest.to_string().contains(&secret),
        "the secret never reaches the Pod object"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_succeeds_in_a_pod_that_then_goes(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let cluster = cluster(&api).await;
    let (check, status, message) = healthcheck(&api, Duration::from_secs(30)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    let pod = format!("mango-{}-1", check.replace('_', "-"));
    crate::support::until("the Pod deleted", Duration::from_secs(15), async || {
        cluster.fake.pods().is_empty()
    })
    .await;
    assert_eq!(
        item_calls(&cluster.fake, &pod),
        vec![
            "POST /api/v1/namespaces/sandboxes/pods?".to_string(),
            "GET /api/v1/namespaces/sandboxes/pods/{pod}/attach?&stdin=true&container=runner"
                .into(),
            "PATCH /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
            "DELETE /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
        ],
        "create, attach, mark handed off, delete; a healthcheck has no PVC"
    );
    assert!(cluster.fake.pvcs().is_empty());
    let attaches = cluster.attaches.lock().unwrap().clone();
    assert_eq!(attaches.len(), 1, "one attach per Pod");
    assert_attach_is_stdin_only(&attaches[0]);
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_second_activation_sees_the_files_of_its_first_on_its_pvc(db: sqlx::PgPool) {
    let model = ScriptedModel::start(two_bash_turns(
        "echo first > kept.txt && echo WROTE",
        "cat kept.txt",
    ))
    .await;
    let api = TestApp::start_with(
        db,
        mango_api::Settings {
            model_base_url: Some(model.base.clone()),
            ..Default::default()
        },
    )
    .await;
    let cluster = cluster(&api).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let pvc = format!("mango-session-{}", session.replace('_', "-"));
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    assert_eq!(
        cluster.fake.pvcs(),
        vec![pvc.clone()],
        "the Session's PVC was made"
    );
    let pvc_object = cluster.fake.requests();
    assert!(pvc_object
        .iter()
        .any(|(m, u)| m == "GET" && u.ends_with(&format!("persistentvolumeclaims/{pvc}"))));
    end_activation(&api, &session).await;
    crate::support::until(
        "the first Pod deleted",
        Duration::from_secs(15),
        async || cluster.fake.pods().is_empty(),
    )
    .await;
    turn(&api, &session, "read it", "first", Duration::from_secs(60)).await;
    end_activation(&api, &session).await;
    assert_eq!(
        api.session_work(&session).await.len(),
        2,
        "two activations, two Pods"
    );
    assert_eq!(
        cluster.fake.pvcs(),
        vec![pvc],
        "one PVC, kept across activations"
    );
    let pvc_creates = cluster
        .fake
        .requests()
        .iter()
        .filter(|(m, u)| m == "POST" && u.contains("persistentvolumeclaims"))
        .count();
    assert_eq!(pvc_creates, 1, "the second activation found its PVC");
    let attaches = cluster.attaches.lock().unwrap().clone();
    assert_eq!(attaches.len(), 2, "one attach per activation");
    for attached in &attaches {
        assert_attach_is_stdin_only(attached);
    }
    assert_ne!(
        attaches[0].stdin, attaches[1].stdin,
        "each activation gets its own secret"
    );
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
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

/// The PVC of a deleted Session is deleted (the deleted-Sessions extension
/// tells the sweep); a live Session's stays.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_deleted_sessions_pvc_is_swept(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let cluster = cluster_with(&api, Node::Runs, |config| {
        config.workspace_sweep_every = Duration::from_millis(300);
    })
    .await;
    let (kept, _) = crate::support::queued_session(&api).await;
    let (doomed, _) = crate::support::queued_session(&api).await;
    let pvc = |session: &str| format!("mango-session-{}", session.replace('_', "-"));
    crate::support::until("both PVCs", Duration::from_secs(20), async || {
        cluster.fake.pvcs().len() == 2
    })
    .await;
    end_activation(&api, &doomed).await;
    api.delete_session(&doomed).await;
    crate::support::until(
        "the deleted Session's PVC goes",
        Duration::from_secs(20),
        async || cluster.fake.pvcs() == vec![pvc(&kept)],
    )
    .await;
    let deletes: Vec<String> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|(m, u)| m == "DELETE" && u.contains("persistentvolumeclaims"))
        .map(|(_, u)| u)
        .collect();
    assert_eq!(
        deletes,
        vec![format!(
            "/api/v1/namespaces/sandboxes/persistentvolumeclaims/{}?",
            pvc(&doomed)
        )],
        "only the deleted Session's PVC"
    );
    end_activation(&api, &kept).await;
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
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
