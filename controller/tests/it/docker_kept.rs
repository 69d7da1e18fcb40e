//! Kept sandboxes on a real Docker Engine (spec §7.1), the launcher's half:
//! a Session's container made to wait for envelopes, and rebound to the
//! Session's next item by a rename and a binding record, because Docker
//! cannot relabel a container.

use crate::engine::{self, Engine};
use bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptions, ListVolumesOptions, RemoveVolumeOptions,
};
use mango_controller::core::launcher::{ItemIdentity, LaunchError, Launcher, SandboxSpec};
use mango_controller::docker::DockerLauncher;
use mango_protocol::WorkType;
use mango_testkit::TestApp;
use std::collections::HashMap;

fn item(work_id: &str, session: Option<&str>) -> ItemIdentity {
    ItemIdentity {
        work_id: work_id.into(),
        claim: 1,
        environment_id: "env_kept".into(),
        work_type: if session.is_some() {
            WorkType::Session
        } else {
            WorkType::Healthcheck
        },
        session_id: session.map(String::from),
    }
}

async fn keeping(engine: &Engine, api: &TestApp, pool: &str, keep: u64) -> DockerLauncher {
    let mut args = engine.args(api);
    args.keep_idle_seconds = keep;
    DockerLauncher::connect(&args, pool)
        .await
        .expect("the Docker launcher connects")
}

/// The volumes whose labels include `label`.
async fn volumes_labelled(engine: &Engine, label: &str) -> Vec<bollard::models::Volume> {
    engine
        .docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![label.to_string()],
            )])),
        }))
        .await
        .expect("volumes are listed")
        .volumes
        .unwrap_or_default()
}

async fn clean(engine: &Engine, pool: &str, sessions: &[&str]) {
    engine.clean(pool, sessions).await;
    for volume in volumes_labelled(engine, &format!("mango.dev/pool={pool}")).await {
        let _ = engine
            .docker
            .remove_volume(&volume.name, None::<RemoveVolumeOptions>)
            .await;
    }
}

/// With a keep, a Session's container runs the runner waiting for envelopes
/// (stdin kept open, no identity in its environment); a healthcheck's does
/// not. Rebinding it to the Session's next item renames it, and its newest
/// binding record names the new item, so a restarted supervisor's
/// `existing()` and `docker volume ls --filter label=mango.dev/work-id=…`
/// find the new item, not the old; older records go, another Session's
/// item is refused, and removing the container removes every record.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_kept_container_waits_and_rebinds_to_the_next_item(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, mango_api::Settings::default()).await;
    let pool = engine::pool("keptrebind");
    let session = format!("sesn_{pool}");
    // Container names are the engine's, not the pool's: each run its own.
    let run = pool.rsplit('-').next().unwrap().to_string();
    let work = |n: &str| format!("work_kept{n}_{run}");
    clean(&engine, &pool, &[&session]).await;
    let launcher = keeping(&engine, &api, &pool, 45).await;
    let base = engine::sandbox_base(&api);

    let first = SandboxSpec::for_item(&item(&work("1"), Some(&session)), &pool, &base);
    let sandbox = launcher.create(&first).await.expect("created");
    assert!(launcher.waits(&sandbox));
    let inspected = engine
        .docker
        .inspect_container(&sandbox.handle, None::<InspectContainerOptions>)
        .await
        .unwrap();
    let config = inspected.config.unwrap();
    assert_eq!(
        config.cmd.unwrap(),
        vec![
            "/usr/local/bin/mango-runner",
            "--wait",
            "--keep-idle-seconds",
            "45"
        ]
    );
    assert_eq!(config.stdin_once, Some(false), "stdin outlives an envelope");
    let env = config.env.unwrap();
    assert!(
        !env.iter().any(|e| e.starts_with("MANGO_WORK_ID=")),
        "its identity comes with each envelope: {env:?}"
    );

    let check = SandboxSpec::for_item(&item(&work("check"), None), &pool, &base);
    let checked = launcher.create(&check).await.expect("created");
    assert!(!launcher.waits(&checked), "a healthcheck's never waits");
    let check_config = engine
        .docker
        .inspect_container(&checked.handle, None::<InspectContainerOptions>)
        .await
        .unwrap()
        .config
        .unwrap();
    assert_eq!(check_config.stdin_once, Some(true));
    launcher.remove(&checked).await.unwrap();

    let second = SandboxSpec::for_item(&item(&work("2"), Some(&session)), &pool, &base);
    let rebound = launcher.rebind(&sandbox, &second).await.expect("rebound");
    assert_eq!(rebound.handle, sandbox.handle, "the same container");
    assert_eq!(rebound.item, second.item);
    let by_name = engine
        .docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![second.name.clone()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(by_name.len(), 1, "renamed to the new item's name");
    let records = volumes_labelled(&engine, &format!("mango.dev/work-id={}", work("2"))).await;
    assert_eq!(records.len(), 1, "the record finds the new item");
    assert_eq!(records[0].labels["mango.dev/container"], sandbox.handle);
    let adopted = launcher.existing().await.unwrap();
    let mine: Vec<_> = adopted
        .iter()
        .filter(|f| f.sandbox.handle == sandbox.handle)
        .collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        mine[0].sandbox.item, second.item,
        "adopted as the new item's, not by its first labels"
    );

    let third = SandboxSpec::for_item(&item(&work("3"), Some(&session)), &pool, &base);
    let again = launcher.rebind(&rebound, &third).await.expect("rebound");
    assert!(
        volumes_labelled(&engine, &format!("mango.dev/work-id={}", work("2")))
            .await
            .is_empty(),
        "the older record goes"
    );
    let adopted = launcher.existing().await.unwrap();
    let mine = adopted
        .iter()
        .find(|f| f.sandbox.handle == sandbox.handle)
        .unwrap();
    assert_eq!(mine.sandbox.item, third.item);

    let other = SandboxSpec::for_item(&item(&work("4"), Some("sesn_other")), &pool, &base);
    assert!(
        matches!(
            launcher.rebind(&again, &other).await,
            Err(LaunchError::Failed(_))
        ),
        "a sandbox serves one Session in its life"
    );

    launcher.remove(&again).await.unwrap();
    assert!(engine.containers(&pool).await.is_empty());
    assert!(
        volumes_labelled(&engine, &format!("mango.dev/container={}", sandbox.handle))
            .await
            .is_empty(),
        "every record goes with the container"
    );
    clean(&engine, &pool, &[&session]).await;
}

/// The first turn leaves what a kept container must not carry over: a
/// shell variable, a directory change, a `setsid` daemon, a double-forked
/// one, and a `/tmp` file; and a workspace file it must.
const LEAVES_TRACES: &str = "export KEPT_VAR=one; mkdir -p sub; cd sub; echo one > ../kept.txt; \
    setsid sleep 1000 >/dev/null 2>&1 < /dev/null & (sleep 1001 >/dev/null 2>&1 < /dev/null &); \
    touch /tmp/left-over; echo TRACES-LEFT";

/// The follow-up turn reports what it finds.
const FINDS_TRACES: &str = r#"echo "VAR=${KEPT_VAR:-unset} DIR=$(basename "$PWD")"; cat kept.txt
[ -e /tmp/left-over ] && echo TMP=kept || echo TMP=empty
n=0; for c in /proc/[0-9]*/comm; do [ "$(cat "$c" 2>/dev/null)" = sleep ] && n=$((n + 1)); done
echo "SLEEPS=$n"; echo FOUND"#;

/// Spec §7.1 end to end, a real runner in a real container: after a turn
/// that ends at the runner's idle end, the Session's next turn runs in the
/// same container, with its files and a fresh shell, and nothing of the
/// last turn runs or lies in `/tmp`. An operator's Stop then removes it.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_kept_follow_up_turn_runs_in_the_same_container_as_a_fresh_one(db: sqlx::PgPool) {
    use crate::support::{config, end_activation, turn, two_bash_turns, Running};
    use mango_controller::core::supervisor::RunEnd;
    use std::time::{Duration, Instant};

    let Some(engine) = engine::engine().await else {
        return;
    };
    let model =
        mango_testkit::ScriptedModel::start(two_bash_turns(LEAVES_TRACES, FINDS_TRACES)).await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("keptturn");
    let mut supervisor = config(&api, 2);
    supervisor.sandbox_base_url = engine::sandbox_base(&api);
    supervisor.pool = pool.clone();
    supervisor.keep_idle = Duration::from_secs(300);
    let running = Running::start(&api, supervisor, keeping(&engine, &api, &pool, 300).await).await;
    let session = mango_testkit::turns::session_with_tools(
        &api,
        serde_json::json!([{"type": "agent_toolset_20260401"}]),
    )
    .await;
    turn(
        &api,
        &session,
        "leave traces",
        "TRACES-LEFT",
        Duration::from_secs(120),
    )
    .await;
    let first = engine.containers(&pool).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let container = first[0].id.clone().unwrap();

    // The runner's own idle end (60 s after the end of turn) stops the Work.
    let deadline = Instant::now() + Duration::from_secs(150);
    while api
        .session_work(&session)
        .await
        .iter()
        .any(|(_, s)| s != "stopped")
    {
        assert!(Instant::now() < deadline, "the activation never ended idle");
        // A poll interval inside the deadline above.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // At once, before the claims watch has read the idle end (it did not,
    // and this turn started cold beside the kept container).
    let kept = engine.containers(&pool).await;
    assert_eq!(kept.len(), 1, "kept, not removed: {kept:?}");
    assert_eq!(kept[0].id.as_deref(), Some(container.as_str()));
    assert_eq!(
        kept[0].state,
        Some(bollard::models::ContainerSummaryStateEnum::RUNNING),
        "{kept:?}"
    );

    let events = turn(
        &api,
        &session,
        "find them",
        "FOUND",
        Duration::from_secs(60),
    )
    .await;
    let output = crate::support::last_output(&events);
    let serving = engine.containers(&pool).await;
    assert_eq!(serving.len(), 1, "{serving:?}");
    assert_eq!(
        serving[0].id.as_deref(),
        Some(container.as_str()),
        "the follow-up turn ran in the kept container"
    );
    for want in ["VAR=unset DIR=workspace", "one", "TMP=empty", "SLEEPS=0"] {
        assert!(output.contains(want), "{want}: {output}");
    }

    // An operator's Stop is never kept: the container goes at once.
    end_activation(&api, &session).await;
    let left = engine.until_empty(&pool, Duration::from_secs(20)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    clean(&engine, &pool, &[&session]).await;
}

/// The test image with its kept label gone: its root filesystem exported
/// and imported again with the same user, paths, environment and command,
/// as an image built before kept sandboxes is (its runner is today's, but
/// the launcher goes by the label alone).
fn unlabelled_copy(engine: &Engine, tag: &str) -> String {
    let image = format!("mango-sandbox-test:{tag}");
    let script = format!(
        r#"set -e; c=$(docker create "{from}"); trap 'docker rm "$c" >/dev/null' EXIT
docker export "$c" | docker import --change 'USER 65534:65534' --change 'WORKDIR /workspace' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'ENV HOME=/workspace' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/usr/local/bin/mango-runner"]' - "{image}" >/dev/null"#,
        from = engine.image
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "the unlabelled copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

/// Keeping is on by default, so it must be safe for an image built before
/// it: only an image labelled `org.mango.sandbox.runner-keep-idle=1` gets
/// Session containers that wait (`--keep-idle-seconds`, which an older
/// runner refuses). An unlabelled one's start the old way (identity in the
/// environment, the bare secret on a one-shot stdin, no keep), and a
/// Session's turn runs in one.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_kept_only_images_labelled_so_are_kept(db: sqlx::PgPool) {
    use crate::support::{config, end_activation, turn, two_bash_turns, Running};
    use mango_controller::docker::runner_image::{LABEL_RUNNER_KEEPS, RUNNER_KEEPS};
    use std::time::Duration;

    let Some(engine) = engine::engine().await else {
        return;
    };
    let labels = engine
        .docker
        .inspect_image(&engine.image)
        .await
        .unwrap()
        .config
        .and_then(|c| c.labels)
        .unwrap_or_default();
    assert_eq!(
        labels.get(LABEL_RUNNER_KEEPS).map(String::as_str),
        Some(RUNNER_KEEPS),
        "scripts/sandbox-image.sh labels an image whose runner can be kept"
    );
    let model = mango_testkit::ScriptedModel::start(two_bash_turns("echo OLD-WAY", "true")).await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("keptlabel");
    let run = pool.rsplit('-').next().unwrap().to_string();
    let unlabelled = unlabelled_copy(&engine, &format!("unlabelled-{run}"));
    let mut args = engine.args(&api);
    args.image = unlabelled.clone();
    args.keep_idle_seconds = 300;
    let launcher = DockerLauncher::connect(&args, &pool).await.unwrap();
    let base = engine::sandbox_base(&api);
    let session = format!("sesn_{pool}");
    clean(&engine, &pool, &[&session]).await;
    let spec = SandboxSpec::for_item(
        &item(&format!("work_label_{run}"), Some(&session)),
        &pool,
        &base,
    );
    let sandbox = launcher.create(&spec).await.expect("created");
    assert!(
        !launcher.waits(&sandbox),
        "an unlabelled image's never waits"
    );
    let config_of = |handle: String| {
        let docker = engine.docker.clone();
        async move {
            docker
                .inspect_container(&handle, None::<InspectContainerOptions>)
                .await
                .unwrap()
                .config
                .unwrap()
        }
    };
    let made = config_of(sandbox.handle.clone()).await;
    assert_eq!(
        made.cmd,
        Some(vec!["/usr/local/bin/mango-runner".to_string()])
    );
    assert_eq!(made.stdin_once, Some(true), "the bare secret, once");
    assert!(
        made.env
            .unwrap_or_default()
            .iter()
            .any(|e| e == &format!("MANGO_WORK_ID=work_label_{run}")),
        "its identity in its environment, as before"
    );
    launcher.remove(&sandbox).await.unwrap();

    let mut supervisor = config(&api, 2);
    supervisor.sandbox_base_url = base;
    supervisor.pool = pool.clone();
    supervisor.keep_idle = Duration::from_secs(300);
    let running = Running::start(&api, supervisor, launcher).await;
    let session = mango_testkit::turns::session_with_tools(
        &api,
        serde_json::json!([{"type": "agent_toolset_20260401"}]),
    )
    .await;
    turn(&api, &session, "run", "OLD-WAY", Duration::from_secs(120)).await;
    let serving = engine.containers(&pool).await;
    assert_eq!(serving.len(), 1, "{serving:?}");
    let served = config_of(serving[0].id.clone().unwrap()).await;
    assert_eq!(
        served.cmd,
        Some(vec!["/usr/local/bin/mango-runner".to_string()]),
        "started the old way, never told to keep"
    );
    end_activation(&api, &session).await;
    let left = engine.until_empty(&pool, Duration::from_secs(20)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        running.shutdown().await,
        mango_controller::core::supervisor::RunEnd::Shutdown
    );
    clean(&engine, &pool, &[&session]).await;
    let _ = engine
        .docker
        .remove_image(
            &unlabelled,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await;
}

/// The supervisor's `--idle-after-end-turn` (`MANGO_DOCKER_IDLE_AFTER_END_TURN_SECONDS`) reaches every
/// runner it starts, waiting or not, so that an activation ends idle (and
/// its sandbox is kept) when the operator says rather than at the runner's
/// 60 s; unset, the runner's own default stands.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_idle_after_end_turn_reaches_every_runner(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, mango_api::Settings::default()).await;
    let pool = engine::pool("keptidle");
    let session = format!("sesn_{pool}");
    let run = pool.rsplit('-').next().unwrap().to_string();
    clean(&engine, &pool, &[&session]).await;
    let base = engine::sandbox_base(&api);
    let env_of = |config: Option<bollard::models::ContainerConfig>| -> Vec<String> {
        config.and_then(|c| c.env).unwrap_or_default()
    };
    let idle_set = |env: &[String]| {
        env.iter()
            .filter(|e| e.starts_with("MANGO_IDLE_AFTER_END_TURN_SECONDS="))
            .cloned()
            .collect::<Vec<_>>()
    };

    let mut args = engine.args(&api);
    args.keep_idle_seconds = 45;
    args.idle_after_end_turn_seconds = Some(3);
    let launcher = DockerLauncher::connect(&args, &pool).await.unwrap();
    let waiting = SandboxSpec::for_item(
        &item(&format!("work_idle1_{run}"), Some(&session)),
        &pool,
        &base,
    );
    let check = SandboxSpec::for_item(&item(&format!("work_idle2_{run}"), None), &pool, &base);
    for spec in [&waiting, &check] {
        let sandbox = launcher.create(spec).await.expect("created");
        let config = engine
            .docker
            .inspect_container(&sandbox.handle, None::<InspectContainerOptions>)
            .await
            .unwrap()
            .config;
        assert_eq!(
            idle_set(&env_of(config)),
            vec!["MANGO_IDLE_AFTER_END_TURN_SECONDS=3".to_string()],
            "{}",
            spec.name
        );
        launcher.remove(&sandbox).await.unwrap();
    }

    let launcher = keeping(&engine, &api, &pool, 45).await;
    let sandbox = launcher.create(&waiting).await.expect("created");
    let config = engine
        .docker
        .inspect_container(&sandbox.handle, None::<InspectContainerOptions>)
        .await
        .unwrap()
        .config;
    assert!(idle_set(&env_of(config)).is_empty(), "unset: not passed");
    launcher.remove(&sandbox).await.unwrap();
    clean(&engine, &pool, &[&session]).await;
}
