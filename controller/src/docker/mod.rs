//! The Docker launcher (`mango-worker docker`, seed parity): one hardened
//! container per item, through the Docker Engine API (bollard):
//! * a non-root user, every capability dropped, `no-new-privileges`, a
//!   read-only root with a tmpfs `/tmp` (and, for Session Work, one at
//!   `/mnt/memory` for its Memory Stores), pids, memory and CPU limits, a
//!   bounded log, and the runner itself as PID 1 (non-dumpable, reaping
//!   what tools leave behind: `mango_runner::init`), no `docker-init`;
//! * the identity of spec §7 in the environment, the labels of
//!   [`crate::core::naming`], and no credential anywhere in its config;
//! * a named volume per Session at `/workspace`, kept across activations
//!   and bounded in size ([`workspace`]; a healthcheck gets a tmpfs there
//!   instead);
//! * the fenced network `mango-sandboxes` ([`fence`]), with
//!   `host.docker.internal` resolving to its gateway, where the api is
//!   reached, and nothing else is;
//! * stdin attached before start, the secret written, stdin closed.
//!
//! Warm containers (`--warm N`, spec §7.1) are the same container started
//! ahead, identity-less (`mango-runner --wait`, stdin kept open), with a
//! fresh volume `mango-warm-<random>` at `/workspace`, bounded as a
//! Session's is ([`workspace`]). Binding renames the
//! container to the item's name and writes two records, because Docker
//! cannot relabel a container or a volume:
//! * `mango-bound-<container id, 12>`, a volume labelled with the item (as a
//!   cold container is), so a restarted supervisor adopts it and no one
//!   binds it again; removed with the container;
//! * for Session Work, `mango-session-<id>` itself, labelled
//!   `mango.dev/workspace-volume=mango-warm-…`: the Session's workspace from
//!   then on, found by every later activation and removed with the Session.

use crate::core::launcher::{
    Found, HandOff, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec, Warm,
};
use crate::core::naming;
use crate::core::secret::Secret;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, HostConfig, HostConfigLogConfig, Mount,
    MountTypeEnum, NetworkCreateRequest, Volume, VolumeCreateOptions,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, InspectNetworkOptions,
    KillContainerOptions, ListContainersOptions, ListNetworksOptions, ListVolumesOptions,
    RemoveContainerOptions, RemoveVolumeOptions, RenameContainerOptions, StartContainerOptions,
    WaitContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

pub mod fence;
mod host;
pub mod runner_image;
pub mod workspace;
use workspace::{WorkspaceSize, Workspaces};

const ENGINE: &str = "Docker engine";
/// The runner's user (the image's `nobody`): never root.
pub const SANDBOX_USER: &str = "65534:65534";
const WORKSPACE: &str = "/workspace";
const MEMORY_ROOT: &str = mango_protocol::memory::DEFAULT_MOUNT_ROOT;
/// The runner in the sandbox image (its `CMD`).
const RUNNER: &str = "/usr/local/bin/mango-runner";
/// The runner's flag that keeps it for a next envelope after an idle end.
const KEEP_FLAG: &str = "--keep-idle-seconds";
/// The prefix of a warm container's first name and of its workspace volume.
const WARM_PREFIX: &str = "mango-warm-";
/// On a binding record: the volume that is the workspace.
const LABEL_WORKSPACE_VOLUME: &str = "mango.dev/workspace-volume";
/// On a binding record of a bound warm container: that container's id.
const LABEL_CONTAINER: &str = "mango.dev/container";
/// On a binding record: how many times its container was rebound before
/// (a kept container gets one record per item it serves; the highest is
/// the current one).
const LABEL_GENERATION: &str = "mango.dev/binding-generation";

#[derive(clap::Args, Debug, Clone)]
pub struct DockerArgs {
    /// The Docker engine (`unix:///var/run/docker.sock`, `tcp://host:2375`);
    /// the local socket when unset.
    #[arg(long, env = "DOCKER_HOST")]
    pub docker_host: Option<String>,
    /// The API URL the sandboxes use (e.g. http://host.docker.internal:8080).
    #[arg(long, env = "MANGO_DOCKER_BASE_URL")]
    pub sandbox_base_url: String,
    /// The sandbox image (built offline by scripts/sandbox-image.sh).
    #[arg(long, env = "MANGO_DOCKER_IMAGE", default_value = "mango-sandbox:dev")]
    pub image: String,
    /// The fenced network sandboxes join (created when missing; see
    /// docs/supervisor.md, "What a sandbox can reach").
    #[arg(long, env = "MANGO_DOCKER_NETWORK", default_value = "mango-sandboxes")]
    pub network: String,
    /// Firewall the host from sandboxes: iptables rules by which packets
    /// from the network's bridge reach the api's port on the gateway only.
    /// `false` leaves every host port open to sandboxes (logged at every
    /// start).
    #[arg(long, env = "MANGO_DOCKER_HOST_FENCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub host_fence: bool,
    /// More ports on the gateway sandboxes may reach, besides the api's
    /// (the egress proxy's): set by the code that runs that peer.
    #[arg(skip)]
    pub extra_peer_ports: Vec<u16>,
    /// Memory limit of each sandbox, MiB.
    #[arg(long, env = "MANGO_SANDBOX_MEMORY_MIB", default_value_t = 512)]
    pub memory_mib: i64,
    /// CPUs of each sandbox.
    #[arg(long, env = "MANGO_SANDBOX_CPUS", default_value_t = 1.0)]
    pub cpus: f64,
    /// Most processes in each sandbox.
    #[arg(long, env = "MANGO_SANDBOX_PIDS", default_value_t = 256)]
    pub pids: i64,
    /// The driver of Session workspace volumes.
    #[arg(long, env = "MANGO_DOCKER_VOLUME_DRIVER", default_value = "local")]
    pub volume_driver: String,
    /// Size of each sandbox's tmpfs `/tmp` (and a healthcheck's `/workspace`), MiB.
    #[arg(long, env = "MANGO_SANDBOX_TMPFS_MIB", default_value_t = 64)]
    pub tmpfs_mib: i64,
    /// Size of each Session's workspace (`1Gi`, `512Mi`: the chart's PVC
    /// default and format), or `unbounded` (then one Session can fill the
    /// host's disk; logged at every start).
    #[arg(long, env = "MANGO_WORKSPACE_SIZE", default_value = "1Gi")]
    pub workspace_size: WorkspaceSize,
    /// Where bounded workspaces' filesystems live, on the engine's host.
    #[arg(
        long,
        env = "MANGO_DOCKER_WORKSPACE_ROOT",
        default_value = "/var/lib/mango/workspaces"
    )]
    pub workspace_root: std::path::PathBuf,
    /// Largest log file of each sandbox before it is rotated (json-file's
    /// `max-size`: `10m`, `512k`).
    #[arg(long, env = "MANGO_SANDBOX_LOG_MAX_SIZE", default_value = "10m", value_parser = log_size)]
    pub log_max_size: String,
    /// Log files kept per sandbox (json-file's `max-file`).
    #[arg(long, env = "MANGO_SANDBOX_LOG_MAX_FILES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub log_max_files: u32,
    /// How long a Session's container waits, after an activation that ended
    /// idle, for the Session's next (spec §7.1), in seconds; 0 removes every
    /// container after its activation. At most 1800; by default 600
    /// ([`crate::core::config::KEEP_IDLE`]). Only containers of an image
    /// labelled [`runner_image::LABEL_RUNNER_KEEPS`] are kept: an older
    /// image's runner would refuse the flag, so its containers start the
    /// old way.
    #[arg(long = "keep-idle", env = "MANGO_KEEP_IDLE",
          default_value_t = crate::core::config::KEEP_IDLE.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=1800))]
    pub keep_idle_seconds: u64,
    /// How long each sandbox's runner stays after its Session's
    /// end-of-turn idle before it ends the activation (the runner's
    /// `MANGO_IDLE_AFTER_END_TURN_SECONDS`, spec §8: 60 s), put into every
    /// container's environment when set. Hidden: only tests and the fault
    /// suite shorten it, so that activations end idle (and sandboxes are
    /// kept) within their run. Its own variable, not the runner's: a
    /// runner's setting exported where the supervisor runs changes nothing.
    #[arg(long = "idle-after-end-turn", env = "MANGO_DOCKER_IDLE_AFTER_END_TURN_SECONDS",
          hide = true, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub idle_after_end_turn_seconds: Option<u64>,
}

/// A json-file `max-size`: a whole number and `k`, `m` or `g`.
fn log_size(given: &str) -> Result<String, String> {
    let (digits, unit) = given.split_at(given.len().saturating_sub(1));
    let number = digits.parse::<u64>().ok().filter(|n| *n > 0);
    match (number, unit) {
        (Some(_), "k" | "m" | "g") => Ok(given.to_string()),
        _ => Err(format!(
            "log size {given:?}: a whole number and k, m or g (e.g. 10m)"
        )),
    }
}

pub struct DockerLauncher {
    docker: Docker,
    args: DockerArgs,
    pool: String,
    /// `None` when workspaces are unbounded.
    workspaces: Option<Workspaces>,
    network: FencedNetwork,
    /// The egress proxy sandboxes are pointed at, when the pool allows any.
    egress: Option<crate::egress::Routing>,
    /// With a keep (spec §7.1), Session containers of an image whose
    /// runner can be kept run it in its waiting mode, taking a next
    /// envelope after an idle end.
    keep_idle: Option<Duration>,
    /// What each image's runner supports, read once per image id.
    images: runner_image::RunnerImages,
    /// The containers whose runner waits for a next envelope after an idle
    /// end (made so here, or adopted running so).
    waiting: Mutex<HashSet<String>>,
}

/// The bounded workspaces `args` ask for, or why they cannot be had here.
fn workspaces_of(args: &DockerArgs) -> Result<Option<Workspaces>, LaunchError> {
    let WorkspaceSize::Bytes(bytes) = args.workspace_size else {
        tracing::warn!(
            "MANGO_WORKSPACE_SIZE=unbounded: a Session's workspace can fill the Docker host's disk"
        );
        return Ok(None);
    };
    let unbounded = "or MANGO_WORKSPACE_SIZE=unbounded to run without a bound";
    if args.volume_driver != "local" {
        return Err(LaunchError::Missing(format!(
            "a bounded workspace needs the `local` volume driver, not {:?} ({unbounded}, bounded by that driver)",
            args.volume_driver
        )));
    }
    if !args.workspace_root.is_absolute() {
        return Err(LaunchError::Missing(format!(
            "MANGO_DOCKER_WORKSPACE_ROOT must be absolute: {}",
            args.workspace_root.display()
        )));
    }
    if !rustix::process::geteuid().is_root() {
        return Err(LaunchError::Missing(format!(
            "bounded workspaces are filesystems the supervisor mounts: run it as root on the engine's host ({unbounded})"
        )));
    }
    Ok(Some(Workspaces::new(&args.workspace_root, bytes)))
}

/// A Docker error as a launch error: an engine that did not answer is
/// unavailable; an answer is the engine's refusal.
fn launch_error(err: DockerError) -> LaunchError {
    match err {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => LaunchError::Failed(format!(
            "the Docker engine answered {status_code}: {message}"
        )),
        other => LaunchError::Unavailable {
            engine: ENGINE,
            message: other.to_string(),
        },
    }
}

fn status_of(err: &DockerError) -> Option<u16> {
    match err {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// A client of the engine at `host` (the local socket when `None`).
fn engine(host: Option<&str>) -> Result<Docker, DockerError> {
    const TIMEOUT_SECONDS: u64 = 120;
    match host {
        None => Docker::connect_with_local_defaults(),
        Some(h) if h.starts_with("unix://") || h.starts_with('/') => {
            Docker::connect_with_unix(h, TIMEOUT_SECONDS, bollard::API_DEFAULT_VERSION)
        }
        Some(h) if h.starts_with("tcp://") || h.starts_with("http://") => {
            Docker::connect_with_http(h, TIMEOUT_SECONDS, bollard::API_DEFAULT_VERSION)
        }
        Some(h) => Err(DockerError::UnsupportedURISchemeError { uri: h.to_string() }),
    }
}

/// The named volume of a Session's workspace.
pub fn session_volume(session_id: &str) -> String {
    let id: String = session_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("mango-session-{id}")
}

/// A volume mounted as the workspace.
fn volume_mount(source: String) -> Mount {
    Mount {
        target: Some(WORKSPACE.into()),
        source: Some(source),
        typ: Some(MountTypeEnum::VOLUME),
        ..Default::default()
    }
}

/// The binding record of the bound warm container `handle`.
/// Whether a container whose command line is `command` (as the engine
/// lists it) runs a runner kept after an idle end.
fn runs_kept(command: Option<&str>) -> bool {
    command.is_some_and(|c| c.split_whitespace().any(|word| word == KEEP_FLAG))
}

fn record_name(handle: &str) -> String {
    format!("mango-bound-{}", &handle[..handle.len().min(12)])
}

/// Which binding of its container a record is (0: the first).
fn generation_of(record: &Volume) -> u64 {
    record
        .labels
        .get(LABEL_GENERATION)
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

/// The binding record of container `handle`'s binding `generation`.
fn record_of_generation(handle: &str, generation: u64) -> String {
    match generation {
        0 => record_name(handle),
        n => format!("{}-{n}", record_name(handle)),
    }
}

/// The workspace a Session's volume stands for: the warm volume it binds,
/// or itself.
fn workspace_of(session: &Volume) -> String {
    session
        .labels
        .get(LABEL_WORKSPACE_VOLUME)
        .cloned()
        .unwrap_or_else(|| session.name.clone())
}

/// A sandbox network as the launcher uses it.
#[derive(Debug, Clone)]
pub struct FencedNetwork {
    pub id: String,
    /// The host's address on the bridge: where the api listens for
    /// sandboxes, and what `host.docker.internal` resolves to in them.
    pub gateway: Ipv4Addr,
    /// The bridge's interface on the host.
    pub bridge: String,
}

/// Makes the fenced network `name` when it is missing ([`fence`]:
/// internal, inter-container traffic off), and leaves one of that name.
/// One made before the fence (ours, unfenced) is made again when no
/// container uses it, and refused otherwise, as is a fenceless one made by
/// someone else.
///
/// Engines before API 1.44 let two creates of one name both succeed, so
/// supervisors starting together on a fresh engine can make two networks
/// of that name, after which the engine refuses every container that
/// names it ("ambiguous", even by id). So every supervisor keeps the
/// oldest and removes the others it finds with this product's label:
/// nothing can have joined them.
pub async fn fenced_network(docker: &Docker, name: &str) -> Result<FencedNetwork, LaunchError> {
    for _ in 0..3 {
        let id = one_network(docker, name).await?;
        let network = docker
            .inspect_network(&id, None::<InspectNetworkOptions>)
            .await
            .map_err(launch_error)?;
        let options = network.options.clone().unwrap_or_default();
        let fenced = network.internal == Some(true)
            && options.get(fence::ICC_OPTION).map(String::as_str) == Some("false");
        if fenced {
            let gateway = network
                .ipam
                .as_ref()
                .and_then(|ipam| ipam.config.as_ref())
                .and_then(|configs| {
                    configs
                        .iter()
                        .find_map(|c| c.gateway.as_deref()?.parse().ok())
                })
                .ok_or_else(|| {
                    LaunchError::Missing(format!("the network {name} has no IPv4 gateway"))
                })?;
            let bridge = options
                .get(fence::BRIDGE_NAME_OPTION)
                .cloned()
                .unwrap_or_else(|| format!("br-{}", &id[..12.min(id.len())]));
            return Ok(FencedNetwork {
                id,
                gateway,
                bridge,
            });
        }
        let ours = network
            .labels
            .as_ref()
            .and_then(|l| l.get(naming::LABEL_MANAGED_BY))
            .is_some_and(|v| v == naming::MANAGED_BY);
        let in_use = network.containers.as_ref().is_some_and(|c| !c.is_empty());
        if !ours || in_use {
            return Err(LaunchError::Missing(format!(
                "the network {name} is not fenced (it must be internal, with {}=false){}: \
                 remove it (`docker network rm {name}`) and the supervisor makes a fenced one",
                fence::ICC_OPTION,
                if in_use {
                    ", and containers use it"
                } else {
                    ""
                }
            )));
        }
        tracing::warn!(
            network = name,
            "making the sandbox network again, fenced: it predates the fence"
        );
        match docker.remove_network(&id).await {
            Ok(()) => {}
            Err(err) if status_of(&err) == Some(404) => {}
            Err(err) => return Err(launch_error(err)),
        }
    }
    Err(LaunchError::Failed(format!(
        "the network {name} kept changing while it was being fenced"
    )))
}

/// The id of the one network named `name`, made (fenced) when missing.
async fn one_network(docker: &Docker, name: &str) -> Result<String, LaunchError> {
    if named_networks(docker, name).await?.is_empty() {
        let created = docker
            .create_network(NetworkCreateRequest {
                name: name.to_string(),
                driver: Some("bridge".into()),
                internal: Some(true),
                options: Some(HashMap::from([(
                    fence::ICC_OPTION.to_string(),
                    "false".to_string(),
                )])),
                labels: Some(HashMap::from([(
                    naming::LABEL_MANAGED_BY.to_string(),
                    naming::MANAGED_BY.to_string(),
                )])),
                ..Default::default()
            })
            .await;
        match created {
            Ok(_) => {}
            // 409 (API 1.44 and later): another supervisor made it meanwhile.
            Err(err) if status_of(&err) == Some(409) => {}
            Err(err) => return Err(launch_error(err)),
        }
    }
    let mut named = named_networks(docker, name).await?;
    named.sort_by_key(|n| (n.created.is_none(), n.created, n.id.clone()));
    for extra in named.iter().skip(1).filter(|n| n.ours) {
        match docker.remove_network(&extra.id).await {
            Ok(()) => tracing::warn!(network = name, id = %extra.id,
                "removed a second network of this name, made at the same time as another"),
            Err(err) if status_of(&err) == Some(404) => {}
            Err(err) => tracing::warn!(network = name, id = %extra.id, error = %err,
                "could not remove a second network of this name; the engine refuses sandboxes on an ambiguous name"),
        }
    }
    named
        .into_iter()
        .next()
        .map(|n| n.id)
        .ok_or_else(|| LaunchError::Failed(format!("the network {name} went as it was made")))
}

struct NamedNetwork {
    id: String,
    created: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Labelled as this product's.
    ours: bool,
}

/// The networks named exactly `name`.
async fn named_networks(docker: &Docker, name: &str) -> Result<Vec<NamedNetwork>, LaunchError> {
    let listed = docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![name.to_string()],
            )])),
        }))
        .await
        .map_err(launch_error)?;
    // The name filter matches parts of names too.
    Ok(listed
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .filter_map(|n| {
            Some(NamedNetwork {
                created: n
                    .created
                    .as_deref()
                    .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok()),
                ours: n
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(naming::LABEL_MANAGED_BY))
                    .is_some_and(|v| v == naming::MANAGED_BY),
                id: n.id?,
            })
        })
        .collect())
}

impl DockerLauncher {
    /// Connects (`DOCKER_HOST` or the local socket), agrees an API version,
    /// checks the image exists and makes the network if it is missing.
    pub async fn connect(args: &DockerArgs, pool: &str) -> Result<DockerLauncher, LaunchError> {
        let at = args
            .docker_host
            .clone()
            .unwrap_or_else(|| "the local socket (DOCKER_HOST unset)".into());
        let unreachable = |err: DockerError| match launch_error(err) {
            LaunchError::Unavailable { engine, message } => LaunchError::Unavailable {
                engine,
                message: format!("{at}: {message}"),
            },
            other => other,
        };
        let docker = engine(args.docker_host.as_deref()).map_err(unreachable)?;
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        match docker.inspect_image(&args.image).await {
            Ok(_) => {}
            Err(err) if status_of(&err) == Some(404) => {
                return Err(LaunchError::Missing(format!(
                    "the sandbox image {} does not exist: build it with scripts/sandbox-image.sh",
                    args.image
                )))
            }
            Err(err) => return Err(launch_error(err)),
        }
        let workspaces = workspaces_of(args)?;
        let network = fenced_network(&docker, &args.network).await?;
        let api = fence::api_peer(&args.sandbox_base_url, network.gateway)
            .map_err(LaunchError::Missing)?;
        if args.host_fence {
            let mut peers = vec![api];
            peers.extend(
                args.extra_peer_ports
                    .iter()
                    .map(|port| SocketAddrV4::new(network.gateway, *port)),
            );
            fence::HostFence::of(&network.bridge)
                .apply(&peers)
                .await
                .map_err(|why| LaunchError::Missing(format!(
                    "the host fence of the network {} could not be set ({why}): run the supervisor as root on the \
                     engine's host, or MANGO_DOCKER_HOST_FENCE=false to leave every host port open to sandboxes",
                    args.network
                )))?;
        } else {
            tracing::warn!(network = %args.network, gateway = %network.gateway,
                "MANGO_DOCKER_HOST_FENCE=false: sandboxes reach every port the host listens on");
        }
        Ok(DockerLauncher {
            docker,
            args: args.clone(),
            pool: pool.to_string(),
            workspaces,
            network,
            egress: None,
            keep_idle: None,
            images: runner_image::RunnerImages::default(),
            waiting: Mutex::default(),
        }
        .with_keep_idle(Duration::from_secs(args.keep_idle_seconds)))
    }

    /// The sandboxes' network.
    pub fn network(&self) -> &FencedNetwork {
        &self.network
    }

    /// The bounded workspaces, when they are.
    pub fn workspaces(&self) -> Option<&Workspaces> {
        self.workspaces.as_ref()
    }

    /// Session containers made from now on (cold and warm) wait, after an
    /// activation that ended idle, up to `keep_idle` for the Session's next
    /// envelope; zero: none does.
    pub fn with_keep_idle(mut self, keep_idle: Duration) -> DockerLauncher {
        self.keep_idle = (!keep_idle.is_zero()).then_some(keep_idle);
        self
    }

    /// The runner's command line in a container that waits for envelopes;
    /// `keeps`: after an idle end it waits for the next one too.
    fn waiting_cmd(&self, keeps: bool) -> Vec<String> {
        let mut cmd = vec![RUNNER.to_string(), "--wait".to_string()];
        if let Some(keep) = self.keep_idle.filter(|_| keeps) {
            cmd.push(KEEP_FLAG.to_string());
            cmd.push(keep.as_secs().max(1).to_string());
        }
        cmd
    }

    /// The binding records of container `handle`, newest generation first.
    async fn records_of(&self, handle: &str) -> Result<Vec<Volume>, LaunchError> {
        let mut records: Vec<Volume> = self
            .bound_records_all()
            .await?
            .into_iter()
            .filter(|v| v.labels.get(LABEL_CONTAINER).map(String::as_str) == Some(handle))
            .collect();
        records.sort_by_key(|v| std::cmp::Reverse(generation_of(v)));
        Ok(records)
    }

    /// Sandboxes made from now on get the proxy variables of `routing`.
    pub fn with_egress(mut self, routing: crate::egress::Routing) -> DockerLauncher {
        self.egress = Some(routing);
        self
    }

    /// The workspace mount of a Session: its own named volume, made if
    /// missing (an existing one is kept as it is), or, when its first
    /// activation went warm, the warm volume its binding names.
    async fn session_mount(
        &self,
        session_id: &str,
        environment_id: &str,
    ) -> Result<Mount, LaunchError> {
        let name = session_volume(session_id);
        if let Some(binding) = self.volume(&name).await? {
            let workspace = workspace_of(&binding);
            if workspace != name {
                // Mounted again after a host reboot, as the Session's own would be.
                self.ensure_bounded(&workspace).await?;
                return Ok(volume_mount(workspace));
            }
        }
        let labels = HashMap::from([
            (naming::LABEL_SESSION_ID.to_string(), session_id.to_string()),
            (
                naming::LABEL_ENVIRONMENT_ID.to_string(),
                environment_id.to_string(),
            ),
            (
                naming::LABEL_MANAGED_BY.to_string(),
                naming::MANAGED_BY.to_string(),
            ),
        ]);
        self.workspace_volume(&name, labels).await?;
        Ok(volume_mount(name))
    }

    /// The workspace volume `name` (a Session's, or a warm container's),
    /// made if missing; an existing one is kept as it is. A bounded one is
    /// a bind of its own filesystem, mounted first.
    async fn workspace_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<Volume, LaunchError> {
        let driver_opts = self.ensure_bounded(name).await?.map(|at| {
            HashMap::from([
                ("type".to_string(), "none".to_string()),
                ("o".to_string(), "bind".to_string()),
                ("device".to_string(), at.to_string_lossy().into_owned()),
            ])
        });
        self.docker
            .create_volume(VolumeCreateOptions {
                name: Some(name.to_string()),
                driver: Some(self.args.volume_driver.clone()),
                driver_opts,
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(|err| match err {
                DockerError::DockerResponseServerError { message, .. } => {
                    LaunchError::Workspace(format!("volume {name}: {message}"))
                }
                other => launch_error(other),
            })
    }

    /// The bounded filesystem of the workspace volume `name`, formatted
    /// once and mounted if it is not: its mount point, `None` unbounded.
    async fn ensure_bounded(&self, name: &str) -> Result<Option<PathBuf>, LaunchError> {
        let Some(workspaces) = &self.workspaces else {
            return Ok(None);
        };
        let at = workspaces
            .ensure(name)
            .await
            .map_err(|why| LaunchError::Workspace(format!("volume {name}: {why}")))?;
        self.warn_if_unbounded(name, &at).await;
        Ok(Some(at))
    }

    /// A volume made before workspaces were bounded keeps its files and
    /// stays unbounded: said, so an operator can move the Session.
    async fn warn_if_unbounded(&self, name: &str, bound: &std::path::Path) {
        if let Ok(volume) = self.docker.inspect_volume(name).await {
            let device = volume.options.get("device").map(String::as_str);
            if device != Some(bound.to_string_lossy().as_ref()) {
                tracing::warn!(volume = name, "this workspace volume predates the size bound and stays unbounded until the Session's volume is removed");
            }
        }
    }

    /// A workspace volume and (bounded) its filesystem: unmounted and deleted.
    async fn remove_workspace_volume(&self, name: &str) -> Result<(), LaunchError> {
        self.remove_volume(name).await?;
        match &self.workspaces {
            Some(workspaces) => workspaces
                .remove(name)
                .await
                .map_err(|why| LaunchError::Workspace(format!("volume {name}: {why}"))),
            None => Ok(()),
        }
    }

    /// The volume `name`, `None` when it does not exist.
    async fn volume(&self, name: &str) -> Result<Option<Volume>, LaunchError> {
        match self.docker.inspect_volume(name).await {
            Ok(volume) => Ok(Some(volume)),
            Err(err) if status_of(&err) == Some(404) => Ok(None),
            Err(err) => Err(launch_error(err)),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<(), LaunchError> {
        match self
            .docker
            .remove_volume(name, None::<RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Ok(()),
            Err(err) => Err(launch_error(err)),
        }
    }

    async fn make_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<Volume, LaunchError> {
        self.docker
            .create_volume(VolumeCreateOptions {
                name: Some(name.to_string()),
                driver: Some(self.args.volume_driver.clone()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(|err| match err {
                DockerError::DockerResponseServerError { message, .. } => {
                    LaunchError::Workspace(format!("volume {name}: {message}"))
                }
                other => launch_error(other),
            })
    }

    /// The current binding record of each bound container (warm bound, or
    /// kept and rebound), by container id.
    async fn bound_records(&self) -> Result<HashMap<String, Volume>, LaunchError> {
        let mut current: HashMap<String, Volume> = HashMap::new();
        for record in self.bound_records_all().await? {
            let Some(handle) = record.labels.get(LABEL_CONTAINER).cloned() else {
                continue;
            };
            match current.get(&handle) {
                Some(had) if generation_of(had) >= generation_of(&record) => {}
                _ => {
                    current.insert(handle, record);
                }
            }
        }
        Ok(current)
    }

    /// Every binding record of this pool.
    async fn bound_records_all(&self) -> Result<Vec<Volume>, LaunchError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                format!("{}={}", naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
                format!("{}={}", naming::LABEL_POOL, self.pool),
                LABEL_CONTAINER.to_string(),
            ],
        )]);
        let listed = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(launch_error)?;
        Ok(listed.volumes.unwrap_or_default())
    }

    async fn image_id(&self) -> Result<String, LaunchError> {
        self.sandbox_image().await.map(|(id, _)| id)
    }

    /// The pool's image now (its id) and whether its runner can be kept.
    async fn sandbox_image(&self) -> Result<(String, bool), LaunchError> {
        match self.docker.inspect_image(&self.args.image).await {
            Ok(image) => {
                let id = image
                    .id
                    .ok_or_else(|| LaunchError::Failed("the engine named no image id".into()))?;
                let keeps = match self.images.known(&id) {
                    Some(keeps) => keeps,
                    None => {
                        let labels = image.config.and_then(|c| c.labels);
                        self.images.learn(&self.args.image, &id, labels.as_ref())
                    }
                };
                Ok((id, keeps))
            }
            Err(err) if status_of(&err) == Some(404) => Err(LaunchError::Missing(format!(
                "the sandbox image {} does not exist: build it with scripts/sandbox-image.sh",
                self.args.image
            ))),
            Err(err) => Err(launch_error(err)),
        }
    }

    /// A warm container: the hardened container of [`Self::container`],
    /// with no identity, its runner waiting for an envelope on a stdin
    /// that stays open, and a fresh workspace volume.
    fn warm_container(
        &self,
        image: &str,
        keeps: bool,
        volume: &str,
        owner: &str,
    ) -> ContainerCreateBody {
        let spec = SandboxSpec {
            name: volume.to_string(),
            item: crate::core::launcher::ItemIdentity {
                work_id: String::new(),
                claim: 0,
                environment_id: String::new(),
                work_type: mango_protocol::WorkType::Session,
                session_id: None,
            },
            labels: [
                (naming::LABEL_POOL, self.pool.as_str()),
                (naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
                (naming::LABEL_WARM_OWNER, owner),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            env: vec![(
                "MANGO_BASE_URL".to_string(),
                self.args.sandbox_base_url.clone(),
            )],
        };
        let mut body = self.container(&spec, Some(volume_mount(volume.to_string())));
        body.image = Some(image.to_string());
        body.cmd = Some(self.waiting_cmd(keeps));
        body.stdin_once = Some(false);
        body
    }

    /// Whether a container made now for `item` is kept after an idle end,
    /// and the image to make it of: a Session's, with a keep, of an image
    /// whose runner takes it (pinned by id, so the image read is the one
    /// run, even when the tag is rebuilt meanwhile).
    async fn keeping_image(
        &self,
        item: &crate::core::launcher::ItemIdentity,
    ) -> Result<Option<String>, LaunchError> {
        if self.keep_idle.is_none() || item.session_id.is_none() {
            return Ok(None);
        }
        let (id, keeps) = self.sandbox_image().await?;
        Ok(keeps.then_some(id))
    }

    /// For Session Work, binds `warm`'s workspace to the Session (the
    /// binding volume that names it): its name, or `None` for a
    /// healthcheck. A Session that got a workspace meanwhile keeps that one.
    async fn bind_workspace(
        &self,
        warm: &Warm,
        spec: &SandboxSpec,
    ) -> Result<Option<String>, LaunchError> {
        let Some(session_id) = &spec.item.session_id else {
            return Ok(None);
        };
        let name = session_volume(session_id);
        let labels = HashMap::from([
            (naming::LABEL_SESSION_ID.to_string(), session_id.clone()),
            (
                naming::LABEL_ENVIRONMENT_ID.to_string(),
                spec.item.environment_id.clone(),
            ),
            (
                naming::LABEL_MANAGED_BY.to_string(),
                naming::MANAGED_BY.to_string(),
            ),
            (LABEL_WORKSPACE_VOLUME.to_string(), warm.name.clone()),
        ]);
        let made = self.make_volume(&name, labels).await?;
        if made.labels.get(LABEL_WORKSPACE_VOLUME) != Some(&warm.name) {
            return Err(LaunchError::Workspace(format!(
                "Session {session_id} has a workspace already"
            )));
        }
        Ok(Some(name))
    }

    /// Notes whether the container `handle`'s runner waits after an idle end.
    fn note_waiting(&self, handle: &str, waits: bool) {
        let mut waiting = self.waiting.lock().expect("waiting lock");
        if waits {
            waiting.insert(handle.to_string());
        } else {
            waiting.remove(handle);
        }
    }

    /// This pool's containers, running or not, with one more label when given.
    async fn pool_containers(
        &self,
        label: Option<String>,
    ) -> Result<Vec<bollard::models::ContainerSummary>, LaunchError> {
        let mut labels = vec![
            format!("{}={}", naming::LABEL_POOL, self.pool),
            format!("{}={}", naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
        ];
        labels.extend(label);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(HashMap::from([("label".to_string(), labels)])),
                ..Default::default()
            }))
            .await
            .map_err(launch_error)
    }

    /// The sandbox's stdin, and nothing else of it: where its secret, or a
    /// warm sandbox's envelope, is written.
    async fn attach_stdin(
        &self,
        handle: &str,
    ) -> Result<bollard::container::AttachContainerResults, LaunchError> {
        self.docker
            .attach_container(
                handle,
                Some(AttachContainerOptions {
                    stdin: true,
                    stream: true,
                    stdout: false,
                    stderr: false,
                    logs: false,
                    detach_keys: None,
                }),
            )
            .await
            .map_err(launch_error)
    }

    async fn wait_handle(&self, handle: &str) -> Result<SandboxExit, LaunchError> {
        let mut waits = self.docker.wait_container(
            handle,
            Some(WaitContainerOptions {
                condition: "not-running".into(),
            }),
        );
        match waits.next().await {
            Some(Ok(answer)) => Ok(SandboxExit::Exited(answer.status_code)),
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => {
                Ok(SandboxExit::Exited(code))
            }
            Some(Err(err)) if status_of(&err) == Some(404) => Ok(SandboxExit::Gone),
            Some(Err(err)) => Err(launch_error(err)),
            None => Ok(SandboxExit::Gone),
        }
    }

    async fn remove_container(&self, handle: &str) -> Result<(), LaunchError> {
        let removed = self
            .docker
            .remove_container(
                handle,
                Some(RemoveContainerOptions {
                    force: true,
                    v: false,
                    link: false,
                }),
            )
            .await;
        match removed {
            Ok(()) => {}
            Err(err) if status_of(&err) == Some(404) => {}
            // 409: a removal already in progress; it will finish.
            Err(err) if status_of(&err) == Some(409) => {}
            Err(err) => return Err(launch_error(err)),
        }
        self.note_waiting(handle, false);
        Ok(())
    }

    /// The container a spec becomes.
    pub fn container(&self, spec: &SandboxSpec, workspace: Option<Mount>) -> ContainerCreateBody {
        let tmpfs_mib = self.args.tmpfs_mib;
        let mut tmpfs = HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={tmpfs_mib}m,mode=1777"),
        )]);
        let private = format!("rw,nosuid,nodev,size={tmpfs_mib}m,uid=65534,gid=65534,mode=0700");
        if workspace.is_none() {
            // A healthcheck's ephemeral workspace, writable by the runner only.
            tmpfs.insert(WORKSPACE.to_string(), private);
        } else {
            // Where the runner mounts the Session's Memory Stores: empty at
            // every activation (they are downloaded afresh), the runner's only.
            tmpfs.insert(MEMORY_ROOT.to_string(), private);
        }
        let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("MANGO_WORKSPACE={WORKSPACE}"));
        if let Some(seconds) = self.args.idle_after_end_turn_seconds {
            env.push(format!("MANGO_IDLE_AFTER_END_TURN_SECONDS={seconds}"));
        }
        if let Some(egress) = &self.egress {
            env.extend(
                egress
                    .env(&spec.item.work_id)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}")),
            );
        }
        ContainerCreateBody {
            image: Some(self.args.image.clone()),
            user: Some(SANDBOX_USER.into()),
            working_dir: Some(WORKSPACE.into()),
            env: Some(env),
            labels: Some(spec.labels.clone().into_iter().collect()),
            attach_stdin: Some(true),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            host_config: Some(HostConfig {
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                tmpfs: Some(tmpfs),
                mounts: workspace.map(|m| vec![m]),
                pids_limit: Some(self.args.pids),
                memory: Some(self.args.memory_mib * 1024 * 1024),
                memory_swap: Some(self.args.memory_mib * 1024 * 1024),
                nano_cpus: Some((self.args.cpus * 1e9) as i64),
                network_mode: Some(self.args.network.clone()),
                // The gateway of the fenced network, the one host address
                // a sandbox reaches (not host-gateway, on another bridge).
                extra_hosts: Some(vec![format!(
                    "host.docker.internal:{}",
                    self.network.gateway
                )]),
                // Sandboxes need no DNS (the api is in /etc/hosts; the
                // egress proxy resolves what it admits). Docker's embedded
                // resolver forwards other names to these servers: the
                // gateway, where the fence refuses port 53, so a name never
                // carries data out. Left to the host's servers, an engine
                // before 23.0 whose host resolver is on loopback forwards
                // from the host's namespace, past the fence (moby#47593).
                dns: Some(vec![self.network.gateway.to_string()]),
                // The image's runner is PID 1 itself (mango_runner::init):
                // a docker-init above it would be dumpable by tools.
                init: Some(false),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: Some(HashMap::from([
                        ("max-size".to_string(), self.args.log_max_size.clone()),
                        ("max-file".to_string(), self.args.log_max_files.to_string()),
                    ])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Launcher for DockerLauncher {
    fn kind(&self) -> &'static str {
        "docker"
    }

    async fn existing(&self) -> Result<Vec<Found>, LaunchError> {
        let containers = self.pool_containers(None).await?;
        let records = self.bound_records().await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default().into_iter().collect();
                let recorded = || {
                    let record = records.get(c.id.as_deref()?)?;
                    naming::item_of(&record.labels.clone().into_iter().collect())
                };
                // Docker cannot relabel a container: once rebound, its record
                // names its item, and its own labels its first.
                let item = recorded().or_else(|| naming::item_of(&labels))?;
                let name = c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string())?;
                if let Some(handle) = &c.id {
                    self.note_waiting(handle, runs_kept(c.command.as_deref()));
                }
                Some(Found {
                    running: c.state == Some(ContainerSummaryStateEnum::RUNNING),
                    sandbox: Sandbox {
                        handle: c.id.unwrap_or_else(|| name.clone()),
                        name,
                        item,
                    },
                })
            })
            .collect())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        let workspace = match &spec.item.session_id {
            Some(session) => Some(
                self.session_mount(session, &spec.item.environment_id)
                    .await?,
            ),
            None => None,
        };
        let keeping = self.keeping_image(&spec.item).await?;
        let body = if let Some(image) = &keeping {
            // Its identity comes with each envelope, never in its
            // environment, which Docker cannot change when it is rebound.
            let waiting = SandboxSpec {
                env: vec![(
                    "MANGO_BASE_URL".to_string(),
                    self.args.sandbox_base_url.clone(),
                )],
                item: crate::core::launcher::ItemIdentity {
                    work_id: String::new(),
                    ..spec.item.clone()
                },
                ..spec.clone()
            };
            let mut body = self.container(&waiting, workspace);
            body.image = Some(image.clone());
            body.cmd = Some(self.waiting_cmd(true));
            body.stdin_once = Some(false);
            body
        } else {
            self.container(spec, workspace)
        };
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(spec.name.clone()),
                    ..Default::default()
                }),
                body,
            )
            .await;
        match created {
            Ok(c) => {
                self.note_waiting(&c.id, keeping.is_some());
                Ok(Sandbox {
                    name: spec.name.clone(),
                    handle: c.id,
                    item: spec.item.clone(),
                })
            }
            Err(err) if status_of(&err) == Some(409) => {
                Err(LaunchError::AlreadyExists(spec.name.clone()))
            }
            Err(err) if status_of(&err) == Some(404) => Err(LaunchError::Missing(format!(
                "the sandbox image {} does not exist: build it with scripts/sandbox-image.sh",
                self.args.image
            ))),
            Err(err) => Err(launch_error(err)),
        }
    }

    async fn hand_off(&self, sandbox: &Sandbox, secret: Secret) -> Result<HandOff, LaunchError> {
        // Attached before start, so the runner's first read gets the secret.
        let attached = self.attach_stdin(&sandbox.handle).await?;
        let mut input = attached.input;
        self.docker
            .start_container(&sandbox.handle, None::<StartContainerOptions>)
            .await
            .map_err(launch_error)?;
        let started = Instant::now();
        let written = async {
            input.write_all(secret.expose().as_bytes()).await?;
            input.write_all(b"\n").await?;
            input.flush().await?;
            // Closing our side closes the container's stdin (stdin_once).
            input.shutdown().await
        }
        .await;
        drop(secret);
        drop(input);
        drop(attached.output);
        written
            .map_err(|e| LaunchError::Failed(format!("writing the secret to the sandbox: {e}")))?;
        Ok(HandOff {
            started,
            delivered: Instant::now(),
        })
    }

    async fn wait(&self, sandbox: &Sandbox) -> Result<SandboxExit, LaunchError> {
        self.wait_handle(&sandbox.handle).await
    }

    /// SIGTERM to the container: the runner's PID 1 passes it to the runner.
    async fn signal_stop(&self, sandbox: &Sandbox, _grace: Duration) -> Result<(), LaunchError> {
        let killed = self
            .docker
            .kill_container(
                &sandbox.handle,
                Some(KillContainerOptions {
                    signal: "SIGTERM".into(),
                }),
            )
            .await;
        match killed {
            Ok(()) => Ok(()),
            // Gone, or not running any more: nothing to ask.
            Err(err) if matches!(status_of(&err), Some(404 | 409)) => Ok(()),
            Err(err) => Err(launch_error(err)),
        }
    }

    /// The container, then, for one that was warm, its binding record and
    /// (a healthcheck's) its workspace; a Session's stays the Session's.
    async fn remove(&self, sandbox: &Sandbox) -> Result<(), LaunchError> {
        self.remove_container(&sandbox.handle).await?;
        for found in self.records_of(&sandbox.handle).await? {
            if sandbox.item.session_id.is_none() {
                if let Some(workspace) = found.labels.get(LABEL_WORKSPACE_VOLUME) {
                    self.remove_workspace_volume(workspace).await?;
                }
            }
            self.remove_volume(&found.name).await?;
        }
        Ok(())
    }

    async fn workspaces(&self, environment_id: &str) -> Result<Vec<String>, LaunchError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                format!("{}={}", naming::LABEL_MANAGED_BY, naming::MANAGED_BY),
                format!("{}={environment_id}", naming::LABEL_ENVIRONMENT_ID),
            ],
        )]);
        let listed = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(launch_error)?;
        Ok(listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.labels.get(naming::LABEL_SESSION_ID).cloned())
            .collect())
    }

    /// The workspace first, then the binding that names it, so a removal
    /// cut short is found and finished by the next sweep; a bounded one's
    /// filesystem with its volume.
    async fn remove_workspace(&self, session_id: &str) -> Result<(), LaunchError> {
        let name = session_volume(session_id);
        let Some(session) = self.volume(&name).await? else {
            // A filesystem its volume's removal left behind, if any.
            return self.remove_workspace_volume(&name).await;
        };
        let workspace = workspace_of(&session);
        if workspace != name {
            self.remove_workspace_volume(&workspace).await?;
        }
        self.remove_workspace_volume(&name).await
    }

    async fn warm_image(&self) -> Result<Option<String>, LaunchError> {
        self.image_id().await.map(Some)
    }

    async fn create_warm(&self, owner: &str) -> Result<Warm, LaunchError> {
        use rand::Rng;
        let (image, keeps) = self.sandbox_image().await?;
        let keeps = keeps && self.keep_idle.is_some();
        let name = format!("{WARM_PREFIX}{:016x}", rand::thread_rng().gen::<u64>());
        let labels = HashMap::from([
            (naming::LABEL_POOL.to_string(), self.pool.clone()),
            (
                naming::LABEL_MANAGED_BY.to_string(),
                naming::MANAGED_BY.to_string(),
            ),
            (naming::LABEL_WARM_OWNER.to_string(), owner.to_string()),
        ]);
        // A fresh workspace, bounded as a cold Session's is.
        self.workspace_volume(&name, labels).await?;
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    ..Default::default()
                }),
                self.warm_container(&image, keeps, &name, owner),
            )
            .await;
        let handle = match created {
            Ok(c) => c.id,
            Err(err) => {
                let _ = self.remove_workspace_volume(&name).await;
                return Err(launch_error(err));
            }
        };
        self.note_waiting(&handle, keeps);
        let warm = Warm {
            name,
            handle,
            image,
        };
        if let Err(err) = self
            .docker
            .start_container(&warm.handle, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove_warm(&warm).await;
            return Err(launch_error(err));
        }
        Ok(warm)
    }

    async fn existing_warm(&self, owner: &str) -> Result<Vec<Warm>, LaunchError> {
        let containers = self
            .pool_containers(Some(format!("{}={owner}", naming::LABEL_WARM_OWNER)))
            .await?;
        let records = self.bound_records().await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let handle = c.id?;
                // Bound (or being bound when its supervisor died): an item's now.
                if records.contains_key(&handle) {
                    return None;
                }
                let name = c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string())?;
                self.note_waiting(&handle, runs_kept(c.command.as_deref()));
                Some(Warm {
                    image: c.image_id.unwrap_or_default(),
                    name,
                    handle,
                })
            })
            .collect())
    }

    async fn has_workspace(&self, session_id: &str) -> Result<bool, LaunchError> {
        Ok(self.volume(&session_volume(session_id)).await?.is_some())
    }

    /// The record first (from then on no one lists it as warm), then the
    /// Session's binding and the name at once (neither needs the other).
    /// What fails undoes what this call made; a renamed container that will
    /// not bind is removed by its handle, whatever its name.
    async fn bind(&self, warm: &Warm, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        let record = record_name(&warm.handle);
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        labels.insert(LABEL_CONTAINER.to_string(), warm.handle.clone());
        labels.insert(LABEL_WORKSPACE_VOLUME.to_string(), warm.name.clone());
        let made = self.make_volume(&record, labels).await?;
        if made.labels.get(LABEL_CONTAINER) != Some(&warm.handle)
            || naming::item_of(&made.labels.clone().into_iter().collect()).as_ref()
                != Some(&spec.item)
        {
            // Another item's record: this container is bound already.
            return Err(LaunchError::Taken(warm.name.clone()));
        }
        let rename = async {
            let renamed = self
                .docker
                .rename_container(
                    &warm.handle,
                    RenameContainerOptions {
                        name: spec.name.clone(),
                    },
                )
                .await;
            match renamed {
                Ok(()) => Ok(()),
                Err(err) if status_of(&err) == Some(409) => {
                    Err(LaunchError::AlreadyExists(spec.name.clone()))
                }
                Err(err) => Err(launch_error(err)),
            }
        };
        let (binding, renamed) = tokio::join!(self.bind_workspace(warm, spec), rename);
        let (made, failure) = match (binding, renamed) {
            (Ok(_), Ok(())) => (None, None),
            (Ok(session), Err(err)) => (session, Some(err)),
            (Err(err), _) => (None, Some(err)),
        };
        if let Some(err) = failure {
            if let Some(session) = made {
                let _ = self.remove_volume(&session).await;
            }
            let _ = self.remove_volume(&record).await;
            return Err(err);
        }
        Ok(Sandbox {
            name: spec.name.clone(),
            handle: warm.handle.clone(),
            item: spec.item.clone(),
        })
    }

    async fn deliver(&self, sandbox: &Sandbox, envelope: Secret) -> Result<Instant, LaunchError> {
        let attached = self.attach_stdin(&sandbox.handle).await?;
        let mut input = attached.input;
        let written = async {
            input.write_all(envelope.expose().as_bytes()).await?;
            input.flush().await
        }
        .await;
        drop(envelope);
        // The container's stdin stays open (not stdin_once): the runner
        // reads the one line and nothing after it.
        let _ = input.shutdown().await;
        drop(input);
        drop(attached.output);
        written.map_err(|e| {
            LaunchError::Failed(format!("writing the envelope to the sandbox: {e}"))
        })?;
        Ok(Instant::now())
    }

    async fn wait_warm(&self, handle: &str) -> Result<SandboxExit, LaunchError> {
        self.wait_handle(handle).await
    }

    async fn remove_warm(&self, warm: &Warm) -> Result<(), LaunchError> {
        self.remove_container(&warm.handle).await?;
        self.remove_volume(&record_name(&warm.handle)).await?;
        self.remove_workspace_volume(&warm.name).await
    }

    async fn image_of(&self, sandbox: &Sandbox) -> Result<Option<String>, LaunchError> {
        match self
            .docker
            .inspect_container(&sandbox.handle, None::<InspectContainerOptions>)
            .await
        {
            Ok(inspected) => Ok(inspected.image),
            Err(err) if status_of(&err) == Some(404) => Ok(None),
            Err(err) => Err(launch_error(err)),
        }
    }

    fn waits(&self, sandbox: &Sandbox) -> bool {
        // A warm container bound to a healthcheck waits for its one
        // envelope, but a healthcheck's sandbox is never kept.
        sandbox.item.session_id.is_some()
            && self
                .waiting
                .lock()
                .expect("waiting lock")
                .contains(&sandbox.handle)
    }

    async fn start_waiting(&self, sandbox: &Sandbox) -> Result<Instant, LaunchError> {
        self.docker
            .start_container(&sandbox.handle, None::<StartContainerOptions>)
            .await
            .map_err(launch_error)?;
        Ok(Instant::now())
    }

    /// A record of the next generation first (from then on a restarted
    /// supervisor adopts the container as the new item's, and
    /// `docker volume ls --filter label=mango.dev/work-id=…` finds it), then
    /// the name, then the older records go. What fails undoes the record.
    async fn rebind(&self, sandbox: &Sandbox, spec: &SandboxSpec) -> Result<Sandbox, LaunchError> {
        if sandbox.item.session_id.is_none() || sandbox.item.session_id != spec.item.session_id {
            return Err(LaunchError::Failed(format!(
                "sandbox {} serves another Session",
                sandbox.name
            )));
        }
        let older = self.records_of(&sandbox.handle).await?;
        let generation = older.first().map_or(0, |r| generation_of(r) + 1);
        let record = record_of_generation(&sandbox.handle, generation);
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        labels.insert(LABEL_CONTAINER.to_string(), sandbox.handle.clone());
        labels.insert(LABEL_GENERATION.to_string(), generation.to_string());
        if let Some(workspace) = older
            .first()
            .and_then(|r| r.labels.get(LABEL_WORKSPACE_VOLUME))
        {
            labels.insert(LABEL_WORKSPACE_VOLUME.to_string(), workspace.clone());
        }
        let made = self.make_volume(&record, labels).await?;
        if naming::item_of(&made.labels.clone().into_iter().collect()).as_ref() != Some(&spec.item)
        {
            // Another item's record of this generation: rebound already.
            return Err(LaunchError::Taken(sandbox.name.clone()));
        }
        let renamed = self
            .docker
            .rename_container(
                &sandbox.handle,
                RenameContainerOptions {
                    name: spec.name.clone(),
                },
            )
            .await;
        if let Err(err) = renamed {
            let _ = self.remove_volume(&record).await;
            if status_of(&err) == Some(409) {
                return Err(LaunchError::AlreadyExists(spec.name.clone()));
            }
            return Err(launch_error(err));
        }
        for old in older {
            // Left behind, an older one is outranked by this generation.
            if let Err(err) = self.remove_volume(&old.name).await {
                tracing::warn!(record = %old.name, error = %err, "could not remove an older binding record");
            }
        }
        Ok(Sandbox {
            name: spec.name.clone(),
            handle: sandbox.handle.clone(),
            item: spec.item.clone(),
        })
    }
}
