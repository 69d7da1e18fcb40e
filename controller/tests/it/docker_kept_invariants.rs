//! Kept sandboxes' invariants (spec §7.1) where the point is the sandbox:
//! a real runner in a real container, and the model's bash calls trying
//! from inside what a tool must not manage.

use crate::engine::{self, Engine};
use crate::support::{config, Running};
use mango_client::Client;
use mango_controller::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec,
};
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::DockerLauncher;
use mango_protocol::envelope::Envelope;
use mango_testkit::TestApp;
use mango_testkit::{json_events, model_reply};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Docker launcher, noting each envelope it delivers: the test keeps
/// what a tool must never get, the first activation's token.
#[derive(Clone)]
struct Noting {
    inner: Arc<DockerLauncher>,
    /// (container, the envelope it got)
    delivered: Arc<Mutex<Vec<(String, Envelope)>>>,
}

impl Launcher for Noting {
    fn kind(&self) -> &'static str {
        "docker"
    }
    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        self.inner.existing().await
    }
    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.inner.create(spec).await
    }
    async fn hand_off(&self, sandbox: &Sandbox, secret: Secret) -> Result<HandOff, LaunchError> {
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
        Launcher::workspaces(&*self.inner, environment_id).await
    }
    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        self.inner.remove_workspace(session_id).await
    }
    async fn warm_image(&self) -> Result<Option<String>, LaunchError> {
        self.inner.warm_image().await
    }
    async fn image_of(&self, sandbox: &Sandbox) -> Result<Option<String>, LaunchError> {
        self.inner.image_of(sandbox).await
    }
    async fn has_workspace(&self, session_id: &str) -> Result<bool, LaunchError> {
        self.inner.has_workspace(session_id).await
    }
    fn waits(&self, sandbox: &Sandbox) -> bool {
        self.inner.waits(sandbox)
    }
    async fn start_waiting(&self, sandbox: &Sandbox) -> Result<Instant, LaunchError> {
        self.inner.start_waiting(sandbox).await
    }
    async fn deliver(&self, sandbox: &Sandbox, envelope: Secret) -> Result<Instant, LaunchError> {
        let parsed = Envelope::parse_line(envelope.expose().as_bytes())
            .map_err(|e| LaunchError::Failed(e.to_string()))?;
        self.delivered
            .lock()
            .unwrap()
            .push((sandbox.handle.clone(), parsed));
        self.inner.deliver(sandbox, envelope).await
    }
    async fn rebind(&self, sandbox: &Sandbox, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        self.inner.rebind(sandbox, spec).await
    }
}

impl Noting {
    fn delivered(&self, n: usize) -> Option<(String, Envelope)> {
        self.delivered.lock().unwrap().get(n).cloned()
    }
}

/// Finds the runner (the mango-runner process that is not PID 1, the
/// reaper that forked it) and tries, as the sandbox's non-root user, to
/// read its own fd 0 and the runner's stdin, memory and environment.
const PROBE: &str = r#"R=; for p in /proc/[0-9]*; do n=${p#/proc/}; [ "$n" != 1 ] && [ "$(cat $p/comm 2>/dev/null)" = mango-runner ] && R=$n; done
echo "RUNNER=${R:-none} UID=$(id -u)"
echo "FD0=$(readlink /proc/self/fd/0)"
if IFS= read -r -t 2 line; then echo "STDIN=read:${#line}"; else echo "STDIN=nothing"; fi
for t in 1 $R; do for f in fd/0 mem environ; do
  if ( exec 3< /proc/$t/$f ) 2>/dev/null; then echo "PID$t:$f=open"; else echo "PID$t:$f=refused"; fi
done; done
echo PROBED"#;

/// Kills the runner, once (its workspace remembers): a rerun of the call
/// in another sandbox reports where it ran.
const KILL_ONCE: &str = r#"if [ -e .killed-once ]; then echo "SURVIVED IN $(cat /etc/hostname)"; else
touch .killed-once
for p in /proc/[0-9]*; do n=${p#/proc/}; [ "$n" != 1 ] && [ "$(cat $p/comm 2>/dev/null)" = mango-runner ] && kill -9 "$n"; done
sleep 30; echo NOT-KILLED; fi"#;

/// The model's replies: a probing turn, then a turn whose call kills the
/// runner; then the end of the turn the rerun call finishes.
fn replies() -> Vec<(u16, serde_json::Value)> {
    let call = |id: &str, command: &str| {
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": id, "name": "bash",
                        "input": {"command": command}}]),
                "tool_use",
            ),
        )
    };
    let end = |text: &str| {
        (
            200,
            model_reply(json!([{"type": "text", "text": text}]), "end_turn"),
        )
    };
    vec![
        call("probe", PROBE),
        end("probed"),
        call("kill", KILL_ONCE),
        end("survived"),
        end("again"),
        end("again"),
    ]
}

/// Waits (at most `within`) until the Session is idle at an end of turn
/// and its last tool result holds `want`; returns that result.
async fn until_turn_ends(api: &TestApp, session: &str, want: &str, within: Duration) -> String {
    let operator = Client::new(&api.base, &api.ws_key);
    let deadline = Instant::now() + within;
    loop {
        let events = json_events(operator.all_events(session).await.unwrap());
        let last = crate::support::last_output(&events);
        let idle = events.last().is_some_and(|e| {
            e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn"
        });
        if idle && last.contains(want) {
            return last;
        }
        assert!(Instant::now() < deadline, "{want}: {events:#?}");
        // A poll interval inside the deadline above.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The container `id` while the engine still has it.
async fn exists(engine: &Engine, pool: &str, id: &str) -> bool {
    engine
        .containers(pool)
        .await
        .iter()
        .any(|c| c.id.as_deref() == Some(id))
}

/// Spec §7.1 from inside a kept sandbox, a real runner in a real container:
/// * a tool's fd 0 is not the runner's stdin, and as the sandbox's user it
///   cannot open the runner's (or its reaper's) fd 0, memory or environment
///   through /proc; the next envelope still reaches the runner, whose next
///   activation runs in the same container;
/// * once the next claim is bound there, the first claim's token is refused
///   (401) by the next item's heartbeat and by the Session's events;
/// * a tool that kills the runner ends the container, which is removed and
///   never bound again: the Session's next Work runs in another.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_kept_sandbox_keeps_its_secrets_and_a_killed_runner_ends_it(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = mango_testkit::ScriptedModel::start(replies()).await;
    // A short lease, so the killed runner's item is reclaimed soon.
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                default_ttl_seconds: 10,
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("keptinv");
    let mut supervisor = config(&api, 2);
    supervisor.sandbox_base_url = engine::sandbox_base(&api);
    supervisor.pool = pool.clone();
    supervisor.keep_idle = Duration::from_secs(300);
    let mut args = engine.args(&api);
    args.keep_idle_seconds = 300;
    let launcher = Noting {
        inner: Arc::new(DockerLauncher::connect(&args, &pool).await.unwrap()),
        delivered: Arc::default(),
    };
    let running = Running::start(&api, supervisor, launcher.clone()).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;

    mango_testkit::turns::say(&api, &session, "probe").await;
    let probed = until_turn_ends(&api, &session, "PROBED", Duration::from_secs(120)).await;
    let (kept, first) = launcher.delivered(0).expect("the first envelope");
    assert!(!probed.contains("RUNNER=none"), "{probed}");
    assert!(
        probed.contains("UID=65534"),
        "as the sandbox's user: {probed}"
    );
    assert!(probed.contains("FD0=/dev/null"), "{probed}");
    assert!(probed.contains("STDIN=nothing"), "{probed}");
    for f in ["fd/0", "mem", "environ"] {
        assert!(probed.contains(&format!("PID1:{f}=refused")), "{probed}");
    }
    let runner = probed
        .split_whitespace()
        .find_map(|w| w.strip_prefix("RUNNER="))
        .unwrap()
        .to_string();
    for f in ["fd/0", "mem", "environ"] {
        assert!(
            probed.contains(&format!("PID{runner}:{f}=refused")),
            "{probed}"
        );
    }

    // The runner's own idle end (60 s after the end of turn) keeps it.
    crate::support::until(
        "the first activation ends idle and is kept",
        Duration::from_secs(150),
        async || {
            running
                .metrics
                .kept
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
        },
    )
    .await;

    mango_testkit::turns::say(&api, &session, "kill").await;
    crate::support::until("the next envelope", Duration::from_secs(60), async || {
        launcher.delivered(1).is_some()
    })
    .await;
    let (rebound, second) = launcher.delivered(1).unwrap();
    assert_eq!(
        rebound, kept,
        "the next activation goes to the kept container"
    );
    assert_ne!(second.work_id, first.work_id);
    let old = Client::new(
        &api.base,
        &mango_runner::secret::sessions_token(&first.secret).unwrap(),
    );
    let beat = old
        .heartbeat(&api.env_id, &second.work_id, None, None)
        .await
        .expect_err("the old token beats the next item's lease");
    assert_eq!(beat.status().map(|s| s.as_u16()), Some(401), "{beat}");
    let read = old
        .all_events(&session)
        .await
        .expect_err("the old token reads the Session's events");
    assert_eq!(read.status().map(|s| s.as_u16()), Some(401), "{read}");

    // The call kills the runner: the container ends and is removed.
    crate::support::until(
        "the killed runner's container removed",
        Duration::from_secs(60),
        async || !exists(&engine, &pool, &kept).await,
    )
    .await;
    // Its item, reclaimed once its lease ran out, reruns the call elsewhere.
    let rerun = until_turn_ends(&api, &session, "SURVIVED IN", Duration::from_secs(120)).await;
    assert!(
        !kept.starts_with(rerun.trim().trim_start_matches("SURVIVED IN ")),
        "the rerun ran in another container: {rerun} (the killed one: {kept})"
    );
    let delivered = launcher.delivered.lock().unwrap().clone();
    assert!(
        delivered[2..].iter().all(|(handle, _)| *handle != kept),
        "the killed container was never bound again: {:?}",
        delivered
            .iter()
            .map(|(h, e)| (h, &e.work_id))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        running
            .metrics
            .kept_reused
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    crate::support::end_activation(&api, &session).await;
    let left = engine.until_empty(&pool, Duration::from_secs(30)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
}
