//! The `mango-worker` binary as operators run it: refusing keys that must
//! not be used, surviving SIGKILL (a new supervisor adopts what the old one
//! left), draining on SIGTERM, and never logging a secret.

use crate::engine::{self, assert_no_secret, Engine};
use crate::support::{end_activation, results_for};
use mango_protocol::CheckStatus;
use mango_testkit::{json_events, model_reply, ScriptedModel, TestApp};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A `mango-worker` process whose stderr goes to a file.
struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    fn start(args: &[&str], env: &[(&str, String)], log: &Path) -> Worker {
        let file = std::fs::File::create(log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_mango-worker"));
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("MANGO_METRICS_ADDR", "127.0.0.1:0")
            .env("MANGO_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        Worker {
            child: command.spawn().expect("mango-worker starts"),
            log: log.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status within `within`.
    async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!("mango-worker still runs after {within:?}: {}", self.log()),
        }
    }

    fn terminate(&self) {
        let pid = self.child.id().expect("running") as i32;
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }
}

fn common_env(api: &TestApp, key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("MANGO_ENVIRONMENT_KEY", key.to_string()),
        ("MANGO_ENVIRONMENT_ID", api.env_id.clone()),
        ("MANGO_BASE_URL", api.base.clone()),
    ]
}

/// A Workspace key, a key that is not one of ours, a revoked key and a key
/// of another Environment are refused at start, each with what to do, at
/// once (no retry loop), and without printing the key.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn keys_that_must_not_be_used_are_refused_at_start(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let (revoked_id, revoked) = api.environment_key(&api.env_id).await;
    mango_api::store::keys::revoke(&api.db, &revoked_id, mango_protocol::time::now())
        .await
        .unwrap();
    let elsewhere = api.create_environment("elsewhere").await;
    let (_, elsewhere_key) = api.environment_key(&elsewhere).await;
    for (key, says) in [
        (api.ws_key.clone(), "is a Workspace key"),
        ("sk-ant-something".to_string(), "is not an Environment key"),
        (revoked, "unknown or revoked"),
        (elsewhere_key, "does not serve Environment"),
    ] {
        let log = dir.path().join("refused.log");
        let mut worker = Worker::start(
            &["local", "--root", dir.path().to_str().unwrap()],
            &common_env(&api, &key),
            &log,
        );
        let status = worker.exit(Duration::from_secs(10)).await;
        let text = worker.log();
        assert_eq!(status.code(), Some(2), "{text}");
        assert!(text.contains(says), "{says}: {text}");
        assert!(!text.contains(&key), "the key is not printed: {text}");
        assert_no_secret("the refusal", &text);
    }
}

/// `mango-worker local` runs a healthcheck, says it is no security
/// boundary, and drains on SIGTERM.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn mango_worker_local_runs_a_healthcheck_and_drains_on_sigterm(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    // With no MANGO_RUNNER_BIN, runners are `mango-worker item`.
    let env = common_env(&api, &api.env_key);
    let mut worker = Worker::start(
        &["local", "--root", dir.path().join("root").to_str().unwrap()],
        &env,
        &log,
    );
    let (_, status, message) = crate::support::healthcheck(&api, Duration::from_secs(30)).await;
    assert_eq!(
        status,
        CheckStatus::Succeeded,
        "{message}: {}",
        worker.log()
    );
    worker.terminate();
    let exit = worker.exit(Duration::from_secs(20)).await;
    let text = worker.log();
    assert!(exit.success(), "{exit:?}: {text}");
    assert!(text.contains("NOT a security boundary"), "{text}");
    assert_no_secret("the supervisor's log", &text);
}

async fn docker_worker(engine: &Engine, api: &TestApp, pool: &str, log: &Path) -> Worker {
    let mut env = common_env(api, &api.env_key);
    env.extend([
        ("MANGO_DOCKER_BASE_URL", engine::sandbox_base(api)),
        ("MANGO_DOCKER_IMAGE", engine.image.clone()),
        ("MANGO_POOL", pool.to_string()),
        ("MANGO_SHUTDOWN_GRACE_SECONDS", "5".to_string()),
    ]);
    Worker::start(&["docker"], &env, log)
}

/// SIGKILL the supervisor while a tool runs, and start another: it adopts
/// the running sandbox, the item finishes with exactly one result for the
/// call, and once the activation ends no container is left.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_supervisor_killed_mid_item_is_replaced_and_the_item_finishes(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t1", "name": "bash",
                        "input": {"command": "sleep 5; echo SLEPT"}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
        ),
    ])
    .await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("sigkill");
    let dir = tempfile::tempdir().unwrap();
    let mut first = docker_worker(&engine, &api, &pool, &dir.path().join("first.log")).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    mango_testkit::turns::say(&api, &session, "sleep on it").await;
    // The tool is running in the sandbox: its call is in the log, and the
    // container has run for a second (the runner takes milliseconds to
    // start, read the call and begin `sleep 5`).
    mango_testkit::turns::until(&api, &session, "the tool call", |events| {
        events.iter().any(|e| e["type"] == "agent.tool_use")
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !engine
        .containers(&pool)
        .await
        .iter()
        .any(|c| c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING))
    {
        assert!(
            Instant::now() < deadline,
            "its container runs: {}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.child.start_kill().unwrap();
    first.exit(Duration::from_secs(5)).await;
    assert_eq!(
        engine.containers(&pool).await.len(),
        1,
        "the sandbox outlives its supervisor"
    );

    let mut second = docker_worker(&engine, &api, &pool, &dir.path().join("second.log")).await;
    let events = json_events(
        mango_client::Client::new(&api.base, &api.ws_key)
            .all_events(&session)
            .await
            .unwrap(),
    );
    let call = events
        .iter()
        .find(|e| e["type"] == "agent.tool_use")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let events = loop {
        let events = api.all_events(&session).await;
        if mango_testkit::turns::idle_with(&events, "end_turn") {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "{:#?}\nfirst: {}\nsecond: {}",
            mango_testkit::turns::types(&events),
            first.log(),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let results = results_for(&events, &call);
    assert_eq!(results.len(), 1, "one result for the call: {results:#?}");
    assert!(
        results[0]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("SLEPT"),
        "{:#?}",
        results[0]
    );
    assert!(
        second.log().contains("adopting a running sandbox"),
        "{}",
        second.log()
    );

    end_activation(&api, &session).await;
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(
        left.is_empty(),
        "within 15 s of the activation's end: {left:?}"
    );
    second.terminate();
    assert!(
        second.exit(Duration::from_secs(30)).await.success(),
        "{}",
        second.log()
    );
    for worker in [&first, &second] {
        assert_no_secret("the supervisor's log", &worker.log());
    }
    engine.clean(&pool, &[&session]).await;
}
