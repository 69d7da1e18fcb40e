//! Issue 25's flood, from inside a real sandbox container: bash's
//! `/dev/tcp` opens many connections to the api's sandbox listener and
//! sends nothing. The sandbox meets its per-peer cap, and operators, and
//! another sandbox, are served meanwhile.

use crate::engine::{self, Engine};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, LogsOptions, RemoveContainerOptions, StartContainerOptions,
    WaitContainerOptions,
};
use futures::StreamExt;
use mango_api::connection_limits::{Audience, ConnectionLimits};
use mango_api::server::{self, Listeners};
use mango_api::{ApiContext, Settings};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const CAP: usize = 40;
const OPENED: usize = 400;

async fn run(engine: &Engine, name: &str, script: &str) -> String {
    let created = engine
        .docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(engine.image.clone()),
                entrypoint: Some(vec!["/bin/bash".into(), "-c".into(), script.into()]),
                labels: Some([("mango.dev/test".to_string(), "api-flood".to_string())].into()),
                // On the fenced test network, as a sandbox is.
                host_config: Some(HostConfig {
                    network_mode: Some(engine::TEST_NETWORK.into()),
                    extra_hosts: Some(vec![format!("host.docker.internal:{}", engine.gateway)]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("a container");
    engine
        .docker
        .start_container(&created.id, None::<StartContainerOptions>)
        .await
        .expect("it starts");
    created.id
}

/// The status line of `GET path` on a connection of its own.
async fn status_of(at: std::net::SocketAddr, path: &str, key: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(at).await.unwrap();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!("GET {path} HTTP/1.1\r\nHost: mango\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("answered within 30 s")
        .unwrap();
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

async fn logs(engine: &Engine, id: &str) -> String {
    engine
        .docker
        .logs(
            id,
            Some(LogsOptions {
                stdout: true,
                stderr: true,
                ..Default::default()
            }),
        )
        .filter_map(|chunk| async move { chunk.ok().map(|c| c.to_string()) })
        .collect()
        .await
}

async fn remove(engine: &Engine, id: &str) {
    let _ = engine
        .docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn docker_a_sandbox_flooding_the_api_meets_its_cap_while_operators_and_other_sandboxes_are_served(
    db: sqlx::PgPool,
) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    let (_, ws_key) = mango_api::store::keys::create(
        &db,
        "wrkspc_default",
        None,
        "operator",
        mango_protocol::time::now(),
    )
    .await
    .unwrap();
    let pool = mango_api::db::api_pool(&db, 8).await.unwrap();
    let settings = Settings {
        caller_plays_model: true,
        connections: ConnectionLimits {
            sandbox_max_per_peer: CAP,
            header_read_timeout: Duration::from_secs(600),
            ..ConnectionLimits::default()
        },
        ..Settings::default()
    };
    let ctx = ApiContext::new(pool, settings);
    let operators = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sandboxes = tokio::net::TcpListener::bind((engine.gateway, 0))
        .await
        .unwrap();
    let operators_addr = operators.local_addr().unwrap();
    let sandbox_port = sandboxes.local_addr().unwrap().port();
    // The host fence admits sandboxes to this port, as a supervisor's would.
    let network = mango_controller::docker::fenced_network(&engine.docker, engine::TEST_NETWORK)
        .await
        .unwrap();
    mango_controller::docker::fence::HostFence::of(&network.bridge)
        .apply(&[std::net::SocketAddrV4::new(network.gateway, sandbox_port)])
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listeners = Listeners {
        operators: vec![operators],
        sandboxes: vec![sandboxes],
        metrics: None,
    };
    tokio::spawn(server::serve_listeners(ctx.clone(), listeners, async {
        let _ = stopped.await;
    }));
    let counters = &ctx.metrics.connections[Audience::Sandboxes.index()];

    let tag = format!("{:08x}", rand::random::<u32>());
    let flood = run(
        &engine,
        &format!("mango-api-flood-{tag}"),
        &format!(
            "for ((i = 0; i < {OPENED}; i++)); do exec {{fd}}<>/dev/tcp/host.docker.internal/{sandbox_port} || exit 1; done; echo opened; sleep 600"
        ),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while counters.refused_peer_limit.load(Relaxed) < (OPENED - CAP) as u64 {
        if Instant::now() > deadline {
            let text = logs(&engine, &flood).await;
            remove(&engine, &flood).await;
            panic!(
                "{} refused, {} open; the flood said: {text}",
                counters.refused_peer_limit.load(Relaxed),
                counters.open.load(Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        counters.open.load(Relaxed),
        CAP as u64,
        "the sandbox holds its cap"
    );
    assert_eq!(
        counters.refused_peer_limit.load(Relaxed),
        (OPENED - CAP) as u64
    );

    // Operators are served meanwhile...
    assert_eq!(
        status_of(operators_addr, "/healthz", None).await,
        "HTTP/1.1 200 OK"
    );
    assert_eq!(
        status_of(operators_addr, "/v1/environments", Some(&ws_key)).await,
        "HTTP/1.1 200 OK"
    );
    // ...and so is another sandbox, on the sandbox listener.
    let other = run(
        &engine,
        &format!("mango-api-neighbour-{tag}"),
        &format!(
            "exec 3<>/dev/tcp/host.docker.internal/{sandbox_port} && printf 'GET /healthz HTTP/1.1\\r\\nHost: mango\\r\\nConnection: close\\r\\n\\r\\n' >&3 && read -r status <&3 && echo \"$status\""
        ),
    )
    .await;
    let _ = engine
        .docker
        .wait_container(&other, None::<WaitContainerOptions>)
        .collect::<Vec<_>>()
        .await;
    let answer = logs(&engine, &other).await;
    remove(&engine, &other).await;
    remove(&engine, &flood).await;
    let _ = stop.send(());
    assert!(
        answer.starts_with("HTTP/1.1 200 OK"),
        "the other sandbox got: {answer:?}"
    );
}
