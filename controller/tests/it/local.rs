//! `mango-worker local` end to end: the supervisor core with the local
//! launcher, against a real api on PostgreSQL and the real runner.

use crate::support::{
    config, end_activation, healthcheck, queued_session, runner_command, turn, two_bash_turns,
    until, Running,
};
use mango_controller::core::supervisor::{RunEnd, Stop};
use mango_controller::local::LocalLauncher;
use mango_protocol::CheckStatus;
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::time::Duration;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_succeeds_and_leaves_nothing_behind(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let launcher = LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap();
    let running = Running::start(&api, config(&api, 2), launcher).await;
    let (_, status, message) = healthcheck(&api, Duration::from_secs(30)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    let left: Vec<_> = std::fs::read_dir(root.path().join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "no sandbox record is left");
    let checks: Vec<_> = std::fs::read_dir(root.path().join("checks"))
        .unwrap()
        .collect();
    assert!(
        checks.is_empty(),
        "the healthcheck's workspace went with it"
    );
}

/// A Session runs through the supervisor with no hand-started process, and
/// its second activation sees the files of its first.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_runs_and_its_next_activation_sees_its_files(db: sqlx::PgPool) {
    let model = ScriptedModel::start(two_bash_turns(
        "echo first > kept.txt && echo WROTE",
        "cat kept.txt",
    ))
    .await;
    let api = TestApp::start_with(
        db,
        mango_api::Settings {
            model_base_url: Some(model.base.clone()),
            ..Default::default()
        },
    )
    .await;
    let root = tempfile::tempdir().unwrap();
    let launcher = LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap();
    let running = Running::start(&api, config(&api, 2), launcher).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    end_activation(&api, &session).await;
    turn(&api, &session, "read it", "first", Duration::from_secs(60)).await;
    end_activation(&api, &session).await;
    let works = api.session_work(&session).await;
    assert_eq!(works.len(), 2, "two activations: {works:?}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    assert!(
        root.path()
            .join("sessions")
            .join(&session)
            .join("kept.txt")
            .exists(),
        "the Session's workspace stays"
    );
}

/// The folders of deleted Sessions are swept; a live Session's stays.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_deleted_sessions_workspace_is_swept_and_a_live_ones_kept(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let launcher = LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap();
    let mut config = config(&api, 2);
    config.workspace_sweep_every = Duration::from_millis(300);
    let running = Running::start(&api, config, launcher).await;
    let (kept, _) = queued_session(&api).await;
    let (doomed, _) = queued_session(&api).await;
    let folder = |s: &str| root.path().join("sessions").join(s);
    until("both workspaces", Duration::from_secs(20), async || {
        folder(&kept).is_dir() && folder(&doomed).is_dir()
    })
    .await;
    end_activation(&api, &doomed).await;
    api.delete_session(&doomed).await;
    until(
        "the deleted Session's folder goes",
        Duration::from_secs(10),
        async || !folder(&doomed).exists(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(folder(&kept).is_dir(), "a live Session's workspace stays");
    end_activation(&api, &kept).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    assert!(folder(&kept).is_dir(), "and stays after its activation");
}

/// A detached supervisor leaves its sandboxes running; the next one adopts
/// them and removes each when its activation ends.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_detached_supervisors_sandboxes_are_adopted_by_the_next(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let records = root.path().join("sandboxes");
    let count = || std::fs::read_dir(&records).map_or(0, |d| d.count());
    let first = Running::start(
        &api,
        config(&api, 2),
        LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap(),
    )
    .await;
    let (session, work_id) = queued_session(&api).await;
    until(
        "its runner heartbeats",
        Duration::from_secs(20),
        async || api.get_work(&work_id).await["state"] == "active",
    )
    .await;
    assert_eq!(first.stop(Stop::Detach).await, RunEnd::Detached);
    assert_eq!(count(), 1, "the sandbox outlives its supervisor");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        api.get_work(&work_id).await["state"],
        "active",
        "and keeps running"
    );

    let second = Running::start(
        &api,
        config(&api, 2),
        LocalLauncher::new(runner_command(), root.path().into(), "default").unwrap(),
    )
    .await;
    until("adopted", Duration::from_secs(10), async || {
        second
            .metrics
            .render()
            .contains(r#"mango_supervisor_items_total{outcome="adopted"} 1"#)
    })
    .await;
    end_activation(&api, &session).await;
    until("its sandbox goes", Duration::from_secs(15), async || {
        count() == 0
    })
    .await;
    assert_eq!(second.shutdown().await, RunEnd::Shutdown);
}

/// A healthcheck's runner reports its Result (which stops the Work with no
/// Stop asked for) and then takes a moment to exit: its sandbox is left to
/// exit by itself (the finish grace), not removed by the next claims check
/// as a stopped Work's would be, so the runner's last steps run and the
/// item counts as finished.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_runner_that_reported_is_let_exit_by_itself(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("exited-by-itself");
    // The real runner, then a pause of its own before the exit.
    let script = root.path().join("lingering-runner.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n'{}' item\ncode=$?\nsleep 0.3\ntouch '{}'\nexit $code\n",
            env!("CARGO_BIN_EXE_mango-worker"),
            marker.display()
        ),
    )
    .unwrap();
    let runner = mango_controller::local::RunnerCommand {
        program: "/bin/bash".into(),
        args: vec![script.display().to_string()],
    };
    let launcher = LocalLauncher::new(runner, root.path().into(), "default").unwrap();
    let mut config = config(&api, 2);
    // A claims check is sure to see the stopped Work before the exit.
    config.claims_every = Duration::from_millis(20);
    let running = Running::start(&api, config, launcher).await;
    let (_, status, message) = healthcheck(&api, Duration::from_secs(30)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    until("its sandbox goes", Duration::from_secs(10), async || {
        std::fs::read_dir(root.path().join("sandboxes")).map_or(0, |d| d.count()) == 0
    })
    .await;
    let metrics = running.metrics.render();
    assert!(marker.exists(), "the runner was cut short: {metrics}");
    assert!(
        metrics.contains(r#"mango_supervisor_items_total{outcome="finished"} 1"#)
            && metrics.contains(r#"mango_supervisor_items_total{outcome="cancelled"} 0"#),
        "{metrics}"
    );
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}

/// A graceful Stop while a tool call runs: the supervisor signals the
/// runner at once (not at its next heartbeat, a minute away), and the
/// runner cancels the call, flushes a Memory Store change no sync had
/// seen, stops its Work and exits by itself (7, `signalled`) well within
/// the stopping grace, so its sandbox is not removed by force.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_graceful_stop_signals_the_runner_which_flushes_and_exits_by_itself(db: sqlx::PgPool) {
    let root = tempfile::tempdir().unwrap();
    let mount_root = root.path().join("mnt");
    let late = mount_root.join("stop-notes").join("late.md");
    let model = ScriptedModel::start(vec![(
        200,
        mango_testkit::model_reply(
            json!([{"type": "tool_use", "id": "t1", "name": "bash", "input": {"command":
                format!("echo flushed-on-stop > '{}' && sleep 120", late.display())}}]),
            "tool_use",
        ),
    )])
    .await;
    let api = TestApp::start_with(
        db,
        mango_api::Settings {
            model_base_url: Some(model.base.clone()),
            memory_mount_root: mount_root.display().to_string(),
            ..Default::default()
        },
    )
    .await;
    let store = api.create_store("stop notes").await;
    let session = api
        .session_with_resources(
            json!([{"type": "agent_toolset_20260401"}]),
            json!([{"type": "memory_store", "memory_store_id": store, "access": "read_write"}]),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let launcher =
        LocalLauncher::new(runner_command(), root.path().join("local"), "default").unwrap();
    let config = config(&api, 2);
    let grace = config.stopping_grace;
    let running = Running::start(&api, config, launcher).await;
    mango_testkit::turns::say(&api, &session, "go").await;
    until(
        "the call wrote into the store",
        Duration::from_secs(60),
        async || late.exists(),
    )
    .await;
    assert!(
        api.memory_at(&store, "/late.md").await.is_none(),
        "not synced yet"
    );
    let (work_id, _) = api.session_work(&session).await.remove(0);
    let asked = std::time::Instant::now();
    api.stop_work(&work_id, false).await;
    let name = mango_controller::core::naming::sandbox_name(&work_id, 1);
    let record = root.path().join(format!("local/sandboxes/{name}.json"));
    let runner_log = root.path().join(format!("local/logs/{name}.log"));
    let log = || std::fs::read_to_string(&runner_log).unwrap_or_default();
    while record.exists() {
        assert!(
            asked.elapsed() < grace,
            "its sandbox is still there: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = asked.elapsed();
    let log = log();
    assert!(
        took < Duration::from_secs(10),
        "gone {took:?} after the Stop: {log}"
    );
    assert!(
        log.contains(r#""signal":"SIGTERM""#) && log.contains(r#""exit":"signalled""#),
        "the runner was signalled and exited by itself: {log}"
    );
    assert_eq!(
        api.memory_at(&store, "/late.md").await.unwrap()["content"],
        "flushed-on-stop\n"
    );
    assert_eq!(api.get_work(&work_id).await["state"], "stopped");
    // The cancelled call has no result yet: the Session's next activation
    // runs it again. It is not this test's.
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}
