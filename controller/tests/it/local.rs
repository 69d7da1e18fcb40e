//! `mango-worker local` end to end: the supervisor core with the local
//! launcher, against a real api on PostgreSQL and the real runner.

use crate::support::{config, healthcheck, runner_command, until_stopped, Running};
use mango_client::Client;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::local::LocalLauncher;
use mango_protocol::CheckStatus;
use mango_testkit::{json_events, model_reply, ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

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
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t1", "name": "bash",
                        "input": {"command": "echo first > kept.txt && echo WROTE"}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
        ),
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t2", "name": "bash",
                        "input": {"command": "cat kept.txt"}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "again"}]), "end_turn"),
        ),
    ])
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
    let operator = Client::new(&api.base, &api.ws_key);
    for (say, want) in [("write it", "WROTE"), ("read it", "first")] {
        mango_testkit::turns::say(&api, &session, say).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = json_events(operator.all_events(&session).await.unwrap());
            let results: Vec<&Value> = events
                .iter()
                .filter(|e| e["type"] == "user.tool_result")
                .collect();
            let idle = events.last().is_some_and(|e| {
                e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn"
            });
            if idle
                && results.last().is_some_and(|r| {
                    r["content"][0]["text"]
                        .as_str()
                        .unwrap_or("")
                        .contains(want)
                })
            {
                break;
            }
            assert!(Instant::now() < deadline, "{say}: {events:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The operator ends this activation: the next message makes another.
        for (id, state) in api.session_work(&session).await {
            if state != "stopped" {
                api.stop_work(&id, true).await;
                until_stopped(&api, &id, Duration::from_secs(15)).await;
            }
        }
    }
    let works = api.session_work(&session).await;
    assert_eq!(works.len(), 2, "two activations: {works:?}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}
