//! What a tool in a real Docker sandbox cannot do, tried from its `bash`
//! as a malicious tool would (issue 25): reach PID 1 (its descriptors, its
//! environment, its memory, stop it), stop the runner for good, leave
//! zombies, or write past its workspace's and `/tmp`'s bounds into the
//! host's disk.

use crate::engine::{self, TEST_WORKSPACE_BYTES};
use crate::support::{config, end_activation, last_output, turn, two_bash_turns, Running};
use mango_controller::core::config::Config;
use mango_controller::core::launcher::Launcher;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::{session_volume, DockerLauncher};
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

fn docker_config(api: &TestApp, pool: &str) -> Config {
    let mut config = config(api, 1);
    config.sandbox_base_url = engine::sandbox_base(api);
    config.pool = pool.to_string();
    config
}

/// Each probe prints `NAME=refused` or `NAME=<what it got>`.
const PID1_PROBES: &str = r#"
tr '\0' ' ' < /proc/1/cmdline; echo
{ echo forged > /proc/1/fd/2; } 2>/dev/null && echo FD2=written || echo FD2=refused
{ ls /proc/1/fd > /dev/null; } 2>/dev/null && echo FDS=listed || echo FDS=refused
{ cat /proc/1/environ > /dev/null; } 2>/dev/null && echo ENVIRON=read || echo ENVIRON=refused
{ exec 3< /proc/1/mem; } 2>/dev/null && echo MEM=opened || echo MEM=refused
{ cat /proc/$PPID/environ > /dev/null; } 2>/dev/null && echo RUNNER_ENVIRON=read || echo RUNNER_ENVIRON=refused
grep -q mango-runner /proc/$PPID/cmdline && echo PARENT=runner
kill -STOP 1; sleep 0.3; echo "PID1_$(grep '^State' /proc/1/status | tr -d '\t ')"
kill -STOP $PPID; sleep 0.5; echo "RUNNER_$(grep '^State' /proc/$PPID/status | tr -d '\t ')"
bash -c 'sleep 0.2 & exit'; sleep 1
zombies=0
for stat in /proc/[0-9]*/stat; do
  read -r line < "$stat" 2>/dev/null || continue
  rest=${line##*) }; [ "${rest%% *}" = Z ] && zombies=$((zombies + 1))
done
echo ZOMBIES=$zombies
"#;

/// PID 1 is the runner binary, non-dumpable: a tool can neither write to
/// its stderr (the container's log), list its descriptors, read its
/// environment nor open its memory (what ptrace needs); SIGSTOP to it is
/// dropped by the kernel, and a runner stopped by a tool is continued at
/// once, so it still posts this result and answers the next turn. An
/// orphan is reaped.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn pid_1_is_out_of_a_tools_reach(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let model = ScriptedModel::start(two_bash_turns(PID1_PROBES, "echo STILL-HERE")).await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("pid1");
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool),
        DockerLauncher::connect(&args, &pool).await.unwrap(),
    )
    .await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(&api, &session, "probe", "ZOMBIES=", Duration::from_secs(90)).await;
    let output = last_output(&events);
    assert!(
        output.starts_with("/usr/local/bin/mango-runner"),
        "{output}"
    );
    for want in [
        "FD2=refused",
        "FDS=refused",
        "ENVIRON=refused",
        "MEM=refused",
        "RUNNER_ENVIRON=refused",
        "PARENT=runner",
        "PID1_State:S(sleeping)",
        "ZOMBIES=0",
    ] {
        assert!(output.contains(want), "{want} in {output}");
    }
    assert!(!output.contains("RUNNER_State:T"), "{output}");
    // The runner goes on: the next turn is answered in the same sandbox.
    let events = turn(
        &api,
        &session,
        "again",
        "STILL-HERE",
        Duration::from_secs(60),
    )
    .await;
    assert!(last_output(&events).contains("STILL-HERE"));
    // Nothing the tool wrote reached the container's log.
    let containers = engine.containers(&pool).await;
    assert_eq!(containers.len(), 1);
    let logs: String = futures::StreamExt::collect::<Vec<_>>(engine.docker.logs(
        containers[0].id.as_deref().unwrap(),
        Some(bollard::query_parameters::LogsOptions {
            stdout: true,
            stderr: true,
            ..Default::default()
        }),
    ))
    .await
    .into_iter()
    .filter_map(|chunk| chunk.ok().map(|c| c.to_string()))
    .collect();
    assert!(!logs.contains("forged"), "{logs}");
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
}

/// A tool that writes past its workspace's bound (32 MiB here) gets "No
/// space left on device", and so past `/tmp`'s; the runner posts that
/// result and the workspace stays usable; the host holds no more than the
/// bound for it; the files outlive the activation, and removing the
/// Session's workspace unmounts and deletes its filesystem.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_workspace_and_tmp_are_bounded(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let fill = "head -c 48M /dev/zero > big; echo WS_RC=$?; head -c 48M /dev/zero > /tmp/big; echo TMP_RC=$?; \
                rm -f big /tmp/big; echo kept > kept.txt && echo AFTER-FILL";
    let model = ScriptedModel::start(two_bash_turns(fill, "cat kept.txt")).await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("disk");
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool),
        DockerLauncher::connect(&args, &pool).await.unwrap(),
    )
    .await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(
        &api,
        &session,
        "fill",
        "AFTER-FILL",
        Duration::from_secs(90),
    )
    .await;
    let output = last_output(&events);
    assert_eq!(
        output.matches("No space left on device").count(),
        2,
        "{output}"
    );
    assert!(
        output.contains("WS_RC=1") && output.contains("TMP_RC=1"),
        "{output}"
    );
    let volume = session_volume(&session);
    let workspaces = engine.workspaces();
    let image = std::fs::metadata(workspaces.image(&volume)).unwrap();
    assert!(
        image.blocks() * 512 <= TEST_WORKSPACE_BYTES,
        "the host holds {} bytes for a {TEST_WORKSPACE_BYTES}-byte workspace",
        image.blocks() * 512
    );
    end_activation(&api, &session).await;
    turn(&api, &session, "read", "kept", Duration::from_secs(90)).await;
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.until_empty(&pool, Duration::from_secs(15)).await;

    let launcher = DockerLauncher::connect(&args, &pool).await.unwrap();
    launcher.remove_workspace(&session).await.unwrap();
    assert!(engine.session_volumes(&session).await.is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let at = workspaces.mount_point(&volume);
    assert!(
        !mounts.contains(at.to_str().unwrap()),
        "unmounted: {mounts}"
    );
    assert!(!workspaces.image(&volume).exists(), "its file is deleted");
    engine.clean(&pool, &[&session]).await;
}

/// Tries a TCP connection from bash (`/dev/tcp`) and prints `open`,
/// `refused`, or `dropped` when nothing answered within 3 s.
const PROBE: &str = r#"probe() { bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null & p=$!
  for ((i = 0; i < 30; i++)); do sleep 0.1; kill -0 $p 2>/dev/null || break; done
  if kill -0 $p 2>/dev/null; then kill $p; echo "$3=dropped"
  elif wait $p; then echo "$3=open"; else echo "$3=refused"; fi; }
"#;

/// A container of the sandbox image that only sleeps, on `network`: a
/// neighbour or an "outside" host; its address.
async fn bystander(engine: &engine::Engine, name: &str, network: &str) -> String {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::{CreateContainerOptions, StartContainerOptions};
    let created = engine
        .docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(engine.image.clone()),
                entrypoint: Some(vec!["/bin/sleep".into(), "300".into()]),
                cmd: Some(vec![]),
                host_config: Some(HostConfig {
                    network_mode: Some(network.to_string()),
                    auto_remove: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("a bystander container");
    engine
        .docker
        .start_container(&created.id, None::<StartContainerOptions>)
        .await
        .expect("the bystander starts");
    let inspected = engine
        .docker
        .inspect_container(
            &created.id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    inspected.network_settings.unwrap().networks.unwrap()[network]
        .ip_address
        .clone()
        .unwrap()
}

/// The reach table of docs/supervisor.md, Docker without an allowlist,
/// tried from a Session's bash: the api (on the network's gateway) is
/// open; another sandbox on the network, a host port other than the
/// api's (on that gateway and on another host address), and a host
/// outside (a container on a network of the test's own) are not; IPv6 is
/// off.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sandbox_reaches_the_api_and_nothing_else(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let tag = format!("{:08x}", rand::random::<u32>());
    let neighbour = bystander(
        &engine,
        &format!("mango-test-neighbour-{tag}"),
        engine::TEST_NETWORK,
    )
    .await;
    let outside_net = format!("mango-test-outside-{tag}");
    engine
        .docker
        .create_network(bollard::models::NetworkCreateRequest {
            name: outside_net.clone(),
            driver: Some("bridge".into()),
            ..Default::default()
        })
        .await
        .expect("the outside network");
    let outside_gateway = engine
        .docker
        .inspect_network(
            &outside_net,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap()
        .ipam
        .unwrap()
        .config
        .unwrap()[0]
        .gateway
        .clone()
        .unwrap();
    let outside = bystander(&engine, &format!("mango-test-outside-{tag}"), &outside_net).await;
    // A host port other than the api's, on every host address.
    let other = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let other_port = other.local_addr().unwrap().port();

    let model = ScriptedModel::start(Vec::new()).await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let api_port = api.also[0].port();
    let gateway = engine.gateway;
    let script = format!(
        "{PROBE}probe {gateway} {api_port} API; probe {gateway} {other_port} HOST_PORT; \
         probe {outside_gateway} {other_port} HOST_OTHER_ADDRESS; probe {neighbour} 80 NEIGHBOUR; \
         probe {outside} 80 OUTSIDE; echo IPV6_OFF=$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6); echo PROBED"
    );
    for (status, reply) in two_bash_turns(&script, "echo unused") {
        model.push_reply(status, reply);
    }
    let pool = engine::pool("reach");
    let args = engine.args(&api);
    let running = Running::start(
        &api,
        docker_config(&api, &pool),
        DockerLauncher::connect(&args, &pool).await.unwrap(),
    )
    .await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(&api, &session, "probe", "PROBED", Duration::from_secs(120)).await;
    let output = last_output(&events);
    // The sandbox's own traffic to the api, and the probe's.
    assert!(output.contains("API=open"), "{output}");
    for fenced in ["HOST_PORT", "HOST_OTHER_ADDRESS", "NEIGHBOUR", "OUTSIDE"] {
        assert!(
            !output.contains(&format!("{fenced}=open")),
            "{fenced}: {output}"
        );
        assert!(
            output.contains(&format!("{fenced}=")),
            "{fenced} probed: {output}"
        );
    }
    // Packets to a closed port of a neighbour would be refused if they
    // arrived: dropped, they did not.
    assert!(output.contains("NEIGHBOUR=dropped"), "{output}");
    assert!(output.contains("IPV6_OFF=1"), "{output}");
    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
    drop(other);
    for name in [
        format!("mango-test-neighbour-{tag}"),
        format!("mango-test-outside-{tag}"),
    ] {
        let _ = engine
            .docker
            .remove_container(
                &name,
                Some(bollard::query_parameters::RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
    }
    let _ = engine.docker.remove_network(&outside_net).await;
}

/// A sandbox network from before the fence (a plain bridge this product
/// made) is made again, fenced, when nothing uses it; while a container
/// uses it, and when someone else made it, the supervisor refuses to
/// start, saying what to do.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn an_unfenced_network_is_made_again_or_refused(db: sqlx::PgPool) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let api = engine.api(db, Default::default()).await;
    let pool = engine::pool("oldnet");
    let mut args = engine.args(&api);
    args.network = format!("mango-test-oldnet-{:08x}", rand::random::<u32>());
    // The host fence would be for a throwaway bridge: left out here.
    args.host_fence = false;
    let old = |labelled: bool| bollard::models::NetworkCreateRequest {
        name: args.network.clone(),
        driver: Some("bridge".into()),
        labels: labelled.then(|| {
            std::collections::HashMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "mango-worker".to_string(),
            )])
        }),
        ..Default::default()
    };
    let inspect = async |name: &str| {
        engine
            .docker
            .inspect_network(
                name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
            .unwrap()
    };

    // Ours, in use: refused.
    let made = engine.docker.create_network(old(true)).await.unwrap();
    let user = bystander(&engine, &format!("{}-user", args.network), &args.network).await;
    let err = DockerLauncher::connect(&args, &pool)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("is not fenced")
            && text.contains("containers use it")
            && text.contains("docker network rm"),
        "{text}"
    );
    assert_eq!(
        inspect(&args.network).await.id.as_deref(),
        Some(made.id.as_str()),
        "{user}"
    );
    engine
        .docker
        .remove_container(
            &format!("{}-user", args.network),
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();

    // Ours, unused: made again, fenced.
    let launcher = DockerLauncher::connect(&args, &pool)
        .await
        .expect("made again");
    let again = inspect(&args.network).await;
    assert_ne!(again.id.as_deref(), Some(made.id.as_str()));
    assert_eq!(again.internal, Some(true));
    assert_eq!(
        again.options.unwrap()["com.docker.network.bridge.enable_icc"],
        "false"
    );
    assert_eq!(launcher.network().id, again.id.clone().unwrap());
    engine.docker.remove_network(&args.network).await.unwrap();

    // Someone else's: refused, and left as it is.
    let theirs = engine.docker.create_network(old(false)).await.unwrap();
    let err = DockerLauncher::connect(&args, &pool)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("is not fenced"), "{err}");
    assert_eq!(
        inspect(&args.network).await.id.as_deref(),
        Some(theirs.id.as_str())
    );
    engine.docker.remove_network(&args.network).await.unwrap();
}
