//! `mango-worker docker` against a real Docker Engine, a real api on
//! PostgreSQL and the sandbox image: the supervisor core in this process
//! with the Docker launcher. Each test has a pool of its own.

use crate::engine::{self, assert_no_secret, names, Engine};
use crate::support::{
    config, end_activation, healthcheck, live_work, queued_session, turn, two_bash_turns,
    until_stopped, Running,
};
use mango_client::Client;
use mango_controller::core::config::Config;
use mango_controller::core::launcher::LaunchError;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::{session_volume, DockerArgs, DockerLauncher};
use mango_protocol::CheckStatus;
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::time::{Duration, Instant};

fn docker_config(api: &TestApp, pool: &str, max_concurrency: usize) -> Config {
    let mut config = config(api, max_concurrency);
    config.sandbox_base_url = engine::sandbox_base(api);
    config.pool = pool.to_string();
    config
}

async fn launcher(args: &DockerArgs, pool: &str) -> DockerLauncher {
    DockerLauncher::connect(args, pool)
        .await
        .expect("the Docker launcher connects")
}

async fn model_api(engine: &Engine, db: sqlx::PgPool, model: &ScriptedModel) -> TestApp {
    engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_healthcheck_succeeds_in_a_container_that_then_goes(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let pool = engine::pool("check");
    let api = engine.api(db, Default::default()).await;
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool, 2),
        launcher(&args, &pool).await,
    )
    .await;
    let (_, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "the check's container goes: {left:?}");
    let metrics = running.metrics.render();
    assert!(
        metrics.contains(r#"mango_supervisor_stage_seconds_count{stage="delivered"} 1"#),
        "{metrics}"
    );
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[]).await;
}

/// A Session with a scripted model runs `bash` in a hardened container
/// whose configuration holds no secret, and its second activation (a new
/// container) sees the files of its first in the Session's volume.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_session_runs_hardened_and_its_next_activation_sees_its_files(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = ScriptedModel::start(two_bash_turns(
        "echo first > kept.txt && id -u && echo WROTE",
        "cat kept.txt",
    ))
    .await;
    let api = model_api(&engine, db, &model).await;
    let pool = engine::pool("session");
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool, 2),
        launcher(&args, &pool).await,
    )
    .await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(&api, &session, "write it", "WROTE", Duration::from_secs(90)).await;
    let output = events
        .iter()
        .find(|e| e["type"] == "user.tool_result")
        .and_then(|r| r["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(output.contains("65534"), "tools run as nobody: {output}");

    // The first activation's runner is live: its container, found by label.
    let work_id = live_work(&api, &session).await;
    let containers = engine.containers(&pool).await;
    assert_eq!(containers.len(), 1, "{:?}", names(&containers));
    let id = containers[0].id.clone().unwrap();
    let inspected = engine
        .docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let text = serde_json::to_string(&inspected).unwrap();
    assert_no_secret("docker inspect", &text);
    for key in [&api.env_key, &api.ws_key] {
        assert!(!text.contains(key.as_str()));
    }
    let labels = inspected.config.as_ref().unwrap().labels.clone().unwrap();
    assert_eq!(labels["mango.dev/work-id"], work_id);
    assert_eq!(labels["mango.dev/session-id"], session);
    assert_eq!(labels["mango.dev/work-type"], "session");
    assert_eq!(labels["mango.dev/pool"], pool);
    assert_eq!(labels["mango.dev/claim"], "1");
    let env = inspected.config.as_ref().unwrap().env.clone().unwrap();
    for want in [
        format!("MANGO_WORK_ID={work_id}"),
        format!("MANGO_SESSION_ID={session}"),
        format!("MANGO_ENVIRONMENT_ID={}", api.env_id),
        "MANGO_WORK_TYPE=session".to_string(),
        "MANGO_WORKSPACE=/workspace".to_string(),
    ] {
        assert!(env.contains(&want), "{want} in {env:?}");
    }
    let host = inspected.host_config.clone().unwrap();
    assert_eq!(
        inspected.config.as_ref().unwrap().user.as_deref(),
        Some("65534:65534")
    );
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_string()])
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    assert!(host.tmpfs.as_ref().unwrap().contains_key("/tmp"));
    assert!(
        host.tmpfs.as_ref().unwrap()["/mnt/memory"].contains("mode=0700"),
        "Session Work has a private, writable Memory Store root"
    );
    assert_eq!(host.pids_limit, Some(128));
    assert_eq!(host.memory, Some(256 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(1_000_000_000));
    assert_eq!(host.init, Some(false), "the runner is PID 1 itself");
    assert_eq!(
        host.dns,
        Some(vec![engine.gateway.to_string()]),
        "names outside /etc/hosts are forwarded only to the fenced gateway"
    );
    let log = host.log_config.clone().unwrap();
    assert_eq!(log.typ.as_deref(), Some("json-file"));
    let bounds = log.config.unwrap();
    assert_eq!(bounds["max-size"], "1m");
    assert_eq!(bounds["max-file"], "2");
    let mounts = inspected.mounts.clone().unwrap();
    assert!(
        mounts.iter().any(
            |m| m.name.as_deref() == Some(session_volume(&session).as_str())
                && m.destination.as_deref() == Some("/workspace")
        ),
        "{mounts:?}"
    );

    end_activation(&api, &session).await;
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(
        left.is_empty(),
        "a stopped activation's container goes: {left:?}"
    );
    turn(&api, &session, "read it", "first", Duration::from_secs(90)).await;
    end_activation(&api, &session).await;
    assert_eq!(api.session_work(&session).await.len(), 2, "two activations");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    assert!(engine.containers(&pool).await.is_empty());
    assert_eq!(
        engine.session_volumes(&session).await,
        vec![session_volume(&session)],
        "the Session's volume stays for its next activation"
    );
    engine.clean(&pool, &[&session]).await;
}

/// Stop of a running item removes its container within 15 s, whether the
/// Stop is forced or lets the holder finish. A graceful one reaches the
/// runner as SIGTERM (through the runner's PID 1), and the runner exits by
/// itself with 7 (`signalled`): within 15 s, which is shorter than the
/// stopping grace after which the container would be removed by force.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn stop_of_a_running_item_removes_its_container_within_15_s(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = ScriptedModel::start(two_bash_turns("echo ONE", "echo TWO")).await;
    // A short lease, so the stopping item is stopped soon after its runner goes.
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                default_ttl_seconds: 10,
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("stop");
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool, 2),
        launcher(&args, &pool).await,
    )
    .await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    for (say, want, force) in [("one", "ONE", false), ("two", "TWO", true)] {
        turn(&api, &session, say, want, Duration::from_secs(90)).await;
        let work_id = live_work(&api, &session).await;
        assert_eq!(engine.containers(&pool).await.len(), 1);
        let asked = Instant::now();
        let since = chrono::Utc::now().timestamp().to_string();
        api.stop_work(&work_id, force).await;
        let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
        assert!(
            left.is_empty(),
            "force={force}: left after {:?}: {left:?}",
            asked.elapsed()
        );
        if !force {
            let died = engine.exit_codes(&pool, &since).await;
            assert_eq!(died, ["7"], "the runner exited by itself after SIGTERM");
        }
        until_stopped(&api, &work_id, Duration::from_secs(30)).await;
    }
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
}

/// With 20 queued healthchecks and `max_concurrency` 3, never more than 3
/// containers exist at once, and every check succeeds.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn max_concurrency_holds_with_20_queued_items(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let pool = engine::pool("concurrency");
    let args = engine.args(&api);
    let operator = Client::new(&api.base, &api.ws_key);
    let mut checks = Vec::new();
    for _ in 0..20 {
        checks.push(operator.create_healthcheck(&api.env_id).await.unwrap().id);
    }
    let running = Running::start(
        &api,
        docker_config(&api, &pool, 3),
        launcher(&args, &pool).await,
    )
    .await;
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(110);
    loop {
        most = most.max(engine.containers(&pool).await.len());
        let mut done = 0;
        for id in &checks {
            if operator.work(&api.env_id, id).await.unwrap().state
                == mango_protocol::WorkState::Stopped
            {
                done += 1;
            }
        }
        if done == checks.len() {
            break;
        }
        assert!(Instant::now() < deadline, "{done}/20 finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(most <= 3, "{most} containers at once");
    assert!(most >= 2, "items ran side by side ({most} at most)");
    for id in &checks {
        let result = operator
            .work(&api.env_id, id)
            .await
            .unwrap()
            .result
            .unwrap();
        assert_eq!(
            result.status,
            CheckStatus::Succeeded,
            "{id}: {}",
            result.message
        );
    }
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "{left:?}");
}

/// Launch-time faults are reported with what to do, and leave nothing: an
/// image that does not exist, an engine that does not answer, and a
/// Session volume that cannot be created.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn launch_faults_are_reported_and_leave_nothing(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let pool = engine::pool("faults");
    let mut args = engine.args(&api);

    args.image = "mango-sandbox:no-such-tag".into();
    let err = DockerLauncher::connect(&args, &pool)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, LaunchError::Missing(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("mango-sandbox:no-such-tag") && text.contains("scripts/sandbox-image.sh"),
        "{text}"
    );

    let mut unreachable = engine.args(&api);
    unreachable.docker_host = Some("unix:///nonexistent/docker.sock".into());
    let err = DockerLauncher::connect(&unreachable, &pool)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, LaunchError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/docker.sock"),
        "{err}"
    );

    // Another volume driver cannot be bounded by the supervisor: refused
    // at start unless the workspaces are declared unbounded.
    let mut no_volume = engine.args(&api);
    no_volume.volume_driver = "no-such-volume-driver".into();
    let err = DockerLauncher::connect(&no_volume, &pool)
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, LaunchError::Missing(m) if m.contains("`local` volume driver") && m.contains("MANGO_WORKSPACE_SIZE=unbounded")),
        "{err:?}"
    );
    // A volume driver that does not exist: the Session's item cannot start.
    no_volume.workspace_size = mango_controller::docker::workspace::WorkspaceSize::Unbounded;
    let running = Running::start(
        &api,
        docker_config(&api, &pool, 2),
        launcher(&no_volume, &pool).await,
    )
    .await;
    let (session, _) = queued_session(&api).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running
        .metrics
        .render()
        .contains(r#"outcome="launch_failed"} 1"#)
    {
        assert!(Instant::now() < deadline, "{}", running.metrics.render());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(engine.containers(&pool).await.is_empty(), "no container");
    assert!(
        engine.session_volumes(&session).await.is_empty(),
        "no volume"
    );
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
}

/// A runner that exits at once, and one that never heartbeats: each
/// sandbox is removed (the first when it exits, the second when its lease
/// runs out), and no container is left.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn misbehaving_runners_are_removed(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine
        .api(
            db,
            mango_api::Settings {
                default_ttl_seconds: 3,
                ..Default::default()
            },
        )
        .await;
    for (tag, entrypoint) in [
        ("exits", &["/bin/false"][..]),
        ("silent", &["/bin/sleep", "3600"][..]),
    ] {
        let pool = engine::pool(tag);
        let mut args = engine.args(&api);
        args.image = engine.image_running(tag, entrypoint).await;
        let running = Running::start(
            &api,
            docker_config(&api, &pool, 1),
            launcher(&args, &pool).await,
        )
        .await;
        let (session, work_id) = queued_session(&api).await;
        let first = format!(
            "/{}",
            mango_controller::core::naming::sandbox_name(&work_id, 1)
        );
        // Its first claim's container appears, then goes.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = false;
        loop {
            let now = names(&engine.containers(&pool).await);
            let here = now.contains(&first);
            seen |= here;
            if seen && !here {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{tag}: {first} seen={seen} now={now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let metrics = running.metrics.render();
        assert!(
            metrics.contains("mango_supervisor_items_total"),
            "{metrics}"
        );
        assert_eq!(running.shutdown().await, RunEnd::Shutdown);
        let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
        assert!(left.is_empty(), "{tag}: {left:?}");
        let stored = api.get_work(&work_id).await;
        assert_ne!(
            stored["state"], "active",
            "{tag}: never heartbeated: {stored}"
        );
        // Otherwise the next case's supervisor, in the same Environment,
        // reclaims this older Work whenever its short lease has run out,
        // before its own.
        if stored["state"] != "stopped" {
            api.stop_work(&work_id, true).await;
        }
        // Its workspace is a mounted filesystem: unmounted and deleted.
        engine.clean(&pool, &[&session]).await;
        let _ = engine
            .docker
            .remove_image(
                &args.image,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
}

/// The volume of a deleted Session is swept; a live Session's is kept.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_deleted_sessions_volume_is_swept(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let pool = engine::pool("sweep");
    let args = engine.args(&api);
    let mut config = docker_config(&api, &pool, 2);
    config.workspace_sweep_every = Duration::from_millis(300);
    let running = Running::start(&api, config, launcher(&args, &pool).await).await;
    let (kept, _) = queued_session(&api).await;
    let (doomed, _) = queued_session(&api).await;
    crate::support::until("both volumes", Duration::from_secs(30), async || {
        engine.session_volumes(&kept).await.len() == 1
            && engine.session_volumes(&doomed).await.len() == 1
    })
    .await;
    end_activation(&api, &doomed).await;
    // Its container goes first (a volume in use cannot be removed).
    api.delete_session(&doomed).await;
    crate::support::until(
        "the deleted Session's volume goes",
        Duration::from_secs(20),
        async || engine.session_volumes(&doomed).await.is_empty(),
    )
    .await;
    assert_eq!(
        engine.session_volumes(&kept).await.len(),
        1,
        "a live Session's volume stays"
    );
    end_activation(&api, &kept).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&kept, &doomed]).await;
}

/// Supervisors starting together on an engine that lacks the network make
/// one network between them, not one each: engines before API 1.44 accept
/// two creates of one name, after which every use of the name is ambiguous.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn supervisors_starting_together_make_one_network(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let mut args = engine.args(&api);
    args.network = engine::pool("network");
    let pools: Vec<String> = (0..4).map(|i| engine::pool(&format!("net{i}"))).collect();
    let connected = futures::future::join_all(
        pools
            .iter()
            .map(|pool| DockerLauncher::connect(&args, pool)),
    )
    .await;
    let named: Vec<String> = engine
        .docker
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(std::collections::HashMap::from([(
                "name".to_string(),
                vec![args.network.clone()],
            )])),
        }))
        .await
        .expect("networks are listed")
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(args.network.as_str()))
        .filter_map(|n| n.id)
        .collect();
    for id in &named {
        engine.docker.remove_network(id).await.ok();
    }
    if let Some(bridge) = connected
        .iter()
        .find_map(|c| c.as_ref().ok())
        .map(|l| l.network().bridge.clone())
    {
        mango_controller::docker::fence::HostFence::of(&bridge)
            .remove()
            .await
            .expect("the throwaway network's fence goes");
    }
    for launcher in connected {
        launcher.expect("every supervisor connects");
    }
    assert_eq!(named.len(), 1, "networks named {}: {named:?}", args.network);
}
