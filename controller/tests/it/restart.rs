//! `mango-worker` stopped while a tool call runs, as `systemctl restart`,
//! an upgrade or `docker compose up` stop it (SIGTERM), or killed: by
//! default it leaves running sandboxes holding their leases and exits at
//! once, the next supervisor adopts them, and the call's result arrives
//! exactly once; with `--drain` (`MANGO_DRAIN`) running items get the
//! shutdown grace, then their sandboxes go.

use crate::engine::{self, assert_no_secret, Engine};
use crate::process::{common_env, Worker};
use crate::support::{end_activation, results_for};
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::LogsOptions;
use futures::StreamExt;
use mango_testkit::{model_reply, ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How the first supervisor is stopped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// SIGTERM: what a restart sends.
    Term,
    /// SIGKILL: a crash.
    Kill,
}

/// Where the sandboxes run.
enum Host<'a> {
    /// `mango-worker local` with this root.
    Local(PathBuf),
    /// `mango-worker docker` with this pool.
    Docker(&'a Engine, String),
}

impl Host<'_> {
    /// Its supervisor, with `extra` arguments and environment.
    fn worker(
        &self,
        api: &TestApp,
        (args, env): (&[&str], &[(&'static str, String)]),
        log: &Path,
    ) -> Worker {
        let mut all_env = common_env(api, &api.env_key);
        all_env.extend(env.iter().cloned());
        let mut all_args = match self {
            Host::Local(root) => vec!["local", "--root", root.to_str().unwrap()],
            Host::Docker(engine, pool) => {
                all_env.extend([
                    ("MANGO_DOCKER_BASE_URL", engine::sandbox_base(api)),
                    ("MANGO_DOCKER_IMAGE", engine.image.clone()),
                    ("MANGO_POOL", pool.clone()),
                    ("MANGO_DOCKER_NETWORK", engine::TEST_NETWORK.to_string()),
                    (
                        "MANGO_DOCKER_WORKSPACE_ROOT",
                        engine::workspace_root().to_string_lossy().into_owned(),
                    ),
                    (
                        "MANGO_WORKSPACE_SIZE",
                        engine::TEST_WORKSPACE_BYTES.to_string(),
                    ),
                ]);
                vec!["docker"]
            }
        };
        all_args.extend(args);
        Worker::start(&all_args, &all_env, log)
    }

    /// The pids of local runners (none for containers).
    fn local_pids(&self) -> Vec<i32> {
        match self {
            Host::Local(root) => local_runner_pids(root),
            Host::Docker(..) => Vec::new(),
        }
    }

    /// The runner's log of each sandbox, running or not.
    async fn runner_logs(&self) -> Vec<String> {
        match self {
            Host::Local(root) => std::fs::read_dir(root.join("logs"))
                .map(|dir| {
                    dir.flatten()
                        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                        .collect()
                })
                .unwrap_or_default(),
            Host::Docker(engine, pool) => {
                let mut logs = Vec::new();
                for container in engine.containers(pool).await {
                    let id = container.id.unwrap_or_default();
                    let chunks: Vec<_> = engine
                        .docker
                        .logs(
                            &id,
                            Some(LogsOptions {
                                stdout: true,
                                stderr: true,
                                ..Default::default()
                            }),
                        )
                        .collect()
                        .await;
                    logs.push(
                        chunks
                            .into_iter()
                            .flatten()
                            .map(|c| c.to_string())
                            .collect::<String>(),
                    );
                }
                logs
            }
        }
    }

    /// Waits until a runner has begun the call.
    async fn until_call_runs(&self, worker: &Worker) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self
            .runner_logs()
            .await
            .iter()
            .any(|log| log.contains("tool call running"))
        {
            assert!(
                Instant::now() < deadline,
                "no runner runs the call: {}",
                worker.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The live sandboxes (a runner process that lives, a running container).
    async fn running(&self) -> usize {
        match self {
            Host::Local(root) => local_runner_pids(root)
                .into_iter()
                .filter(|pid| runner_lives(*pid))
                .count(),
            Host::Docker(engine, pool) => engine
                .containers(pool)
                .await
                .iter()
                .filter(|c| c.state == Some(ContainerSummaryStateEnum::RUNNING))
                .count(),
        }
    }

    /// Waits (at most `within`) until no sandbox is left, running or not;
    /// how many are left otherwise.
    async fn until_none(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let left = match self {
                Host::Local(root) => {
                    std::fs::read_dir(root.join("sandboxes")).map_or(0, |d| d.count())
                }
                Host::Docker(engine, pool) => engine.containers(pool).await.len(),
            };
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The runner pids the local sandbox records hold.
fn local_runner_pids(root: &Path) -> Vec<i32> {
    std::fs::read_dir(root.join("sandboxes"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
                .filter_map(|record| record["pid"].as_i64())
                .map(|pid| pid as i32)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` runs (not exited, not a zombie nobody reaped).
fn runner_lives(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| !cmd.is_empty())
}

/// A model that makes one `bash` call of `command`, then ends its turn.
async fn one_call(command: &str) -> ScriptedModel {
    ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t1", "name": "bash",
                        "input": {"command": command}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
        ),
    ])
    .await
}

fn settings(model: &ScriptedModel) -> mango_api::Settings {
    mango_api::Settings {
        model_base_url: Some(model.base.clone()),
        ..Default::default()
    }
}

/// A Session with the toolset, told to go.
async fn started_session(api: &TestApp) -> String {
    let session =
        mango_testkit::turns::session_with_tools(api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    mango_testkit::turns::say(api, &session, "sleep on it").await;
    session
}

/// Waits (at most `within`) until the Session's turn ended; its events.
async fn until_turn_ends(api: &TestApp, session: &str, within: Duration, logs: &str) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let events = api.all_events(session).await;
        if mango_testkit::turns::idle_with(&events, "end_turn") {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "{:#?}\n{logs}",
            mango_testkit::turns::types(&events)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The result of the Session's one call, which must have exactly one.
fn the_result(events: &[Value]) -> String {
    let call = events
        .iter()
        .find(|e| e["type"] == "agent.tool_use")
        .expect("the call")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let results = results_for(events, &call);
    assert_eq!(results.len(), 1, "one result for the call: {results:#?}");
    results[0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The supervisor is stopped (`end`) while the call runs, and exits within
/// a few seconds leaving the sandbox running; a second supervisor adopts
/// it; the call's result arrives exactly once and the Session ends its
/// turn; once the activation ends no sandbox is left. The Session.
async fn replaced_mid_call(api: &TestApp, host: &Host<'_>, end: End, dir: &Path) -> String {
    let mut first = host.worker(api, (&[], &[]), &dir.join("first.log"));
    let session = started_session(api).await;
    host.until_call_runs(&first).await;
    let stopped = Instant::now();
    match end {
        End::Term => first.terminate(),
        End::Kill => first.child.start_kill().unwrap(),
    }
    let status = first.exit(Duration::from_secs(10)).await;
    let took = stopped.elapsed();
    if end == End::Term {
        assert!(status.success(), "{status:?}: {}", first.log());
        assert!(
            took < Duration::from_secs(5),
            "exited {took:?} after SIGTERM: {}",
            first.log()
        );
    }
    assert_eq!(
        host.running().await,
        1,
        "the sandbox outlives its supervisor: {}",
        first.log()
    );

    let mut second = host.worker(api, (&[], &[]), &dir.join("second.log"));
    let events = until_turn_ends(
        api,
        &session,
        Duration::from_secs(60),
        &format!("first: {}\nsecond: {}", first.log(), second.log()),
    )
    .await;
    let result = the_result(&events);
    assert!(result.contains("SLEPT"), "{result}");
    assert!(
        second.log().contains("adopting a running sandbox"),
        "{}",
        second.log()
    );

    end_activation(api, &session).await;
    assert_eq!(
        host.until_none(Duration::from_secs(15)).await,
        0,
        "a sandbox is left 15 s after the activation's end: {}",
        second.log()
    );
    second.terminate();
    assert!(
        second.exit(Duration::from_secs(10)).await.success(),
        "{}",
        second.log()
    );
    for worker in [&first, &second] {
        assert_no_secret("the supervisor's log", &worker.log());
    }
    session
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sigterm_leaves_a_local_runner_mid_call_to_the_next_supervisor(db: sqlx::PgPool) {
    let model = one_call("sleep 3; echo SLEPT").await;
    let api = TestApp::start_with(db, settings(&model)).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let host = Host::Local(root.clone());
    replaced_mid_call(&api, &host, End::Term, dir.path()).await;
    assert!(
        local_runner_pids(&root).is_empty(),
        "no record is left behind"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn sigterm_leaves_a_container_mid_call_to_the_next_supervisor(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = one_call("sleep 3; echo SLEPT").await;
    let api = engine.api(db, settings(&model)).await;
    let pool = engine::pool("sigterm");
    let dir = tempfile::tempdir().unwrap();
    let host = Host::Docker(&engine, pool.clone());
    let session = replaced_mid_call(&api, &host, End::Term, dir.path()).await;
    engine.clean(&pool, &[&session]).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_supervisor_killed_mid_call_is_replaced_and_the_call_finishes(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = one_call("sleep 5; echo SLEPT").await;
    let api = engine.api(db, settings(&model)).await;
    let pool = engine::pool("sigkill");
    let dir = tempfile::tempdir().unwrap();
    let host = Host::Docker(&engine, pool.clone());
    let session = replaced_mid_call(&api, &host, End::Kill, dir.path()).await;
    engine.clean(&pool, &[&session]).await;
}

/// With `--drain` (or `MANGO_DRAIN`), SIGTERM stops polling and lets the
/// running item go on for the shutdown grace (the call's result arrives),
/// then removes its sandbox and exits. The Session.
async fn drained_mid_call(
    api: &TestApp,
    host: &Host<'_>,
    drain: (&[&str], &[(&'static str, String)]),
    dir: &Path,
) -> String {
    let grace = Duration::from_secs(5);
    let mut env = drain.1.to_vec();
    env.push(("MANGO_SHUTDOWN_GRACE_SECONDS", grace.as_secs().to_string()));
    let mut worker = host.worker(api, (drain.0, &env), &dir.join("worker.log"));
    let session = started_session(api).await;
    host.until_call_runs(&worker).await;
    let pids = host.local_pids();
    let stopped = Instant::now();
    worker.terminate();
    let status = worker.exit(grace + Duration::from_secs(20)).await;
    let took = stopped.elapsed();
    let log = worker.log();
    assert!(status.success(), "{status:?}: {log}");
    assert!(
        took >= grace - Duration::from_millis(500),
        "a Session's item does not end by itself within the grace, yet the supervisor exited after {took:?}: {log}"
    );
    assert!(
        log.contains("the shutdown grace is over; removing the sandboxes of running items"),
        "{log}"
    );
    assert_eq!(
        host.until_none(Duration::ZERO).await,
        0,
        "its sandbox is removed: {log}"
    );
    assert!(
        !pids.into_iter().any(runner_lives),
        "its runner is gone: {log}"
    );
    // The call ran on during the grace.
    let events = api.all_events(&session).await;
    let result = the_result(&events);
    assert!(result.contains("SLEPT"), "{result}");
    assert_no_secret("the supervisor's log", &log);
    session
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn with_drain_sigterm_lets_a_local_item_run_for_the_grace_then_removes_it(db: sqlx::PgPool) {
    let model = one_call("sleep 2; echo SLEPT").await;
    let api = TestApp::start_with(db, settings(&model)).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let host = Host::Local(root);
    drained_mid_call(&api, &host, (&["--drain"], &[]), dir.path()).await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn with_drain_sigterm_lets_a_container_run_for_the_grace_then_removes_it(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = one_call("sleep 2; echo SLEPT").await;
    let api = engine.api(db, settings(&model)).await;
    let pool = engine::pool("drain");
    let dir = tempfile::tempdir().unwrap();
    let host = Host::Docker(&engine, pool.clone());
    let session = drained_mid_call(
        &api,
        &host,
        (&[], &[("MANGO_DRAIN", "true".into())]),
        dir.path(),
    )
    .await;
    engine.clean(&pool, &[&session]).await;
}
