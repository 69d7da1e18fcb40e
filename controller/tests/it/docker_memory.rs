//! A Session's Memory Store in a hardened Docker sandbox (spec §9): the
//! read-only root filesystem leaves the runner a private tmpfs at
//! `/mnt/memory`, where it downloads the store before the first tool call;
//! a file a tool writes there reaches the server at the first sync after a
//! tool call 15 s or more after the download.

use crate::engine;
use crate::support::{config, end_activation, turn, Running};
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::DockerLauncher;
use mango_testkit::{model_reply, ScriptedModel};
use serde_json::json;
use std::time::{Duration, Instant};

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_store_is_mounted_and_synced_in_a_hardened_container(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let root = "/mnt/memory/docker-notes";
    let bash = |id: &str, command: String| {
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}]),
                "tool_use",
            ),
        )
    };
    let end = |text: &str| {
        (
            200,
            model_reply(json!([{"type": "text", "text": text}]), "end_turn"),
        )
    };
    let model = ScriptedModel::start(vec![
        bash(
            "t1",
            format!("cat {root}/known.md && echo learned-in-docker > {root}/learned.md"),
        ),
        end("done"),
        bash("t2", "echo SECOND".into()),
        end("again"),
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
    let store = api.create_store("Docker Notes").await;
    api.create_memory(&store, "/known.md", "known-from-the-store")
        .await;
    let session = api
        .session_with_resources(
            json!([{"type": "agent_toolset_20260401"}]),
            json!([{"type": "memory_store", "memory_store_id": store}]),
        )
        .await;
    assert_eq!(session["resources"][0]["mount_path"], root);
    let session = session["id"].as_str().unwrap().to_string();

    let pool = engine::pool("memory");
    let args = engine.args(&api);
    let mut cfg = config(&api, 1);
    cfg.sandbox_base_url = engine::sandbox_base(&api);
    cfg.pool = pool.clone();
    let launcher = DockerLauncher::connect(&args, &pool)
        .await
        .expect("the Docker launcher connects");
    let running = Running::start(&api, cfg, launcher).await;

    turn(
        &api,
        &session,
        "one",
        "known-from-the-store",
        Duration::from_secs(90),
    )
    .await;
    // The next tool call after the 15 s interval (counted from the download,
    // before the first call) syncs the store.
    tokio::time::sleep(Duration::from_secs(16)).await;
    turn(&api, &session, "two", "SECOND", Duration::from_secs(90)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(m) = api.memory_at(&store, "/learned.md").await {
            assert_eq!(m["content"], "learned-in-docker\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "learned.md never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
}
