//! The operator against the strict fake API server over HTTP: the
//! WorkerPool, its Secret, its status by server-side apply and its Events
//! all admitted as a real apiserver admits them, and the pool's
//! supervisor running a healthcheck in a Pod the fake's watch reports.

use crate::k8s_strict::{self, Attaches, NS};
use crate::support::healthcheck;
use mango_controller::kubernetes::operator::{self, Context, Settings};
use mango_protocol::CheckStatus;
use mango_testkit::apiserver::{ApiServer, Options};
use mango_testkit::TestApp;
use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub fn settings(api: &TestApp, instance: &str) -> Settings {
    Settings {
        namespace: NS.into(),
        default_api_url: Some(api.base.clone()),
        default_sandbox_api_url: None,
        default_sandbox_image: "mango-sandbox:test".into(),
        instance: instance.into(),
        check_crd: true,
    }
}

pub fn condition(fake: &ApiServer, pool: &str, kind: &str) -> Option<Value> {
    let stored = fake.object("workerpools", NS, pool)?;
    stored["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_operator_runs_a_pool_and_its_healthcheck_against_the_strict_fake(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    k8s_strict::make_pool(&fake, &api, "builders", &api.env_key);
    let volumes = tempfile::tempdir().unwrap();
    let kubelet = k8s_strict::kubelet(
        fake.clone(),
        volumes.path().to_path_buf(),
        Attaches::default(),
    );
    let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));

    crate::support::until("the pool Ready", Duration::from_secs(30), async || {
        condition(&fake, "builders", "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let stored = fake.object("workerpools", NS, "builders").unwrap();
    let managers = stored["metadata"]["managedFields"].as_array().unwrap();
    assert!(
        managers
            .iter()
            .any(|m| m["manager"] == operator::FIELD_MANAGER
                && m["operation"] == "Apply"
                && m["subresource"] == "status"),
        "the status is the controller's by server-side apply: {managers:?}"
    );
    crate::support::until("the Polling Event", Duration::from_secs(10), async || {
        fake.names("events", NS).iter().any(|name| {
            fake.object("events", NS, name)
                .is_some_and(|e| e["reason"] == "Polling" && e["regarding"]["name"] == "builders")
        })
    })
    .await;

    let (_, status, message) = healthcheck(&api, Duration::from_secs(45)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    crate::support::until("the Pod gone", Duration::from_secs(20), async || {
        fake.pods().is_empty()
    })
    .await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap();
    kubelet.abort();
}

/// Issue 24, defect 2: a WorkerPool's name may be 253 characters, but it
/// becomes the `mango.dev/pool` label of every Pod and the value of the
/// watch's selector, which may be 63: a real apiserver refuses each Pod
/// (422) and the watch (400). The pool must not report Ready.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_pool_whose_name_cannot_be_a_label_value_is_not_ready(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    let name = "b".repeat(70);
    k8s_strict::make_pool(&fake, &api, &name, &api.env_key);
    let ctx = Context::new(k8s_strict::client(&fake).await, settings(&api, "replica-0"));
    let stop = CancellationToken::new();
    let run = tokio::spawn(operator::run(ctx.clone(), stop.clone()));
    crate::support::until("a Ready condition", Duration::from_secs(30), async || {
        condition(&fake, &name, "Ready").is_some()
    })
    .await;
    let ready = condition(&fake, &name, "Ready").unwrap();
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "InvalidSpec", "{ready}");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
}
