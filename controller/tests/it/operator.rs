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
            default_sandbox_image: "mango-sandbox:test".into(),
            instance: "replica-0".into(),
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
    ctx.detach_all();
}

#[tokio::test]
async fn the_orphan_sweep_deletes_finished_poolless_and_never_handed_off_pods_only() {
    let (client, mut server) = kube_mock::client();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, NS);
    let pools: sweep::Pools = [(
        "builders".to_string(),
        ("pool-uid".to_string(), Duration::from_secs(120)),
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
