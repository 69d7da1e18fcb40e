//! Kept Pods (spec §7.1 `keepIdle`) against the strict fake API server
//! over HTTP, with this test as the kubelet running the real runner: a
//! Session's Pod outlives an activation that ended at the runner's idle
//! end and takes the Session's next envelope over a second attach, its
//! labels patched to the new item; a Stop, the keep's expiry, a changed
//! image and a restarted supervisor remove it; healthcheck Pods and
//! `stdinOnce` Pods are never kept; no secret is stored before or after
//! the rebinding.

use crate::k8s_strict::{self, Attaches, NS};
use crate::support::{config, turn, two_bash_turns, Running};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use mango_controller::core::launcher::{ItemIdentity, LaunchError, Launcher, SandboxSpec};
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::{RunEnd, Stop};
use mango_controller::kubernetes::crd::WorkerPool;
use mango_controller::kubernetes::launcher::{pool_selector, PodLauncher};
use mango_controller::kubernetes::pods::PodStore;
use mango_protocol::WorkType;
use mango_testkit::apiserver::{ApiServer, Options};
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

const POOL: &str = "builders";
const BASE: &str = "http://mango-api:8080";

/// The WorkerPool `builders` with `spec` added, and its key's Secret.
fn pool_with(fake: &ApiServer, env_id: &str, key: &str, spec: Value) -> Arc<WorkerPool> {
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": key}}))
        .expect("the Secret is admitted");
    let mut full = json!({"environmentId": env_id, "environmentKeySecret": {"name": "pool-key"},
        "maxConcurrency": 1});
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    let stored = fake
        .create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": POOL, "namespace": NS}, "spec": full}),
        )
        .expect("the WorkerPool is admitted");
    Arc::new(serde_json::from_value(stored).expect("a WorkerPool"))
}

async fn launcher(
    fake: &ApiServer,
    pool: &Arc<WorkerPool>,
    image: &str,
    base_url: &str,
) -> (PodLauncher, tokio::task::JoinHandle<()>) {
    let client = k8s_strict::client(fake).await;
    let (store, watch) = PodStore::watching(
        Api::<Pod>::namespaced(client.clone(), NS),
        &pool_selector(POOL).unwrap(),
    );
    let launcher = PodLauncher::new(client, pool.clone(), image, store).with_warm(base_url);
    (launcher, watch)
}

/// The runner ends an activation 2 s after an end of turn (60 s otherwise).
fn quick_idle_kubelet(fake: &Arc<ApiServer>, attaches: &Attaches) -> tokio::task::JoinHandle<()> {
    k8s_strict::kubelet_with(
        fake.clone(),
        tempfile::tempdir().unwrap().keep(),
        attaches.clone(),
        vec![("MANGO_IDLE_AFTER_END_TURN_SECONDS".into(), "2".into())],
    )
}

fn session_pods(fake: &ApiServer, session: &str) -> Vec<Value> {
    fake.pods()
        .into_iter()
        .filter_map(|p| fake.pod(&p))
        .filter(|p| p["metadata"]["labels"]["mango.dev/session-id"] == session)
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// No credential of any kind in what the apiserver stores.
fn assert_no_secret(fake: &ApiServer, secrets: &[String]) {
    for pod in fake.pods() {
        let text = fake.pod(&pod).unwrap().to_string();
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

/// The secrets of every envelope delivered so far.
fn delivered_secrets(attaches: &Attaches) -> Vec<String> {
    attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| !a.stdin.is_empty())
        .map(|a| {
            let line = String::from_utf8_lossy(a.stdin.trim_ascii()).to_string();
            // An envelope names its secret; a healthcheck's hand-off is the secret.
            match serde_json::from_str::<Value>(&line) {
                Ok(envelope) => envelope["secret"].as_str().unwrap_or_default().to_string(),
                Err(_) => line,
            }
        })
        .collect()
}

/// Until every Work of the Session is stopped (the runner's idle end).
async fn until_idle_end(api: &TestApp, session: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while api
        .session_work(session)
        .await
        .iter()
        .any(|(_, s)| s != "stopped")
    {
        assert!(Instant::now() < deadline, "the activation never ended idle");
        // A poll interval inside the deadline above.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn names_by_selector(fake: &ApiServer, selector: &str) -> Vec<String> {
    let client = k8s_strict::client(fake).await;
    Api::<Pod>::namespaced(client, NS)
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect()
}

/// Spec §7.1 end to end: the Session's idle end keeps its Pod (which does
/// not count against `maxConcurrency: 1`: a healthcheck runs meanwhile),
/// the next Work is delivered to the same Pod over a second attach and
/// `-l mango.dev/work-id=…` finds it by the new item, and an operator's
/// Stop of that Work removes it at once.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_pod_takes_its_sessions_next_work_over_a_second_attach(db: sqlx::PgPool) {
    let model = ScriptedModel::start(two_bash_turns(
        "echo one > kept.txt && echo WROTE",
        "cat kept.txt",
    ))
    .await;
    let settings = mango_api::Settings {
        model_base_url: Some(model.base.clone()),
        ..Default::default()
    };
    let api = TestApp::start_with(db, settings).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = pool_with(&fake, &api.env_id, &api.env_key, json!({"keepIdle": 300}));
    let (launcher, watch) = launcher(&fake, &pool, "mango-sandbox:test", &api.base).await;
    let attaches = Attaches::default();
    let kubelet = quick_idle_kubelet(&fake, &attaches);
    let mut config = config(&api, 1);
    config.pool = POOL.into();
    config.keep_idle = pool.spec.keep_idle();
    let running = Running::start(&api, config, launcher).await;

    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    let first_work = api.session_work(&session).await[0].0.clone();
    let pods = session_pods(&fake, &session);
    assert_eq!(pods.len(), 1);
    let (name, uid) = (
        pods[0]["metadata"]["name"].as_str().unwrap().to_string(),
        pods[0]["metadata"]["uid"].clone(),
    );
    let runner = &pods[0]["spec"]["containers"][0];
    assert_eq!(runner["stdinOnce"], false, "its stdin outlives an envelope");
    let command: Vec<&str> = runner["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(command[1], "--wait");
    assert!(
        command.ends_with(&["--keep-idle-seconds", "300"]),
        "{command:?}"
    );
    let env = runner["env"].to_string();
    assert!(!env.contains("MANGO_WORK_ID"), "no item in its env: {env}");

    until_idle_end(&api, &session).await;
    crate::support::until("the Pod kept", Duration::from_secs(10), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    let kept = fake.pod(&name).expect("kept, not removed");
    assert_eq!(kept["metadata"]["uid"], uid);
    assert!(kept["metadata"]["deletionTimestamp"].is_null());
    assert_no_secret(&fake, &delivered_secrets(&attaches));

    // A kept Pod is bound to no item: the one slot is free for another.
    let check = api.create_check().await;
    crate::support::until("the healthcheck ran", Duration::from_secs(30), async || {
        api.get_work(&check).await["state"] == "stopped"
    })
    .await;
    let checks: Vec<Value> = attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.manifest["metadata"]["labels"]["mango.dev/work-id"] == check.as_str())
        .map(|a| a.manifest.clone())
        .collect();
    assert_eq!(checks.len(), 1, "the healthcheck had a Pod of its own");
    assert_eq!(
        checks[0]["spec"]["containers"][0]["stdinOnce"], true,
        "a healthcheck's stdin closes after its secret"
    );
    assert!(checks[0]["spec"]["containers"][0]["command"].is_null());
    assert!(fake.pod(&name).is_some(), "still kept");

    turn(&api, &session, "read it", "one", Duration::from_secs(60)).await;
    let works = api.session_work(&session).await;
    let second_work = works
        .iter()
        .map(|(id, _)| id.clone())
        .find(|id| *id != first_work)
        .expect("the second Work");
    let serving = session_pods(&fake, &session);
    assert_eq!(serving.len(), 1, "no second Pod for the Session");
    assert_eq!(serving[0]["metadata"]["name"], name.as_str());
    assert_eq!(serving[0]["metadata"]["uid"], uid, "the same Pod");
    let labels = &serving[0]["metadata"]["labels"];
    assert_eq!(labels["mango.dev/work-id"], second_work.as_str());
    assert_eq!(
        names_by_selector(&fake, &format!("mango.dev/work-id={second_work}")).await,
        vec![name.clone()]
    );
    assert!(
        names_by_selector(&fake, &format!("mango.dev/work-id={first_work}"))
            .await
            .is_empty()
    );
    let to_it: Vec<_> = attaches
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.pod == name)
        .cloned()
        .collect();
    assert_eq!(to_it.len(), 2, "one attach per envelope");
    assert!(to_it.iter().all(|a| a.reached), "both reached the runner");
    assert_eq!(running.metrics.kept_reused.load(Relaxed), 1);
    let secrets = delivered_secrets(&attaches);
    assert_eq!(secrets.len(), 3, "two envelopes and the healthcheck's");
    assert_no_secret(&fake, &secrets);

    // An operator's Stop before the idle end: removed at once, not kept.
    api.stop_work(&second_work, true).await;
    crate::support::until("the Pod removed", Duration::from_secs(10), async || {
        fake.pod(&name)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0);
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    kubelet.abort();
    watch.abort();
}

/// A kept Pod goes when its keep runs out, and a supervisor restarted on
/// another image neither rebinds nor keeps the Pod an earlier one kept:
/// it finds it by its labels, adopts it as the ended item it names, and
/// removes it; the Session's next Work starts a Pod of the new image.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_pod_expires_and_a_restart_on_another_image_recycles_it(db: sqlx::PgPool) {
    let model = ScriptedModel::start(
        [
            two_bash_turns("echo ALPHA", "echo BRAVO"),
            two_bash_turns("echo CHARLIE", "echo DELTA"),
        ]
        .concat(),
    )
    .await;
    let settings = mango_api::Settings {
        model_base_url: Some(model.base.clone()),
        ..Default::default()
    };
    let api = TestApp::start_with(db, settings).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = pool_with(&fake, &api.env_id, &api.env_key, json!({"keepIdle": 3}));
    let attaches = Attaches::default();
    let kubelet = quick_idle_kubelet(&fake, &attaches);
    let start = async |image: &str| {
        let (launcher, watch) = launcher(&fake, &pool, image, &api.base).await;
        let mut config = config(&api, 1);
        config.pool = POOL.into();
        config.keep_idle = pool.spec.keep_idle();
        (Running::start(&api, config, launcher).await, watch)
    };
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;

    let (running, watch) = start("mango-sandbox:one").await;
    turn(&api, &session, "one", "ALPHA", Duration::from_secs(60)).await;
    let name = session_pods(&fake, &session)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    until_idle_end(&api, &session).await;
    crate::support::until("the Pod kept", Duration::from_secs(10), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    crate::support::until("its keep ran out", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 0 && session_pods(&fake, &session).is_empty()
    })
    .await;

    turn(&api, &session, "two", "BRAVO", Duration::from_secs(60)).await;
    let second = session_pods(&fake, &session);
    assert_eq!(second.len(), 1);
    let kept_name = second[0]["metadata"]["name"].as_str().unwrap().to_string();
    assert_ne!(kept_name, name, "the expired Pod was not reused");
    until_idle_end(&api, &session).await;
    crate::support::until("kept again", Duration::from_secs(10), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    // A changed pool restarts its supervisor this way: the Pods stay.
    assert_eq!(running.stop(Stop::Detach).await, RunEnd::Detached);
    watch.abort();
    assert!(
        fake.pod(&kept_name).is_some(),
        "left to the next supervisor"
    );

    let (running, watch) = start("mango-sandbox:two").await;
    crate::support::until(
        "the old kept Pod removed",
        Duration::from_secs(15),
        async || session_pods(&fake, &session).is_empty(),
    )
    .await;
    turn(&api, &session, "three", "CHARLIE", Duration::from_secs(60)).await;
    let third = session_pods(&fake, &session);
    assert_eq!(third.len(), 1);
    assert_ne!(third[0]["metadata"]["name"], kept_name.as_str());
    assert_eq!(
        third[0]["spec"]["containers"][0]["image"],
        "mango-sandbox:two"
    );
    assert_eq!(running.metrics.kept_reused.load(Relaxed), 0);
    assert_no_secret(&fake, &delivered_secrets(&attaches));
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    kubelet.abort();
    watch.abort();
}

fn spec_of(work_id: &str, session: Option<&str>) -> SandboxSpec {
    let item = ItemIdentity {
        work_id: work_id.into(),
        claim: 1,
        environment_id: "env_1".into(),
        work_type: if session.is_some() {
            WorkType::Session
        } else {
            WorkType::Healthcheck
        },
        session_id: session.map(String::from),
    };
    SandboxSpec::for_item(&item, POOL, BASE)
}

fn running_status(fake: &ApiServer, pod: &str, started: &str) {
    fake.set_pod_status(
        pod,
        json!({"phase": "Running", "startTime": started, "containerStatuses": [{
            "name": "runner", "image": "mango-sandbox:test", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": started}}}]}),
    );
}

fn envelope(n: u32) -> Secret {
    Secret::new(format!("{{\"n\":{n}}}\n"))
}

/// What the fake kubelet does with a second attach, as containerd does:
/// a kept Pod's (`stdinOnce: false`) reaches the runner; a `stdinOnce`
/// Pod's is reported a Success and reaches nothing, which is why the
/// launcher never rebinds one.
#[tokio::test]
async fn a_second_attach_reaches_a_kept_pod_and_not_a_stdin_once_one() {
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = pool_with(&fake, "env_1", "mango_envk_unused", json!({"keepIdle": 60}));
    let (keeping, watch) = launcher(&fake, &pool, "mango-sandbox:test", BASE).await;
    let now = jiff::Timestamp::now().to_string();

    let kept = keeping
        .create(&spec_of("work_k1", Some("sesn_k")))
        .await
        .unwrap();
    running_status(&fake, &kept.name, &now);
    keeping.start_waiting(&kept).await.unwrap();
    for n in [1, 2] {
        keeping.deliver(&kept, envelope(n)).await.unwrap();
        let attached = fake.attached(Duration::from_secs(5)).await.unwrap();
        assert!(attached.reached, "envelope {n}");
        assert_eq!(attached.stdin, format!("{{\"n\":{n}}}\n").as_bytes());
    }

    // A healthcheck of the same pool: one hand-off, stdinOnce.
    let check = keeping.create(&spec_of("work_c1", None)).await.unwrap();
    assert!(!keeping.waits(&check));
    assert_eq!(
        fake.pod(&check.name).unwrap()["spec"]["containers"][0]["stdinOnce"],
        true
    );
    running_status(&fake, &check.name, &now);
    keeping.deliver(&check, envelope(1)).await.unwrap();
    assert!(fake.attached(Duration::from_secs(5)).await.unwrap().reached);
    keeping
        .deliver(&check, envelope(2))
        .await
        .expect("the kubelet reports a Success");
    let second = fake.attached(Duration::from_secs(5)).await.unwrap();
    assert_eq!(second.status.as_ref().unwrap()["status"], "Success");
    assert!(!second.reached, "stdinOnce closed the container's stdin");
    assert!(second.stdin.is_empty());
    watch.abort();
}

/// The launcher's rebinding: the kept Pod's labels become the next item's
/// (two supervisors racing for it: one wins), and it refuses a Pod of
/// another Session, a `stdinOnce` Pod, and one with too little of its
/// deadline left; the template a kept Pod was made from tells a changed
/// image. No secret in the Pod before or after.
#[tokio::test]
async fn a_kept_pod_is_rebound_once_and_never_when_it_cannot_serve() {
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = pool_with(
        &fake,
        "env_1",
        "mango_envk_unused",
        json!({"keepIdle": 60, "activeDeadlineSeconds": 600}),
    );
    let (first, watch_a) = launcher(&fake, &pool, "mango-sandbox:test", BASE).await;
    let (second, watch_b) = launcher(&fake, &pool, "mango-sandbox:test", BASE).await;
    let now = jiff::Timestamp::now().to_string();

    let kept = first
        .create(&spec_of("work_r1", Some("sesn_r")))
        .await
        .unwrap();
    assert!(first.waits(&kept));
    running_status(&fake, &kept.name, &now);
    assert_eq!(
        first.image_of(&kept).await.unwrap(),
        first.warm_image().await.unwrap(),
        "made from the pool's template of now"
    );
    let (other, watch_c) = launcher(&fake, &pool, "mango-sandbox:next", BASE).await;
    assert_ne!(
        other.image_of(&kept).await.unwrap(),
        other.warm_image().await.unwrap(),
        "a changed image recycles it"
    );

    let refused = first
        .rebind(&kept, &spec_of("work_x", Some("sesn_other")))
        .await;
    assert!(
        matches!(refused, Err(LaunchError::Failed(_))),
        "{refused:?}"
    );
    let (next_a, next_b) = (
        spec_of("work_r2", Some("sesn_r")),
        spec_of("work_r3", Some("sesn_r")),
    );
    let (a, b) = tokio::join!(first.rebind(&kept, &next_a), second.rebind(&kept, &next_b));
    assert_eq!(
        [&a, &b].iter().filter(|r| r.is_ok()).count(),
        1,
        "{a:?} {b:?}"
    );
    let lost = if a.is_ok() { &b } else { &a };
    assert!(matches!(lost, Err(LaunchError::Taken(_))), "{lost:?}");
    let won = a.as_ref().or(b.as_ref()).unwrap();
    let pod = fake.pod(&kept.name).unwrap();
    assert_eq!(
        pod["metadata"]["labels"]["mango.dev/work-id"],
        won.item.work_id.as_str()
    );
    assert!(
        pod["metadata"]["annotations"]["mango.dev/handed-off"].is_null(),
        "not handed off until its envelope is"
    );
    assert_eq!(won.name, kept.name, "a Pod keeps its name");
    let found = first.existing().await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].sandbox.item, won.item, "found as the new item's");
    assert!(!found[0].running, "not adopted before its envelope");
    assert_no_secret(&fake, &[]);

    // Up since long before its deadline: too little left to serve an item.
    running_status(&fake, &kept.name, "2026-01-01T00:00:00Z");
    let late = first.rebind(won, &spec_of("work_r4", Some("sesn_r"))).await;
    assert!(
        matches!(&late, Err(LaunchError::Failed(why)) if why.contains("activeDeadlineSeconds")),
        "{late:?}"
    );

    // A pool that keeps nothing makes stdinOnce Pods, never rebound.
    let once = Arc::new({
        let mut p = (*pool).clone();
        p.spec.keep_idle = None;
        p
    });
    let (plain, watch_d) = launcher(&fake, &once, "mango-sandbox:test", BASE).await;
    let cold = plain
        .create(&spec_of("work_p1", Some("sesn_p")))
        .await
        .unwrap();
    assert!(!plain.waits(&cold));
    running_status(&fake, &cold.name, &now);
    let refused = first
        .rebind(&cold, &spec_of("work_p2", Some("sesn_p")))
        .await;
    assert!(
        matches!(&refused, Err(LaunchError::Failed(why)) if why.contains("stdinOnce")),
        "{refused:?}"
    );
    for watch in [watch_a, watch_b, watch_c, watch_d] {
        watch.abort();
    }
}

/// Whether a Pod's runner waits after an idle end is the Pod's to say, not
/// the pool's now: a supervisor started after a `keepIdle` edit adopts
/// Pods made before it. One made under `keepIdle: 60` still waits (so
/// its idle end removes it at once) when the pool keeps nothing since,
/// and one made under `keepIdle: 0` does not (its runner exits by
/// itself) when the pool keeps since.
#[tokio::test]
async fn an_adopted_pod_waits_as_it_was_made_whatever_the_pool_keeps_now() {
    let fake = k8s_strict::fake_with(Options::default()).await;
    let keeping = pool_with(&fake, "env_1", "mango_envk_unused", json!({"keepIdle": 60}));
    let plain = Arc::new({
        let mut p = (*keeping).clone();
        p.spec.keep_idle = Some(0);
        p
    });
    let now = jiff::Timestamp::now().to_string();
    let (keeping_launcher, watch_a) = launcher(&fake, &keeping, "mango-sandbox:test", BASE).await;
    let made_waiting = keeping_launcher
        .create(&spec_of("work_w1", Some("sesn_w")))
        .await
        .unwrap();
    let (maker, watch_b) = launcher(&fake, &plain, "mango-sandbox:test", BASE).await;
    let made_once = maker
        .create(&spec_of("work_o1", Some("sesn_o")))
        .await
        .unwrap();
    for pod in [&made_waiting.name, &made_once.name] {
        running_status(&fake, pod, &now);
    }

    for (now_pool, what) in [(&plain, "keeps nothing now"), (&keeping, "keeps now")] {
        let (adopter, watch) = launcher(&fake, now_pool, "mango-sandbox:test", BASE).await;
        let found = adopter.existing().await.unwrap();
        let adopted = |name: &str| {
            found
                .iter()
                .find(|f| f.sandbox.name == name)
                .map(|f| f.sandbox.clone())
                .unwrap()
        };
        assert!(
            adopter.waits(&adopted(&made_waiting.name)),
            "the Pod made to wait still waits when the pool {what}"
        );
        assert!(
            !adopter.waits(&adopted(&made_once.name)),
            "the one-shot Pod's runner exits by itself when the pool {what}"
        );
        if now_pool.spec.keep_idle().is_zero() {
            let removed = adopted(&made_waiting.name);
            adopter.remove(&removed).await.unwrap();
            assert!(!adopter.waits(&removed), "a removed Pod waits for nothing");
            let again = keeping_launcher
                .create(&spec_of("work_w1", Some("sesn_w")))
                .await
                .unwrap();
            running_status(&fake, &again.name, &now);
        }
        watch.abort();
    }
    assert_no_secret(&fake, &[]);
    watch_a.abort();
    watch_b.abort();
}

/// Spec §7.1 across a `keepIdle` edit: a Session's Pod made under
/// `keepIdle: 300`, whose runner waits for a next envelope after an idle
/// end, is adopted by the supervisor of the pool edited to `keepIdle: 0`.
/// That one keeps nothing, and the Pod's idle end removes it at once: it
/// does not wait out the finish grace for a runner that will not exit.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pod_made_to_wait_goes_at_its_idle_end_once_the_pool_keeps_nothing(db: sqlx::PgPool) {
    let model = ScriptedModel::start(two_bash_turns("echo ALPHA", "echo BRAVO")).await;
    let settings = mango_api::Settings {
        model_base_url: Some(model.base.clone()),
        ..Default::default()
    };
    let api = TestApp::start_with(db, settings).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    let pool = pool_with(&fake, &api.env_id, &api.env_key, json!({"keepIdle": 300}));
    let attaches = Attaches::default();
    let kubelet = quick_idle_kubelet(&fake, &attaches);
    // Far longer than the removal may take: waiting it out is the defect.
    let finish_grace = Duration::from_secs(120);
    let start = async |pool: &Arc<WorkerPool>| {
        let (launcher, watch) = launcher(&fake, pool, "mango-sandbox:test", &api.base).await;
        let mut config = config(&api, 1);
        config.pool = POOL.into();
        config.keep_idle = pool.spec.keep_idle();
        config.finish_grace = finish_grace;
        (Running::start(&api, config, launcher).await, watch)
    };
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let (running, watch) = start(&pool).await;
    turn(&api, &session, "one", "ALPHA", Duration::from_secs(60)).await;
    // The edit restarts the pool's supervisor this way: its Pods stay.
    assert_eq!(running.stop(Stop::Detach).await, RunEnd::Detached);
    watch.abort();
    let pods = session_pods(&fake, &session);
    assert_eq!(pods.len(), 1);
    let name = pods[0]["metadata"]["name"].as_str().unwrap().to_string();
    let command = pods[0]["spec"]["containers"][0]["command"].to_string();
    assert!(command.contains("--keep-idle-seconds"), "{command}");

    let edited = Arc::new({
        let mut p = (*pool).clone();
        p.spec.keep_idle = Some(0);
        p
    });
    until_idle_end(&api, &session).await;
    let (running, watch) = start(&edited).await;
    crate::support::until(
        "the adopted Pod removed at its idle end",
        Duration::from_secs(15),
        async || k8s_strict::terminating(&fake, &name),
    )
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0, "nothing is kept now");
    let exited_by_itself = fake
        .pod(&name)
        .is_some_and(|p| p["status"]["phase"] == "Succeeded");
    assert!(!exited_by_itself, "its runner was waiting, not exiting");
    assert_no_secret(&fake, &delivered_secrets(&attaches));
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    kubelet.abort();
    watch.abort();
}
