//! Warm pools on a real Docker Engine (spec §7.1): warm containers made
//! ahead, identity-less, bound on Ack by a rename and two records, never
//! bound twice, adopted by their owner after a restart, replaced when they
//! die, removed when the pool goes to 0.

use crate::engine::{self, assert_no_secret, Engine};
use crate::process::Worker;
use crate::support::{config, end_activation, healthcheck, turn, two_bash_turns, until, Running};
use bollard::models::ContainerSummary;
use bollard::query_parameters::{
    EventsOptions, InspectContainerOptions, KillContainerOptions, ListVolumesOptions,
    RemoveVolumeOptions,
};
use futures::StreamExt;
use mango_client::Client;
use mango_controller::core::config::Config;
use mango_controller::core::launcher::Launcher;
use mango_controller::core::naming::sandbox_name;
use mango_controller::core::supervisor::{RunEnd, Stop};
use mango_controller::docker::{session_volume, DockerLauncher};
use mango_protocol::CheckStatus;
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

fn warm_config(api: &TestApp, pool: &str, warm: usize, owner: &str) -> Config {
    let mut config = config(api, 4);
    config.sandbox_base_url = engine::sandbox_base(api);
    config.pool = pool.to_string();
    config.warm = warm;
    config.worker_id = owner.to_string();
    config.warm_check_every = Duration::from_millis(300);
    config
}

async fn launcher(engine: &Engine, api: &TestApp, pool: &str) -> DockerLauncher {
    DockerLauncher::connect(&engine.args(api), pool)
        .await
        .expect("the Docker launcher connects")
}

fn name_of(c: &ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_default()
}

/// The running warm (unbound) containers of `pool`, by id.
async fn warm_ids(engine: &Engine, pool: &str) -> HashSet<String> {
    engine
        .containers(pool)
        .await
        .into_iter()
        .filter(|c| name_of(c).starts_with("mango-warm-"))
        .filter(|c| c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING))
        .filter_map(|c| c.id)
        .collect()
}

async fn until_warm(engine: &Engine, pool: &str, n: usize) -> HashSet<String> {
    let mut ids = HashSet::new();
    until(
        &format!("{n} warm containers"),
        Duration::from_secs(60),
        async || {
            ids = warm_ids(engine, pool).await;
            ids.len() == n && engine.containers(pool).await.len() == n
        },
    )
    .await;
    ids
}

/// The engine's container events of `kind` in `pool` since `since`: the
/// actor's id and attributes.
async fn events(
    engine: &Engine,
    pool: &str,
    kind: &str,
    since: i64,
) -> Vec<(String, HashMap<String, String>)> {
    let until = (chrono::Utc::now().timestamp() + 1).to_string();
    engine
        .docker
        .events(Some(EventsOptions {
            since: Some(since.to_string()),
            until: Some(until),
            filters: Some(HashMap::from([
                ("type".to_string(), vec!["container".to_string()]),
                ("event".to_string(), vec![kind.to_string()]),
                ("label".to_string(), vec![format!("mango.dev/pool={pool}")]),
            ])),
        }))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|e| e.expect("an event"))
        .filter_map(|e| {
            let actor = e.actor?;
            Some((actor.id?, actor.attributes.unwrap_or_default()))
        })
        .collect()
}

/// The volumes labelled with `pool` (warm workspaces, binding records).
async fn pool_volumes(engine: &Engine, pool: &str) -> Vec<String> {
    let listed = engine
        .docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("mango.dev/pool={pool}")],
            )])),
        }))
        .await
        .expect("volumes are listed");
    listed
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
}

async fn clean(engine: &Engine, pool: &str, sessions: &[&str]) {
    engine.clean(pool, sessions).await;
    for volume in pool_volumes(engine, pool).await {
        let _ = engine
            .docker
            .remove_volume(&volume, None::<RemoveVolumeOptions>)
            .await;
        let _ = engine.workspaces().remove(&volume).await;
    }
}

async fn inspect_text(engine: &Engine, id: &str) -> (String, Vec<String>) {
    let inspected = engine
        .docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
        .expect("the container exists");
    let env = inspected.config.as_ref().unwrap().env.clone().unwrap();
    (serde_json::to_string(&inspected).unwrap(), env)
}

/// A pool of 2 serves a healthcheck with a warm container: no container is
/// created for it (only the replenishment, named warm), the bound one is
/// renamed to the item's name, and the pool is back at 2 after. No secret
/// is in the warm container's configuration before binding; draining
/// removes the pool and its volumes.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_pool_serves_a_healthcheck_and_replenishes(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let pool = engine::pool("warm");
    let api = engine.api(db, Default::default()).await;
    let owner = format!("{pool}-a");
    let running = Running::start(
        &api,
        warm_config(&api, &pool, 2, &owner),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let before = until_warm(&engine, &pool, 2).await;
    for id in &before {
        let (text, env) = inspect_text(&engine, id).await;
        assert_no_secret("a warm container", &text);
        let mango: Vec<&String> = env.iter().filter(|e| e.starts_with("MANGO_")).collect();
        assert_eq!(
            mango.len(),
            2,
            "identity-less: only the api and the workspace: {env:?}"
        );
        assert!(env.contains(&format!("MANGO_BASE_URL={}", engine::sandbox_base(&api))));
        assert!(env.contains(&"MANGO_WORKSPACE=/workspace".to_string()));
        assert!(text.contains(&format!("\"mango.dev/warm-owner\":\"{owner}\"")));
    }
    let since = chrono::Utc::now().timestamp() - 1;
    let (check, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");

    let renames = events(&engine, &pool, "rename", since).await;
    assert_eq!(renames.len(), 1, "{renames:?}");
    let (bound, attributes) = &renames[0];
    assert!(before.contains(bound), "a warm one served it: {renames:?}");
    assert_eq!(attributes["name"], sandbox_name(&check, 1));
    for (id, attributes) in events(&engine, &pool, "create", since).await {
        assert!(
            attributes["name"].starts_with("mango-warm-"),
            "only warm ones are made after Ack: {id} {attributes:?}"
        );
    }
    let after = until_warm(&engine, &pool, 2).await;
    assert!(!after.contains(bound), "the bound one is gone, replaced");
    let metrics = running.metrics.render();
    assert!(
        metrics.contains("mango_supervisor_warm_bound_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"mango_supervisor_stage_seconds_count{stage="bound"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"mango_supervisor_stage_seconds_count{stage="created"} 0"#),
        "{metrics}"
    );
    let volumes = pool_volumes(&engine, &pool).await;
    assert_eq!(
        volumes.len(),
        2,
        "the check's workspace and record went: {volumes:?}"
    );

    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "drained: {left:?}");
    assert_eq!(pool_volumes(&engine, &pool).await, Vec::<String>::new());
    clean(&engine, &pool, &[]).await;
}

/// A Session's first activation goes warm: `docker ps -f name=` finds its
/// container by the item's name, nothing in it holds a secret after
/// binding, and its workspace becomes the Session's: the next activation
/// (cold, the Session has a workspace) sees its files, and removing the
/// Session's workspace removes the warm volume too.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_session_keeps_its_warm_workspace(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = ScriptedModel::start(two_bash_turns(
        "echo first > kept.txt && echo WROTE",
        "cat kept.txt",
    ))
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
    let pool = engine::pool("warmsession");
    let owner = format!("{pool}-a");
    let running = Running::start(
        &api,
        warm_config(&api, &pool, 1, &owner),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let warm = until_warm(&engine, &pool, 1).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(90)).await;
    let work_id = crate::support::live_work(&api, &session).await;
    let found = engine
        .docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![sandbox_name(&work_id, 1)],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "docker ps -f name= finds it");
    let id = found[0].id.clone().unwrap();
    assert!(warm.contains(&id), "the first activation went warm");
    let (text, _) = inspect_text(&engine, &id).await;
    assert_no_secret("a bound warm container", &text);
    for key in [&api.env_key, &api.ws_key] {
        assert!(!text.contains(key.as_str()));
    }
    let binding = engine
        .docker
        .inspect_volume(&session_volume(&session))
        .await
        .expect("the Session's binding");
    let workspace = binding.labels["mango.dev/workspace-volume"].clone();
    assert!(workspace.starts_with("mango-warm-"), "{workspace}");
    assert_eq!(binding.labels["mango.dev/session-id"], session);
    // Bounded as a cold Session's workspace is: a bind of its own
    // loop-mounted filesystem, not a directory on the engine's disk.
    let warm_volume = engine.docker.inspect_volume(&workspace).await.unwrap();
    let bounded = engine.workspaces().mount_point(&workspace);
    assert_eq!(
        warm_volume.options.get("device").map(String::as_str),
        Some(bounded.to_string_lossy().as_ref()),
        "the warm workspace is a bounded one: {warm_volume:?}"
    );
    let disk = engine.workspaces().image(&workspace);
    assert_eq!(
        std::fs::metadata(&disk).map(|m| m.len()).ok(),
        Some(engine::TEST_WORKSPACE_BYTES),
        "its filesystem's file: {}",
        disk.display()
    );

    end_activation(&api, &session).await;
    let events = turn(&api, &session, "read it", "first", Duration::from_secs(90)).await;
    assert!(!events.is_empty());
    let second = crate::support::live_work(&api, &session).await;
    let containers = engine.containers(&pool).await;
    let serving: Vec<_> = containers
        .iter()
        .filter(|c| name_of(c) == sandbox_name(&second, 1))
        .collect();
    assert_eq!(serving.len(), 1);
    assert!(
        !warm.contains(serving[0].id.as_ref().unwrap()),
        "a Session with a workspace never goes warm"
    );
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);

    let launcher = launcher(&engine, &api, &pool).await;
    // The trait's: the launcher's own `workspaces()` is its bounded ones.
    assert!(Launcher::workspaces(&launcher, &api.env_id)
        .await
        .unwrap()
        .contains(&session));
    launcher.remove_workspace(&session).await.unwrap();
    for volume in [session_volume(&session), workspace] {
        assert!(
            engine.docker.inspect_volume(&volume).await.is_err(),
            "{volume} is removed with the Session"
        );
    }
    assert!(
        !disk.exists(),
        "the warm workspace's filesystem goes with the Session"
    );
    clean(&engine, &pool, &[&session]).await;
}

/// Two supervisors of one pool on one engine, each with its own warm
/// sandboxes: a burst of checks binds each warm container at most once,
/// and each supervisor binds only those it made.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_two_supervisors_never_bind_one_twice(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let pool = engine::pool("warmrace");
    let api = engine.api(db, Default::default()).await;
    let a = Running::start(
        &api,
        warm_config(&api, &pool, 2, &format!("{pool}-a")),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let b = Running::start(
        &api,
        warm_config(&api, &pool, 2, &format!("{pool}-b")),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let warm = until_warm(&engine, &pool, 4).await;
    let owners: HashMap<String, String> = {
        let mut owners = HashMap::new();
        for id in &warm {
            let (text, _) = inspect_text(&engine, id).await;
            let owner = if text.contains(&format!("{pool}-a\"")) {
                "a"
            } else {
                "b"
            };
            owners.insert(id.clone(), owner.to_string());
        }
        owners
    };
    let since = chrono::Utc::now().timestamp() - 1;
    let checks =
        futures::future::join_all((0..6).map(|_| healthcheck(&api, Duration::from_secs(90)))).await;
    for (id, status, message) in &checks {
        assert_eq!(*status, CheckStatus::Succeeded, "{id}: {message}");
    }
    let renames = events(&engine, &pool, "rename", since).await;
    let mut bound = HashSet::new();
    for (id, _) in &renames {
        assert!(bound.insert(id.clone()), "{id} bound twice: {renames:?}");
    }
    assert!(!renames.is_empty(), "some checks went warm");
    let bound_total = |m: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix("mango_supervisor_warm_bound_total "))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let by_a = bound_total(&a.metrics.render());
    let by_b = bound_total(&b.metrics.render());
    assert_eq!(by_a + by_b, renames.len());
    let first_a = renames
        .iter()
        .filter(|(id, _)| owners.get(id).is_some_and(|o| o == "a"))
        .count();
    let first_b = renames
        .iter()
        .filter(|(id, _)| owners.get(id).is_some_and(|o| o == "b"))
        .count();
    assert!(
        first_a <= by_a && first_b <= by_b,
        "each binds its own: {owners:?} {renames:?}"
    );
    assert_eq!(a.shutdown().await, RunEnd::Shutdown);
    assert_eq!(b.shutdown().await, RunEnd::Shutdown);
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(pool_volumes(&engine, &pool).await, Vec::<String>::new());
    clean(&engine, &pool, &[]).await;
}

/// A supervisor stopped with warm sandboxes live (detached, as SIGTERM
/// does, or killed) leaves them; started again with its worker id it
/// adopts them (makes none), another worker id never takes them, one that
/// dies while waiting is replaced, and a pool of 0 removes them all.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_restart_adopts_own_and_scale_to_zero_removes(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let pool = engine::pool("warmrestart");
    let api = engine.api(db, Default::default()).await;
    let owner = format!("{pool}-a");
    let first = Running::start(
        &api,
        warm_config(&api, &pool, 2, &owner),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let warm = until_warm(&engine, &pool, 2).await;
    assert_eq!(first.stop(Stop::Detach).await, RunEnd::Detached);
    assert_eq!(warm_ids(&engine, &pool).await, warm, "left running");

    // Another owner on the pool makes its own and takes none of these.
    let other = Running::start(
        &api,
        warm_config(&api, &pool, 1, &format!("{pool}-b")),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    until_warm(&engine, &pool, 3).await;
    assert_eq!(other.shutdown().await, RunEnd::Shutdown);
    until_warm(&engine, &pool, 2).await;
    assert_eq!(warm_ids(&engine, &pool).await, warm);

    let since = chrono::Utc::now().timestamp() - 1;
    let again = Running::start(
        &api,
        warm_config(&api, &pool, 2, &owner),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    until(
        "the restarted one adopts",
        Duration::from_secs(10),
        async || {
            again
                .metrics
                .render()
                .contains("mango_supervisor_warm_ready 2")
        },
    )
    .await;
    let made: Vec<_> = events(&engine, &pool, "create", since)
        .await
        .into_iter()
        .filter(|(_, attributes)| attributes.get("mango.dev/warm-owner") == Some(&owner))
        .collect();
    assert!(made.is_empty(), "adopted, none made: {made:?}");
    assert_eq!(warm_ids(&engine, &pool).await, warm);
    let (_, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    let renamed: Vec<String> = events(&engine, &pool, "rename", since)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(renamed.len(), 1);
    assert!(warm.contains(&renamed[0]), "an adopted one served it");

    // One that dies while waiting is replaced.
    let now = until_warm(&engine, &pool, 2).await;
    let victim = now.iter().next().unwrap().clone();
    engine
        .docker
        .kill_container(&victim, None::<KillContainerOptions>)
        .await
        .unwrap();
    until(
        "the dead one is replaced",
        Duration::from_secs(30),
        async || {
            let ids = warm_ids(&engine, &pool).await;
            ids.len() == 2 && !ids.contains(&victim) && engine.containers(&pool).await.len() == 2
        },
    )
    .await;
    assert_eq!(again.stop(Stop::Detach).await, RunEnd::Detached);

    // Scaled to 0: the owner's warm sandboxes and their volumes go.
    let none = Running::start(
        &api,
        warm_config(&api, &pool, 0, &owner),
        launcher(&engine, &api, &pool).await,
    )
    .await;
    let left = engine.until_empty(&pool, Duration::from_secs(15)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(pool_volumes(&engine, &pool).await, Vec::<String>::new());
    assert_eq!(none.shutdown().await, RunEnd::Shutdown);
    let _ = Client::new(&api.base, &api.ws_key);
    clean(&engine, &pool, &[]).await;
}

/// The pool's image changes under it (the tag now names another image):
/// the warm container of the old image is removed and one of the new is
/// made, which serves a check.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_image_change_recycles_the_pool(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    use bollard::query_parameters::{RemoveImageOptions, TagImageOptions};
    let pool = engine::pool("warmimage");
    let api = engine.api(db, Default::default()).await;
    let tag = pool.clone();
    let moving = format!("mango-sandbox-test:{tag}");
    let retag = async |from: &str| {
        engine
            .docker
            .tag_image(
                from,
                Some(TagImageOptions {
                    repo: Some("mango-sandbox-test".into()),
                    tag: Some(tag.clone()),
                }),
            )
            .await
            .expect("tagged");
    };
    retag(&engine.image).await;
    let mut args = engine.args(&api);
    args.image = moving.clone();
    let launcher = DockerLauncher::connect(&args, &pool).await.unwrap();
    let running = Running::start(
        &api,
        warm_config(&api, &pool, 1, &format!("{pool}-a")),
        launcher,
    )
    .await;
    let old = until_warm(&engine, &pool, 1).await;
    // Another image id, the same runner behind a shell entrypoint.
    let other = engine
        .image_running(
            &format!("{tag}-other"),
            &["/bin/bash", "-c", "exec \"$0\" \"$@\""],
        )
        .await;
    retag(&other).await;
    until(
        "the old image's warm one is replaced",
        Duration::from_secs(30),
        async || {
            let now = warm_ids(&engine, &pool).await;
            now.len() == 1 && now.is_disjoint(&old) && engine.containers(&pool).await.len() == 1
        },
    )
    .await;
    let (_, status, message) = healthcheck(&api, Duration::from_secs(60)).await;
    assert_eq!(status, CheckStatus::Succeeded, "{message}");
    assert!(running
        .metrics
        .render()
        .contains("mango_supervisor_warm_bound_total 1"));
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    clean(&engine, &pool, &[]).await;
    for image in [moving, other] {
        let _ = engine
            .docker
            .remove_image(&image, None::<RemoveImageOptions>, None)
            .await;
    }
}

/// `mango-worker docker --warm 2` as an operator runs it, with no
/// `--worker-id`: the environment the supervisor gets in production.
fn warm_worker(engine: &Engine, api: &TestApp, pool: &str, log: &std::path::Path) -> Worker {
    let mut env = crate::process::common_env(api, &api.env_key);
    env.extend([
        ("MANGO_DOCKER_BASE_URL", engine::sandbox_base(api)),
        ("MANGO_DOCKER_IMAGE", engine.image.clone()),
        ("MANGO_POOL", pool.to_string()),
        ("MANGO_DOCKER_NETWORK", engine::TEST_NETWORK.to_string()),
        (
            "MANGO_DOCKER_WORKSPACE_ROOT",
            engine::workspace_root().to_string_lossy().into_owned(),
        ),
        (
            "MANGO_WORKSPACE_SIZE",
            engine::TEST_WORKSPACE_BYTES.to_string(),
        ),
        ("MANGO_WARM", "2".to_string()),
    ]);
    Worker::start(&["docker"], &env, log)
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_warm_restart_with_the_default_worker_id_adopts_and_a_second_live_one_is_refused(
    db: sqlx::PgPool,
) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let pool = engine::pool("warmdefaultid");
    let api = engine.api(db, Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut first = warm_worker(&engine, &api, &pool, &dir.path().join("first.log"));
    let warm = until_warm(&engine, &pool, 2).await;

    // A restart (SIGTERM, then the same command): the warm containers are
    // the restarted supervisor's own, so it adopts them and makes none.
    first.terminate();
    assert!(first.exit(Duration::from_secs(15)).await.success());
    let second = warm_worker(&engine, &api, &pool, &dir.path().join("second.log"));
    second
        .until_logged("supervisor polling", Duration::from_secs(30))
        .await;
    // Past a few warm checks of the restarted one: nothing new was made.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = until_warm(&engine, &pool, 2).await;
    assert_eq!(
        after,
        warm,
        "the restarted supervisor adopted its warm containers: {}",
        second.log()
    );

    // A second live supervisor of the same id would bind the same warm
    // containers: it waits for the first to exit, then is refused.
    let mut third = warm_worker(&engine, &api, &pool, &dir.path().join("third.log"));
    let status = third.exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "{}", third.log());
    let refusal = third.log();
    assert!(
        refusal.contains("another mango-worker with worker id")
            && refusal.contains(&format!("(pid {})", second.child.id().unwrap())),
        "{refusal}"
    );
    assert_eq!(until_warm(&engine, &pool, 2).await, warm);

    drop(second);
    clean(&engine, &pool, &[]).await;
}
