//! Warm Pods (spec §7.1) against the strict fake API server over HTTP:
//! admitted as a real apiserver admits them, bound by a patch of their
//! labels so `-l mango.dev/work-id=…` finds them, their PVC bound to the
//! Session by label and mounted by the Session's next activation, no
//! secret in any Pod or PVC before or after binding, and one warm Pod
//! bound once when two launchers race for it.

use crate::k8s_strict::{self, Attaches, NS};
use crate::support::{config, end_activation, turn, two_bash_turns, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use mango_controller::core::launcher::{ItemIdentity, LaunchError, Launcher, SandboxSpec};
use mango_controller::core::supervisor::RunEnd;
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::pods::PodStore;
use mango_protocol::WorkType;
use mango_testkit::apiserver::{ApiServer, Options};
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The WorkerPool `builders` with `warm`, and its key's Secret.
fn warm_pool(fake: &ApiServer, env_id: &str, key: &str, warm: Value) -> Arc<WorkerPool> {
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": key}}))
        .expect("the Secret is admitted");
    let stored = fake
        .create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "builders", "namespace": NS},
            "spec": {"environmentId": env_id, "environmentKeySecret": {"name": "pool-key"},
                     "maxConcurrency": 2, "warm": warm}}),
        )
        .expect("the WorkerPool is admitted");
    Arc::new(serde_json::from_value(stored).expect("a WorkerPool"))
}

async fn launcher(
    fake: &ApiServer,
    pool: &Arc<WorkerPool>,
    base_url: &str,
) -> (PodLauncher, tokio::task::JoinHandle<()>) {
    let client = k8s_strict::client(fake).await;
    let (store, watch) = PodStore::watching(
        Api::<Pod>::namespaced(client.clone(), NS),
        &pool_selector("builders").unwrap(),
    );
    let launcher =
        PodLauncher::new(client, pool.clone(), "mango-sandbox:test", store).with_warm(base_url);
    (launcher, watch)
}

fn warm_pods(fake: &ApiServer) -> Vec<String> {
    fake.pods()
        .into_iter()
        .filter(|p| {
            fake.pod(p)
                .is_some_and(|p| p["metadata"]["labels"]["mango.dev/warm"] == "true")
        })
        .collect()
}

/// No credential of any kind in what the apiserver stores.
fn assert_no_secret(fake: &ApiServer, secrets: &[String]) {
    let mut stored = Vec::new();
    for pod in fake.pods() {
        stored.push(fake.pod(&pod).unwrap().to_string());
    }
    for pvc in fake.pvcs() {
        stored.push(
            fake.object("persistentvolumeclaims", NS, &pvc)
                .unwrap()
                .to_string(),
        );
    }
    for text in &stored {
        for marker in [
            "mango_st_",
            "mango_envk_",
            "mango_wsk_",
            "sessions_token",
            "\"secret\"",
        ] {
            assert!(!text.contains(marker), "{marker} stored: {text}");
        }
        for secret in secrets {
            assert!(!text.contains(secret.as_str()), "a secret stored: {text}");
        }
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_first_activation_binds_a_warm_pod_and_its_next_mounts_the_pvc_by_label(
    db: sqlx::PgPool,
) {
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
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = warm_pool(
        &fake,
        &api.env_id,
        &api.env_key,
        json!({"replicas": 1, "maxAge": 600}),
    );
    let (launcher, watch) = launcher(&fake, &pool, &api.base).await;
    let volumes = tempfile::tempdir().unwrap();
    let attaches = Attaches::default();
    let kubelet = k8s_strict::kubelet(fake.clone(), volumes.path().to_path_buf(), attaches.clone());
    let mut config = config(&api, 2);
    config.pool = "builders".into();
    config.warm = 1;
    let running = Running::start(&api, config, launcher).await;
    crate::support::until("a warm Pod", Duration::from_secs(30), async || {
        warm_pods(&fake).len() == 1
            && fake.pod(&warm_pods(&fake)[0]).unwrap()["status"]["phase"] == "Running"
    })
    .await;
    let warm = warm_pods(&fake)[0].clone();
    assert!(warm.starts_with("mango-warm-"));
    let pvc = fake
        .object("persistentvolumeclaims", NS, &warm)
        .expect("its PVC");
    assert_eq!(pvc["metadata"]["ownerReferences"][0]["kind"], "Pod");
    assert!(pvc["metadata"]["labels"]["mango.dev/session-id"].is_null());
    assert_no_secret(&fake, &[]);

    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    let work = api.session_work(&session).await;
    let bound = fake.pod(&warm).expect("the warm Pod serves the Session");
    let labels = &bound["metadata"]["labels"];
    assert_eq!(labels["mango.dev/session-id"], session.as_str());
    assert!(labels["mango.dev/warm"].is_null(), "no longer warm");
    assert_eq!(labels["mango.dev/work-type"], "session");
    // What `kubectl get pods -l mango.dev/work-id=…` asks.
    let selector = format!("mango.dev/work-id={}", work[0].0);
    let client = k8s_strict::client(&fake).await;
    let found = Api::<Pod>::namespaced(client, NS)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .unwrap();
    assert_eq!(
        found
            .items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        vec![warm.clone()]
    );
    assert!(bound["spec"]["activeDeadlineSeconds"].as_i64().unwrap() <= 24 * 3600 + 5);
    let pvc = fake.object("persistentvolumeclaims", NS, &warm).unwrap();
    assert_eq!(
        pvc["metadata"]["labels"]["mango.dev/session-id"],
        session.as_str()
    );
    assert!(
        pvc["metadata"]["ownerReferences"].is_null(),
        "it outlives the Pod"
    );
    let attaches_now = attaches.lock().unwrap().clone();
    let envelope = String::from_utf8_lossy(&attaches_now[0].stdin).to_string();
    let parsed: Value = serde_json::from_str(envelope.trim()).unwrap();
    assert_eq!(parsed["session_id"], session.as_str());
    let secret = parsed["secret"].as_str().unwrap().to_string();
    assert_no_secret(&fake, std::slice::from_ref(&secret));

    end_activation(&api, &session).await;
    crate::support::until(
        "the bound Pod removed",
        Duration::from_secs(20),
        async || fake.pod(&warm).is_none(),
    )
    .await;
    turn(&api, &session, "read it", "first", Duration::from_secs(60)).await;
    let second: Vec<String> = fake
        .pods()
        .into_iter()
        .filter(|p| {
            fake.pod(p).is_some_and(|p| {
                p["metadata"]["labels"]["mango.dev/session-id"] == session.as_str()
            })
        })
        .collect();
    assert_eq!(second.len(), 1, "the second activation's Pod");
    let claims: Vec<Value> = fake.pod(&second[0]).unwrap()["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            v["persistentVolumeClaim"]["claimName"]
                .as_str()
                .map(|c| json!(c))
        })
        .collect();
    assert_eq!(
        claims,
        vec![json!(warm)],
        "the Session's PVC, found by label"
    );
    end_activation(&api, &session).await;
    assert!(
        !fake
            .pvcs()
            .contains(&format!("mango-session-{}", session.replace('_', "-"))),
        "no second PVC was made for the Session"
    );
    crate::support::until("a warm Pod again", Duration::from_secs(30), async || {
        warm_pods(&fake).len() == 1
    })
    .await;
    assert_no_secret(&fake, &[secret]);
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    crate::support::until("warm Pods drained", Duration::from_secs(20), async || {
        warm_pods(&fake).is_empty()
    })
    .await;
    kubelet.abort();
    watch.abort();
}

fn spec_of(work_id: &str, session: &str) -> SandboxSpec {
    let item = ItemIdentity {
        work_id: work_id.into(),
        claim: 1,
        environment_id: "env_1".into(),
        work_type: WorkType::Session,
        session_id: Some(session.into()),
    };
    SandboxSpec::for_item(&item, "builders", "http://mango-api:8080")
}

#[tokio::test]
async fn two_launchers_racing_for_one_warm_pod_bind_it_once() {
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = warm_pool(&fake, "env_1", "mango_envk_unused", json!({"replicas": 1}));
    let (first, watch_a) = launcher(&fake, &pool, "http://mango-api:8080").await;
    let (second, watch_b) = launcher(&fake, &pool, "http://mango-api:8080").await;
    let kubelet = k8s_strict::kubelet(
        fake.clone(),
        tempfile::tempdir().unwrap().keep(),
        Attaches::default(),
    );
    for round in 0..5 {
        let warm = first.create_warm("a").await.expect("a warm Pod");
        let listed = second.existing_warm("b").await.unwrap();
        let theirs = listed
            .into_iter()
            .find(|w| w.name == warm.name)
            .expect("both see it");
        let spec_a = spec_of(&format!("work_a{round}"), &format!("sesn_a{round}"));
        let spec_b = spec_of(&format!("work_b{round}"), &format!("sesn_b{round}"));
        let (a, b) = tokio::join!(first.bind(&warm, &spec_a), second.bind(&theirs, &spec_b));
        let won: Vec<bool> = [&a, &b].iter().map(|r| r.is_ok()).collect();
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {a:?} {b:?}"
        );
        let lost = if a.is_ok() { &b } else { &a };
        assert!(matches!(lost, Err(LaunchError::Taken(_))), "{lost:?}");
        let winner = a.as_ref().or(b.as_ref()).unwrap();
        let pod = fake.pod(&warm.name).unwrap();
        assert_eq!(
            pod["metadata"]["labels"]["mango.dev/work-id"],
            winner.item.work_id.as_str()
        );
        let pvc = fake
            .object("persistentvolumeclaims", NS, &warm.name)
            .unwrap();
        assert_eq!(
            pvc["metadata"]["labels"]["mango.dev/session-id"],
            winner.item.session_id.as_deref().unwrap()
        );
        // The loser's removal of what it took for warm leaves the winner's Pod.
        second.remove_warm(&theirs).await.unwrap();
        first.remove_warm(&warm).await.unwrap();
        assert!(
            fake.pod(&warm.name).is_some(),
            "a bound Pod is not the pool's to remove"
        );
        first.remove(winner).await.unwrap();
    }
    kubelet.abort();
    watch_a.abort();
    watch_b.abort();
}

#[tokio::test]
async fn a_healthchecks_warm_pod_takes_its_pvc_with_it_and_a_changed_image_recycles() {
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = warm_pool(&fake, "env_1", "mango_envk_unused", json!({"replicas": 1}));
    let (launcher, watch) = launcher(&fake, &pool, "http://mango-api:8080").await;
    let kubelet = k8s_strict::kubelet(
        fake.clone(),
        tempfile::tempdir().unwrap().keep(),
        Attaches::default(),
    );
    let warm = launcher.create_warm("a").await.unwrap();
    assert_eq!(
        launcher.warm_image().await.unwrap().as_deref(),
        Some(warm.image.as_str())
    );
    let item = ItemIdentity {
        work_id: "work_check".into(),
        claim: 1,
        environment_id: "env_1".into(),
        work_type: WorkType::Healthcheck,
        session_id: None,
    };
    let spec = SandboxSpec::for_item(&item, "builders", "http://mango-api:8080");
    let bound = launcher.bind(&warm, &spec).await.unwrap();
    let pvc = fake
        .object("persistentvolumeclaims", NS, &warm.name)
        .unwrap();
    assert!(
        pvc["metadata"]["labels"]["mango.dev/session-id"].is_null(),
        "never a Session's"
    );
    launcher.remove(&bound).await.unwrap();
    crate::support::until(
        "the Pod and its PVC gone",
        Duration::from_secs(20),
        async || fake.pod(&warm.name).is_none() && !fake.pvcs().contains(&warm.name),
    )
    .await;
    // Another image: warm Pods of the old one no longer match.
    let client = k8s_strict::client(&fake).await;
    let (store, watch_b) = PodStore::watching(
        Api::<Pod>::namespaced(client.clone(), NS),
        &pool_selector("builders").unwrap(),
    );
    let other = PodLauncher::new(client, pool.clone(), "mango-sandbox:next", store)
        .with_warm("http://mango-api:8080");
    assert_ne!(
        other.warm_image().await.unwrap(),
        launcher.warm_image().await.unwrap()
    );
    kubelet.abort();
    watch.abort();
    watch_b.abort();
}
