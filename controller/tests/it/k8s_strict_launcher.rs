//! The Pod launcher against the strict fake API server over HTTP: its Pod
//! and attach admitted as a real apiserver admits them, its `PodStore`
//! fed by a real watch (not by hand), a healthcheck through the real
//! runner on either channel protocol, and a hand-off whose error channel
//! carries a Failure.

use crate::k8s_strict::{self, Attaches, NS};
use crate::support::{config, healthcheck, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::pods::PodStore;
use mango_protocol::CheckStatus;
use mango_testkit::apiserver::{ApiServer, AttachFailure, Options, V4, V5};
use mango_testkit::TestApp;
use std::sync::Arc;
use std::time::Duration;

pub struct Cluster {
    pub fake: Arc<ApiServer>,
    pub running: Running,
    pub kubelet: tokio::task::JoinHandle<()>,
    pub watch: tokio::task::JoinHandle<()>,
    pub attaches: Attaches,
    _volumes: tempfile::TempDir,
}

async fn cluster(api: &TestApp, options: Options) -> Cluster {
    cluster_with(api, options, |_| {}).await
}

/// A supervisor of pool `builders` on the Pod launcher, with `tweak` applied to its config.
pub async fn cluster_with(
    api: &TestApp,
    options: Options,
    tweak: impl FnOnce(&mut mango_controller::core::config::Config),
) -> Cluster {
    let fake = k8s_strict::fake_with(options).await;
    let pool = k8s_strict::make_pool(&fake, api, "builders", &api.env_key);
    let client = k8s_strict::client(&fake).await;
    let (store, watch) = PodStore::watching(
        Api::<Pod>::namespaced(client.clone(), NS),
        &pool_selector("builders").unwrap(),
    );
    let launcher = PodLauncher::new(client, pool, "mango-sandbox:test", store);
    let mut config = config(api, 2);
    config.pool = "builders".into();
    tweak(&mut config);
    let volumes = tempfile::tempdir().unwrap();
    let attaches = Attaches::default();
    let kubelet = k8s_strict::kubelet(fake.clone(), volumes.path().to_path_buf(), attaches.clone());
    let running = Running::start(api, config, launcher).await;
    Cluster {
        fake,
        running,
        kubelet,
        watch,
        attaches,
        _volumes: volumes,
    }
}

async fn healthcheck_on(api: &TestApp, protocol: &'static str) {
    let cluster = cluster(
        api,
        Options {
            attach_protocols: vec![protocol],
            ..Options::default()
        },
    )
    .await;
    let (check, status, message) = healthcheck(api, Duration::from_secs(30)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{protocol}: {message}");
    let pod = format!("mango-{}-1", check.replace('_', "-"));
    crate::support::until("the Pod gone", Duration::from_secs(20), async || {
        cluster.fake.pods().is_empty()
    })
    .await;
    let calls = k8s_strict::pod_calls(&cluster.fake, &pod);
    assert_eq!(
        calls,
        vec![
            "GET /api/v1/namespaces/sandboxes/pods/{pod}/attach?&stdin=true&container=runner"
                .to_string(),
            "PATCH /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
            "DELETE /api/v1/namespaces/sandboxes/pods/{pod}?".into(),
        ],
        "{protocol}: attach, mark handed off, delete"
    );
    let attaches = cluster.attaches.lock().unwrap().clone();
    assert_eq!(attaches.len(), 1);
    assert_eq!(attaches[0].protocol, protocol);
    assert!(
        attaches[0].stdin.ends_with(b"\n"),
        "the secret and a newline"
    );
    // The launcher learnt every state from the watch: it never listed Pods after the start.
    let watches = cluster
        .fake
        .requests()
        .iter()
        .filter(|(m, u)| m == "GET" && u.contains("/pods?") && u.contains("watch=true"))
        .count();
    assert!(watches >= 1, "the PodStore watched");
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
    cluster.watch.abort();
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_succeeds_through_a_watched_pod_on_the_v5_protocol(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    healthcheck_on(&api, V5).await;
}

/// Kubernetes before 1.30 speaks only v4, which cannot close stdin without
/// closing the whole attach, so no status ever confirms the secret arrived.
/// Those versions are unsupported: the launcher must say so and never mark
/// such a Pod handed off, or a new leader would adopt a runner that may
/// still be waiting on stdin.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_cluster_that_speaks_only_v4_gets_no_unconfirmed_hand_off(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let cluster = cluster(
        &api,
        Options {
            attach_protocols: vec![V4],
            ..Options::default()
        },
    )
    .await;
    let operator = mango_client::Client::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    let pod = format!("mango-{}-1", check.id.replace('_', "-"));
    crate::support::until("the Pod deleted", Duration::from_secs(40), async || {
        !cluster.attaches.lock().unwrap().is_empty()
            && cluster
                .fake
                .pod(&pod)
                .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    assert_eq!(cluster.attaches.lock().unwrap()[0].protocol, V4);
    let calls = k8s_strict::pod_calls(&cluster.fake, &pod);
    assert!(
        !calls.iter().any(|c| c.starts_with("PATCH")),
        "no handed-off mark without a confirming status: {calls:?}"
    );
    // Whether the runner read the line before the Pod went is a race: the
    // lease decides what happens to the item, never an unconfirmed mark.
    cluster
        .running
        .stop(mango_controller::core::supervisor::Stop::Detach)
        .await;
    cluster.kubelet.abort();
    cluster.watch.abort();
}

/// Issue 24, defect 1: the apiserver accepted the WebSocket, and the
/// kubelet failed behind it; the Failure on the error channel means the
/// secret never arrived. The Pod must be deleted unmarked and the item
/// left to its lease: a launcher that dropped the status marked the Pod
/// handed off, and the runner waited on stdin until its lease expired.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_failure_on_the_attach_error_channel_is_not_a_hand_off(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let cluster = cluster(&api, Options::default()).await;
    cluster
        .fake
        .fail_next_attach(AttachFailure::kubelet_unreachable());
    let operator = mango_client::Client::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    let pod = format!("mango-{}-1", check.id.replace('_', "-"));
    crate::support::until("the attach", Duration::from_secs(20), async || {
        !cluster.attaches.lock().unwrap().is_empty()
    })
    .await;
    let attached = cluster.attaches.lock().unwrap()[0].clone();
    assert_eq!(attached.status.as_ref().unwrap()["status"], "Failure");
    crate::support::until("the Pod deleted", Duration::from_secs(20), async || {
        cluster
            .fake
            .pod(&pod)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    let calls = k8s_strict::pod_calls(&cluster.fake, &pod);
    assert!(
        !calls.iter().any(|c| c.starts_with("PATCH")),
        "no handed-off mark after a failed hand-off: {calls:?}"
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
    cluster.watch.abort();
}
