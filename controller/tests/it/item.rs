//! `mango-worker item` is the item runner (the seed's `HandleItem`): the
//! same identity in the environment, the secret on stdin, the same outcome.

use mango_client::Client;
use mango_protocol::{CheckStatus, WorkState};
use mango_testkit::TestApp;
use std::io::Write;
use std::process::{Command, Stdio};

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn mango_worker_item_runs_a_healthcheck_to_its_result(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let operator = Client::new(&api.base, &api.ws_key);
    let supervisor = Client::new(&api.base, &api.env_key);
    operator.create_healthcheck(&api.env_id).await.unwrap();
    let work = supervisor
        .poll(&api.env_id, None, None)
        .await
        .unwrap()
        .expect("the check");
    supervisor.ack(&api.env_id, &work.id).await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let secret = format!("{}\n", work.secret.clone().unwrap());
    let (base, env, id, dir) = (
        api.base.clone(),
        api.env_id.clone(),
        work.id.clone(),
        workspace.path().to_path_buf(),
    );
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mango-worker"))
            .arg("item")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("MANGO_BASE_URL", base)
            .env("MANGO_WORK_ID", id)
            .env("MANGO_ENVIRONMENT_ID", env)
            .env("MANGO_WORK_TYPE", "healthcheck")
            .env("MANGO_WORKSPACE", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mango-worker starts");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(secret.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {log}", out.status);
    let stored = operator.work(&api.env_id, &work.id).await.unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
    let result = stored.result.expect("a result");
    assert_eq!(result.status, CheckStatus::Succeeded, "{}", result.message);
}
