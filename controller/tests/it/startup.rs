//! What `mango-worker` makes of where and how it is started: relative paths
//! are taken from its starting directory once, and a second supervisor on
//! the host does not collide with the first on the default metrics port.

use crate::process::{command, common_env, Worker};
use crate::support::{end_activation, turn};
use mango_testkit::{model_reply, ScriptedModel, TestApp};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `mango-worker local` as the README starts it, from some directory with
/// the default root (`.mango/local`, relative) and runner: a Session's
/// `bash` call runs in `<that directory>/.mango/local/sessions/<id>`.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn mango_worker_local_started_elsewhere_with_the_defaults_runs_a_bash_call(db: sqlx::PgPool) {
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t1", "name": "bash",
                        "input": {"command": "pwd && echo here > made.txt && echo MADE"}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
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
    let dir = tempfile::tempdir().unwrap();
    let start_in = std::fs::canonicalize(dir.path()).unwrap().join("elsewhere");
    std::fs::create_dir(&start_in).unwrap();
    let mut local = command(&["local"], &common_env(&api, &api.env_key));
    local.current_dir(&start_in);
    let worker = Worker::spawn(local, &dir.path().join("worker.log"));
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(&api, &session, "go", "MADE", Duration::from_secs(60)).await;
    let workspace = start_in.join(".mango/local/sessions").join(&session);
    let output = events
        .iter()
        .rev()
        .find(|e| e["type"] == "user.tool_result")
        .and_then(|r| r["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        output.starts_with(&format!("{}\n", workspace.display())),
        "{output}: {}",
        worker.log()
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("made.txt")).unwrap(),
        "here\n"
    );
    end_activation(&api, &session).await;
    stop(worker).await;
}

/// A second supervisor on the host finds the default metrics address
/// (127.0.0.1:9464) taken, serves on a free port and says which; an address
/// that was asked for and is taken still stops it, saying why.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_taken_default_metrics_port_is_replaced_but_a_chosen_one_is_not(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let dir = tempfile::tempdir().unwrap();
    // Taken by this test, unless something else holds it already.
    let held = std::net::TcpListener::bind("127.0.0.1:9464");
    if let Err(err) = &held {
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    }
    let local = |root: &str| {
        let root = dir.path().join(root);
        let mut local = command(
            &["local", "--root", root.to_str().unwrap()],
            &common_env(&api, &api.env_key),
        );
        local.env_remove("MANGO_METRICS_ADDR");
        local
    };

    let first = Worker::spawn(local("first"), &dir.path().join("first.log"));
    let line = first
        .until_logged("serving /metrics and /healthz", Duration::from_secs(20))
        .await;
    let addr: SocketAddr = serde_json::from_str::<Value>(&line).unwrap()["fields"]["addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 9464, "{line}");
    let moved = first.log();
    assert!(
        moved.contains("the default metrics address is taken") && moved.contains(&addr.to_string()),
        "it says where it serves: {moved}"
    );
    let health = get(addr, "/healthz").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );

    let mut chosen = local("second");
    chosen.env("MANGO_METRICS_ADDR", addr.to_string());
    // A second live supervisor beside the first needs its own worker id.
    chosen.env("MANGO_WORKER_ID", "mango-worker-second");
    let mut second = Worker::spawn(chosen, &dir.path().join("second.log"));
    let status = second.exit(Duration::from_secs(20)).await;
    let refused = second.log();
    assert_eq!(status.code(), Some(2), "{refused}");
    assert!(
        refused.contains(&format!("cannot serve metrics on {addr}")),
        "{refused}"
    );
    drop(held);
    stop(first).await;
}

/// A plain HTTP/1.1 GET of `path`; the whole answer.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

async fn stop(mut worker: Worker) {
    worker.terminate();
    let status = worker.exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}: {}", worker.log());
}
