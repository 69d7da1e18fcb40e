//! `mango-worker`: the supervisor's binary. Its launchers start one sandbox
//! per acknowledged Work item: `docker` (hardened containers) and `local`
//! (subprocesses, development only), and `kubernetes` runs the operator
//! (one hardened Pod per item under a `WorkerPool`), and `egress-proxy` the
//! egress proxy of one pool; `item` runs one item in this process,
//! as the seed's `HandleItem` does (the same code as `mango-runner`).

use clap::{Args, Parser, Subcommand};
use mango_controller::core::config::Config;
use mango_controller::core::launcher::Launcher;
use mango_controller::core::metrics::Metrics;
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::{RunEnd, Stop, Supervisor};
use mango_controller::egress::proxy::EgressMetrics;
use mango_controller::local::{LocalLauncher, RunnerCommand};
use mango_runner::item::{self, Identity};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "mango-worker", version, about = "The Mango supervisor")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run items as hardened Docker containers, one per item.
    Docker {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        docker: mango_controller::docker::DockerArgs,
        #[command(flatten)]
        egress: mango_controller::egress::EgressArgs,
    },
    /// Run items as subprocesses of this user (development only: NOT a
    /// security boundary).
    Local {
        #[command(flatten)]
        common: Common,
        /// The `mango-runner` binary (default: this one, as `mango-worker item`).
        #[arg(long, env = "MANGO_RUNNER_BIN")]
        runner_bin: Option<PathBuf>,
        /// Where Session workspaces, healthcheck workspaces and sandbox
        /// records live (a relative path is taken from where it starts).
        #[arg(long, env = "MANGO_LOCAL_ROOT", default_value = ".mango/local")]
        root: PathBuf,
        /// The API URL the runners use (default: MANGO_BASE_URL).
        #[arg(long, env = "MANGO_SANDBOX_BASE_URL")]
        sandbox_base_url: Option<String>,
    },
    /// Run the Kubernetes operator: one supervisor per WorkerPool, one
    /// hardened Pod per item, a PVC per Session.
    Kubernetes(mango_controller::kubernetes::cli::KubernetesArgs),
    /// Run the egress proxy of one Kubernetes WorkerPool: admits only the
    /// names its `spec.egress.allow` lists, and follows its edits live.
    EgressProxy(mango_controller::egress::pool::EgressProxyArgs),
    /// Run one acknowledged Work item here; the Work secret is read from
    /// stdin (an alias of `mango-runner`).
    Item(Identity),
}

/// What every launcher's supervisor takes.
#[derive(Args)]
struct Common {
    /// The Environment key (Poll, Ack, Stats; never a Workspace key).
    #[arg(long, env = "MANGO_ENVIRONMENT_KEY", hide_env_values = true)]
    environment_key: String,
    #[arg(long, env = "MANGO_ENVIRONMENT_ID")]
    environment_id: String,
    /// The API, as this supervisor reaches it.
    #[arg(long, env = "MANGO_BASE_URL")]
    base_url: String,
    /// At most this many live sandboxes.
    #[arg(long, env = "MANGO_MAX_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_concurrency: u32,
    /// The `mango.dev/pool` label of this supervisor's sandboxes.
    #[arg(long, env = "MANGO_POOL", default_value = "default")]
    pool: String,
    /// Where `/metrics` and `/healthz` are served [default: 127.0.0.1:9464,
    /// or a free port when another process holds it].
    #[arg(long, env = "MANGO_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// On SIGTERM or SIGINT, let running items finish within the shutdown
    /// grace and then remove their sandboxes, instead of leaving them
    /// running for the next supervisor to adopt.
    #[arg(long, env = "MANGO_DRAIN")]
    drain: bool,
    /// Warm sandboxes kept started and identity-less, bound on Ack (spec
    /// §7.1; `docker` only, others start every item cold). 0: none.
    #[arg(long, env = "MANGO_WARM", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    warm: u32,
    /// This supervisor's `Anthropic-Worker-ID`, and the owner of its warm
    /// sandboxes, which only the same id adopts after a restart. One live
    /// process per id on a host (default:
    /// mango-worker-<host>-<environment id>-<pool>, `-local` after it for
    /// `local`).
    #[arg(long, env = "MANGO_WORKER_ID")]
    worker_id: Option<String>,
    /// With --drain: how long running items get before their sandboxes are removed.
    #[arg(long, env = "MANGO_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    shutdown_grace_seconds: u64,
    /// How often the workspaces of deleted Sessions are looked for and removed.
    #[arg(long, env = "MANGO_WORKSPACE_SWEEP_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    workspace_sweep_seconds: u64,
}

/// Where `/metrics` is served unless told otherwise.
const DEFAULT_METRICS_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9464);

impl Common {
    fn config(&self, kind: mango_controller::worker_id::Kind, sandbox_base_url: &str) -> Config {
        let mut config = Config::new(&self.environment_id, sandbox_base_url);
        config.max_concurrency = self.max_concurrency as usize;
        config.pool = self.pool.clone();
        config.shutdown_grace = Duration::from_secs(self.shutdown_grace_seconds);
        config.warm = self.warm as usize;
        config.workspace_sweep_every = Duration::from_secs(self.workspace_sweep_seconds);
        config.worker_id = self.worker_id.clone().unwrap_or_else(|| {
            mango_controller::worker_id::default_for(kind, &self.environment_id, &self.pool)
        });
        config
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Item(identity) => item::run(identity),
        Command::Local {
            common,
            runner_bin,
            root,
            sandbox_base_url,
        } => {
            init_logging();
            eprintln!(
                "mango-worker local: items run as subprocesses of this user, with this \
                 machine's files and network. This is NOT a security boundary: use it for \
                 development only, and `mango-worker docker` (or Kubernetes) for anything else."
            );
            let runner = match runner_bin {
                Some(bin) => RunnerCommand::new(bin),
                None => myself_as_runner(),
            };
            let base = sandbox_base_url.unwrap_or_else(|| common.base_url.clone());
            let config = common.config(mango_controller::worker_id::Kind::Local, &base);
            let _worker_id = match hold_worker_id(&config) {
                Ok(held) => held,
                Err(code) => return code,
            };
            block_on(async move {
                let launcher = LocalLauncher::new(runner, root, &config.pool)?;
                tracing::info!(root = %launcher.root().display(), "sandbox records, Session workspaces and runner logs");
                Ok(supervise(common, config, launcher, None).await)
            })
        }
        Command::Kubernetes(mango_controller::kubernetes::cli::KubernetesArgs {
            command: Some(mango_controller::kubernetes::cli::KubernetesCommand::Render(args)),
            ..
        }) => mango_controller::kubernetes::render::run(args),
        Command::Kubernetes(args) => {
            init_logging();
            block_on(async move {
                Ok(mango_controller::kubernetes::cli::run(args, shutdown_signal()).await)
            })
        }
        Command::EgressProxy(args) => {
            init_logging();
            block_on(async move {
                mango_controller::egress::pool::run(args, shutdown_signal())
                    .await
                    .map(|()| ExitCode::SUCCESS)
                    .map_err(|err| {
                        mango_controller::core::launcher::LaunchError::Failed(format!("{err:#}"))
                    })
            })
        }
        Command::Docker {
            common,
            docker,
            egress,
        } => {
            init_logging();
            let mut config = common.config(
                mango_controller::worker_id::Kind::Docker,
                &docker.sandbox_base_url,
            );
            let _worker_id = match hold_worker_id(&config) {
                Ok(held) => held,
                Err(code) => return code,
            };
            config.keep_idle = Duration::from_secs(docker.keep_idle_seconds);
            let allowlist = match egress.allowlist() {
                Ok(list) => list,
                Err(err) => {
                    eprintln!("mango-worker: {err}");
                    return ExitCode::from(2);
                }
            };
            let mut docker = docker;
            if !allowlist.is_empty() {
                // The host fence lets sandboxes reach the proxy's port on the gateway too.
                docker.extra_peer_ports.push(egress.egress_proxy_port);
            }
            block_on(async move {
                let launcher =
                    mango_controller::docker::DockerLauncher::connect(&docker, &config.pool)
                        .await?;
                if allowlist.is_empty() {
                    return Ok(supervise(common, config, launcher, None).await);
                }
                let (launcher, metrics) = mango_controller::egress::serve_for_docker(
                    launcher,
                    mango_controller::egress::DockerEgress {
                        allowlist,
                        allow_private: egress.egress_allow_private,
                        port: egress.egress_proxy_port,
                        resolver: Arc::new(mango_controller::egress::proxy::SystemResolver),
                    },
                    &config.pool,
                    &config.sandbox_base_url,
                )
                .await?;
                Ok(supervise(common, config, launcher, Some(metrics)).await)
            })
        }
    }
}

fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("MANGO_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// `mango-worker item`: the runner is built into this binary.
fn myself_as_runner() -> RunnerCommand {
    RunnerCommand {
        program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("mango-worker")),
        args: vec!["item".into()],
    }
}

fn block_on(
    run: impl std::future::Future<
        Output = Result<ExitCode, mango_controller::core::launcher::LaunchError>,
    >,
) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mango-worker: {err}");
            ExitCode::from(2)
        }
    }
}

/// Takes this supervisor's worker id on this host before anything of the
/// host is touched (the engine's network and fence, the egress proxy's
/// port): a second live process of the id waits for the first, then stops.
fn hold_worker_id(config: &Config) -> Result<mango_controller::worker_id::Held, ExitCode> {
    use mango_controller::worker_id::{hold, lock_dir, TAKEOVER_WAIT};
    hold(&config.worker_id, &lock_dir(), TAKEOVER_WAIT).map_err(|err| {
        eprintln!("mango-worker: {err}");
        ExitCode::from(2)
    })
}

async fn supervise<L: Launcher>(
    common: Common,
    config: Config,
    launcher: L,
    egress: Option<Arc<EgressMetrics>>,
) -> ExitCode {
    let key = Secret::new(common.environment_key);
    let kind = launcher.kind();
    let pool = config.pool.clone();
    let supervisor = Supervisor::new(config, launcher, &common.base_url, &key);
    if let Err(err) = supervisor.check_key(&key).await {
        eprintln!("mango-worker: {err}");
        return ExitCode::from(2);
    }
    drop(key);
    let metrics = supervisor.metrics();
    match metrics_listener(common.metrics_addr).await {
        Ok(listener) => {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving /metrics and /healthz");
            }
            tokio::spawn(serve_metrics(listener, metrics, pool, egress));
        }
        Err(err) => {
            eprintln!("mango-worker: {err}");
            return ExitCode::from(2);
        }
    }
    let how = if common.drain {
        Stop::Drain
    } else {
        Stop::Detach
    };
    tracing::info!(launcher = kind, environment_id = %common.environment_id, on_sigterm = ?how, "supervisor polling");
    let grace = Duration::from_secs(common.shutdown_grace_seconds);
    let stop = async move {
        shutdown_signal().await;
        match how {
            Stop::Drain => tracing::info!(?grace, "shutting down: no more polling; running items get the shutdown grace, then their sandboxes are removed"),
            Stop::Detach => tracing::info!("shutting down: no more polling; running sandboxes are left for the next supervisor to adopt"),
        }
        how
    };
    match supervisor.run_until(stop).await {
        RunEnd::Shutdown | RunEnd::Detached => ExitCode::SUCCESS,
        RunEnd::KeyRefused(why) => {
            eprintln!("mango-worker: the api no longer accepts MANGO_ENVIRONMENT_KEY ({why}); stopped polling");
            ExitCode::from(3)
        }
    }
}

/// The metrics listener: at `given`, or else at [`DEFAULT_METRICS_ADDR`],
/// or, when another process holds that (a second supervisor on the host),
/// at a free port, logged. An address that was asked for is never swapped.
async fn metrics_listener(given: Option<SocketAddr>) -> Result<tokio::net::TcpListener, String> {
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|err| (addr, err))
    };
    let failed = |(addr, err): (SocketAddr, std::io::Error)| {
        format!("cannot serve metrics on {addr} (MANGO_METRICS_ADDR, --metrics-addr): {err}")
    };
    if let Some(addr) = given {
        return bind(addr).await.map_err(failed);
    }
    match bind(DEFAULT_METRICS_ADDR).await {
        Ok(listener) => Ok(listener),
        Err((_, err)) if err.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = bind(SocketAddr::new(DEFAULT_METRICS_ADDR.ip(), 0))
                .await
                .map_err(failed)?;
            let addr = listener
                .local_addr()
                .map_err(|e| failed((DEFAULT_METRICS_ADDR, e)))?;
            tracing::warn!(default = %DEFAULT_METRICS_ADDR, %addr, "the default metrics address is taken (another supervisor on this host?); serving /metrics and /healthz on a free port instead (MANGO_METRICS_ADDR chooses one)");
            Ok(listener)
        }
        Err(failure) => Err(failed(failure)),
    }
}

/// Every series carries the pool, as the Kubernetes controller's do, so one
/// dashboard and one set of alerts serve every launcher.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    pool: String,
    egress: Option<Arc<EgressMetrics>>,
) {
    use axum::routing::get;
    let render = move || {
        let mut text = mango_controller::core::metrics::render_pools(&[(Some(&pool), &metrics)]);
        if let Some(egress) = &egress {
            text.push_str(&egress.render());
        }
        text
    };
    let app = axum::Router::new()
        .route("/metrics", get(move || async move { render() }))
        .route("/healthz", get(|| async { "ok" }));
    if let Err(err) = axum::serve(listener, app).await {
        tracing::error!(error = %err, "the metrics server stopped");
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
