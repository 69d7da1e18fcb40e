//! Kept sandboxes, the core's half (spec §7.1), against the real api with a
//! launcher whose "runner" is the test: it reads each delivered envelope
//! and plays the runner's idle end with the envelope's token.

use crate::support::{config, queued_session, until, Running};
use mango_client::Client;
use mango_controller::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec,
};
use mango_controller::core::secret::Secret;
use mango_protocol::envelope::Envelope;
use mango_testkit::TestApp;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Log {
    created: Vec<String>,
    /// (handle, the work id it was rebound to)
    rebound: Vec<(String, String)>,
    removed: Vec<String>,
    /// (handle, the envelope it got)
    delivered: Vec<(String, Envelope)>,
    /// Every Session a sandbox was made for (its workspace), and the
    /// workspaces removed since.
    workspaces: Vec<String>,
    workspaces_removed: Vec<String>,
}

/// Sandboxes whose runners wait for envelopes; a handle in `exited` has
/// its runner gone.
#[derive(Clone)]
struct Waiting {
    log: Arc<Mutex<Log>>,
    exited: Arc<tokio::sync::watch::Sender<HashSet<String>>>,
    /// The image new sandboxes run, and what each one made runs.
    image: Arc<Mutex<String>>,
    images: Arc<Mutex<HashMap<String, String>>>,
}

impl Waiting {
    fn new() -> Waiting {
        Waiting {
            log: Arc::default(),
            exited: Arc::new(tokio::sync::watch::channel(HashSet::new()).0),
            image: Arc::new(Mutex::new("image-1".into())),
            images: Arc::default(),
        }
    }

    fn delivered(&self, n: usize) -> Option<(String, Envelope)> {
        self.log.lock().unwrap().delivered.get(n).cloned()
    }

    fn removed(&self, handle: &str) -> bool {
        self.log.lock().unwrap().removed.iter().any(|h| h == handle)
    }
}

impl Launcher for Waiting {
    fn kind(&self) -> &'static str {
        "waiting"
    }
    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        Ok(Vec::new())
    }
    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        let handle = format!("h-{}", spec.name);
        let mut log = self.log.lock().unwrap();
        log.created.push(handle.clone());
        log.workspaces.extend(spec.item.session_id.clone());
        drop(log);
        let image = self.image.lock().unwrap().clone();
        self.images.lock().unwrap().insert(handle.clone(), image);
        Ok(Sandbox {
            name: spec.name.clone(),
            handle,
            item: spec.item.clone(),
        })
    }
    async fn hand_off(&self, _: &Sandbox, _: Secret) -> Result<HandOff, LaunchError> {
        Err(LaunchError::Failed(
            "a waiting runner gets envelopes".into(),
        ))
    }
    async fn wait(&self, sandbox: &Sandbox) -> Result<SandboxExit, LaunchError> {
        let mut exited = self.exited.subscribe();
        let _ = exited.wait_for(|e| e.contains(&sandbox.handle)).await;
        Ok(SandboxExit::Exited(137))
    }
    async fn signal_stop(&self, _: &Sandbox, _: Duration) -> Result<(), LaunchError> {
        Ok(())
    }
    async fn remove(&self, sandbox: &Sandbox) -> Result<(), LaunchError> {
        self.log
            .lock()
            .unwrap()
            .removed
            .push(sandbox.handle.clone());
        Ok(())
    }
    async fn workspaces(&self, _: &str) -> Result<Vec<String>, LaunchError> {
        let log = self.log.lock().unwrap();
        Ok(log
            .workspaces
            .iter()
            .filter(|s| !log.workspaces_removed.contains(s))
            .cloned()
            .collect())
    }
    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        let mut log = self.log.lock().unwrap();
        // The sweep must never take a workspace a live sandbox mounts.
        log.workspaces_removed.push(session_id.to_string());
        Ok(())
    }
    async fn warm_image(&self) -> Result<Option<String>, LaunchError> {
        Ok(Some(self.image.lock().unwrap().clone()))
    }
    async fn image_of(&self, sandbox: &Sandbox) -> Result<Option<String>, LaunchError> {
        Ok(self.images.lock().unwrap().get(&sandbox.handle).cloned())
    }
    fn waits(&self, sandbox: &Sandbox) -> bool {
        sandbox.item.session_id.is_some()
    }
    async fn start_waiting(&self, _: &Sandbox) -> Result<Instant, LaunchError> {
        Ok(Instant::now())
    }
    async fn deliver(&self, sandbox: &Sandbox, envelope: Secret) -> Result<Instant, LaunchError> {
        let parsed = Envelope::parse_line(envelope.expose().as_bytes())
            .map_err(|e| LaunchError::Failed(e.to_string()))?;
        self.log
            .lock()
            .unwrap()
            .delivered
            .push((sandbox.handle.clone(), parsed));
        Ok(Instant::now())
    }
    async fn rebind(&self, sandbox: &Sandbox, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.log
            .lock()
            .unwrap()
            .rebound
            .push((sandbox.handle.clone(), spec.item.work_id.clone()));
        Ok(Sandbox {
            name: spec.name.clone(),
            handle: sandbox.handle.clone(),
            item: spec.item.clone(),
        })
    }
}

/// The `n`th envelope, once delivered.
async fn envelope(launcher: &Waiting, n: usize) -> (String, Envelope) {
    until(
        &format!("envelope {n}"),
        Duration::from_secs(15),
        async || launcher.delivered(n).is_some(),
    )
    .await;
    launcher.delivered(n).unwrap()
}

/// The runner's client: the sessions token inside the envelope's secret.
fn holder_of(api: &TestApp, envelope: &Envelope) -> Client {
    let token = mango_runner::secret::sessions_token(&envelope.secret).expect("a Work secret");
    Client::new(&api.base, &token)
}

/// What the runner does at its Session's idle end: a first beat, then the
/// idle Stop.
async fn idle_end(api: &TestApp, envelope: &Envelope) {
    let holder = holder_of(api, envelope);
    holder
        .heartbeat(&api.env_id, &envelope.work_id, None, None)
        .await
        .expect("the first beat");
    holder
        .stop_idle(&api.env_id, &envelope.work_id)
        .await
        .expect("the idle Stop");
}

/// A Session's sandbox whose activation ended idle is kept, its slot freed;
/// the Session's next Work gets the same sandbox (rebound, no create) with
/// its own envelope; a runner that exits while kept has its sandbox removed.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_idle_end_keeps_the_sandbox_for_the_sessions_next_work(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let launcher = Waiting::new();
    let mut config = config(&api, 1);
    config.keep_idle = Duration::from_secs(120);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (session, first) = queued_session(&api).await;
    let (handle, one) = envelope(&launcher, 0).await;
    assert_eq!(one.work_id, first);
    idle_end(&api, &one).await;
    until("kept", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    assert!(!launcher.removed(&handle), "a kept sandbox is not removed");

    mango_testkit::turns::say(&api, &session, "again").await;
    let (again, two) = envelope(&launcher, 1).await;
    assert_eq!(again, handle, "the same sandbox");
    assert_ne!(two.work_id, first, "with the next Work's envelope");
    assert_ne!(two.secret, one.secret);
    {
        let log = launcher.log.lock().unwrap();
        assert_eq!(log.created.len(), 1, "none was created for it");
        assert_eq!(log.rebound, vec![(handle.clone(), two.work_id.clone())]);
    }
    assert_eq!(running.metrics.kept_reused.load(Relaxed), 1);
    assert_eq!(running.metrics.kept.load(Relaxed), 0, "taken, once");

    idle_end(&api, &two).await;
    until("kept again", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    // Both items are done: the first was created, the second bound.
    let stages = running.metrics.render();
    for (stage, count) in [("created", 1), ("bound", 1)] {
        let line = format!("mango_supervisor_stage_seconds_count{{stage=\"{stage}\"}} {count}");
        assert!(stages.contains(&line), "{line}: {stages}");
    }
    launcher.exited.send_modify(|e| {
        e.insert(handle.clone());
    });
    until(
        "a kept sandbox whose runner exited removed",
        Duration::from_secs(15),
        async || launcher.removed(&handle),
    )
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0);
    running.shutdown().await;
}

/// A kept sandbox goes when its keep runs out; an activation ended by an
/// operator's Stop is not kept; with `keep_idle` 0 nothing is.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_sandbox_expires_and_a_stop_is_never_kept(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let launcher = Waiting::new();
    let mut config = config(&api, 2);
    config.keep_idle = Duration::from_secs(2);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (_, _) = queued_session(&api).await;
    let (handle, one) = envelope(&launcher, 0).await;
    idle_end(&api, &one).await;
    until("kept", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    until("expired", Duration::from_secs(15), async || {
        launcher.removed(&handle)
    })
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0);

    let (_, stopped) = queued_session(&api).await;
    let (handle, two) = envelope(&launcher, 1).await;
    holder_of(&api, &two)
        .heartbeat(&api.env_id, &two.work_id, None, None)
        .await
        .unwrap();
    api.stop_work(&stopped, true).await;
    until("removed on a Stop", Duration::from_secs(15), async || {
        launcher.removed(&handle)
    })
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0, "a Stop never keeps");
    running.shutdown().await;

    let launcher = Waiting::new();
    let mut config = crate::support::config(&api, 1);
    config.keep_idle = Duration::ZERO;
    let running = Running::start(&api, config, launcher.clone()).await;
    let (_, _) = queued_session(&api).await;
    let (handle, three) = envelope(&launcher, 0).await;
    idle_end(&api, &three).await;
    until(
        "removed after its activation",
        Duration::from_secs(15),
        async || launcher.removed(&handle),
    )
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0);
    running.shutdown().await;
}

/// A sandbox kept under an image that changed since is not reused: the
/// Session's next Work gets a new one, and the old one is removed.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_sandbox_of_an_old_image_is_not_reused(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let launcher = Waiting::new();
    let mut config = config(&api, 1);
    config.keep_idle = Duration::from_secs(120);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (session, _) = queued_session(&api).await;
    let (handle, one) = envelope(&launcher, 0).await;
    idle_end(&api, &one).await;
    until("kept", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    *launcher.image.lock().unwrap() = "image-2".into();
    mango_testkit::turns::say(&api, &session, "again").await;
    let (fresh, _) = envelope(&launcher, 1).await;
    assert_ne!(fresh, handle, "a new sandbox, of the new image");
    assert!(launcher.removed(&handle), "the old one is removed");
    assert_eq!(running.metrics.kept_reused.load(Relaxed), 0);
    running.shutdown().await;
}

/// Kept sandboxes hold no slot and serve their own Session only: with
/// `max_concurrency` 1 and Session A's sandbox kept, Session B's Work gets
/// a sandbox of its own at once (not A's); keeping B's then evicts A's
/// (at most `max_concurrency` are kept); a healthcheck's is never kept.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn kept_sandboxes_hold_no_slot_serve_one_session_and_are_bounded(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let launcher = Waiting::new();
    let mut config = config(&api, 1);
    config.keep_idle = Duration::from_secs(120);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (_, _) = queued_session(&api).await;
    let (a, one) = envelope(&launcher, 0).await;
    idle_end(&api, &one).await;
    until("A's kept", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;

    let (_, b_work) = queued_session(&api).await;
    let (b, two) = envelope(&launcher, 1).await;
    assert_eq!(two.work_id, b_work);
    assert_ne!(b, a, "another Session's Work never gets A's sandbox");
    assert!(
        !launcher.removed(&a),
        "A's waits on: it held no slot B needed"
    );
    assert_eq!(launcher.log.lock().unwrap().created.len(), 2);

    idle_end(&api, &two).await;
    until("A's evicted by B's", Duration::from_secs(15), async || {
        launcher.removed(&a)
    })
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 1, "B's alone is kept");
    assert!(!launcher.removed(&b));

    Client::new(&api.base, &api.ws_key)
        .create_healthcheck(&api.env_id)
        .await
        .unwrap();
    let check = created(&launcher, 3).await;
    until("the check's removed", Duration::from_secs(15), async || {
        launcher.removed(&check)
    })
    .await;
    assert_eq!(
        running.metrics.kept.load(Relaxed),
        1,
        "the check's not kept"
    );
    assert!(!launcher.removed(&b), "nor did it take B's place");
    running.shutdown().await;
}

/// The handle of the `n`th sandbox created, once it is.
async fn created(launcher: &Waiting, n: usize) -> String {
    until(
        &format!("sandbox {n} created"),
        Duration::from_secs(15),
        async || launcher.log.lock().unwrap().created.len() >= n,
    )
    .await;
    launcher.log.lock().unwrap().created[n - 1].clone()
}

/// A lost lease is never kept: an activation whose runner stopped
/// heartbeating (its lease expired and Poll reclaims it) has its sandbox
/// removed at once, not kept for the Session's next.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_lost_lease_removes_the_sandbox_and_never_keeps_it(db: sqlx::PgPool) {
    let api = TestApp::start_with(
        db,
        mango_api::Settings {
            default_ttl_seconds: 2,
            caller_plays_model: true,
            ..Default::default()
        },
    )
    .await;
    let launcher = Waiting::new();
    let mut config = config(&api, 1);
    config.keep_idle = Duration::from_secs(120);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (_, _) = queued_session(&api).await;
    let (handle, one) = envelope(&launcher, 0).await;
    holder_of(&api, &one)
        .heartbeat(&api.env_id, &one.work_id, None, None)
        .await
        .expect("the first beat");
    // No more beats: the lease of 2 s runs out.
    until(
        "removed on the lost lease",
        Duration::from_secs(20),
        async || launcher.removed(&handle),
    )
    .await;
    assert_eq!(
        running.metrics.kept.load(Relaxed),
        0,
        "a lost lease never keeps"
    );
    let late = holder_of(&api, &one)
        .stop_idle(&api.env_id, &one.work_id)
        .await;
    assert!(
        late.is_err(),
        "the lost claim's idle Stop is refused: {late:?}"
    );
    assert_eq!(running.metrics.kept.load(Relaxed), 0);
    running.shutdown().await;
}

/// A kept sandbox whose Session is deleted goes with the workspace sweep,
/// before the workspace it mounts; the Session's other sandboxes are gone
/// already, and nothing is left kept.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_sandbox_of_a_deleted_session_is_removed(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let launcher = Waiting::new();
    let mut config = config(&api, 1);
    config.keep_idle = Duration::from_secs(120);
    config.workspace_sweep_every = Duration::from_millis(300);
    let running = Running::start(&api, config, launcher.clone()).await;
    let (session, _) = queued_session(&api).await;
    let (handle, one) = envelope(&launcher, 0).await;
    idle_end(&api, &one).await;
    until("kept", Duration::from_secs(15), async || {
        running.metrics.kept.load(Relaxed) == 1
    })
    .await;
    // A fault window of three sweeps while the Session lives: its kept
    // sandbox must stay through them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!launcher.removed(&handle), "kept while its Session lives");

    api.delete_session(&session).await;
    until(
        "the kept sandbox of a deleted Session removed",
        Duration::from_secs(15),
        async || launcher.removed(&handle),
    )
    .await;
    until(
        "its workspace removed",
        Duration::from_secs(15),
        async || {
            launcher
                .log
                .lock()
                .unwrap()
                .workspaces_removed
                .contains(&session)
        },
    )
    .await;
    assert_eq!(running.metrics.kept.load(Relaxed), 0, "nothing kept");
    running.shutdown().await;
}
