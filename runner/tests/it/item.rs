//! `mango-runner` run as a supervisor runs it: identity in the
//! environment, the Work secret on stdin, against a real api.

use mango_client::Client;
use mango_protocol::{CheckStatus, Work, WorkState};
use mango_testkit::TestApp;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Creates a healthcheck, polls and acks it with the Environment key.
async fn acked_check(api: &TestApp) -> Work {
    let operator = Client::new(&api.base, &api.ws_key);
    let supervisor = Client::new(&api.base, &api.env_key);
    operator.create_healthcheck(&api.env_id).await.unwrap();
    let work = supervisor
        .poll(&api.env_id, None, None)
        .await
        .unwrap()
        .expect("the check");
    supervisor.ack(&api.env_id, &work.id).await.unwrap();
    work
}

/// Runs `mango-runner` with only its identity in the environment.
fn run_worker(
    base: &str,
    environment_id: &str,
    work_id: &str,
    work_type: &str,
    workspace: &Path,
    stdin: &[u8],
) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", base)
        .env("MANGO_WORK_ID", work_id)
        .env("MANGO_ENVIRONMENT_ID", environment_id)
        .env("MANGO_WORK_TYPE", work_type)
        .env("MANGO_WORKSPACE", workspace)
        .env("MANGO_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mango-runner starts");
    let mut input = child.stdin.take().unwrap();
    // A runner that rejects early may close stdin first; that is fine.
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().unwrap()
}

async fn wait_output(
    api: &TestApp,
    work: &Work,
    work_type: &'static str,
    workspace: &Path,
    stdin: Vec<u8>,
) -> Output {
    let (base, env, id, dir) = (
        api.base.clone(),
        api.env_id.clone(),
        work.id.clone(),
        workspace.to_path_buf(),
    );
    tokio::task::spawn_blocking(move || run_worker(&base, &env, &id, work_type, &dir, &stdin))
        .await
        .unwrap()
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_passes_end_to_end(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let work = acked_check(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let line = format!("{}\n", work.secret.clone().unwrap());
    let out = wait_output(
        &api,
        &work,
        "healthcheck",
        workspace.path(),
        line.into_bytes(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let token = secret_token(work.secret.as_deref().unwrap());
    assert!(
        !stderr.contains(&token) && !stderr.contains(work.secret.as_deref().unwrap()),
        "the secret never reaches the logs"
    );

    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
    let result = stored.result.unwrap();
    assert_eq!(
        (result.status, result.message.as_str()),
        (
            CheckStatus::Succeeded,
            "Sandbox process and workspace check passed"
        )
    );
    assert!(
        stored.started_at.is_some(),
        "the first heartbeat came before the probe"
    );
    assert_eq!(
        std::fs::read_dir(workspace.path()).unwrap().count(),
        0,
        "the probe cleans up after itself"
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unusable_workspace_fails_the_check_with_a_reason(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let work = acked_check(&api).await;
    let missing = std::path::Path::new("/nonexistent/mango-workspace");
    let line = format!("{}\n", work.secret.clone().unwrap());
    let out = wait_output(&api, &work, "healthcheck", missing, line.into_bytes()).await;
    assert!(!out.status.success());
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    let result = stored.result.unwrap();
    assert_eq!(result.status, CheckStatus::Failed);
    assert!(
        result.message.contains("/nonexistent/mango-workspace"),
        "{}",
        result.message
    );
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_secrets_exit_cleanly_with_a_reason_and_touch_nothing(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let work = acked_check(&api).await;
    let dir = tempfile::tempdir().unwrap();
    for (stdin, reason) in [
        (b"!!!\n".to_vec(), "not URL-safe base64"),
        (
            b"bm90IGpzb24\n".to_vec(),
            "does not decode to a JSON object",
        ),
        (b"eyJvdGhlciI6IngifQ\n".to_vec(), "has no sessions_token"),
        (vec![b'a'; 20_000], "exceeds 16384 bytes"),
        (Vec::new(), "no Work secret arrived"),
    ] {
        let out = wait_output(&api, &work, "healthcheck", dir.path(), stdin).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(reason), "expected {reason:?} in: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(stored.state, WorkState::Starting, "no heartbeat was sent");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_work_type_it_cannot_run_is_left_to_be_reclaimed(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let work = acked_check(&api).await;
    let dir = tempfile::tempdir().unwrap();
    let out = wait_output(
        &api,
        &work,
        "mystery",
        dir.path(),
        format!("{}\n", work.secret.clone().unwrap()).into_bytes(),
    )
    .await;
    assert_eq!(out.status.code(), Some(3));
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(
        stored.state,
        WorkState::Starting,
        "untouched: its lease will expire and Poll reclaims it"
    );
}

fn secret_token(secret: &str) -> String {
    mango_runner::secret::sessions_token(secret).unwrap()
}
