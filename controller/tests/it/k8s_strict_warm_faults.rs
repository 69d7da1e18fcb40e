//! Warm Pods (spec §7.1) when things go wrong, against the strict fake API
//! server: a warm Pod that dies while it waits, a pool scaled to zero or
//! given another image through the operator while an item runs in a
//! bound warm Pod, an operator killed and started again, an envelope whose
//! claim was lost before its runner read it, and a warm Pod at its
//! `warm.maxAge`. Each ends by counting the Pods and PVCs the fake holds:
//! none may be left that no supervisor will remove.

use crate::k8s_strict::{self, Attaches, NS};
use crate::k8s_strict_operator::{condition, settings};
use crate::support::{config, end_activation, healthcheck, turn, two_bash_turns, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::operator::{self, Context};
use mango_controller::kubernetes::pods::PodStore;
use mango_protocol::CheckStatus;
use mango_testkit::apiserver::{ApiServer, Attached, Options};
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const POOL: &str = "builders";

/// The pool's Secret and the WorkerPool `builders` with `warm` (and
/// `extra` merged into its spec).
fn warm_pool(fake: &ApiServer, api: &TestApp, warm: Value, extra: Value) -> Arc<WorkerPool> {
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": api.env_key}}))
        .expect("the Secret is admitted");
    let mut spec = json!({"environmentId": api.env_id, "environmentKeySecret": {"name": "pool-key"},
                          "maxConcurrency": 2, "warm": warm});
    for (key, value) in extra.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    let stored = fake
        .create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": POOL, "namespace": NS}, "spec": spec}),
        )
        .expect("the WorkerPool is admitted");
    Arc::new(serde_json::from_value(stored).expect("a WorkerPool"))
}

/// A supervisor in this process with the pool's Pod launcher.
async fn supervisor(fake: &ApiServer, api: &TestApp, pool: &Arc<WorkerPool>) -> Running {
    let client = k8s_strict::client(fake).await;
    let (store, _watch) = PodStore::watching(
        Api::<Pod>::namespaced(client.clone(), NS),
        &pool_selector(POOL).unwrap(),
    );
    let launcher =
        PodLauncher::new(client, pool.clone(), "mango-sandbox:test", store).with_warm(&api.base);
    let mut config = config(api, 2);
    config.pool = POOL.into();
    config.warm = pool.spec.warm_replicas();
    Running::start(api, config, launcher).await
}

fn is_live(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
}

/// Unbound warm Pods not being deleted, by name.
fn warm_pods(fake: &ApiServer) -> BTreeSet<String> {
    fake.pods()
        .into_iter()
        .filter(|p| {
            fake.pod(p)
                .is_some_and(|p| p["metadata"]["labels"]["mango.dev/warm"] == "true" && is_live(&p))
        })
        .collect()
}

fn running_warm(fake: &ApiServer) -> BTreeSet<String> {
    warm_pods(fake)
        .into_iter()
        .filter(|p| {
            fake.pod(p)
                .is_some_and(|p| p["status"]["phase"] == "Running")
        })
        .collect()
}

fn pvc(fake: &ApiServer, name: &str) -> Option<Value> {
    fake.object("persistentvolumeclaims", NS, name)
}

/// Every Pod and PVC the fake holds.
fn everything(fake: &ApiServer) -> (BTreeSet<String>, BTreeSet<String>) {
    (
        fake.pods().into_iter().collect(),
        fake.pvcs().into_iter().collect(),
    )
}

/// The PVCs nothing will remove: neither a Session's (kept for it) nor
/// one of a live warm Pod (it goes with its Pod).
fn leaked_pvcs(fake: &ApiServer) -> Vec<String> {
    fake.pvcs()
        .into_iter()
        .filter(|name| {
            let claim = pvc(fake, name).unwrap();
            claim["metadata"]["labels"]["mango.dev/session-id"].is_null()
                && fake.pod(name).is_none_or(|p| !is_live(&p))
        })
        .collect()
}

/// Until no PVC is leaked: a removal is two deletes (the Pod's, then its
/// PVC's), so one may be seen between them.
async fn until_no_leak(fake: &ApiServer) {
    crate::support::until("no PVC leaked", Duration::from_secs(10), async || {
        leaked_pvcs(fake).is_empty()
    })
    .await;
}

/// The bodies of every stored object a credential must never reach.
fn stored_text(fake: &ApiServer) -> Vec<String> {
    let mut stored = Vec::new();
    for (resource, names) in [
        ("pods", fake.names("pods", NS)),
        (
            "persistentvolumeclaims",
            fake.names("persistentvolumeclaims", NS),
        ),
        ("events", fake.names("events", NS)),
        ("workerpools", fake.names("workerpools", NS)),
    ] {
        for name in names {
            if let Some(object) = fake.object(resource, NS, &name) {
                stored.push(object.to_string());
            }
        }
    }
    stored
}

fn assert_no_secret(fake: &ApiServer, secrets: &[String]) {
    for text in stored_text(fake) {
        for marker in ["mango_st_", "mango_envk_", "mango_wsk_", "sessions_token"] {
            assert!(!text.contains(marker), "{marker} stored: {text}");
        }
        for secret in secrets {
            assert!(!text.contains(secret.as_str()), "a secret stored: {text}");
        }
    }
}

/// What this test's kubelet does besides running Pods.
#[derive(Default)]
struct Control {
    /// Envelopes are held, their runners not started, until released.
    hold: AtomicBool,
    held: Mutex<Vec<Attached>>,
    /// The next Pod it runs reports a `startTime` this long ago, as a
    /// kubelet does for a Pod that started then.
    started_ago: Mutex<Option<Duration>>,
}

/// RFC 3339 in whole seconds, `ago` before now.
fn time_ago(ago: Duration) -> String {
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(ago).unwrap();
    at.round(jiff::Unit::Second).unwrap().to_string()
}

/// `k8s_strict::kubelet` with [`Control`]: it runs each Pod once its PVCs
/// exist (reporting its `startTime`), runs the runner with what an attach delivered (or
/// holds it), and lets a deleted Pod go once nothing runs in it.
fn kubelet(
    fake: Arc<ApiServer>,
    volumes: PathBuf,
    attaches: Attaches,
    control: Arc<Control>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut started: HashSet<String> = HashSet::new();
        let running_now: Arc<Mutex<HashSet<String>>> = Arc::default();
        loop {
            for name in fake.pods() {
                let Some(pod) = fake.pod(&name) else { continue };
                if !is_live(&pod) {
                    if !running_now.lock().unwrap().contains(&name) {
                        fake.pod_terminated(&name);
                    }
                } else if k8s_strict::claims_exist(&fake, &pod) && started.insert(name.clone()) {
                    let ago = control.started_ago.lock().unwrap().take();
                    let mut status = k8s_strict::running(&pod);
                    status["startTime"] = json!(time_ago(ago.unwrap_or_default()));
                    fake.set_pod_status(&name, status);
                }
            }
            // A poll interval of the fake's attach queue, as k8s_strict's kubelet.
            if let Some(attached) = fake.attached(Duration::from_millis(20)).await {
                attaches.lock().unwrap().push(attached.clone());
                if attached.stdin.is_empty() {
                    continue;
                }
                if control.hold.load(Ordering::SeqCst) {
                    control.held.lock().unwrap().push(attached);
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

/// Runs a held attach's runner now, as the kubelet would have.
fn release(
    fake: &Arc<ApiServer>,
    volumes: PathBuf,
    attached: Attached,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(k8s_strict::run_container(
        fake.clone(),
        volumes,
        attached,
        Arc::default(),
        None,
        Arc::default(),
    ))
}

/// The envelopes each Pod's stdin got.
fn deliveries(attaches: &Attaches, pod: &str) -> usize {
    attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.pod == pod && !a.stdin.is_empty())
        .count()
}

/// The Pods whose stdin got `work_id`'s secret or envelope (the attach
/// saw the Pod labelled with the Work).
fn served_by(attaches: &Attaches, work_id: &str) -> Vec<String> {
    attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| {
            !a.stdin.is_empty() && a.manifest["metadata"]["labels"]["mango.dev/work-id"] == work_id
        })
        .map(|a| a.pod.clone())
        .collect()
}

fn patches_of(fake: &ApiServer, pod: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|(method, uri)| {
            method == axum::http::Method::PATCH && uri.contains(&format!("/pods/{pod}"))
        })
        .count()
}

struct Setup {
    fake: Arc<ApiServer>,
    attaches: Attaches,
    control: Arc<Control>,
    volumes: tempfile::TempDir,
    kubelet: tokio::task::JoinHandle<()>,
}

async fn setup(options: Options) -> Setup {
    let fake = k8s_strict::fake_with(options).await;
    let attaches = Attaches::default();
    let control = Arc::new(Control::default());
    let volumes = tempfile::tempdir().unwrap();
    let kubelet = kubelet(
        fake.clone(),
        volumes.path().to_path_buf(),
        attaches.clone(),
        control.clone(),
    );
    Setup {
        fake,
        attaches,
        control,
        volumes,
        kubelet,
    }
}

/// Item 1: a warm Pod whose runner exits, one evicted (phase Failed, no
/// container status) and one deleted by someone else each leave the pool:
/// the Pod and its PVC are removed (the garbage collector is off, so
/// nothing but the supervisor removes the PVC), another is made, and the
/// dead one is never bound, even to an item acked right after it died.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_warm_pod_that_dies_while_it_waits_is_replaced_never_bound_and_its_pvc_removed(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    let s = setup(Options {
        garbage_collector: false,
        ..Options::default()
    })
    .await;
    let fake = &s.fake;
    let pool = warm_pool(fake, &api, json!({"replicas": 2}), json!({}));
    let running = supervisor(fake, &api, &pool).await;
    crate::support::until("two warm Pods", Duration::from_secs(30), async || {
        running_warm(fake).len() == 2
    })
    .await;
    let client = k8s_strict::client(fake).await;
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let mut dead = Vec::new();
    for death in ["exited", "evicted", "deleted"] {
        let before = running_warm(fake);
        let victim = before.iter().next().unwrap().clone();
        assert!(pvc(fake, &victim).is_some(), "{victim} has its PVC");
        let patches = patches_of(fake, &victim);
        match death {
            "exited" => {
                fake.set_pod_status(
                    &victim,
                    json!({"phase": "Succeeded", "containerStatuses": [{
                        "name": "runner", "image": "mango-sandbox:test", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "finishedAt": time_ago(Duration::ZERO)}}}]}),
                );
            }
            "evicted" => {
                fake.set_pod_status(
                    &victim,
                    json!({"phase": "Failed", "reason": "Evicted",
                           "message": "The node was low on resource: ephemeral-storage."}),
                );
            }
            _ => {
                pods.delete(&victim, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
        // An item acked right after the death: it must not get the dead Pod.
        let (check, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
        assert_eq!(status, CheckStatus::Succeeded, "{death}: {message}");
        crate::support::until(
            &format!("the {death} warm Pod and its PVC removed, and replaced"),
            Duration::from_secs(30),
            async || {
                fake.pod(&victim).is_none()
                    && pvc(fake, &victim).is_none()
                    && running_warm(fake).len() == 2
                    && !running_warm(fake).contains(&victim)
            },
        )
        .await;
        assert_eq!(deliveries(&s.attaches, &victim), 0, "{death}: never bound");
        assert_eq!(
            patches_of(fake, &victim),
            patches,
            "{death}: no binding patch reached {victim}"
        );
        let bound = served_by(&s.attaches, &check);
        assert_eq!(
            bound.len(),
            1,
            "{death}: the check had one envelope: {bound:?}"
        );
        assert!(!dead.contains(&bound[0]), "{death}: a dead Pod served it");
        dead.push(victim);
    }
    until_no_leak(fake).await;
    running.shutdown().await;
    crate::support::until("nothing left", Duration::from_secs(30), async || {
        everything(fake) == Default::default()
    })
    .await;
    s.kubelet.abort();
}

/// The operator over the fake, with a Session whose first activation holds
/// a bound warm Pod (its runner waits for the next turn).
struct Live {
    api: TestApp,
    s: Setup,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    session: String,
    bound: String,
    bound_uid: String,
    _model: ScriptedModel,
}

async fn operator_with_a_bound_session(db: sqlx::PgPool) -> Live {
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
    let s = setup(Options::default()).await;
    let fake = &s.fake;
    warm_pool(fake, &api, json!({"replicas": 2}), json!({}));
    let ctx = Context::new(k8s_strict::client(fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx, stop.clone()));
    crate::support::until("two warm Pods", Duration::from_secs(60), async || {
        running_warm(fake).len() == 2
    })
    .await;
    let ready = running_warm(fake);
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    let bound: Vec<String> = fake
        .pods()
        .into_iter()
        .filter(|p| {
            fake.pod(p).is_some_and(|p| {
                p["metadata"]["labels"]["mango.dev/session-id"] == session.as_str()
            })
        })
        .collect();
    assert_eq!(bound.len(), 1, "{bound:?}");
    let bound = bound[0].clone();
    assert!(ready.contains(&bound), "the Session went warm: {bound}");
    let bound_uid = fake.pod(&bound).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    crate::support::until("the pool refilled", Duration::from_secs(30), async || {
        running_warm(fake).len() == 2
    })
    .await;
    Live {
        api,
        s,
        stop,
        run,
        session,
        bound,
        bound_uid,
        _model: model,
    }
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

/// The bound Pod as it was: same uid, not being deleted, still the Session's.
fn assert_untouched(live: &Live) {
    let pod = live.s.fake.pod(&live.bound).expect("the bound Pod stays");
    assert_eq!(pod["metadata"]["uid"], live.bound_uid.as_str());
    assert!(is_live(&pod), "the bound Pod is not being deleted: {pod}");
    assert_eq!(
        pod["metadata"]["labels"]["mango.dev/session-id"],
        live.session.as_str()
    );
    assert_eq!(deliveries(&live.s.attaches, &live.bound), 1);
}

async fn until_observed(fake: &ApiServer, generation: i64) {
    crate::support::until(
        "the operator observes the edit",
        Duration::from_secs(30),
        async || {
            condition(fake, POOL, "Ready").is_some_and(|c| {
                c["status"] == "True" && c["observedGeneration"].as_i64() == Some(generation)
            })
        },
    )
    .await;
}

/// Item 2: `warm.replicas: 0` through the operator removes every unbound
/// warm Pod and its PVC (none made after, not even by the supervisor the
/// edit replaced); the bound one serves its Session to the end.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_scaled_to_no_warm_pods_removes_them_and_their_pvcs_and_keeps_the_bound_one(
    db: sqlx::PgPool,
) {
    let live = operator_with_a_bound_session(db).await;
    let fake = &live.s.fake;
    let warm_before = running_warm(fake);
    let generation = edit_pool(fake, json!({"warm": {"replicas": 0}})).await;
    until_observed(fake, generation).await;
    crate::support::until(
        "the warm Pods and their PVCs gone",
        Duration::from_secs(30),
        async || {
            warm_pods(fake).is_empty()
                && warm_before
                    .iter()
                    .all(|w| fake.pod(w).is_none() && pvc(fake, w).is_none())
        },
    )
    .await;
    assert_untouched(&live);
    // The bound Pod's item goes on: the Session's second turn runs in it.
    turn(
        &live.api,
        &live.session,
        "read it",
        "first",
        Duration::from_secs(60),
    )
    .await;
    assert_untouched(&live);
    end_activation(&live.api, &live.session).await;
    crate::support::until(
        "the bound Pod removed",
        Duration::from_secs(30),
        async || fake.pod(&live.bound).is_none(),
    )
    .await;
    // Whatever a replaced supervisor had in flight has landed by now.
    let (pods, pvcs) = everything(fake);
    assert!(
        pods.is_empty(),
        "no Pod is left, no warm one made: {pods:?}"
    );
    assert_eq!(
        pvcs,
        BTreeSet::from([live.bound.clone()]),
        "only the Session's PVC (the bound warm Pod's)"
    );
    until_no_leak(fake).await;
    live.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), live.run).await;
    live.s.kubelet.abort();
}

/// Item 3: another `spec.image` through the operator recycles every
/// unbound warm Pod (and PVC) of the old image; the bound one finishes
/// its item on the old image, untouched; no Pod of the old image is made
/// after the edit.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_image_changed_under_a_live_pool_recycles_its_unbound_warm_pods_and_not_the_bound(
    db: sqlx::PgPool,
) {
    let live = operator_with_a_bound_session(db).await;
    let fake = &live.s.fake;
    let warm_before = running_warm(fake);
    let generation = edit_pool(fake, json!({"image": "mango-sandbox:next"})).await;
    until_observed(fake, generation).await;
    let image_of = |name: &str| {
        fake.pod(name).map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap()
                .to_string()
        })
    };
    crate::support::until(
        "warm Pods of the new image only",
        Duration::from_secs(30),
        async || {
            let now = running_warm(fake);
            now.len() == 2
                && now.is_disjoint(&warm_before)
                && warm_before
                    .iter()
                    .all(|w| fake.pod(w).is_none() && pvc(fake, w).is_none())
        },
    )
    .await;
    for pod in warm_pods(fake) {
        assert_eq!(
            image_of(&pod).as_deref(),
            Some("mango-sandbox:next"),
            "{pod}"
        );
    }
    assert_untouched(&live);
    assert_eq!(
        image_of(&live.bound).as_deref(),
        Some("mango-sandbox:test"),
        "the bound Pod keeps its image"
    );
    turn(
        &live.api,
        &live.session,
        "read it",
        "first",
        Duration::from_secs(60),
    )
    .await;
    assert_untouched(&live);
    end_activation(&live.api, &live.session).await;
    crate::support::until(
        "the bound Pod removed",
        Duration::from_secs(30),
        async || fake.pod(&live.bound).is_none(),
    )
    .await;
    let old: Vec<String> = fake
        .pods()
        .into_iter()
        .filter(|p| image_of(p).as_deref() != Some("mango-sandbox:next"))
        .collect();
    assert!(old.is_empty(), "Pods of the old image left: {old:?}");
    assert_eq!(warm_pods(fake).len(), 2);
    until_no_leak(fake).await;
    live.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), live.run).await;
    live.s.kubelet.abort();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `mango-worker kubernetes` on the fake through a kubeconfig, as replica `name`.
fn operator_process(
    api: &TestApp,
    kubeconfig: &std::path::Path,
    name: &str,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_mango-worker"))
        .arg("kubernetes")
        .args(["--namespace", NS, "--default-api-url", &api.base])
        .args(["--default-sandbox-image", "mango-sandbox:test"])
        .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--leader-election", "false"])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", name)
        .env_remove("MANGO_NAMESPACE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mango-worker starts")
}

/// Item 4: the operator's process killed (SIGKILL: nothing detaches) with
/// its warm Pods live; meanwhile one is deleted and a stranded one (its
/// PVC never made) appears. The next operator adopts the live one, binds
/// each warm Pod once, removes the stranded one within the pool's start
/// bound instead of counting it ready, refills the pool, and leaves
/// exactly one PVC per live warm Pod.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_operator_killed_with_warm_pods_live_is_followed_by_one_that_adopts_them(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    let s = setup(Options::default()).await;
    let fake = &s.fake;
    let pool = warm_pool(
        fake,
        &api,
        json!({"replicas": 2}),
        json!({"startTimeoutSeconds": 5}),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: fake, user: {{}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NS}}}}}]\n\
             current-context: fake\n",
            fake.url
        ),
    )
    .unwrap();
    let mut first = operator_process(&api, &kubeconfig, "replica-a");
    crate::support::until("two warm Pods", Duration::from_secs(60), async || {
        running_warm(fake).len() == 2
    })
    .await;
    first.kill().await.unwrap();
    let left = everything(fake);
    let warm = running_warm(fake);
    assert_eq!(left.0, warm, "only the warm Pods: {left:?}");
    assert_eq!(left.1, warm, "and their PVCs: {left:?}");
    // While no operator runs, someone deletes one warm Pod (its PVC goes
    // with it), and a kill between a warm Pod's create and its PVC's left
    // one that can never run: Pending, its claim not found.
    let client = k8s_strict::client(fake).await;
    let gone = warm.iter().next().unwrap().clone();
    Api::<Pod>::namespaced(client, NS)
        .delete(&gone, &DeleteParams::default())
        .await
        .unwrap();
    crate::support::until(
        "the deleted one gone",
        Duration::from_secs(20),
        async || fake.pod(&gone).is_none() && pvc(fake, &gone).is_none(),
    )
    .await;
    let warm: BTreeSet<String> = warm.into_iter().filter(|w| *w != gone).collect();
    let stranded = "mango-warm-ffffffffffffffff";
    let manifest = mango_controller::kubernetes::pod::warm::warm_pod(
        &pool,
        stranded,
        "mango-sandbox:test",
        &api.base,
    );
    fake.create(serde_json::to_value(&manifest).unwrap())
        .expect("the stranded warm Pod is admitted");

    // Its supervisor adopts before it polls: the first check finds them.
    let mut second = operator_process(&api, &kubeconfig, "replica-b");
    let check_once = async || {
        let (check, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
        assert_eq!(status, CheckStatus::Succeeded, "{message}");
        let pod = served_by(&s.attaches, &check);
        assert_eq!(pod.len(), 1, "one envelope for {check}: {pod:?}");
        pod[0].clone()
    };
    let first_served = check_once().await;
    assert!(
        warm.contains(&first_served),
        "the first check went to the adopted warm Pod: {first_served} of {warm:?}"
    );
    // Before any item could take it: the stranded Pod is not counted ready.
    crate::support::until(
        "the pool refilled, the stranded Pod removed",
        Duration::from_secs(30),
        async || running_warm(fake).len() == 2 && fake.pods().len() == 2,
    )
    .await;
    assert!(fake.pod(stranded).is_none());
    let second_served = check_once().await;
    assert_ne!(first_served, second_served, "a warm Pod is bound once");
    assert_eq!(deliveries(&s.attaches, stranded), 0);
    for pod in fake.pods().iter().chain([&first_served, &second_served]) {
        assert!(deliveries(&s.attaches, pod) <= 1, "{pod} bound twice");
    }
    crate::support::until(
        "the pool refilled again",
        Duration::from_secs(30),
        async || running_warm(fake).len() == 2 && fake.pods().len() == 2,
    )
    .await;
    let (pods, pvcs) = everything(fake);
    assert_eq!(pods, pvcs, "one PVC per warm Pod and no other");
    assert_eq!(pods, running_warm(fake));
    second.kill().await.unwrap();
    s.kubelet.abort();
}

/// Item 5: the claim of a healthcheck bound to a warm Pod is lost (the
/// Work stopped) after its envelope was written and before its runner
/// read it: nothing runs for it (the runner, if it starts at all, holds no
/// lease), the Pod and its PVC go, the pool makes
/// another, and the envelope's secret is in no stored object.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_envelope_whose_claim_was_lost_leaves_nothing_and_no_secret(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let s = setup(Options {
        garbage_collector: false,
        ..Options::default()
    })
    .await;
    let fake = &s.fake;
    let pool = warm_pool(fake, &api, json!({"replicas": 1}), json!({}));
    let running = supervisor(fake, &api, &pool).await;
    crate::support::until("a warm Pod", Duration::from_secs(30), async || {
        running_warm(fake).len() == 1
    })
    .await;
    let warm = running_warm(fake).into_iter().next().unwrap();
    s.control.hold.store(true, Ordering::SeqCst);
    let operator = mango_client::Client::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    crate::support::until("its envelope", Duration::from_secs(30), async || {
        !s.control.held.lock().unwrap().is_empty()
    })
    .await;
    let held = s.control.held.lock().unwrap().remove(0);
    s.control.hold.store(false, Ordering::SeqCst);
    assert_eq!(held.pod, warm, "bound to the warm Pod");
    let envelope: Value = serde_json::from_slice(held.stdin.trim_ascii()).unwrap();
    assert_eq!(envelope["work_id"], check.id.as_str());
    let secret = envelope["secret"].as_str().unwrap().to_string();
    assert_no_secret(fake, std::slice::from_ref(&secret));

    api.stop_work(&check.id, true).await;
    crate::support::until_stopped(&api, &check.id, Duration::from_secs(15)).await;
    let runner = release(fake, s.volumes.path().to_path_buf(), held);
    crate::support::until(
        "the bound Pod and its PVC gone, another warm one ready",
        Duration::from_secs(30),
        async || {
            fake.pod(&warm).is_none()
                && pvc(fake, &warm).is_none()
                && running_warm(fake).len() == 1
                && !running_warm(fake).contains(&warm)
        },
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(30), runner).await;
    assert_eq!(deliveries(&s.attaches, &warm), 1, "delivered once");
    let work = operator.work(&api.env_id, &check.id).await.unwrap();
    assert!(
        work.result
            .is_none_or(|r| r.status != CheckStatus::Succeeded),
        "the stale envelope ran nothing"
    );
    assert_no_secret(fake, std::slice::from_ref(&secret));
    until_no_leak(fake).await;
    let (pods, pvcs) = everything(fake);
    assert_eq!(pods, running_warm(fake));
    assert_eq!(pods, pvcs);
    running.shutdown().await;
    crate::support::until("nothing left", Duration::from_secs(30), async || {
        everything(fake) == Default::default()
    })
    .await;
    s.kubelet.abort();
}

/// Item 6: a warm Pod reaches `warm.maxAge` (60 s, its least) counted
/// from the `startTime` its kubelet reports: it is replaced, not before,
/// its PVC goes with it, and an item then binds its replacement. The
/// CRD admits `maxAge` only within 60..=86400.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_warm_pod_at_its_max_age_is_replaced(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let s = setup(Options {
        garbage_collector: false,
        ..Options::default()
    })
    .await;
    let fake = &s.fake;
    for refused in [59, 86401] {
        let err = fake
            .create(
                json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
                "metadata": {"name": format!("refused-{refused}"), "namespace": NS},
                "spec": {"environmentId": api.env_id, "environmentKeySecret": {"name": "pool-key"},
                         "warm": {"replicas": 1, "maxAge": refused}}}),
            )
            .expect_err("outside 60..=86400");
        assert_eq!(err.code, 422, "{err:?}");
    }
    // The first warm Pod started 55 s before its kubelet reports it Running.
    let ago = Duration::from_secs(55);
    *s.control.started_ago.lock().unwrap() = Some(ago);
    let pool = warm_pool(fake, &api, json!({"replicas": 1, "maxAge": 60}), json!({}));
    let running = supervisor(fake, &api, &pool).await;
    crate::support::until("a warm Pod", Duration::from_secs(30), async || {
        running_warm(fake).len() == 1
    })
    .await;
    let old = running_warm(fake).into_iter().next().unwrap();
    let started: jiff::Timestamp = fake.pod(&old).unwrap()["status"]["startTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    crate::support::until("the old one gone", Duration::from_secs(30), async || {
        fake.pod(&old).is_none()
    })
    .await;
    // `startTime` has whole seconds and a wait so far is rounded up: the
    // replacement may come within a second before the 60th.
    let age = jiff::Timestamp::now().duration_since(started);
    assert!(
        age >= jiff::SignedDuration::from_secs(59),
        "replaced at {age:?}, before its maxAge"
    );
    crate::support::until(
        "its PVC gone, a new one ready",
        Duration::from_secs(30),
        async || pvc(fake, &old).is_none() && running_warm(fake).len() == 1,
    )
    .await;
    let new = running_warm(fake).into_iter().next().unwrap();
    assert_ne!(new, old);
    let (check, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    let served = served_by(&s.attaches, &check);
    assert_eq!(served, vec![new], "the replacement served it");
    assert_eq!(deliveries(&s.attaches, &old), 0);
    running.shutdown().await;
    crate::support::until("nothing left", Duration::from_secs(30), async || {
        everything(fake) == Default::default()
    })
    .await;
    s.kubelet.abort();
}
