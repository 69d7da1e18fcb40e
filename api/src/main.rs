//! `mango`: the control plane binary. `serve`, `migrate`, `api-key` and
//! `openapi` on the database or on nothing; `work`, `sessions` and
//! `environments`, the operator's commands, over HTTP (`cli/`).

mod cli;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use mango_api::connection_limits as limits;
use mango_api::memory_quota as quota;
use mango_api::model::ModelConfig;
use mango_api::store::keys::{self, CreateKeyError, KeyRow};
use mango_api::{server, ApiContext, Settings, MIGRATOR};
use mango_protocol::time;
use sqlx::PgPool;

#[derive(Parser)]
#[command(
    name = "mango",
    version,
    about = "Mango Environment Work control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Database {
    /// PostgreSQL URL of the lease store.
    #[arg(long, env = "MANGO_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Connections in the pool (three at least: the LISTEN connection keeps
    /// one, and a Session's agent-loop step holds one for its lock and
    /// queries on another; half of the pool but one step Sessions at once,
    /// at most 32).
    #[arg(long, env = "MANGO_DB_MAX_CONNECTIONS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(3..))]
    db_max_connections: u32,
}

/// What a Memory Store may hold and keep, and how fast a sessions token
/// may write to one (docs/memory.md, "Quotas").
#[derive(Args, Clone)]
struct MemoryLimitArgs {
    /// A store's content, at most, in bytes: a write past it is 413
    /// `memory_store_full` (the default fits the sandboxes' 64 MiB mount).
    #[arg(long, env = "MANGO_MEMORY_STORE_MAX_BYTES", default_value_t = quota::DEFAULT_STORE_MAX_BYTES, value_parser = clap::value_parser!(i64).range(0..))]
    memory_store_max_bytes: i64,
    /// A store's memories, at most: a create past it is 413 `memory_store_full`.
    #[arg(long, env = "MANGO_MEMORY_STORE_MAX_MEMORIES", default_value_t = quota::DEFAULT_STORE_MAX_MEMORIES, value_parser = clap::value_parser!(i64).range(0..))]
    memory_store_max_memories: i64,
    /// Content a store's history (versions no memory holds now) keeps, in
    /// bytes; past it a write prunes the oldest versions.
    #[arg(long, env = "MANGO_MEMORY_HISTORY_MAX_BYTES", default_value_t = quota::DEFAULT_HISTORY_MAX_BYTES, value_parser = clap::value_parser!(i64).range(0..))]
    memory_history_max_bytes: i64,
    /// Versions a store's history keeps; past it a write prunes the oldest.
    #[arg(long, env = "MANGO_MEMORY_HISTORY_MAX_VERSIONS", default_value_t = quota::DEFAULT_HISTORY_MAX_VERSIONS, value_parser = clap::value_parser!(i64).range(0..))]
    memory_history_max_versions: i64,
    /// Memory writes one sessions token makes per minute, sustained; past
    /// it (and the burst) a write is 429 with `retry-after`.
    #[arg(long, env = "MANGO_MEMORY_WRITES_PER_MINUTE", default_value_t = quota::DEFAULT_WRITES_PER_MINUTE, value_parser = clap::value_parser!(u32).range(1..=6_000_000))]
    memory_writes_per_minute: u32,
    /// Memory writes one sessions token may make at once.
    #[arg(long, env = "MANGO_MEMORY_WRITE_BURST", default_value_t = quota::DEFAULT_WRITE_BURST, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    memory_write_burst: u32,
}

impl From<MemoryLimitArgs> for quota::MemoryLimits {
    fn from(a: MemoryLimitArgs) -> Self {
        quota::MemoryLimits {
            store_max_bytes: a.memory_store_max_bytes,
            store_max_memories: a.memory_store_max_memories,
            history_max_bytes: a.memory_history_max_bytes,
            history_max_versions: a.memory_history_max_versions,
            writes_per_minute: a.memory_writes_per_minute,
            write_burst: a.memory_write_burst,
        }
    }
}

/// Where the api listens besides MANGO_LISTEN_ADDR, and what each
/// connection may hold (docs/operations.md, "Connections").
#[derive(Args, Clone)]
struct ConnectionArgs {
    /// A listener for sandboxes alone (several addresses separated by
    /// commas): it serves only the routes a sandbox's runner uses, with its
    /// own per-peer cap. Point sandboxes' MANGO_BASE_URL at it.
    #[arg(long, env = "MANGO_SANDBOX_LISTEN_ADDR")]
    sandbox_listen_addr: Option<String>,
    /// Where /metrics (and /healthz) are served [default: 127.0.0.1:9465, or
    /// a free loopback port when another process holds it]; never on the
    /// other listeners.
    #[arg(long, env = "MANGO_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Seconds an HTTP/1 connection may take to send a request head, from
    /// its first byte or from opening (1..=3600).
    #[arg(long, env = "MANGO_HEADER_READ_TIMEOUT_SECONDS", default_value_t = limits::DEFAULT_HEADER_READ_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_read_timeout_seconds: u64,
    /// Seconds a kept-alive connection may wait for its next request; an
    /// open event stream or long poll is never idle (1..=86400).
    #[arg(long, env = "MANGO_IDLE_TIMEOUT_SECONDS", default_value_t = limits::DEFAULT_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86400))]
    idle_timeout_seconds: u64,
    /// Open connections one peer address may hold on an operators' (or the
    /// metrics) listener; past it a new one is closed as it is accepted.
    #[arg(long, env = "MANGO_MAX_CONNECTIONS_PER_PEER", default_value_t = limits::DEFAULT_MAX_PER_PEER, value_parser = per_peer)]
    max_connections_per_peer: usize,
    /// Open connections one peer address may hold on the sandbox listener.
    #[arg(long, env = "MANGO_SANDBOX_MAX_CONNECTIONS_PER_PEER", default_value_t = limits::DEFAULT_SANDBOX_MAX_PER_PEER, value_parser = per_peer)]
    sandbox_max_connections_per_peer: usize,
    /// Open connections of the process on all listeners [default: the
    /// open-file limit, raised to its hard limit at start, less 1,024 (half
    /// when the limit is 2,048 or less)]; more than that is refused.
    #[arg(long, env = "MANGO_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
}

fn per_peer(raw: &str) -> Result<usize, String> {
    match raw.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{raw:?} is not a number of connections from 1 to 1000000"
        )),
    }
}

impl ConnectionArgs {
    /// The limits, with the open-file limit raised first so the default
    /// budget is the most the process may have.
    fn limits(&self) -> anyhow::Result<limits::ConnectionLimits> {
        let open_files = limits::raise_open_file_limit();
        let max_connections = match self.max_connections {
            Some(asked) => {
                limits::check_max_connections(asked, open_files).map_err(anyhow::Error::msg)?
            }
            None => limits::connection_budget(open_files),
        };
        tracing::info!(open_files, max_connections, "connection limits");
        Ok(limits::ConnectionLimits {
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_seconds),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_seconds),
            max_per_peer: self.max_connections_per_peer,
            sandbox_max_per_peer: self.sandbox_max_connections_per_peer,
            max_connections,
        })
    }
}

/// Binds each of a comma-separated list of addresses.
async fn bind_each(list: &str, what: &str) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let mut listeners = Vec::new();
    for addr in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("could not listen on {addr} ({what})"))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

// Parsed once per process: a large `Serve` costs nothing worth boxing for
// (and clap cannot flatten a boxed group).
#[allow(clippy::large_enum_variant)]
/// The commands on the database (or on nothing).
#[derive(Subcommand)]
enum ServerCommand {
    /// Serve the HTTP API (runs pending migrations first unless --no-migrate).
    Serve {
        #[command(flatten)]
        db: Database,
        /// Where to listen; several addresses separated by commas.
        #[arg(long, env = "MANGO_LISTEN_ADDR", default_value = "127.0.0.1:8080")]
        listen_addr: String,
        #[arg(long)]
        no_migrate: bool,
        /// A Messages-API-compatible endpoint for the agent loop. Without it,
        /// the Anthropic API when a key is set (MANGO_MODEL_API_KEY or
        /// ANTHROPIC_API_KEY); with no key either, every Session's input is
        /// answered with a session.error saying that no model is configured.
        #[arg(long, env = "MANGO_MODEL_BASE_URL")]
        model_base_url: Option<String>,
        /// Sent to the model endpoint as x-api-key; never stored, logged or sent to a sandbox.
        #[arg(long, env = "MANGO_MODEL_API_KEY", hide_env_values = true)]
        model_api_key: Option<String>,
        /// The Anthropic API's key, used (with https://api.anthropic.com) when
        /// MANGO_MODEL_BASE_URL is unset; never sent to another endpoint.
        #[arg(long, env = "ANTHROPIC_API_KEY", hide_env_values = true)]
        anthropic_api_key: Option<String>,
        /// Seconds one model call may take before it fails and is retried (1..=3600).
        #[arg(long, env = "MANGO_MODEL_TIMEOUT_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=3600))]
        model_timeout_seconds: u64,
        /// Lease TTL when a heartbeat asks for none (1..=300).
        #[arg(long, env = "MANGO_DEFAULT_TTL_SECONDS", default_value_t = 120, value_parser = clap::value_parser!(i64).range(1..=300))]
        default_ttl_seconds: i64,
        /// A Work item reclaimed more often than this is failed, its Session
        /// terminated with the reason (0..=1000).
        #[arg(long, env = "MANGO_MAX_RECLAIMS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=1000))]
        max_reclaims: u32,
        /// Where Skill archives are stored: a local folder (a path or
        /// file:// URL, created if missing; a relative one is taken from
        /// where `mango serve` starts) or s3://bucket/prefix, with
        /// credentials, region and an S3-compatible endpoint from the usual
        /// AWS_* variables (AWS_ENDPOINT, AWS_ALLOW_HTTP, …).
        #[arg(long, env = "MANGO_OBJECT_STORE", default_value = ".mango/objects")]
        object_store: String,
        /// Where Sessions mount their Memory Stores: a store's `mount_path`
        /// is `<this>/<slug of its name>` (an absolute path).
        #[arg(long, env = "MANGO_MEMORY_MOUNT_ROOT", default_value = mango_api::memory_rules::DEFAULT_MOUNT_ROOT, value_parser = mount_root)]
        memory_mount_root: String,
        #[command(flatten)]
        memory_limits: MemoryLimitArgs,
        #[command(flatten)]
        connections: ConnectionArgs,
    },
    /// Apply pending migrations and exit.
    Migrate {
        #[command(flatten)]
        db: Database,
    },
    /// Create, list and revoke Workspace and Environment keys.
    #[command(subcommand)]
    ApiKey(ApiKeyCommand),
    /// Print the OpenAPI document of the HTTP API (what `GET /openapi.json`
    /// serves and `docs/openapi.json` holds).
    Openapi,
}

// Parsed once per process: the large `Serve` costs nothing worth boxing
// for (and clap cannot flatten a boxed group).
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Server(ServerCommand),
    #[command(flatten)]
    Operator(cli::Operator),
}

#[derive(Subcommand)]
enum ApiKeyCommand {
    /// Create a key; with --environment it is an Environment key (Poll, Ack, Stats only).
    Create {
        #[command(flatten)]
        db: Database,
        #[arg(long)]
        workspace: String,
        #[arg(long)]
        environment: Option<String>,
        #[arg(long)]
        label: String,
        #[arg(long)]
        json: bool,
    },
    /// List a workspace's keys (never their secrets).
    List {
        #[command(flatten)]
        db: Database,
        #[arg(long)]
        workspace: String,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key; Poll and Ack in flight finish first, then the key stops working.
    Revoke {
        #[command(flatten)]
        db: Database,
        #[arg(long)]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

/// The seed's commands use one dash (`-workspace W`); accept both spellings.
const LONG_FLAGS: &[&str] = &[
    "workspace",
    "environment",
    "label",
    "id",
    "json",
    "database-url",
    "db-max-connections",
    "listen-addr",
    "model-base-url",
    "model-api-key",
    "anthropic-api-key",
    "model-timeout-seconds",
    "no-migrate",
    "default-ttl-seconds",
    "max-reclaims",
    "object-store",
    "sandbox-listen-addr",
    "metrics-addr",
];

fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|arg| {
        let Some(rest) = arg.strip_prefix('-').filter(|r| !r.starts_with('-')) else {
            return arg;
        };
        let name = rest.split_once('=').map_or(rest, |(n, _)| n);
        if LONG_FLAGS.contains(&name) {
            format!("--{rest}")
        } else {
            arg
        }
    })
    .collect()
}

fn init_logging(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("MANGO_LOG").unwrap_or_else(|_| default.into());
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn connect(db: &Database) -> anyhow::Result<PgPool> {
    mango_api::db::pool_options(db.db_max_connections)
        .connect(&db.database_url)
        .await
        .context("could not connect to MANGO_DATABASE_URL")
}

/// [`connect`] for the server: its connections carry the process's name
/// (see `mango_api::db::as_api_process`).
async fn connect_as_api(db: &Database) -> anyhow::Result<PgPool> {
    let options: sqlx::postgres::PgConnectOptions = db
        .database_url
        .parse()
        .context("MANGO_DATABASE_URL is not a PostgreSQL URL")?;
    mango_api::db::pool_options(db.db_max_connections)
        .connect_with(mango_api::db::as_api_process(options))
        .await
        .context("could not connect to MANGO_DATABASE_URL")
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// `MANGO_OBJECT_STORE` with a local folder made absolute, once, from the
/// starting directory (so the log names the folder in use); a URL of
/// another scheme as it is.
fn absolute_store(spec: &str) -> anyhow::Result<String> {
    let spec = spec.trim();
    if spec.contains("://") && !spec.starts_with("file://") {
        return Ok(spec.to_string());
    }
    let folder = spec.strip_prefix("file://").unwrap_or(spec);
    let absolute = std::path::absolute(folder)
        .with_context(|| format!("MANGO_OBJECT_STORE {folder:?}: not a usable path"))?;
    absolute
        .to_str()
        .map(str::to_string)
        .with_context(|| format!("MANGO_OBJECT_STORE {}: not UTF-8", absolute.display()))
}

/// `MANGO_MEMORY_MOUNT_ROOT`: an absolute path without `.`, `..` or empty segments.
fn mount_root(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim_end_matches('/');
    let clean = trimmed.starts_with('/')
        && trimmed[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    if clean {
        Ok(trimmed.to_string())
    } else {
        Err(format!(
            "{raw:?} is not a clean absolute directory (like /mnt/memory)"
        ))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Cli::parse_from(normalize_args(std::env::args()));
    let command = match args.command {
        Command::Operator(operator) => return cli::run(operator).await,
        Command::Server(command) => command,
    };
    match run(command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: ServerCommand) -> anyhow::Result<()> {
    match command {
        ServerCommand::Serve {
            db,
            listen_addr,
            no_migrate,
            default_ttl_seconds,
            max_reclaims,
            model_base_url,
            model_api_key,
            anthropic_api_key,
            model_timeout_seconds,
            object_store,
            memory_mount_root,
            memory_limits,
            connections,
        } => {
            init_logging("info");
            let connection_limits = connections.limits()?;
            let model = ModelConfig::resolve(model_base_url, model_api_key, anthropic_api_key);
            if let Some(model) = &model {
                tracing::info!(model = %model.describe(), "model endpoint");
            }
            let skill_archives =
                mango_api::skills::objects::Archives::open(&absolute_store(&object_store)?)?;
            tracing::info!(store = %skill_archives.location(), "Skill archives");
            let pool = connect_as_api(&db).await?;
            if !no_migrate {
                MIGRATOR.run(&pool).await.context("migration failed")?;
            }
            let operators = bind_each(&listen_addr, "MANGO_LISTEN_ADDR").await?;
            for listener in &operators {
                tracing::info!(addr = %listener.local_addr()?, "mango api listening");
            }
            let sandboxes = match &connections.sandbox_listen_addr {
                Some(list) => bind_each(list, "MANGO_SANDBOX_LISTEN_ADDR").await?,
                None => Vec::new(),
            };
            for listener in &sandboxes {
                tracing::info!(addr = %listener.local_addr()?, "mango api listening for sandboxes");
            }
            let metrics = server::bind_metrics(connections.metrics_addr).await?;
            tracing::info!(addr = %metrics.local_addr()?, "serving /metrics");
            let listeners = server::Listeners {
                operators,
                sandboxes,
                metrics: Some(metrics),
            };
            let settings = Settings {
                default_ttl_seconds,
                max_reclaims,
                model_base_url: model.as_ref().map(|m| m.base_url.clone()),
                model_api_key: model.and_then(|m| m.api_key),
                model_request_timeout: std::time::Duration::from_secs(model_timeout_seconds),
                skill_archives,
                memory_mount_root,
                memory_limits: memory_limits.into(),
                connections: connection_limits,
                ..Settings::default()
            };
            server::serve_listeners(
                ApiContext::new(pool, settings),
                listeners,
                shutdown_signal(),
            )
            .await
        }
        ServerCommand::Migrate { db } => {
            init_logging("warn");
            let pool = connect(&db).await?;
            MIGRATOR.run(&pool).await.context("migration failed")?;
            println!("migrations applied");
            Ok(())
        }
        ServerCommand::ApiKey(cmd) => {
            init_logging("warn");
            api_key(cmd).await
        }
        ServerCommand::Openapi => {
            print!(
                "{}",
                mango_api::openapi::to_json(&mango_api::routes::openapi())
            );
            Ok(())
        }
    }
}

fn key_json(key: &KeyRow) -> serde_json::Value {
    serde_json::json!({
        "id": key.id, "kind": key.kind, "workspace_id": key.workspace_id,
        "environment_id": key.environment_id, "label": key.label,
        "created_at": time::format(&key.created_at),
        "last_used_at": key.last_used_at.map(|t| time::format(&t)),
        "revoked_at": key.revoked_at.map(|t| time::format(&t)),
    })
}

fn short(ts: Option<time::Timestamp>) -> String {
    ts.map_or_else(
        || "-".to_string(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

async fn api_key(cmd: ApiKeyCommand) -> anyhow::Result<()> {
    match cmd {
        ApiKeyCommand::Create {
            db,
            workspace,
            environment,
            label,
            json,
        } => {
            let pool = connect(&db).await?;
            let (key, secret) = match keys::create(
                &pool,
                &workspace,
                environment.as_deref(),
                &label,
                time::now(),
            )
            .await
            {
                Ok(created) => created,
                Err(CreateKeyError::Db(err)) => return Err(err.into()),
                Err(err) => anyhow::bail!("{err}"),
            };
            if json {
                let out = serde_json::json!({
                    "id": key.id, "api_key": secret, "kind": key.kind, "workspace_id": key.workspace_id,
                    "environment_id": key.environment_id, "label": key.label,
                    "created_at": time::format(&key.created_at),
                });
                println!("{out}");
            } else {
                println!("Created {} key {} ({})", key.kind, key.id, key.label);
                if let Some(env) = &key.environment_id {
                    println!("Environment: {env} (may Poll, Ack and read Stats only)");
                }
                println!();
                println!("  {secret}");
                println!();
                println!("Store it now: this is the only time the key is shown.");
            }
        }
        ApiKeyCommand::List {
            db,
            workspace,
            json,
        } => {
            let pool = connect(&db).await?;
            let list = keys::list(&pool, &workspace).await?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(list.iter().map(key_json).collect())
                );
            } else if list.is_empty() {
                println!("No keys in workspace {workspace}.");
            } else {
                let rows: Vec<[String; 7]> = list
                    .iter()
                    .map(|k| {
                        [
                            k.id.clone(),
                            k.label.clone(),
                            k.kind.clone(),
                            k.environment_id.clone().unwrap_or_else(|| "-".into()),
                            short(Some(k.created_at)),
                            short(k.last_used_at),
                            short(k.revoked_at),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "ID",
                        "LABEL",
                        "KIND",
                        "ENVIRONMENT",
                        "CREATED",
                        "LAST USED",
                        "REVOKED",
                    ],
                    &rows,
                );
            }
        }
        ApiKeyCommand::Revoke { db, id, json } => {
            let pool = connect(&db).await?;
            let Some(key) = keys::revoke(&pool, &id, time::now()).await? else {
                anyhow::bail!("no key with id {id}");
            };
            if json {
                println!("{}", key_json(&key));
            } else {
                println!(
                    "Revoked {} ({}) at {}",
                    key.id,
                    key.label,
                    short(key.revoked_at)
                );
            }
        }
    }
    Ok(())
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_object_store_folder_is_made_absolute_and_urls_are_kept() {
        let here = std::env::current_dir().unwrap();
        let at = |p: &str| here.join(p).to_str().unwrap().to_string();
        assert_eq!(
            absolute_store(".mango/objects").unwrap(),
            at(".mango/objects")
        );
        assert_eq!(absolute_store(" file://objects ").unwrap(), at("objects"));
        assert_eq!(absolute_store("/srv/objects").unwrap(), "/srv/objects");
        assert_eq!(
            absolute_store("file:///srv/objects").unwrap(),
            "/srv/objects"
        );
        assert_eq!(
            absolute_store("s3://bucket/prefix").unwrap(),
            "s3://bucket/prefix"
        );
        let empty = absolute_store("").unwrap_err().to_string();
        assert!(empty.contains("MANGO_OBJECT_STORE"), "{empty}");
    }

    #[test]
    fn one_dash_flags_become_two_and_values_are_untouched() {
        let args = [
            "mango",
            "api-key",
            "create",
            "-workspace",
            "w",
            "-label",
            "-json",
            "-environment=e",
            "-x",
        ];
        let out = normalize_args(args.iter().map(|s| s.to_string()));
        assert_eq!(
            out,
            [
                "mango",
                "api-key",
                "create",
                "--workspace",
                "w",
                "--label",
                "--json",
                "--environment=e",
                "-x"
            ]
        );
    }
}
