//! The Kubernetes launcher's exact API traffic, against kube-rs's mock
//! service, with the real supervisor core polling a real api: the PVC made
//! when missing, the Pod created once per claim, the attach, and the Pod
//! deleted when the hand-off fails or the activation ends.

use crate::kube_mock::{self, ApiServer};
use crate::support::{config, queued_session, until, Running};
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use mango_controller::core::config::STOPPING_GRACE;
use mango_controller::core::launcher::{ItemIdentity, Launcher, Sandbox};
use mango_controller::core::supervisor::RunEnd;
use mango_controller::kubernetes::crd::{SecretKeyRef, WorkerPool, WorkerPoolSpec};
use mango_controller::kubernetes::launcher::PodLauncher;
use mango_controller::kubernetes::pods::{PodFeed, PodStore};
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "sandboxes";
const PODS_OF_POOL: &str = "/api/v1/namespaces/sandboxes/pods?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmango-worker%2Cmango.dev%2Fpool%3Dbuilders";
const WARM_PODS_OF_POOL: &str = "/api/v1/namespaces/sandboxes/pods?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmango-worker%2Cmango.dev%2Fpool%3Dbuilders%2Cmango.dev%2Fwarm%3Dtrue";

fn pool(api: &TestApp) -> Arc<WorkerPool> {
    pool_of(&api.env_id)
}

fn pool_of(environment_id: &str) -> Arc<WorkerPool> {
    let mut pool: WorkerPool = WorkerPool::new(
        "builders",
        serde_json::from_value::<WorkerPoolSpec>(json!({
            "environmentId": environment_id,
            "environmentKeySecret": SecretKeyRef { name: "pool-key".into(), key: None },
        }))
        .unwrap(),
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some("pool-uid".into());
    Arc::new(pool)
}

struct Setup {
    api: TestApp,
    server: ApiServer,
    feed: PodFeed,
    running: Running,
}

async fn start(db: sqlx::PgPool) -> Setup {
    let api = TestApp::start(db).await;
    let (client, mut server) = kube_mock::client();
    let (store, feed) = PodStore::new();
    let launcher = PodLauncher::new(client, pool(&api), "mango-sandbox:test", store);
    let mut config = config(&api, 2);
    config.pool = "builders".into();
    config.hand_off_bound = Duration::from_secs(10);
    let running_fut = Running::start(&api, config, launcher);
    // The supervisor first lists what an earlier run left, sandboxes and
    // warm Pods: nothing.
    let (running, ()) = tokio::join!(running_fut, async {
        for listing in [PODS_OF_POOL, WARM_PODS_OF_POOL] {
            server
                .expect(Method::GET, listing)
                .await
                .respond(200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []}));
        }
    });
    Setup {
        api,
        server,
        feed,
        running,
    }
}

/// The Pod the mock created, as the API server answers it.
fn created(body: &Value) -> Value {
    let mut pod = body.clone();
    pod["metadata"]["uid"] = json!("pod-uid");
    pod["metadata"]["resourceVersion"] = json!("2");
    pod
}

fn running(pod: &Value) -> Pod {
    let mut pod = pod.clone();
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{
        "name": "runner", "image": "mango-sandbox:test", "imageID": "", "ready": true,
        "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]});
    serde_json::from_value(pod).unwrap()
}

/// A Session's item: its PVC is looked up and, missing, created; its Pod
/// created hardened and secret-free; once it runs, stdin (only) is
/// attached; the attach fails, so the Pod is deleted with zero grace and
/// the item left to its lease.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_item_gets_its_pvc_and_pod_and_a_failed_attach_deletes_the_pod(db: sqlx::PgPool) {
    let Setup {
        api,
        mut server,
        feed,
        running: supervisor,
    } = start(db).await;
    let (session, work_id) = queued_session(&api).await;
    let pvc = format!("mango-session-{}", session.replace('_', "-"));
    let pod_name = format!("mango-{}-1", work_id.replace('_', "-"));

    // The Session's PVC is looked for by its label first (a warm Pod's
    // PVC becomes the Session's whatever its name), then by its name.
    server
        .expect(
            Method::GET,
            &format!("/api/v1/namespaces/sandboxes/persistentvolumeclaims?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmango-worker%2Cmango.dev%2Fsession-id%3D{session}"),
        )
        .await
        .respond(200, json!({"apiVersion": "v1", "kind": "PersistentVolumeClaimList", "metadata": {"resourceVersion": "1"}, "items": []}));
    server
        .expect(
            Method::GET,
            &format!("/api/v1/namespaces/sandboxes/persistentvolumeclaims/{pvc}"),
        )
        .await
        .refuse(404, "NotFound", "persistentvolumeclaims not found");
    let made = server
        .expect(
            Method::POST,
            "/api/v1/namespaces/sandboxes/persistentvolumeclaims?",
        )
        .await;
    assert_eq!(made.body["metadata"]["name"], pvc);
    assert_eq!(
        made.body["metadata"]["labels"]["mango.dev/session-id"],
        session
    );
    assert_eq!(made.body["spec"]["resources"]["requests"]["storage"], "1Gi");
    let body = made.body.clone();
    made.respond(201, body);

    let pod = server
        .expect(Method::POST, "/api/v1/namespaces/sandboxes/pods?")
        .await;
    let text = pod.body.to_string();
    for marker in [
        "mango_st_",
        "mango_envk_",
        "mango_wsk_",
        "eyJzZXNzaW9uc190b2tlbi",
    ] {
        assert!(!text.contains(marker), "no credential in the Pod: {text}");
    }
    assert_eq!(pod.body["metadata"]["name"], pod_name);
    assert_eq!(pod.body["metadata"]["labels"]["mango.dev/work-id"], work_id);
    assert_eq!(
        pod.body["metadata"]["ownerReferences"][0]["uid"],
        "pool-uid"
    );
    assert_eq!(pod.body["spec"]["containers"][0]["stdinOnce"], true);
    // The kubelet's SIGTERM leaves the runner the stopping grace, whoever
    // deletes or evicts the Pod.
    assert_eq!(
        pod.body["spec"]["terminationGracePeriodSeconds"],
        STOPPING_GRACE.as_secs()
    );
    assert_eq!(
        pod.body["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        pvc
    );
    let answer = created(&pod.body);
    pod.respond(201, answer.clone());
    // Not attached before the container runs.
    server.quiet(Duration::from_millis(500)).await;
    feed.apply(Event::Apply(running(&answer)));

    server
        .expect(
            Method::GET,
            // stdin only: stdout, stderr and tty are off when not asked for.
            &format!(
                "/api/v1/namespaces/sandboxes/pods/{pod_name}/attach?&stdin=true&container=runner"
            ),
        )
        .await
        .refuse(403, "Forbidden", "pods/attach is forbidden");
    let deleted = server
        .expect(
            Method::DELETE,
            &format!("/api/v1/namespaces/sandboxes/pods/{pod_name}?"),
        )
        .await;
    assert_eq!(deleted.body["gracePeriodSeconds"], 0);
    deleted.respond(200, answer);
    until(
        "the launch to count as failed",
        Duration::from_secs(10),
        async || {
            supervisor
                .metrics
                .render()
                .contains(r#"mango_supervisor_items_total{outcome="launch_failed"} 1"#)
        },
    )
    .await;
    server.quiet(Duration::from_millis(500)).await;
    assert_eq!(
        api.get_work(&work_id).await["state"],
        "starting",
        "left to its lease"
    );
    assert_eq!(supervisor.shutdown().await, RunEnd::Shutdown);
}

/// A second create for the same claim conflicts: the launcher reports it,
/// and nothing retries it into a duplicate or deletes the first Pod.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_second_create_for_a_claim_conflicts_and_is_not_retried(db: sqlx::PgPool) {
    let Setup {
        api,
        mut server,
        feed: _feed,
        running: supervisor,
    } = start(db).await;
    mango_client::Client::new(&api.base, &api.ws_key)
        .create_healthcheck(&api.env_id)
        .await
        .unwrap();
    let pod = server
        .expect(Method::POST, "/api/v1/namespaces/sandboxes/pods?")
        .await;
    assert_eq!(
        pod.body["spec"]["volumes"][0]["emptyDir"]["medium"],
        "Memory"
    );
    pod.refuse(409, "AlreadyExists", "pods \"x\" already exists");
    until(
        "the launch to count as failed",
        Duration::from_secs(10),
        async || {
            supervisor
                .metrics
                .render()
                .contains(r#"mango_supervisor_items_total{outcome="launch_failed"} 1"#)
        },
    )
    .await;
    server.quiet(Duration::from_secs(1)).await;
    assert_eq!(supervisor.shutdown().await, RunEnd::Shutdown);
}

/// Asking a Pod's runner to stop (its Work is stopping) is one delete with
/// the grace the supervisor then waits: the kubelet sends the runner
/// SIGTERM, and SIGKILL once the grace is over. The removal, if the runner
/// outlives it, stays a delete with zero grace, which cuts the first short;
/// a Pod already gone is asked and removed.
#[tokio::test]
async fn asking_a_pods_runner_to_stop_deletes_it_with_the_grace_and_removal_with_none() {
    let (client, mut server) = kube_mock::client();
    let (store, _feed) = PodStore::new();
    let launcher = PodLauncher::new(client, pool_of("env_1"), "mango-sandbox:test", store);
    let sandbox = Sandbox {
        name: "mango-work-1-1".into(),
        handle: "mango-work-1-1".into(),
        item: ItemIdentity {
            work_id: "work_1".into(),
            claim: 1,
            environment_id: "env_1".into(),
            work_type: mango_protocol::WorkType::Session,
            session_id: Some("sesn_1".into()),
        },
    };
    let uri = "/api/v1/namespaces/sandboxes/pods/mango-work-1-1?";
    let deleting = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "mango-work-1-1", "namespace": NS,
                     "deletionTimestamp": "2026-12-01T00:00:20Z", "deletionGracePeriodSeconds": 20}});
    let (asked, ()) = tokio::join!(
        launcher.signal_stop(&sandbox, Duration::from_secs(20)),
        async {
            let delete = server.expect(Method::DELETE, uri).await;
            assert_eq!(
                delete.body,
                json!({"gracePeriodSeconds": 20}),
                "a graceful delete and nothing else"
            );
            delete.respond(200, deleting.clone());
        }
    );
    asked.expect("the runner was asked to stop");
    let (removed, ()) = tokio::join!(launcher.remove(&sandbox), async {
        let delete = server.expect(Method::DELETE, uri).await;
        assert_eq!(delete.body, json!({"gracePeriodSeconds": 0}));
        delete.respond(200, deleting.clone());
    });
    removed.expect("removed");
    // A grace of a fraction of a second is not rounded down to none.
    let (asked, ()) = tokio::join!(
        launcher.signal_stop(&sandbox, Duration::from_millis(1500)),
        async {
            let delete = server.expect(Method::DELETE, uri).await;
            assert_eq!(delete.body["gracePeriodSeconds"], 2);
            delete.refuse(404, "NotFound", "pods \"mango-work-1-1\" not found");
        }
    );
    asked.expect("a Pod already gone is asked");
    server.quiet(Duration::from_millis(200)).await;
}

/// The labels and selectors the launcher sends are checked first: a label
/// value the API server would refuse (an Environment id longer than 63
/// characters, from a pool the operator would not have started) fails the
/// launch with what is wrong, and nothing is sent.
#[tokio::test]
async fn labels_the_api_server_would_refuse_are_never_sent() {
    let (client, mut server) = kube_mock::client();
    let (store, _feed) = PodStore::new();
    let environment = format!("env_{}", "x".repeat(60));
    let launcher = PodLauncher::new(client, pool_of(&environment), "mango-sandbox:test", store);
    let item = ItemIdentity {
        work_id: "work_1".into(),
        claim: 1,
        environment_id: environment.clone(),
        work_type: mango_protocol::WorkType::Session,
        session_id: Some("sesn_1".into()),
    };
    let spec = mango_controller::core::launcher::SandboxSpec {
        name: "mango-work-1-1".into(),
        labels: mango_controller::core::naming::labels(&item, "builders"),
        env: vec![],
        item,
    };
    let err = launcher.create(&spec).await.unwrap_err().to_string();
    assert!(
        err.contains("mango.dev/environment-id") && err.contains("no more than 63"),
        "{err}"
    );
    let err = launcher
        .workspaces(&environment)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("listing Session PVCs"), "{err}");
    server.quiet(Duration::from_millis(300)).await;
}
