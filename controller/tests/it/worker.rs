//! The `mango-worker` binary as operators run it: refusing keys that must
//! not be used, running a healthcheck, and never logging a secret (stopping
//! and restarting it mid-item: `restart.rs`).

use crate::engine::assert_no_secret;
use crate::process::{common_env, Worker};
use mango_protocol::CheckStatus;
use mango_testkit::TestApp;
use std::time::Duration;

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
/// boundary, and exits on SIGTERM, its sandbox gone with the check.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn mango_worker_local_runs_a_healthcheck_and_exits_on_sigterm(db: sqlx::PgPool) {
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
    let records = dir.path().join("root/sandboxes");
    crate::support::until(
        "the check's sandbox goes",
        Duration::from_secs(10),
        async || std::fs::read_dir(&records).map_or(0, |d| d.count()) == 0,
    )
    .await;
    worker.terminate();
    let exit = worker.exit(Duration::from_secs(10)).await;
    let text = worker.log();
    assert!(exit.success(), "{exit:?}: {text}");
    assert!(text.contains("NOT a security boundary"), "{text}");
    assert_no_secret("the supervisor's log", &text);
}

/// `--workspace-sweep-seconds` takes 1 to 86400: 0 and 86401 are refused
/// at start (exit status 2) with the flag named.
#[tokio::test]
async fn a_workspace_sweep_period_outside_its_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("MANGO_ENVIRONMENT_KEY", "mango_envk_unused".to_string()),
        ("MANGO_ENVIRONMENT_ID", "env_unused".to_string()),
        ("MANGO_BASE_URL", "http://127.0.0.1:9".to_string()),
    ];
    for value in ["0", "86401"] {
        let log = dir.path().join(format!("sweep-{value}.log"));
        let mut worker = Worker::start(
            &[
                "local",
                "--root",
                dir.path().to_str().unwrap(),
                "--workspace-sweep-seconds",
                value,
            ],
            &env,
            &log,
        );
        let status = worker.exit(Duration::from_secs(10)).await;
        let text = worker.log();
        assert_eq!(status.code(), Some(2), "{value}: {text}");
        assert!(
            text.contains("--workspace-sweep-seconds"),
            "{value}: {text}"
        );
    }
}
