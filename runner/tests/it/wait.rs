//! `mango-runner --wait` as a warm sandbox runs it: started with only the
//! api's address and the workspace, its Work arriving later as one
//! envelope line on stdin (spec §7.1).

use mango_client::Client;
use mango_protocol::envelope::{Envelope, MAX_ENVELOPE_BYTES};
use mango_protocol::{CheckStatus, Work, WorkState, WorkType};
use mango_testkit::TestApp;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Starts `mango-runner --wait` with nothing but the api's address and
/// the workspace and writes `stdin`; closes it after, unless a wait timeout
/// is being tested.
fn run_waiting(base: &str, workspace: &Path, stdin: &[u8], extra: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mango-runner"))
        .arg("--wait")
        .args(extra)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MANGO_BASE_URL", base)
        .env("MANGO_WORKSPACE", workspace)
        .env("MANGO_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mango-runner starts");
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin);
    if extra.contains(&"--wait-timeout-seconds") {
        // Held open: only the timeout can end the wait.
        let out = child.wait_with_output().unwrap();
        drop(input);
        return out;
    }
    drop(input);
    child.wait_with_output().unwrap()
}

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

fn envelope_for(api: &TestApp, work: &Work) -> Envelope {
    Envelope {
        work_id: work.id.clone(),
        environment_id: api.env_id.clone(),
        work_type: WorkType::Healthcheck,
        session_id: None,
        claim: work.claim.unwrap_or(1),
        secret: work.secret.clone().unwrap(),
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_waiting_runner_runs_the_healthcheck_its_envelope_names(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let work = acked_check(&api).await;
    let workspace = tempfile::tempdir().unwrap();
    let line = envelope_for(&api, &work).to_line();
    let (base, dir) = (api.base.clone(), workspace.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || run_waiting(&base, &dir, line.as_bytes(), &[]))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(
        !stderr.contains(work.secret.as_deref().unwrap()),
        "the secret never reaches the logs"
    );
    let stored = Client::new(&api.base, &api.ws_key)
        .work(&api.env_id, &work.id)
        .await
        .unwrap();
    assert_eq!(stored.state, WorkState::Stopped);
    assert_eq!(stored.result.unwrap().status, CheckStatus::Succeeded);
}

/// Each refused start has its exit code, and the api's address never saw a
/// connection: a listener that nobody accepts from holds any that came.
#[test]
fn a_bad_or_missing_envelope_exits_with_its_code_and_contacts_nothing() {
    let good = Envelope {
        work_id: "work_1".into(),
        environment_id: "env_1".into(),
        work_type: WorkType::Healthcheck,
        session_id: None,
        claim: 1,
        secret: "eyJzZXNzaW9uc190b2tlbiI6Im1hbmdvX3N0X3gifQ".into(),
    };
    let mut oversized = good.clone();
    oversized.work_id = "w".repeat(MAX_ENVELOPE_BYTES);
    let mut session_without_id = serde_json::to_value(&good).unwrap();
    session_without_id["work_type"] = "session".into();
    let cases: Vec<(&str, Vec<u8>, &[&str], i32)> = vec![
        ("stdin closed at once", vec![], &[], 9),
        ("oversized", oversized.to_line().into_bytes(), &[], 8),
        (
            "partial",
            good.to_line().trim_end().as_bytes().to_vec(),
            &[],
            8,
        ),
        ("not json", b"hello\n".to_vec(), &[], 8),
        ("not utf-8", vec![0xff, b'\n'], &[], 8),
        (
            "invalid",
            format!("{session_without_id}\n").into_bytes(),
            &[],
            8,
        ),
        ("wait timeout", vec![], &["--wait-timeout-seconds", "1"], 10),
    ];
    for (name, stdin, extra, code) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let workspace = tempfile::tempdir().unwrap();
        let out = run_waiting(&base, workspace.path(), &stdin, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{name}: {stderr}");
        assert!(
            listener.accept().is_err(),
            "{name}: the runner contacted the api"
        );
        assert!(!stderr.contains("mango_st_x"), "{name}: {stderr}");
    }
}
