//! The bench's fixture: a throw-away database, the api served in-process on
//! 127.0.0.1:0 over it (mango-testkit's [`TestApp`]: a Workspace key, an
//! Environment and its key), the publications of its event feeds, the
//! client threads, and direct-SQL seeding and counters (setup, never measured).

use crate::http::{http_client, Api};
use anyhow::Context;
use mango_api::{ApiContext, Settings, MIGRATOR};
use mango_protocol::time;
use mango_testkit::TestApp;
use rand::distributions::Alphanumeric;
use rand::Rng;
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// An event as the api published it: the instant its Session's feed
/// broadcast it (right after the commit, in the committing task), and the event.
pub type Publication = (Instant, Arc<Value>);
type PublicationRoutes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Publication>>>>;

pub struct Bench {
    admin: PgConnectOptions,
    pub db_name: String,
    /// The api served in-process. Its `db` is the api's own pool, which the
    /// bench's direct SQL (seeding, the ceiling) uses too; its `ctx` holds the
    /// agent loop's append path and the event feeds.
    pub app: TestApp,
    pub api: Api,
    /// Where the simulated workers of `lease` run: their own threads
    /// (named `bench-client`), so CPU can be told apart from the api's.
    client_rt: Mutex<Option<tokio::runtime::Runtime>>,
    pub client: tokio::runtime::Handle,
    publications: PublicationRoutes,
    observer_installed: std::sync::Once,
    /// This run's files, under [`scratch_root`]: Skill archives
    /// (`archives/`), the root Sessions mount their Memory Stores under
    /// (`memory/`) and the inputs phase's workspaces; removed at teardown.
    pub scratch: std::path::PathBuf,
}

/// The threads the simulated workers run on.
pub const CLIENT_THREAD: &str = "bench-client";

/// `MANGO_BENCH_SCRATCH`, else `/dev/shm` where it is a directory (a
/// tmpfs), else the temporary directory. Memory rather than disk, because
/// the inputs phase writes and removes tens of thousands of files per pass,
/// and a disk mounted with online discard (as this machine's ext4 is) then
/// slows every later file operation for a while, whichever side it is: the
/// comparison is of the workers, not of the disk's TRIM backlog.
pub fn scratch_root() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("MANGO_BENCH_SCRATCH") {
        return dir.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

async fn create_database(admin: &PgConnectOptions) -> anyhow::Result<String> {
    let suffix: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(10)
        .map(|c| (c as char).to_ascii_lowercase())
        .collect();
    let name = format!("mango_bench_{suffix}");
    let mut conn = admin
        .connect()
        .await
        .context("could not connect to the admin database URL")?;
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut conn)
        .await
        .with_context(|| format!("CREATE DATABASE {name}"))?;
    conn.close().await.ok();
    Ok(name)
}

async fn drop_database(admin: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    let mut conn = admin.connect().await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    conn.close().await.ok();
    Ok(())
}

impl Bench {
    /// The api on 127.0.0.1, and on a port of each of `also_on` too (the
    /// Docker bridge's gateway, where sandboxes reach the host). With a
    /// `model` (a Messages API base URL) the api runs its agent loop
    /// against it; without one the bench appends the agent's events itself.
    pub async fn setup(
        admin_url: &str,
        max_connections: u32,
        also_on: &[std::net::IpAddr],
        model: Option<&str>,
    ) -> anyhow::Result<Bench> {
        let admin = PgConnectOptions::from_str(admin_url)
            .context("--database-url / MANGO_DATABASE_URL is not a PostgreSQL URL")?;
        let db_name = create_database(&admin).await?;
        match Self::start(
            admin.clone(),
            db_name.clone(),
            max_connections,
            also_on,
            model,
        )
        .await
        {
            Ok(bench) => Ok(bench),
            Err(err) => {
                drop_database(&admin, &db_name).await.ok();
                Err(err)
            }
        }
    }

    async fn start(
        admin: PgConnectOptions,
        db_name: String,
        max_connections: u32,
        also_on: &[std::net::IpAddr],
        model: Option<&str>,
    ) -> anyhow::Result<Bench> {
        // Exactly as `mango serve` builds its pool.
        let pool = mango_api::db::pool_options(max_connections)
            .connect_with(mango_api::db::as_api_process(
                admin.clone().database(&db_name),
            ))
            .await
            .with_context(|| format!("could not connect to {db_name}"))?;
        MIGRATOR.run(&pool).await.context("migration failed")?;

        let scratch = scratch_root().join(&db_name);
        let settings = Settings {
            skill_archives: mango_api::skills::objects::Archives::local(&scratch.join("archives"))
                .map_err(|e| anyhow::anyhow!("the Skill archive folder: {e}"))?,
            memory_mount_root: scratch.join("memory").to_string_lossy().into_owned(),
            // The inputs phase's store has `--input-memories` (10,000)
            // memories, past the default quota of 4,000; it mounts on the
            // scratch disk, not a sandbox's 64 MiB mount.
            memory_limits: mango_api::memory_quota::MemoryLimits {
                store_max_memories: i64::MAX,
                ..Default::default()
            },
            // Without a model the bench appends the agent's events itself
            // (it measures the api and the runner, not a model).
            caller_plays_model: model.is_none(),
            model_base_url: model.map(str::to_string),
            model_api_key: model
                .map(|_| mango_api::context::Secret("sk-bench-scripted-model".into())),
            // Its clients all come from loopback, one peer: the per-peer
            // cap a hostile sandbox meets would cap the load itself.
            connections: {
                let limits = mango_api::connection_limits::ConnectionLimits::default();
                mango_api::connection_limits::ConnectionLimits {
                    max_per_peer: limits.max_connections,
                    ..limits
                }
            },
            ..Settings::default()
        };
        let ctx = ApiContext::new(pool.clone(), settings);
        // The harness asserts as it sets up: a failure panics its task, not
        // the bench, which then still drops its database. It returns once
        // the LISTEN connection is up, before anything relies on wake-ups.
        let also_on = also_on.to_vec();
        let app = tokio::spawn(async move { TestApp::serve_also_on(pool, ctx, &also_on).await })
            .await
            .context("serving the api in-process")?;
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(CLIENT_THREAD)
            .enable_all()
            .build()?;
        Ok(Bench {
            admin,
            db_name,
            api: Api::new(http_client()?, &app),
            app,
            client: client_rt.handle().clone(),
            client_rt: Mutex::new(Some(client_rt)),
            publications: PublicationRoutes::default(),
            observer_installed: std::sync::Once::new(),
            scratch,
        })
    }

    /// Every event the api publishes to Session `session`'s streams from now
    /// on, stamped as it is broadcast, until `forget_publications`. A feed
    /// exists only while the Session has a subscriber: hold one meanwhile.
    pub fn publications(&self, session: &str) -> mpsc::UnboundedReceiver<Publication> {
        // Installed by the first phase that asks, so the others run without it.
        self.observer_installed.call_once(|| {
            let routes = self.publications.clone();
            self.app
                .ctx
                .events
                .observe_publications(Box::new(move |session, event| {
                    let at = Instant::now();
                    if let Some(tx) = routes.lock().expect("routes lock").get(session) {
                        let _ = tx.send((at, event.body.clone()));
                    }
                }));
        });
        let (tx, rx) = mpsc::unbounded_channel();
        self.publications
            .lock()
            .expect("routes lock")
            .insert(session.to_string(), tx);
        rx
    }

    pub fn forget_publications(&self, session: &str) {
        self.publications
            .lock()
            .expect("routes lock")
            .remove(session);
    }

    /// Stops the server, closes the pool and drops the database.
    pub async fn teardown(&self, keep_db: bool) -> anyhow::Result<()> {
        // Graceful shutdown waits for in-flight long polls (≤ 1 s).
        if let Err(err) = self.app.stop(Duration::from_secs(5)).await {
            eprintln!("{err:#}");
        }
        if let Some(rt) = self.client_rt.lock().expect("runtime lock").take() {
            rt.shutdown_background();
        }
        self.app.db.close().await;
        if self.scratch.exists() {
            std::fs::remove_dir_all(&self.scratch)
                .with_context(|| format!("removing {}", self.scratch.display()))?;
        }
        if keep_db {
            eprintln!("kept database {}", self.db_name);
            return Ok(());
        }
        drop_database(&self.admin, &self.db_name)
            .await
            .with_context(|| format!("DROP DATABASE {}", self.db_name))
    }

    // ------------------------------------------------------------ setup SQL (not measured)

    /// Inserts `count` queued healthchecks at the tail of the queue, as
    /// `store::work::insert` would (same columns), in one statement.
    pub async fn seed(&self, count: i64) -> anyhow::Result<()> {
        if count <= 0 {
            return Ok(());
        }
        let now = time::now();
        sqlx::query(
            "INSERT INTO work (id, environment_id, kind, session_id, metadata, state, ttl_seconds, created_at, expires_at)
             SELECT 'work_' || substr(md5(random()::text || g::text), 1, 24), $1, 'healthcheck', NULL,
                    '{}'::jsonb, 'queued', $2, $3 + g * interval '1 microsecond', $4
             FROM generate_series(1, $5) AS g",
        )
        .bind(&self.app.env_id)
        .bind(Settings::default().default_ttl_seconds as i32)
        .bind(now)
        // Far in the future, so no seeded check times out during the run.
        .bind(now + chrono::Duration::days(1))
        .bind(count)
        .execute(&self.app.db)
        .await
        .context("seeding the queue")?;
        Ok(())
    }

    /// Removes the live (unstopped) rows a phase left behind, so the next
    /// phase starts from an empty queue. Stopped history stays.
    pub async fn clear_live(&self) -> anyhow::Result<u64> {
        let done = sqlx::query("DELETE FROM work WHERE environment_id = $1 AND state <> 'stopped'")
            .bind(&self.app.env_id)
            .execute(&self.app.db)
            .await?;
        Ok(done.rows_affected())
    }

    /// VACUUM ANALYZE of the bench database, then a CHECKPOINT: what earlier
    /// phases left for autovacuum and the checkpointer is done now, not on the
    /// 2 cores while a latency phase measures. Returns what it could not do.
    pub async fn settle(&self) -> Option<String> {
        if let Err(err) = sqlx::raw_sql("VACUUM (ANALYZE)")
            .execute(&self.app.db)
            .await
        {
            return Some(format!("VACUUM: {err}"));
        }
        if let Err(err) = sqlx::raw_sql("CHECKPOINT").execute(&self.app.db).await {
            return Some(format!("CHECKPOINT: {err}"));
        }
        None
    }

    pub async fn count_rows(&self, filter: &str) -> anyhow::Result<i64> {
        let (n,): (i64,) = sqlx::query_as(&format!(
            "SELECT count(*) FROM work WHERE environment_id = $1 AND {filter}"
        ))
        .bind(&self.app.env_id)
        .fetch_one(&self.app.db)
        .await?;
        Ok(n)
    }

    /// Per prepared statement of the pool's connections: how often PostgreSQL
    /// planned it generically vs per execution (custom plans cost a planning
    /// pass every time). Holds every idle connection briefly to ask each one.
    pub async fn plan_cache_report(&self) -> anyhow::Result<Vec<String>> {
        let mut held = Vec::new();
        let mut totals: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        while held.len() < self.app.db.size() as usize {
            let Ok(Ok(mut conn)) =
                tokio::time::timeout(Duration::from_millis(200), self.app.db.acquire()).await
            else {
                break;
            };
            let rows: Vec<(String, i64, i64)> = sqlx::query_as(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
            )
            .fetch_all(&mut *conn)
            .await?;
            for (statement, generic, custom) in rows {
                let words: Vec<&str> = statement.split_whitespace().collect();
                let text: Vec<char> = words.join(" ").chars().collect();
                let label: String = if text.len() <= 100 {
                    text.iter().collect()
                } else {
                    let head: String = text[..45].iter().collect();
                    let tail: String = text[text.len() - 50..].iter().collect();
                    format!("{head} … {tail}")
                };
                let entry = totals.entry(label).or_default();
                entry.0 += generic;
                entry.1 += custom;
            }
            held.push(conn);
        }
        let mut lines = vec![format!(
            "plan cache over {} connections (generic / custom plans):",
            held.len()
        )];
        let mut sorted: Vec<_> = totals.into_iter().collect();
        sorted.sort_by_key(|(_, (g, c))| std::cmp::Reverse(g + c));
        for (label, (generic, custom)) in sorted.into_iter().take(12) {
            lines.push(format!("  {generic:>7} / {custom:>7}  {label}"));
        }
        Ok(lines)
    }

    /// What autovacuum would have done by the time a real queue got here:
    /// dead row versions of earlier phases pruned, statistics fresh.
    pub async fn vacuum(&self) -> anyhow::Result<()> {
        sqlx::query("VACUUM ANALYZE work")
            .execute(&self.app.db)
            .await?;
        Ok(())
    }

    /// Committed + rolled-back transactions of the bench database so far (every
    /// autocommit statement is one). PostgreSQL publishes these from each
    /// backend about once a second, so deltas over a few seconds are approximate.
    pub async fn xacts(&self) -> anyhow::Result<i64> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&self.app.db)
        .await?;
        Ok(n)
    }
}
