//! The bench's fixture: a throw-away database, the api served in-process on
//! 127.0.0.1:0, a Workspace key, an Environment and its key; plus the HTTP
//! calls of a worker, direct-SQL seeding (setup, never measured) and the small
//! measuring helpers (percentiles, CPU and transaction counters).

use anyhow::{bail, Context};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use mango_api::store::keys;
use mango_api::{server, ApiContext, Settings, MIGRATOR};
use mango_protocol::time;
use rand::distributions::Alphanumeric;
use rand::Rng;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgPool};
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
    /// The api's own pool; the bench's direct SQL (seeding, the ceiling) uses it too.
    pub pool: PgPool,
    /// The in-process api's context: the agent loop's append path, and its event feeds.
    pub ctx: ApiContext,
    pub base: String,
    pub env_id: String,
    pub env_key_id: String,
    pub api: Api,
    /// Where the simulated workers of `lease` run: their own threads
    /// (named `bench-client`), so CPU can be told apart from the api's.
    client_rt: Mutex<Option<tokio::runtime::Runtime>>,
    pub client: tokio::runtime::Handle,
    shutdown: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    server: Mutex<Option<tokio::task::JoinHandle<anyhow::Result<()>>>>,
    publications: PublicationRoutes,
    observer_installed: std::sync::Once,
}

/// A polled item: its id and the sessions token decoded from its secret.
pub struct Claim {
    pub id: String,
    pub token: String,
}

#[derive(Deserialize)]
struct Polled {
    id: String,
    secret: Option<String>,
}

#[derive(Deserialize)]
struct WorkSecret {
    sessions_token: String,
}

/// The sessions token inside a Work secret.
pub fn sessions_token(secret: &str) -> anyhow::Result<String> {
    let raw = URL_SAFE_NO_PAD
        .decode(secret)
        .context("secret is not URL-safe base64 without padding")?;
    let payload: WorkSecret = serde_json::from_slice(&raw)?;
    Ok(payload.sessions_token)
}

#[derive(Deserialize)]
struct Beat {
    last_heartbeat: String,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

/// Creates `mango_bench_<random>` next to the admin URL's database and migrates it.
pub const CLIENT_THREAD: &str = "bench-client";

fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()?)
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
    pub async fn setup(admin_url: &str, max_connections: u32) -> anyhow::Result<Bench> {
        let admin = PgConnectOptions::from_str(admin_url)
            .context("--database-url / MANGO_DATABASE_URL is not a PostgreSQL URL")?;
        let db_name = create_database(&admin).await?;
        match Self::start(admin.clone(), db_name.clone(), max_connections).await {
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
    ) -> anyhow::Result<Bench> {
        // Exactly as `mango serve` builds its pool.
        let pool = mango_api::db::pool_options(max_connections)
            .connect_with(mango_api::db::as_api_process(
                admin.clone().database(&db_name),
            ))
            .await
            .with_context(|| format!("could not connect to {db_name}"))?;
        MIGRATOR.run(&pool).await.context("migration failed")?;

        let ctx = ApiContext::new(pool.clone(), Settings::default());
        let publications = PublicationRoutes::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::serve(ctx.clone(), listener, async {
            let _ = rx.await;
        }));

        let (_, ws_key) =
            keys::create(&pool, "wrkspc_default", None, "bench operator", time::now())
                .await
                .context("creating the Workspace key")?;
        let http = http_client()?;
        let reply = http
            .post(format!("{base}/v1/environments"))
            .bearer_auth(&ws_key)
            .json(&json!({"name": "bench", "config": {"type": "self_hosted"}}))
            .send()
            .await?;
        let status = reply.status();
        let body: Value = reply.json().await?;
        if !status.is_success() {
            bail!("creating the Environment: {status} {body}");
        }
        let env_id = body["id"]
            .as_str()
            .context("Environment without an id")?
            .to_string();
        let (key, env_key) = keys::create(
            &pool,
            "wrkspc_default",
            Some(&env_id),
            "bench supervisor",
            time::now(),
        )
        .await
        .context("creating the Environment key")?;
        // The LISTEN connection is up before anything relies on wake-ups.
        ctx.until_listening().await;
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(CLIENT_THREAD)
            .enable_all()
            .build()?;
        Ok(Bench {
            admin,
            db_name,
            pool,
            ctx,
            api: Api {
                http,
                work_url: format!("{base}/v1/environments/{env_id}/work"),
                ws_key,
                env_key,
            },
            base,
            env_id,
            env_key_id: key.id,
            client: client_rt.handle().clone(),
            client_rt: Mutex::new(Some(client_rt)),
            shutdown: Mutex::new(Some(tx)),
            server: Mutex::new(Some(server)),
            publications,
            observer_installed: std::sync::Once::new(),
        })
    }

    /// Every event the api publishes to Session `session`'s streams from now
    /// on, stamped as it is broadcast, until `forget_publications`. A feed
    /// exists only while the Session has a subscriber: hold one meanwhile.
    pub fn publications(&self, session: &str) -> mpsc::UnboundedReceiver<Publication> {
        // Installed by the first phase that asks, so the others run without it.
        self.observer_installed.call_once(|| {
            let routes = self.publications.clone();
            self.ctx
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
        if let Some(tx) = self.shutdown.lock().expect("shutdown lock").take() {
            let _ = tx.send(());
        }
        let server = self.server.lock().expect("server lock").take();
        if let Some(server) = server {
            // Graceful shutdown waits for in-flight long polls (≤ 1 s).
            match tokio::time::timeout(Duration::from_secs(5), server).await {
                Ok(Ok(Err(err))) => eprintln!("server ended with an error: {err:#}"),
                Ok(_) => {}
                Err(_) => eprintln!("server did not shut down within 5 s"),
            }
        }
        if let Some(rt) = self.client_rt.lock().expect("runtime lock").take() {
            rt.shutdown_background();
        }
        self.pool.close().await;
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
        .bind(&self.env_id)
        .bind(Settings::default().default_ttl_seconds as i32)
        .bind(now)
        // Far in the future, so no seeded check times out during the run.
        .bind(now + chrono::Duration::days(1))
        .bind(count)
        .execute(&self.pool)
        .await
        .context("seeding the queue")?;
        Ok(())
    }

    /// Removes the live (unstopped) rows a phase left behind, so the next
    /// phase starts from an empty queue. Stopped history stays.
    pub async fn clear_live(&self) -> anyhow::Result<u64> {
        let done = sqlx::query("DELETE FROM work WHERE environment_id = $1 AND state <> 'stopped'")
            .bind(&self.env_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// VACUUM ANALYZE of the bench database, then a CHECKPOINT: what earlier
    /// phases left for autovacuum and the checkpointer is done now, not on the
    /// 2 cores while a latency phase measures. Returns what it could not do.
    pub async fn settle(&self) -> Option<String> {
        if let Err(err) = sqlx::raw_sql("VACUUM (ANALYZE)").execute(&self.pool).await {
            return Some(format!("VACUUM: {err}"));
        }
        if let Err(err) = sqlx::raw_sql("CHECKPOINT").execute(&self.pool).await {
            return Some(format!("CHECKPOINT: {err}"));
        }
        None
    }

    pub async fn count_rows(&self, filter: &str) -> anyhow::Result<i64> {
        let (n,): (i64,) = sqlx::query_as(&format!(
            "SELECT count(*) FROM work WHERE environment_id = $1 AND {filter}"
        ))
        .bind(&self.env_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }

    /// Per prepared statement of the pool's connections: how often PostgreSQL
    /// planned it generically vs per execution (custom plans cost a planning
    /// pass every time). Holds every idle connection briefly to ask each one.
    pub async fn plan_cache_report(&self) -> anyhow::Result<Vec<String>> {
        let mut held = Vec::new();
        let mut totals: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        while held.len() < self.pool.size() as usize {
            let Ok(Ok(mut conn)) =
                tokio::time::timeout(Duration::from_millis(200), self.pool.acquire()).await
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
            .execute(&self.pool)
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
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// The HTTP calls of a worker and an operator.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// `{base}/v1/environments/{env_id}/work`
    work_url: String,
    ws_key: String,
    env_key: String,
}

impl Api {
    /// The same calls over a client of their own, whose connections are
    /// driven by whichever runtime first uses it.
    pub fn with_new_client(&self) -> anyhow::Result<Api> {
        Ok(Api {
            http: http_client()?,
            ..self.clone()
        })
    }

    pub fn env_key(&self) -> &str {
        &self.env_key
    }

    /// Poll with the Environment key; `query` is e.g. `""` or `"?block_ms=999"`.
    pub async fn poll(&self, query: &str, worker_id: &str) -> anyhow::Result<Option<Claim>> {
        let reply = self
            .http
            .get(format!("{}/poll{query}", self.work_url))
            .bearer_auth(&self.env_key)
            .header("Anthropic-Worker-ID", worker_id)
            .send()
            .await?;
        let status = reply.status();
        let bytes = reply.bytes().await?;
        if status != StatusCode::OK {
            bail!("poll: {status} {}", String::from_utf8_lossy(&bytes));
        }
        let Some(polled) = serde_json::from_slice::<Option<Polled>>(&bytes)? else {
            return Ok(None);
        };
        let secret = polled.secret.context("Poll returned no secret")?;
        Ok(Some(Claim {
            id: polled.id,
            token: sessions_token(&secret)?,
        }))
    }

    /// Poll with the Environment key, as a supervisor does: the whole item,
    /// secret included; `query` is e.g. `"?block_ms=999"`.
    pub async fn poll_work(
        &self,
        query: &str,
        worker_id: &str,
    ) -> anyhow::Result<Option<mango_protocol::Work>> {
        let reply = self
            .http
            .get(format!("{}/poll{query}", self.work_url))
            .bearer_auth(&self.env_key)
            .header("Anthropic-Worker-ID", worker_id)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, "poll").await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub async fn ack(&self, id: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/{id}/ack", self.work_url))
            .bearer_auth(&self.env_key)
            .send()
            .await?;
        expect(reply, StatusCode::OK, "ack").await.map(drop)
    }

    /// One beat; returns the `last_heartbeat` to echo next time.
    pub async fn heartbeat(&self, claim: &Claim, expected: &str) -> anyhow::Result<String> {
        let expected: String = form_urlencoded::byte_serialize(expected.as_bytes()).collect();
        let reply = self
            .http
            .post(format!(
                "{}/{}/heartbeat?expected_last_heartbeat={expected}",
                self.work_url, claim.id
            ))
            .bearer_auth(&claim.token)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, "heartbeat").await?;
        Ok(serde_json::from_slice::<Beat>(&bytes)?.last_heartbeat)
    }

    /// The holder's own final, forced Stop.
    pub async fn stop(&self, claim: &Claim) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/{}/stop", self.work_url, claim.id))
            .bearer_auth(&claim.token)
            .json(&json!({"force": true}))
            .send()
            .await?;
        expect(reply, StatusCode::NO_CONTENT, "stop")
            .await
            .map(drop)
    }

    /// `{base}/v1`, derived from the Work URL.
    fn v1(&self) -> &str {
        let end = self.work_url.find("/v1/").map_or(0, |i| i + 3);
        &self.work_url[..end]
    }

    /// POST `{base}/v1/{path}` with the Workspace key; returns the new `id`.
    async fn create(&self, path: &str, body: Value) -> anyhow::Result<String> {
        let reply = self
            .http
            .post(format!("{}/{path}", self.v1()))
            .bearer_auth(&self.ws_key)
            .json(&body)
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::OK, path).await?;
        Ok(serde_json::from_slice::<Created>(&bytes)?.id)
    }

    /// Creates an Agent; returns its id.
    pub async fn create_agent(&self, name: &str) -> anyhow::Result<String> {
        self.create("agents", json!({"name": name, "model": "m"}))
            .await
    }

    /// Creates an idle Session of `agent` in `environment_id`; returns its id.
    pub async fn create_session(
        &self,
        agent: &str,
        environment_id: &str,
    ) -> anyhow::Result<String> {
        self.create(
            "sessions",
            json!({"agent": agent, "environment_id": environment_id}),
        )
        .await
    }

    /// Sends one `user.message` carrying `text` to Session `session` with the Workspace key.
    pub async fn send_message(&self, session: &str, text: &str) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/sessions/{session}/events", self.v1()))
            .bearer_auth(&self.ws_key)
            .json(&json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]}))
            .send()
            .await?;
        expect(reply, StatusCode::OK, "send events").await.map(drop)
    }

    /// Sends `events` to Session `session` with `credential` (e.g. a sessions token).
    pub async fn send_events_as(
        &self,
        session: &str,
        credential: &str,
        events: Vec<Value>,
    ) -> anyhow::Result<()> {
        let reply = self
            .http
            .post(format!("{}/sessions/{session}/events", self.v1()))
            .bearer_auth(credential)
            .json(&json!({ "events": events }))
            .send()
            .await?;
        expect(reply, StatusCode::OK, "send events").await.map(drop)
    }

    /// Opens Session `session`'s event stream with the Workspace key; the
    /// response headers have arrived (the server subscribed before answering).
    pub async fn open_stream(&self, session: &str) -> anyhow::Result<reqwest::Response> {
        let reply = self
            .http
            .get(format!("{}/sessions/{session}/events/stream", self.v1()))
            .bearer_auth(&self.ws_key)
            .send()
            .await?;
        let status = reply.status();
        if status != StatusCode::OK {
            let bytes = reply.bytes().await.unwrap_or_default();
            bail!("stream: {status} {}", String::from_utf8_lossy(&bytes));
        }
        Ok(reply)
    }

    /// Creates a healthcheck with the Workspace key; returns its id.
    pub async fn create_check(&self) -> anyhow::Result<String> {
        let reply = self
            .http
            .post(&self.work_url)
            .bearer_auth(&self.ws_key)
            .json(&json!({"data": {"type": "healthcheck"}}))
            .send()
            .await?;
        let bytes = expect(reply, StatusCode::CREATED, "create").await?;
        Ok(serde_json::from_slice::<Created>(&bytes)?.id)
    }
}

async fn expect(reply: reqwest::Response, want: StatusCode, what: &str) -> anyhow::Result<Vec<u8>> {
    let status = reply.status();
    let bytes = reply.bytes().await?;
    if status != want {
        bail!(
            "{what}: expected {want}, got {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    Ok(bytes.to_vec())
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of `samples` (sorted in place), in their unit.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// `p50 / p99` of a list of millisecond samples, formatted.
pub fn summary(samples: &mut [f64]) -> String {
    format!(
        "p50 {:.2} ms, p99 {:.2} ms (n={})",
        percentile(samples, 50.0),
        percentile(samples, 99.0),
        samples.len()
    )
}

/// CPU time, from /proc: the bench's client threads, the rest of this process
/// (the in-process api and sqlx), the PostgreSQL backends serving the bench
/// database, and the whole machine. `None` where /proc is not available.
#[derive(Clone, Copy)]
pub struct CpuSample {
    at: Instant,
    client_ticks: u64,
    api_ticks: u64,
    backend_ticks: u64,
    machine_busy: u64,
}

const TICKS_PER_S: f64 = 100.0;

/// (comm, utime + stime) of one process or thread, from its `stat` file.
fn stat_ticks(path: &std::path::Path) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (head, after) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ")".
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((comm, ticks))
}

fn numbered(dir: &str) -> impl Iterator<Item = std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .map(|e| e.path())
}

/// Summed CPU of the `postgres: <user> <db_name> …` backends visible here.
fn backend_ticks(db_name: &str) -> u64 {
    let needle = format!(" {db_name} ");
    numbered("/proc")
        .filter_map(|path| {
            let cmdline = std::fs::read(path.join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            if !(cmdline.starts_with("postgres: ") && cmdline.contains(&needle)) {
                return None;
            }
            stat_ticks(&path.join("stat")).map(|(_, t)| t)
        })
        .sum()
}

impl CpuSample {
    pub fn take(db_name: &str) -> Option<CpuSample> {
        let (_, process) = stat_ticks(std::path::Path::new("/proc/self/stat"))?;
        let client_ticks = numbered("/proc/self/task")
            .filter_map(|t| stat_ticks(&t.join("stat")))
            .filter(|(comm, _)| comm.starts_with(CLIENT_THREAD))
            .map(|(_, t)| t)
            .sum::<u64>();
        let all = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = all
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3)? + cpu.get(4).copied().unwrap_or(0);
        Some(CpuSample {
            at: Instant::now(),
            client_ticks,
            api_ticks: process.saturating_sub(client_ticks),
            backend_ticks: backend_ticks(db_name),
            machine_busy: total - idle,
        })
    }

    /// Where the CPU went between `self` and `later` (in cores), per cycle
    /// (in ms), and what that would sustain on this machine were it idle.
    pub fn describe(self, later: CpuSample, cycles: u64) -> Vec<String> {
        self.describe_as(later, cycles, "cycle")
    }

    /// [`CpuSample::describe`] for `count` units named `unit` (e.g. "event").
    pub fn describe_as(self, later: CpuSample, cycles: u64, unit: &str) -> Vec<String> {
        let secs = later.at.duration_since(self.at).as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let used = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_S;
        let client = used(self.client_ticks, later.client_ticks);
        let api = used(self.api_ticks, later.api_ticks);
        let pg = used(self.backend_ticks, later.backend_ticks);
        let busy = used(self.machine_busy, later.machine_busy);
        let other = (busy - client - api - pg).max(0.0);
        let per = |s: f64| s * 1000.0 / cycles.max(1) as f64;
        let mut lines = vec![format!(
            "cpu, cores: machine {:.2} of {cores} busy = client {:.2} + api {:.2} + its PostgreSQL backends {:.2} + other load {:.2}",
            busy / secs,
            client / secs,
            api / secs,
            pg / secs,
            other / secs
        )];
        let ours = per(client + api + pg);
        if ours > 0.0 {
            let server = per(api + pg);
            lines.push(format!(
                "cpu per {unit}: client {:.2} ms + api {:.2} ms + PostgreSQL {:.2} ms = {ours:.2} ms → ≈{:.0} {unit}s/s if these {cores} cores were ours alone (server side only: ≈{:.0})",
                per(client),
                per(api),
                per(pg),
                cores * 1000.0 / ours,
                cores * 1000.0 / server
            ));
        }
        lines
    }
}
