//! The operator's exact API traffic against kube-rs's mock service, with a
//! real api on PostgreSQL behind the pools: a Secret holding a Workspace
//! key (or missing) stops the pool with a reason and no polling, an
//! Environment key starts a supervisor whose polling the status reports
//! (written with server-side apply), and the orphan sweep's deletes.

use crate::kube_mock::{self, Seen};
use http::Method;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use mango_client::Client as MangoClient;
use mango_controller::kubernetes::crd::{SecretKeyRef, WorkerPool, WorkerPoolSpec};
use mango_controller::kubernetes::operator::{self, Context, Settings};
use mango_controller::kubernetes::sweep;
use mango_protocol::WorkState;
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "sandboxes";
const SECRET: &str = "/api/v1/namespaces/sandboxes/secrets/pool-key";
const STATUS: &str = "/apis/mango.dev/v1alpha1/namespaces/sandboxes/workerpools/builders/status?&force=true&fieldManager=mango-controller";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/sandboxes/events?";

fn pool(api: &TestApp) -> Arc<WorkerPool> {
    let mut pool = WorkerPool::new(
        "builders",
        serde_json::from_value::<WorkerPoolSpec>(json!({
            "environmentId": api.env_id,
            "environmentKeySecret": SecretKeyRef { name: "pool-key".into(), key: None },
            "maxConcurrency": 2,
        }))
        .unwrap(),
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(3);
    Arc::new(pool)
}

fn context(client: kube::Client, api: &TestApp) -> Arc<Context> {
    Context::new(
        client,
        Settings {
            namespace: NS.into(),
            default_api_url: Some(api.base.clone()),
            default_sandbox_api_url: None,
            default_sandbox_image: "mango-sandbox:test".into(),
            instance: "replica-0".into(),
            check_crd: true,
        },
    )
}

fn secret_holding(value: &str) -> Value {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("pool-key".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "environment-key".to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    serde_json::to_value(secret).unwrap()
}

/// The condition of `kind` in a status patch.
fn condition<'a>(patch: &'a Value, kind: &str) -> &'a Value {
    patch["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {patch}"))
}

/// The API server's answers: the Secret as given, everything else accepted;
/// watches stay open.
fn answers(secret: Option<Value>, pool: &WorkerPool) -> impl Fn(&Seen) -> kube_mock::Answer {
    let pool = serde_json::to_value(pool).unwrap();
    move |seen: &Seen| {
        if seen.uri.starts_with(SECRET) {
            return Some(match &secret {
                Some(secret) => (200, secret.clone()),
                None => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": "secrets \"pool-key\" not found", "reason": "NotFound", "code": 404}),
                ),
            });
        }
        if seen.uri.contains("watch=true") {
            return None;
        }
        if seen.method == Method::GET && seen.uri.starts_with("/api/v1/namespaces/sandboxes/pods") {
            return Some((
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []}),
            ));
        }
        if seen.uri == STATUS {
            let mut stored = pool.clone();
            stored["status"] = seen.body["status"].clone();
            return Some((200, stored));
        }
        // Events: the API server answers with what it stored.
        Some((201, seen.body.clone()))
    }
}

async fn stays_queued(api: &TestApp, work: &str) {
    let operator = MangoClient::new(&api.base, &api.ws_key);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let work = operator.work(&api.env_id, work).await.unwrap();
    assert_eq!(
        work.state,
        WorkState::Queued,
        "nothing polled the Environment"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workspace_key_in_the_pools_secret_is_refused_with_a_reason_and_no_polling(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    let operator = MangoClient::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    let (client, server) = kube_mock::client();
    let ctx = context(client, &api);
    let mock = server.route(answers(Some(secret_holding(&api.ws_key)), &pool(&api)));

    operator::reconcile(pool(&api), ctx.clone())
        .await
        .expect("the reconcile succeeds");

    let patch = mock.until("status patch", |s| s.uri == STATUS).await;
    assert_eq!(patch.method, Method::PATCH);
    assert_eq!(patch.body["apiVersion"], "mango.dev/v1alpha1");
    assert_eq!(patch.body["kind"], "WorkerPool");
    let ready = condition(&patch.body, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("WorkspaceKey"))
    );
    assert_eq!(ready["observedGeneration"], 3);
    assert_eq!(condition(&patch.body, "Polling")["status"], "False");
    assert_eq!(condition(&patch.body, "Degraded")["status"], "True");
    assert_eq!(patch.body["status"]["observedGeneration"], 3);

    let event = mock.until("Event", |s| s.uri == EVENTS).await;
    assert_eq!(event.method, Method::POST);
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["reason"], "WorkspaceKey");
    assert_eq!(event.body["regarding"]["kind"], "WorkerPool");
    assert_eq!(event.body["regarding"]["name"], "builders");

    stays_queued(&api, &check.id).await;
    for seen in mock.seen() {
        assert!(
            !seen.body.to_string().contains(&api.ws_key),
            "{} {} carries the key",
            seen.method,
            seen.uri
        );
        assert!(
            !seen.uri.contains("/pods"),
            "no supervisor, so no Pod traffic: {}",
            seen.uri
        );
    }
    assert!(
        !ctx.render_metrics().contains("pool=\"builders\""),
        "no supervisor runs for the pool"
    );

    // A second reconcile changes nothing and publishes no second Event.
    operator::reconcile(pool(&api), ctx.clone()).await.unwrap();
    let events = mock.seen().iter().filter(|s| s.uri == EVENTS).count();
    assert_eq!(events, 1, "one Event per change of the problem");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_missing_secret_is_reported_on_the_status(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let operator = MangoClient::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    let (client, server) = kube_mock::client();
    let mock = server.route(answers(None, &pool(&api)));

    operator::reconcile(pool(&api), context(client, &api))
        .await
        .unwrap();

    let patch = mock.until("status patch", |s| s.uri == STATUS).await;
    let ready = condition(&patch.body, "Ready");
    assert_eq!(ready["reason"], "SecretMissing");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("pool-key") && message.contains(NS),
        "the message names the Secret and its namespace: {message}"
    );
    let event = mock.until("Event", |s| s.uri == EVENTS).await;
    assert_eq!(event.body["reason"], "SecretMissing");
    stays_queued(&api, &check.id).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_environment_key_starts_the_pools_supervisor_and_the_status_shows_it_polling(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    let (client, server) = kube_mock::client();
    let ctx = context(client, &api);
    let pool = pool(&api);
    let mock = server.route(answers(Some(secret_holding(&api.env_key)), &pool));

    // The first reconcile starts the supervisor; later ones report it.
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let patch = loop {
        let patches: Vec<Seen> = mock
            .seen()
            .into_iter()
            .filter(|s| s.uri == STATUS)
            .collect();
        let last = patches
            .last()
            .expect("a status patch per reconcile")
            .clone();
        if condition(&last.body, "Polling")["status"] == "True" {
            break last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the status never showed polling; last: {}",
            last.body
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        operator::reconcile(pool.clone(), ctx.clone())
            .await
            .unwrap();
    };
    let ready = condition(&patch.body, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("Running"))
    );
    assert_eq!(condition(&patch.body, "Degraded")["status"], "False");
    let status = &patch.body["status"];
    assert!(status["lastSuccessfulPoll"].is_string(), "{status}");
    assert_eq!(status["liveItems"], 0);
    assert_eq!(
        status["queue"]["depth"], 0,
        "queue stats come from the api: {status}"
    );

    // The supervisor watches only its pool's Pods.
    let watch = mock
        .until("Pod watch", |s| {
            s.uri.contains("/pods") && s.uri.contains("watch=true")
        })
        .await;
    assert!(
        watch.uri.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmango-worker%2Cmango.dev%2Fpool%3Dbuilders"),
        "{}",
        watch.uri
    );
    assert!(ctx.render_metrics().contains("pool=\"builders\""));
    let polling = mock
        .until("Polling Event", |s| {
            s.uri == EVENTS && s.body["reason"] == "Polling"
        })
        .await;
    assert_eq!(polling.body["type"], "Normal");
    for seen in mock.seen() {
        assert!(
            !seen.body.to_string().contains(&api.env_key),
            "{} {} carries the key",
            seen.method,
            seen.uri
        );
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), ctx.detach_all())
        .await
        .expect("every supervisor detaches");
}

#[tokio::test]
async fn the_orphan_sweep_deletes_finished_poolless_and_never_handed_off_pods_only() {
    let (client, mut server) = kube_mock::client();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, NS);
    let pools: sweep::Pools = [(
        "builders".to_string(),
        sweep::PoolBounds {
            uid: "pool-uid".to_string(),
            start_bound: Duration::from_secs(120),
            warm_wait: Duration::from_secs(3660),
        },
    )]
    .into();
    let pod = |name: &str, pool: &str, created: &str, phase: &str, handed_off: bool| {
        let mut annotations = serde_json::Map::new();
        if handed_off {
            annotations.insert(
                mango_controller::kubernetes::pod::ANNOTATION_HANDED_OFF.into(),
                json!("true"),
            );
        }
        json!({
            "metadata": {
                "name": name, "namespace": NS, "creationTimestamp": created,
                "labels": {"app.kubernetes.io/managed-by": "mango-worker", "mango.dev/pool": pool},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool", "name": pool, "uid": "pool-uid"}],
            },
            "spec": {"containers": [{"name": "runner", "image": "mango-sandbox:test"}]},
            "status": {"phase": phase},
        })
    };
    let now = jiff::Timestamp::now();
    let long_ago = (now - jiff::SignedDuration::from_secs(3600)).to_string();
    let just_now = now.to_string();
    let listed = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": [
        pod("finished", "builders", &long_ago, "Succeeded", true),
        pod("pool-gone", "deleted-pool", &just_now, "Running", true),
        pod("never-handed-off", "builders", &long_ago, "Running", false),
        pod("live", "builders", &long_ago, "Running", true),
        pod("starting", "builders", &just_now, "Pending", false),
    ]});
    let sweeping = tokio::spawn(async move { sweep::sweep(&pods, &pools).await });
    server
        .expect(Method::GET, "/api/v1/namespaces/sandboxes/pods?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmango-worker")
        .await
        .respond(200, listed);
    for name in ["finished", "pool-gone", "never-handed-off"] {
        let delete = server
            .expect(
                Method::DELETE,
                &format!("/api/v1/namespaces/sandboxes/pods/{name}?"),
            )
            .await;
        assert_eq!(delete.body["gracePeriodSeconds"], 0, "{}", delete.body);
        delete.respond(
            200,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}}),
        );
    }
    assert_eq!(sweeping.await.unwrap().unwrap(), 3);
    server.quiet(Duration::from_millis(300)).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unreachable_api_shows_as_degraded_with_an_event(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (client, server) = kube_mock::client();
    let ctx = Context::new(
        client,
        Settings {
            namespace: NS.into(),
            default_api_url: Some(format!("http://{closed}")),
            default_sandbox_api_url: None,
            default_sandbox_image: "mango-sandbox:test".into(),
            instance: "replica-0".into(),
            check_crd: true,
        },
    );
    let pool = pool(&api);
    let mock = server.route(answers(Some(secret_holding(&api.env_key)), &pool));

    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let patch = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        operator::reconcile(pool.clone(), ctx.clone())
            .await
            .unwrap();
        let last = mock.seen().into_iter().rfind(|s| s.uri == STATUS).unwrap();
        if condition(&last.body, "Degraded")["status"] == "True" {
            break last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never degraded: {}",
            last.body
        );
    };
    let degraded = condition(&patch.body, "Degraded");
    assert_eq!(degraded["reason"], "ApiUnavailable");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("the api is unavailable"),
        "{degraded}"
    );
    let ready = condition(&patch.body, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("Starting"))
    );
    let event = mock
        .until("ApiUnavailable Event", |s| {
            s.uri == EVENTS && s.body["reason"] == "ApiUnavailable"
        })
        .await;
    assert_eq!(event.body["type"], "Warning");
    for seen in mock.seen() {
        assert!(
            !seen.body.to_string().contains(&api.env_key),
            "{} {} carries the key",
            seen.method,
            seen.uri
        );
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), ctx.detach_all())
        .await
        .expect("every supervisor detaches");
}

const CRD: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workerpools.mango.dev";

/// The served WorkerPool CRD: the controller's own, at `revision` (`None`:
/// from before the revision annotation).
fn served_crd(revision: Option<&str>) -> Value {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(WorkerPool::crd()).unwrap();
    match revision {
        Some(r) => crd["metadata"]["annotations"]["mango.dev/schema"] = json!(r),
        None => {
            crd["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("annotations");
        }
    }
    crd
}

/// Helm installs `crds/` once and never upgrades it: a controller built
/// for a newer schema runs no pool on the old CRD (which would prune its
/// fields and admit pools it refuses), says why on every pool, and reads
/// no key. Once the CRD is current, the pool runs.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_crd_older_than_the_controller_stops_every_pool_until_it_is_applied(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let (client, server) = kube_mock::client();
    let ctx = context(client, &api);
    let pool = pool(&api);
    let served = Arc::new(std::sync::Mutex::new(Some(served_crd(None))));
    let base = answers(Some(secret_holding(&api.env_key)), &pool);
    let mock = server.route({
        let served = served.clone();
        move |seen: &Seen| {
            if seen.uri == CRD {
                return Some(match served.lock().unwrap().clone() {
                    Some(crd) => (200, crd),
                    None => (
                        403,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "reason": "Forbidden", "code": 403,
                               "message": "customresourcedefinitions.apiextensions.k8s.io \"workerpools.mango.dev\" is forbidden"}),
                    ),
                });
            }
            base(seen)
        }
    });

    ctx.check_crd().await;
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let patch = mock.until("status patch", |s| s.uri == STATUS).await;
    let ready = condition(&patch.body, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("CrdOutdated"))
    );
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("revision 1") && message.contains("kubectl apply --server-side"),
        "{message}"
    );
    let event = mock
        .until("Event", |s| {
            s.uri == EVENTS && s.body["reason"] == "CrdOutdated"
        })
        .await;
    assert_eq!(event.body["type"], "Warning");
    assert!(
        !mock.seen().iter().any(|s| s.uri.starts_with(SECRET)),
        "no key is read for a pool that cannot run"
    );
    assert!(!ctx.render_metrics().contains("pool=\"builders\""));

    // Unreadable (no ClusterRole): refused too, saying what to grant.
    *served.lock().unwrap() = None;
    ctx.check_crd().await;
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let last = mock.seen().into_iter().rfind(|s| s.uri == STATUS).unwrap();
    let ready = condition(&last.body, "Ready");
    assert_eq!(ready["reason"], "CrdUnreadable");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("MANGO_CHECK_CRD=false"),
        "{ready}"
    );

    // Applied: the pool runs.
    *served.lock().unwrap() = Some(served_crd(Some(
        &mango_controller::kubernetes::crd::SCHEMA_REVISION.to_string(),
    )));
    ctx.check_crd().await;
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    mock.until("the key read", |s| s.uri.starts_with(SECRET))
        .await;
    let last = mock.seen().into_iter().rfind(|s| s.uri == STATUS).unwrap();
    assert_ne!(condition(&last.body, "Ready")["reason"], "CrdUnreadable");
    tokio::time::timeout(std::time::Duration::from_secs(60), ctx.detach_all())
        .await
        .expect("every supervisor detaches");
}

/// A pool whose name or Environment id is no label value would have every
/// Pod refused (422) and its watch refused (400) while it showed Ready: it
/// is refused as an invalid spec, with an Event the API server accepts
/// (the recorder would name it after a 253-character pool, too long).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_whose_labels_the_api_server_would_refuse_never_runs(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let long_name = format!(
        "{}.{}.{}.{}",
        "p".repeat(63),
        "p".repeat(63),
        "p".repeat(63),
        "p".repeat(61)
    );
    assert_eq!(
        long_name.len(),
        253,
        "the longest name a WorkerPool may have"
    );
    for (name, environment, field) in [
        (long_name.as_str(), api.env_id.clone(), "metadata.name"),
        (
            "builders",
            format!("{}-x", "e".repeat(63)),
            "spec.environmentId",
        ),
    ] {
        let (client, server) = kube_mock::client();
        let ctx = context(client, &api);
        let mut pool = (*pool(&api)).clone();
        pool.metadata.name = Some(name.to_string());
        pool.spec.environment_id = environment;
        let pool = Arc::new(pool);
        let status_uri = format!(
            "/apis/mango.dev/v1alpha1/namespaces/sandboxes/workerpools/{name}/status?&force=true&fieldManager=mango-controller"
        );
        let stored = serde_json::to_value(&*pool).unwrap();
        let base = answers(Some(secret_holding(&api.env_key)), &pool);
        let mock = server.route({
            let status_uri = status_uri.clone();
            move |seen: &Seen| {
                if seen.uri == status_uri {
                    let mut answer = stored.clone();
                    answer["status"] = seen.body["status"].clone();
                    return Some((200, answer));
                }
                base(seen)
            }
        });
        operator::reconcile(pool.clone(), ctx.clone())
            .await
            .unwrap();
        let patch = mock.until("status patch", |s| s.uri == status_uri).await;
        let ready = condition(&patch.body, "Ready");
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("False"), Some("InvalidSpec")),
            "{field}"
        );
        let message = ready["message"].as_str().unwrap();
        assert!(
            message.starts_with(field) && message.contains("63"),
            "{message}"
        );
        let event = mock
            .until("Event", |s| {
                s.uri == EVENTS && s.body["reason"] == "InvalidSpec"
            })
            .await;
        let event_name = event.body["metadata"]["name"].as_str().unwrap();
        mango_controller::kubernetes::validation::dns1123_subdomain(event_name)
            .unwrap_or_else(|e| panic!("{field}: the Event's name {event_name}: {e}"));
        assert_eq!(event.body["regarding"]["name"], name);
        for seen in mock.seen() {
            assert!(
                !seen.uri.contains("/pods") && !seen.uri.starts_with(SECRET),
                "{field}: nothing runs for the pool: {} {}",
                seen.method,
                seen.uri
            );
        }
    }
}

/// An API server whose UserNamespacesSupport gate is off (the default
/// before 1.33) drops `hostUsers: false` from each Pod without an error.
/// The create's answer is the stored Pod: the controller compares it with
/// what it sent and says so on the pool (condition `Hardened`, an Event
/// about that Pod).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn hardening_the_api_server_dropped_shows_on_the_pool(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let operator_client = MangoClient::new(&api.base, &api.ws_key);
    let (client, server) = kube_mock::client();
    let ctx = context(client, &api);
    let mut pool = (*pool(&api)).clone();
    pool.spec.pod.host_users = Some(false);
    pool.spec.start_timeout_seconds = Some(5);
    let pool = Arc::new(pool);
    let base = answers(Some(secret_holding(&api.env_key)), &pool);
    let mock = server.route(move |seen: &Seen| {
        if seen.method == Method::POST && seen.uri == "/api/v1/namespaces/sandboxes/pods?" {
            let mut stored = seen.body.clone();
            stored["spec"].as_object_mut().unwrap().remove("hostUsers");
            stored["metadata"]["uid"] = json!("pod-uid");
            stored["status"] = json!({"phase": "Pending"});
            return Some((201, stored));
        }
        base(seen)
    });
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let first = mock.until("status patch", |s| s.uri == STATUS).await;
    assert_eq!(condition(&first.body, "Hardened")["status"], "Unknown");
    let check = operator_client
        .create_healthcheck(&api.env_id)
        .await
        .unwrap();
    let created = mock
        .until("the Pod's create", |s| {
            s.method == Method::POST && s.uri == "/api/v1/namespaces/sandboxes/pods?"
        })
        .await;
    assert_eq!(created.body["spec"]["hostUsers"], false, "it was asked for");
    let pod_name = created.body["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let event = mock
        .until("HardeningNotStored Event", |s| {
            s.uri == EVENTS && s.body["reason"] == "HardeningNotStored"
        })
        .await;
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["related"]["kind"], "Pod");
    assert_eq!(event.body["related"]["name"], pod_name.as_str());
    assert!(event.body["note"]
        .as_str()
        .unwrap()
        .contains("spec.hostUsers"));
    operator::reconcile(pool.clone(), ctx.clone())
        .await
        .unwrap();
    let last = mock.seen().into_iter().rfind(|s| s.uri == STATUS).unwrap();
    let hardened = condition(&last.body, "Hardened");
    assert_eq!(
        (hardened["status"].as_str(), hardened["reason"].as_str()),
        (Some("False"), Some("FieldsNotStored"))
    );
    let message = hardened["message"].as_str().unwrap();
    assert!(
        message.contains("spec.hostUsers") && message.contains(&pod_name),
        "{message}"
    );
    assert_eq!(
        condition(&last.body, "Ready")["status"],
        "True",
        "it still launches"
    );
    tokio::time::timeout(std::time::Duration::from_secs(60), ctx.detach_all())
        .await
        .expect("every supervisor detaches");
    api.stop_work(&check.id, true).await;
}

/// kube-runtime's recorder keeps one Event per (type, action, reason,
/// reporter, regarding, related) for six minutes and only counts repeats.
/// Each sandbox's Event names its Pod as `related`, so a second Pod's
/// launch is an Event of its own with its own note, not a count on the
/// first's; a repeat for the same Pod is counted. Notes are cut to the
/// API server's 1,024 bytes, however wide their characters.
#[tokio::test]
async fn each_pods_events_are_its_own() {
    use kube::runtime::events::{Recorder, Reporter};
    use mango_controller::core::launcher::{ItemIdentity, Sandbox};
    use mango_controller::core::observer::{Happening, Observer};
    use mango_controller::kubernetes::events::PoolEvents;
    let (client, server) = kube_mock::client();
    let mock = server.route(|seen: &Seen| Some((201, seen.body.clone())));
    let reporter = Reporter {
        controller: "mango-controller".into(),
        instance: Some("replica-0".into()),
    };
    let pool_ref = {
        use kube::Resource;
        let mut p = WorkerPool::new(
            "builders",
            serde_json::from_value(json!({
            "environmentId": "env_1", "environmentKeySecret": {"name": "k"}}))
            .unwrap(),
        );
        p.metadata.namespace = Some(NS.into());
        p.object_ref(&())
    };
    let events = PoolEvents::new(
        Recorder::new(client.clone(), reporter.clone()),
        client,
        reporter,
        pool_ref,
    );
    let sandbox = |n: u32| Sandbox {
        name: format!("mango-work-{n}-1"),
        handle: format!("mango-work-{n}-1"),
        item: ItemIdentity {
            work_id: format!("work_{n}"),
            claim: 1,
            environment_id: "env_1".into(),
            work_type: mango_protocol::WorkType::Healthcheck,
            session_id: None,
        },
    };
    let (a, b) = (sandbox(1), sandbox(2));
    let published = |n: usize| {
        let mock = &mock;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while mock
                .seen()
                .iter()
                .filter(|s| s.uri.contains("/events"))
                .count()
                < n
            {
                assert!(std::time::Instant::now() < deadline, "{:?}", mock.seen());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            mock.seen()
                .into_iter()
                .filter(|s| s.uri.contains("/events"))
                .collect::<Vec<_>>()
        }
    };
    events.observe(Happening::Launched(&a));
    published(1).await;
    events.observe(Happening::Launched(&b));
    let seen = published(2).await;
    assert_eq!(
        (seen[1].method.clone(), seen[1].uri.as_str()),
        (Method::POST, EVENTS),
        "a second Pod's Event is created, not counted on the first's"
    );
    for (event, sandbox) in seen.iter().zip([&a, &b]) {
        assert_eq!(event.body["related"]["kind"], "Pod");
        assert_eq!(event.body["related"]["name"], sandbox.name.as_str());
        assert!(event.body["note"].as_str().unwrap().contains(&sandbox.name));
    }
    // The same Pod again: a repeat, counted on its own Event.
    events.observe(Happening::Launched(&a));
    let seen = published(3).await;
    assert_eq!(seen[2].method, Method::PATCH);
    assert!(seen[2]
        .uri
        .contains(seen[0].body["metadata"]["name"].as_str().unwrap()));
    assert_eq!(seen[2].body["series"]["count"], 2);

    // 600 three-byte characters: 1,800 bytes in fewer than 1,024 characters.
    let wide = "€".repeat(600);
    events.observe(Happening::LaunchFailed {
        item: &sandbox(3).item,
        error: &wide,
    });
    let seen = published(4).await;
    let note = seen[3].body["note"].as_str().unwrap();
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(note.starts_with("work_3 (claim 1): €"));
    assert_eq!(seen[3].body["related"]["name"], "mango-work-3-1");
}
