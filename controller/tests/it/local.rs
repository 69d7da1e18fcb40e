//! `mango-worker local` end to end: the supervisor core with the local
//! launcher, against a real api on PostgreSQL and the real runner.

use crate::support::{
    config, end_activation, healthcheck, runner_command, turn, two_bash_turns, Running,
};
use mango_controller::core::supervisor::RunEnd;
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
