//! Pools with a problem, against the strict fake API server over HTTP:
//! those the operator must not run (each one's status by server-side
//! apply and its Warning Event admitted as a real apiserver admits them,
//! the condition naming the reason, no Pod made), and one whose Pods the
//! apiserver stores without a hardening field. Ported from the tower-test
//! mocks of `operator.rs`, where the test wrote the apiserver's answers.

use crate::k8s_strict::{self, NS};
use crate::k8s_strict_operator::{condition, settings};
use http::Method;
use kube::CustomResourceExt;
use mango_controller::kubernetes::crd::{WorkerPool, SCHEMA_ANNOTATION};
use mango_controller::kubernetes::operator::{self, Context};
use mango_testkit::apiserver::{ApiServer, Options, Overload};
use mango_testkit::TestApp;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs the operator until pool `name` shows a Ready condition; that condition.
async fn ready_of(fake: &Arc<ApiServer>, api: &TestApp, name: &str) -> Value {
    let ctx = Context::new(k8s_strict::client(fake).await, settings(api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));
    crate::support::until("a Ready condition", Duration::from_secs(30), async || {
        condition(fake, name, "Ready").is_some()
    })
    .await;
    let ready = condition(fake, name, "Ready").unwrap();
    let reason = ready["reason"].as_str().unwrap().to_string();
    crate::support::until("its Warning Event", Duration::from_secs(10), async || {
        fake.names("events", NS).iter().any(|event| {
            fake.object("events", NS, event).is_some_and(|e| {
                e["reason"] == reason.as_str()
                    && e["type"] == "Warning"
                    && e["regarding"]["name"] == name
            })
        })
    })
    .await;
    // A while later: still nothing runs for it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(fake.pods().is_empty(), "no Pod for a pool that cannot run");
    assert!(!ctx.render_metrics().contains(&format!("pool=\"{name}\"")));
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    ready
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workspace_key_in_the_pools_secret_is_refused(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    k8s_strict::make_pool(&fake, &api, "builders", &api.ws_key);
    let ready = ready_of(&fake, &api, "builders").await;
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("WorkspaceKey")),
        "{ready}"
    );
    let stored = fake.object("workerpools", NS, "builders").unwrap();
    assert!(
        !stored.to_string().contains(&api.ws_key),
        "the key is in no status or Event"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_whose_secret_is_missing_says_so(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    fake.create(
        json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "builders", "namespace": NS},
        "spec": {"environmentId": api.env_id, "environmentKeySecret": {"name": "absent"}}}),
    )
    .expect("the WorkerPool is admitted");
    let ready = ready_of(&fake, &api, "builders").await;
    assert_eq!(ready["reason"], "SecretMissing", "{ready}");
    assert!(
        ready["message"].as_str().unwrap().contains("absent"),
        "{ready}"
    );
}

/// Helm never upgrades `crds/`: on a CRD older than its own the
/// controller runs no pool and reads no key.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_crd_older_than_the_controllers_stops_the_pool(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let mut older = serde_json::to_value(WorkerPool::crd()).unwrap();
    older["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(SCHEMA_ANNOTATION);
    let fake = k8s_strict::fake_with(Options {
        crds: vec![older],
        ..Options::default()
    })
    .await;
    k8s_strict::make_pool(&fake, &api, "builders", &api.env_key);
    let ready = ready_of(&fake, &api, "builders").await;
    assert_eq!(ready["reason"], "CrdOutdated", "{ready}");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("revision 1") && message.contains("kubectl apply --server-side"),
        "{message}"
    );
    assert!(
        !fake
            .requests()
            .iter()
            .any(|(m, u)| m == "GET" && u.contains("/secrets/")),
        "no key is read for a pool that cannot run"
    );
}

/// Issue 24, defect 8, where a real apiserver decides it: with the
/// `UserNamespacesSupport` gate off (the default on 1.30 to 1.32) the
/// strict fake drops `hostUsers: false` from the stored Pod as such an
/// apiserver does, and the pool says so (`Hardened=False`, an Event about
/// that Pod) while it still launches; with the gate on, it is kept.
///
/// Each case has an Environment of its own: the first case's detached
/// supervisor keeps its Poll in flight until the api answers it, and on a
/// shared Environment that Poll could take the second case's healthcheck
/// into the first case's cluster, so the second pool would never see a Pod.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn hardening_the_apiserver_drops_shows_on_the_pool_and_kept_hardening_does_not(
    db: sqlx::PgPool,
) {
    let api = TestApp::start(db).await;
    for (gates, want) in [
        (vec![], ("False", "FieldsNotStored")),
        (
            vec!["UserNamespacesSupport".to_string()],
            ("True", "AsRequested"),
        ),
    ] {
        let env_id = api.create_environment(&format!("gates {gates:?}")).await;
        let (_, env_key) = api.environment_key(&env_id).await;
        let fake = k8s_strict::fake_with(Options {
            feature_gates: gates.clone(),
            ..Options::default()
        })
        .await;
        fake.create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "pool-key", "namespace": NS},
            "stringData": {"environment-key": env_key}}))
            .unwrap();
        fake.create(
            json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "builders", "namespace": NS},
            "spec": {"environmentId": env_id, "environmentKeySecret": {"name": "pool-key"},
                     "startTimeoutSeconds": 5, "pod": {"hostUsers": false}}}),
        )
        .unwrap();
        let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
        let stop = CancellationToken::new();
        let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));
        crate::support::until("the pool Ready", Duration::from_secs(30), async || {
            condition(&fake, "builders", "Ready").is_some_and(|c| c["status"] == "True")
        })
        .await;
        let workspace = mango_client::Client::new(&api.base, &api.ws_key);
        let check = workspace.create_healthcheck(&env_id).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while condition(&fake, "builders", "Hardened").is_none_or(|c| c["status"] == "Unknown") {
            assert!(
                std::time::Instant::now() < deadline,
                "gates {gates:?}: Hardened undecided; the pool: {}; Pod requests: {:?}",
                fake.object("workerpools", NS, "builders").unwrap()["status"],
                fake.requests()
                    .iter()
                    .filter(|(m, u)| *m != Method::GET && u.contains("/pods"))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let hardened = condition(&fake, "builders", "Hardened").unwrap();
        assert_eq!(
            (hardened["status"].as_str(), hardened["reason"].as_str()),
            (Some(want.0), Some(want.1)),
            "gates {gates:?}: {hardened}"
        );
        let dropped_events = fake
            .names("events", NS)
            .iter()
            .filter_map(|e| fake.object("events", NS, e))
            .filter(|e| e["reason"] == "HardeningNotStored")
            .count();
        if want.0 == "False" {
            assert!(hardened["message"]
                .as_str()
                .unwrap()
                .contains("spec.hostUsers"));
            crate::support::until("the Event", Duration::from_secs(10), async || {
                fake.names("events", NS).iter().any(|e| {
                    fake.object("events", NS, e).is_some_and(|e| {
                        e["reason"] == "HardeningNotStored" && e["related"]["kind"] == "Pod"
                    })
                })
            })
            .await;
        } else {
            assert_eq!(dropped_events, 0, "nothing was dropped");
        }
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
        workspace.stop(&env_id, &check.id, true).await.unwrap();
    }
}

/// An API server sheds or fails a read now and then (429 from API
/// Priority and Fairness, a 500 when etcd is slow). A pool that cannot
/// read its Secret at its first start says so (`SecretUnreadable`) and
/// starts once a read succeeds; one that runs keeps running on the key it
/// has, Ready all along, rather than stopping its supervisor at each
/// failed read.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_secret_read_the_apiserver_fails_now_and_then_keeps_a_running_pool(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    fake.fail_next(Method::GET, "/secrets/pool-key", Overload::EtcdTimeout, 1);
    k8s_strict::make_pool(&fake, &api, "builders", &api.env_key);
    let secret_reads = || {
        fake.requests()
            .iter()
            .filter(|(m, u)| *m == Method::GET && u.contains("/secrets/pool-key"))
            .count()
    };
    let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));
    // The status says so only until the next read, which may come at
    // once; the Event stays.
    crate::support::until("SecretUnreadable", Duration::from_secs(30), async || {
        fake.names("events", NS).iter().any(|e| {
            fake.object("events", NS, e).is_some_and(|e| {
                e["reason"] == "SecretUnreadable" && e["regarding"]["name"] == "builders"
            })
        })
    })
    .await;
    crate::support::until("the pool Ready", Duration::from_secs(60), async || {
        condition(&fake, "builders", "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let ready_since = condition(&fake, "builders", "Ready").unwrap()["lastTransitionTime"].clone();
    let before = secret_reads();
    fake.fail_next(Method::GET, "/secrets/pool-key", Overload::EtcdTimeout, 1);
    fake.fail_next(Method::GET, "/secrets/pool-key", Overload::Throttled, 1);
    crate::support::until(
        "two failed reads and a good one",
        Duration::from_secs(90),
        async || {
            let ready = condition(&fake, "builders", "Ready").unwrap();
            assert_eq!(ready["status"], "True", "Ready all along: {ready}");
            secret_reads() >= before + 3
        },
    )
    .await;
    let ready = condition(&fake, "builders", "Ready").unwrap();
    assert_eq!(
        ready["lastTransitionTime"], ready_since,
        "the pool never left Ready: {ready}"
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
}

/// A pool with `spec.egress`, admitted by the fake as the CRD's schema says.
fn make_egress_pool(fake: &ApiServer, api: &TestApp, env_id: &str, key: &str, egress: Value) {
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pool-key", "namespace": NS},
        "stringData": {"environment-key": key}}))
        .expect("the Secret is admitted");
    let _ = api;
    fake.create(
        json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "builders", "namespace": NS},
        "spec": {"environmentId": env_id, "environmentKeySecret": {"name": "pool-key"},
                 "egress": egress}}),
    )
    .expect("the WorkerPool is admitted");
}

/// A bad allow entry, or an allowlist with no proxy, stops the pool once
/// (`InvalidSpec`, a Warning Event) with the entry or field named.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_bad_egress_spec_is_invalid_naming_the_entry(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    for (egress, want) in [
        (
            json!({"allow": ["pypi.org", "*.com"], "proxy": "mango-egress.mango.svc:3128"}),
            "spec.egress.allow[1]: egress allowlist entry \"*.com\"",
        ),
        (
            json!({"allow": ["pypi.org"]}),
            "spec.egress.proxy: is required when spec.egress.allow is set",
        ),
    ] {
        let fake = k8s_strict::fake_with(Options::default()).await;
        make_egress_pool(&fake, &api, &api.env_id, &api.env_key, egress);
        let ready = ready_of(&fake, &api, "builders").await;
        assert_eq!(ready["reason"], "InvalidSpec", "{ready}");
        let message = ready["message"].as_str().unwrap();
        assert!(message.starts_with(want), "{message}");
        let event = fake
            .names("events", NS)
            .iter()
            .filter_map(|e| fake.object("events", NS, e))
            .find(|e| e["reason"] == "InvalidSpec")
            .expect("the Warning Event");
        assert!(event["note"].as_str().unwrap().contains(want), "{event}");
    }
}

/// A pool that allows egress: the Pod the fake stores (after its strict
/// validation) carries the proxy variables, the Work id as proxy user.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_with_egress_gives_its_pod_the_proxy_variables(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    make_egress_pool(
        &fake,
        &api,
        &api.env_id,
        &api.env_key,
        json!({"allow": ["pypi.org"], "proxy": "mango-egress.mango.svc:3128"}),
    );
    let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));
    crate::support::until("the pool Ready", Duration::from_secs(30), async || {
        condition(&fake, "builders", "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let workspace = mango_client::Client::new(&api.base, &api.ws_key);
    let check = workspace.create_healthcheck(&api.env_id).await.unwrap();
    crate::support::until("its Pod", Duration::from_secs(60), async || {
        !fake.pods().is_empty()
    })
    .await;
    let pod = fake.pod(&fake.pods()[0]).unwrap();
    let env: Vec<(String, String)> = pod["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (text("name"), text("value"))
        })
        .collect();
    let work_id = pod["metadata"]["labels"]["mango.dev/work-id"]
        .as_str()
        .unwrap();
    let routing = mango_controller::egress::Routing {
        proxy: "mango-egress.mango.svc:3128".into(),
        no_proxy: mango_controller::egress::url_host(&api.base).unwrap(),
    };
    for var in routing.env(work_id) {
        assert!(env.contains(&var), "{var:?} in {env:?}");
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    workspace.stop(&api.env_id, &check.id, true).await.unwrap();
}
