//! Faults around the supervisor: its engine going away mid-run, the api
//! being down, and a Work stopped before its secret was handed over.

use crate::engine;
use crate::proxy::Relay;
use crate::support::{config, healthcheck, queued_session, runner_command, until, Running};
use mango_client::Client;
use mango_controller::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec,
};
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::DockerLauncher;
use mango_controller::local::LocalLauncher;
use mango_protocol::CheckStatus;
use mango_testkit::TestApp;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn metric(rendered: &str, name: &str) -> f64 {
    rendered
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The engine goes away while a sandbox runs, and its Work is stopped
/// meanwhile: the failure to confirm the removal is reported (and
/// counted), the sandbox is not forgotten, and once the engine is back it
/// is removed.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_engine_that_goes_away_is_reported_and_its_sandbox_removed_on_return(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let pool = engine::pool("engine-away");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("docker.sock");
    let mut relay = Relay::unix(&socket, std::path::Path::new("/var/run/docker.sock")).await;
    let mut args = engine.args(&api);
    args.docker_host = Some(format!("unix://{}", socket.display()));
    let launcher = DockerLauncher::connect(&args, &pool).await.unwrap();
    let mut config = config(&api, 2);
    config.sandbox_base_url = engine::sandbox_base(&api);
    config.pool = pool.clone();
    config.max_backoff = Duration::from_secs(1);
    config.request_bound = Duration::from_secs(3);
    let running = Running::start(&api, config, launcher).await;

    let (_, work_id) = queued_session(&api).await;
    until("its container", Duration::from_secs(30), async || {
        engine
            .containers(&pool)
            .await
            .iter()
            .any(|c| c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING))
    })
    .await;
    relay.cut();
    api.stop_work(&work_id, true).await;
    until(
        "a removal it cannot confirm",
        Duration::from_secs(20),
        async || {
            metric(
                &running.metrics.render(),
                "mango_supervisor_removal_errors_total",
            ) >= 1.0
        },
    )
    .await;
    assert_eq!(
        engine.containers(&pool).await.len(),
        1,
        "the sandbox is still there while its engine is unreachable"
    );
    relay.restore().await;
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "removed once the engine is back: {left:?}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[]).await;
}

/// While the api is down the supervisor backs off (counting failed
/// polls) and, when it returns, takes up the work queued meanwhile.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_api_that_is_down_is_waited_for_and_work_resumes(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let target = api.base.trim_start_matches("http://").parse().unwrap();
    let mut relay = Relay::tcp(target).await;
    let root = tempfile::tempdir().unwrap();
    let launcher = LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap();
    let mut config = config(&api, 2);
    config.first_backoff = Duration::from_millis(100);
    config.max_backoff = Duration::from_millis(800);
    // The supervisor reaches the api through the relay; runners directly.
    let through = format!("http://{}", relay.addr());
    let running = Running::start_via(&api, &through, config, launcher).await;
    relay.cut();
    until("failed polls", Duration::from_secs(10), async || {
        metric(
            &running.metrics.render(),
            "mango_supervisor_poll_errors_total",
        ) >= 2.0
    })
    .await;
    let failed = metric(
        &running.metrics.render(),
        "mango_supervisor_poll_errors_total",
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = metric(
        &running.metrics.render(),
        "mango_supervisor_poll_errors_total",
    );
    assert!(
        later - failed <= 6.0,
        "it backs off rather than retrying in a loop: {failed} then {later} in 2 s"
    );
    relay.restore().await;
    let (_, status, message) = healthcheck(&api, Duration::from_secs(30)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}

/// A launcher whose `create` waits for the test, and that counts hand-offs.
struct Gated {
    inner: LocalLauncher,
    creating: Arc<tokio::sync::Notify>,
    open: Arc<tokio::sync::Notify>,
    hand_offs: Arc<AtomicUsize>,
}

impl Gated {
    /// A local launcher under `root`, gated.
    fn on(root: &std::path::Path) -> Gated {
        Gated {
            inner: LocalLauncher::new(runner_command(), root.into(), "default").unwrap(),
            creating: Arc::default(),
            open: Arc::default(),
            hand_offs: Arc::default(),
        }
    }
}

impl Launcher for Gated {
    fn kind(&self) -> &'static str {
        "gated"
    }
    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        self.inner.existing().await
    }
    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.creating.notify_one();
        self.open.notified().await;
        self.inner.create(spec).await
    }
    async fn hand_off(&self, sandbox: &Sandbox, secret: Secret) -> Result<HandOff, LaunchError> {
        self.hand_offs.fetch_add(1, Ordering::SeqCst);
        self.inner.hand_off(sandbox, secret).await
    }
    async fn wait(&self, sandbox: &Sandbox) -> Result<SandboxExit, LaunchError> {
        self.inner.wait(sandbox).await
    }
    async fn signal_stop(&self, sandbox: &Sandbox, grace: Duration) -> Result<(), LaunchError> {
        self.inner.signal_stop(sandbox, grace).await
    }
    async fn remove(&self, sandbox: &Sandbox) -> Result<(), LaunchError> {
        self.inner.remove(sandbox).await
    }
    async fn workspaces(&self, environment_id: &str) -> Result<Vec<String>, LaunchError> {
        self.inner.workspaces(environment_id).await
    }
    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        self.inner.remove_workspace(session_id).await
    }
}

/// A Work stopped while its sandbox is being made gets no secret: the
/// sandbox is removed unstarted.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_work_stopped_before_its_hand_off_gets_no_secret(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let gated = Gated::on(root.path());
    let (creating, open, hand_offs) = (
        gated.creating.clone(),
        gated.open.clone(),
        gated.hand_offs.clone(),
    );
    let running = Running::start(&api, config(&api, 1), gated).await;
    let check = Client::new(&api.base, &api.ws_key)
        .create_healthcheck(&api.env_id)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), creating.notified())
        .await
        .expect("its sandbox is being made");
    api.stop_work(&check.id, true).await;
    // The claims watcher (every 300 ms here) learns of the stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    open.notify_one();
    until("the item's end", Duration::from_secs(10), async || {
        running
            .metrics
            .render()
            .contains(r#"mango_supervisor_items_total{outcome="cancelled"} 1"#)
    })
    .await;
    assert_eq!(
        hand_offs.load(Ordering::SeqCst),
        0,
        "no secret was handed over"
    );
    let left: Vec<_> = std::fs::read_dir(root.path().join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "the unstarted sandbox was removed");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}

/// An Environment key revoked while every slot is taken: no Poll would
/// ask, but the claims watch learns of it, and the supervisor stops
/// polling at once (its items go on with their own tokens).
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_key_revoked_while_every_slot_is_taken_ends_polling_at_once(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let gated = Gated::on(root.path());
    let (creating, open) = (gated.creating.clone(), gated.open.clone());
    let running = Running::start(&api, config(&api, 1), gated).await;
    Client::new(&api.base, &api.ws_key)
        .create_healthcheck(&api.env_id)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), creating.notified())
        .await
        .expect("its sandbox is being made, holding the only slot");
    mango_api::store::keys::revoke(&api.db, &api.env_key_id, mango_protocol::time::now())
        .await
        .unwrap();
    // The claims watch runs every 300 ms here.
    until("the refusal noted", Duration::from_secs(5), async || {
        running
            .metrics
            .snapshot()
            .last_error
            .is_some_and(|(_, e)| e.contains("refused the Environment key"))
    })
    .await;
    open.notify_one();
    assert!(
        matches!(running.shutdown().await, RunEnd::KeyRefused(_)),
        "the run ends on the refused key"
    );
}
