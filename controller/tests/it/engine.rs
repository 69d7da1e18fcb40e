//! The real Docker Engine for the Docker launcher's tests: found or
//! skipped (failing instead when `CI` is set), the sandbox image, the
//! fenced test network's gateway where sandboxes reach the test's api, and
//! what a pool left behind.

use bollard::models::{ContainerConfig, ContainerCreateBody, ContainerSummary};
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptions, EventsOptions, ListContainersOptions,
    ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use bollard::Docker;
use futures::StreamExt;
use mango_controller::docker::workspace::{WorkspaceSize, Workspaces};
use mango_controller::docker::{fenced_network, DockerArgs};
use mango_testkit::TestApp;
use std::collections::HashMap;
use std::net::IpAddr;

pub struct Engine {
    pub docker: Docker,
    /// The sandbox image under test (`MANGO_TEST_SANDBOX_IMAGE`, which
    /// `make test` builds first as `mango-sandbox:test`; default
    /// `mango-sandbox:dev`).
    pub image: String,
    /// The gateway of the fenced test network, where `host.docker.internal`
    /// resolves in a sandbox: where the test's api listens for them.
    pub gateway: IpAddr,
}

/// Reported and skipped, or under `CI` failed: Docker mode is tested for
/// real wherever an engine exists.
fn unavailable(why: String) -> Option<Engine> {
    if std::env::var_os("CI").is_some() {
        panic!("CI is set, and the Docker tests cannot run: {why}");
    }
    eprintln!("SKIPPED: {why}; the Docker launcher's tests run wherever an engine answers (and fail under CI)");
    None
}

/// The engine, or `None` (with the reason on stderr) where none answers.
pub async fn engine() -> Option<Engine> {
    let docker = match Docker::connect_with_local_defaults() {
        Ok(docker) => docker,
        Err(err) => return unavailable(format!("no Docker engine: {err}")),
    };
    let docker = match docker.negotiate_version().await {
        Ok(docker) => docker,
        Err(err) => return unavailable(format!("no Docker engine answers: {err}")),
    };
    let image =
        std::env::var("MANGO_TEST_SANDBOX_IMAGE").unwrap_or_else(|_| "mango-sandbox:dev".into());
    if let Err(err) = docker.inspect_image(&image).await {
        return unavailable(format!(
            "the sandbox image {image} is missing ({err}): build it with scripts/sandbox-image.sh"
        ));
    }
    let gateway = match fenced_network(&docker, TEST_NETWORK).await {
        Ok(network) => IpAddr::V4(network.gateway),
        Err(err) => return unavailable(format!("the fenced test network {TEST_NETWORK}: {err}")),
    };
    Some(Engine {
        docker,
        image,
        gateway,
    })
}

impl Engine {
    /// The api, also listening on the bridge's gateway for sandboxes.
    /// A test that gives no scripted model appends the agent's events itself.
    pub async fn api(&self, db: sqlx::PgPool, mut settings: mango_api::Settings) -> TestApp {
        settings.caller_plays_model |= settings.model_base_url.is_none();
        TestApp::start_also_on(db, settings, &[self.gateway]).await
    }

    /// A launcher's arguments for `pool`: the test's image, the api as
    /// sandboxes reach it (`host.docker.internal`), small limits.
    pub fn args(&self, api: &TestApp) -> DockerArgs {
        DockerArgs {
            docker_host: None,
            sandbox_base_url: sandbox_base(api),
            image: self.image.clone(),
            network: TEST_NETWORK.into(),
            host_fence: true,
            extra_peer_ports: Vec::new(),
            memory_mib: 256,
            cpus: 1.0,
            pids: 128,
            volume_driver: "local".into(),
            tmpfs_mib: 32,
            workspace_size: WorkspaceSize::Bytes(TEST_WORKSPACE_BYTES),
            workspace_root: workspace_root(),
            log_max_size: "1m".into(),
            log_max_files: 2,
            // Removed after each activation unless a test keeps them.
            keep_idle_seconds: 0,
            idle_after_end_turn_seconds: None,
        }
    }

    /// The bounded workspaces the tests' launchers make.
    pub fn workspaces(&self) -> Workspaces {
        Workspaces::new(&workspace_root(), TEST_WORKSPACE_BYTES)
    }

    /// The containers of `pool`, running or not.
    pub async fn containers(&self, pool: &str) -> Vec<ContainerSummary> {
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![format!("mango.dev/pool={pool}")],
                )])),
                ..Default::default()
            }))
            .await
            .expect("containers are listed")
    }

    /// The exit codes of `pool`'s containers that died since `since` (Unix
    /// seconds), from the engine's events: 137 for one killed by a removal.
    pub async fn exit_codes(&self, pool: &str, since: &str) -> Vec<String> {
        let until = (chrono::Utc::now().timestamp() + 1).to_string();
        let events: Vec<_> = self
            .docker
            .events(Some(EventsOptions {
                since: Some(since.to_string()),
                until: Some(until),
                filters: Some(HashMap::from([
                    ("type".to_string(), vec!["container".to_string()]),
                    ("event".to_string(), vec!["die".to_string()]),
                    ("label".to_string(), vec![format!("mango.dev/pool={pool}")]),
                ])),
            }))
            .collect()
            .await;
        events
            .into_iter()
            .map(|e| e.expect("an event"))
            .filter_map(|e| e.actor?.attributes?.get("exitCode").cloned())
            .collect()
    }

    /// Waits (at most `within`) until `pool` has no container; the names of
    /// those left otherwise.
    pub async fn until_empty(&self, pool: &str, within: std::time::Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = names(&self.containers(pool).await);
            if left.is_empty() || std::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Removes whatever a failed test left in `pool`, and the Session
    /// volumes it names.
    pub async fn clean(&self, pool: &str, sessions: &[&str]) {
        for c in self.containers(pool).await {
            let _ = self
                .docker
                .remove_container(
                    c.id.as_deref().unwrap_or_default(),
                    Some(RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
        for session in sessions {
            let volume = mango_controller::docker::session_volume(session);
            let _ = self
                .docker
                .remove_volume(&volume, None::<RemoveVolumeOptions>)
                .await;
            let _ = self.workspaces().remove(&volume).await;
        }
    }

    /// The volumes that name Session `session`.
    pub async fn session_volumes(&self, session: &str) -> Vec<String> {
        let listed = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![format!("mango.dev/session-id={session}")],
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

    /// The sandbox image with another entrypoint (`tag` of
    /// `mango-sandbox-test`), for runners that misbehave.
    pub async fn image_running(&self, tag: &str, entrypoint: &[&str]) -> String {
        let holder = format!("mango-image-{tag}-{}", std::process::id());
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(holder.clone()),
                    ..Default::default()
                }),
                ContainerCreateBody {
                    image: Some(self.image.clone()),
                    ..Default::default()
                },
            )
            .await
            .expect("a container to commit");
        self.docker
            .commit_container(
                CommitContainerOptions {
                    container: Some(created.id.clone()),
                    repo: Some("mango-sandbox-test".into()),
                    tag: Some(tag.into()),
                    pause: false,
                    ..Default::default()
                },
                ContainerConfig {
                    entrypoint: Some(entrypoint.iter().map(|s| s.to_string()).collect()),
                    cmd: Some(vec![]),
                    ..Default::default()
                },
            )
            .await
            .expect("the image is committed");
        self.docker
            .remove_container(&created.id, None::<RemoveContainerOptions>)
            .await
            .expect("the holder goes");
        format!("mango-sandbox-test:{tag}")
    }
}

/// The fenced network of the tests' sandboxes: apart from the default one,
/// so that tests never meet sandboxes of a supervisor running here.
pub const TEST_NETWORK: &str = "mango-test-sandboxes";

/// Each test workspace's size: small, so filling one is quick.
pub const TEST_WORKSPACE_BYTES: u64 = 32 << 20;

/// Where the tests' bounded workspaces live (`MANGO_TEST_WORKSPACE_ROOT`).
pub fn workspace_root() -> std::path::PathBuf {
    std::env::var_os("MANGO_TEST_WORKSPACE_ROOT")
        .map(Into::into)
        .unwrap_or_else(|| std::env::temp_dir().join("mango-test-workspaces"))
}

/// The api's URL as sandboxes see it.
pub fn sandbox_base(api: &TestApp) -> String {
    let port = api
        .also
        .first()
        .expect("the api listens for sandboxes")
        .port();
    format!("http://host.docker.internal:{port}")
}

/// A pool of this test's own, so tests that share the engine never see
/// (or reconcile) each other's sandboxes.
pub fn pool(test: &str) -> String {
    format!("test-{test}-{:08x}", rand::random::<u32>())
}

pub fn names(containers: &[ContainerSummary]) -> Vec<String> {
    containers
        .iter()
        .flat_map(|c| c.names.clone().unwrap_or_default())
        .collect()
}

/// What must never appear in a sandbox's configuration, logs or errors:
/// keys, sessions tokens, and the Work secret (base64 of
/// `{"sessions_token":"mango_st…`).
pub const SECRET_MARKERS: [&str; 4] = [
    "mango_wsk_",
    "mango_envk_",
    "mango_st_",
    "eyJzZXNzaW9uc190b2tlbiI6Im1hbmdvX3N0",
];

pub fn assert_no_secret(what: &str, text: &str) {
    for marker in SECRET_MARKERS {
        // A marker followed by secret characters: a message may name a
        // key's prefix, never a key.
        for (at, _) in text.match_indices(marker) {
            let rest = &text[at + marker.len()..];
            let secretish = rest
                .chars()
                .take(8)
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .count();
            assert!(secretish < 8, "{what} contains {marker}…: {text}");
        }
    }
}
