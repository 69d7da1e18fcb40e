//! The connection pool, configured the same way for `mango serve` and the bench.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handlers take one connection per request, and sqlx pings a connection when
/// it goes back to the pool; a ping before every acquire as well would double
/// the round trips of the hot path. A connection broken by a database restart
/// fails one request (a retryable 5xx) and is then discarded.
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
}

const PROCESS_PREFIX: &str = "mango-api ";

/// Names every connection of an api process `mango-api <random>` (its
/// `application_name`): the LISTEN connection registers the process under
/// that name, and a commit of a process that is the only one registered
/// skips the NOTIFY its own streams and agent loop do not need (migration
/// `…_notify_only_when_another_process_listens`).
pub fn as_api_process(options: PgConnectOptions) -> PgConnectOptions {
    let name = format!("{PROCESS_PREFIX}{}", crate::ids::new_id("proc"));
    options.application_name(&name)
}

/// The process name of a pool built with [`as_api_process`]; `None` for any
/// other pool, whose commits always notify.
pub fn api_process(pool: &PgPool) -> Option<String> {
    pool.connect_options()
        .get_application_name()
        .filter(|name| name.starts_with(PROCESS_PREFIX))
        .map(str::to_string)
}

/// A pool for an api process over the database `db` points at (the tests'
/// and fixtures' way to run a server configured as `mango serve` is).
pub async fn api_pool(db: &PgPool, max_connections: u32) -> sqlx::Result<PgPool> {
    pool_options(max_connections)
        .connect_with(as_api_process((*db.connect_options()).clone()))
        .await
}

/// Connections kept out of the pool between hot requests (a worker's tool
/// result, the agent loop's appends), so they skip sqlx's release ping.
///
/// sqlx pings every connection it takes back into the pool: a round trip to
/// PostgreSQL after every request. On these paths it lands just as the
/// commit's readers are woken (a worker is about to receive a tool call),
/// and the two compete for the same CPUs. The ping exists to catch a
/// connection that a cancelled query left mid-protocol; a connection comes
/// back here only from [`ReusedConnection::finish`], called after its last
/// statement completed, and any error or cancellation drops it into the
/// pool's own release (ping included) as before. A connection broken by a
/// database restart fails one request, as pool connections do (see
/// [`pool_options`]), and is dropped then. Kept connections count as in use
/// to the pool, so few are kept (none when the pool is full with nothing
/// idle), none for long, and all are let go as the pool starts closing.
#[derive(Default)]
pub struct ReusedConnections {
    /// Kept connections, each with when it was kept.
    idle: std::sync::Mutex<Vec<(PoolConnection<Postgres>, Instant)>>,
    watching_close: std::sync::OnceLock<()>,
}

/// At most this many are kept, and at most a quarter of the pool: kept
/// connections are out of reach of every other request.
const REUSED_KEPT: u32 = 4;
/// A connection kept longer than this unused goes back to the pool (where
/// its idle timeout and lifetime apply) at the next take.
const REUSED_IDLE: Duration = Duration::from_secs(30);

impl ReusedConnections {
    /// A kept connection, or a fresh one from the pool.
    pub async fn take<'a>(
        self: &'a Arc<Self>,
        pool: &'a PgPool,
    ) -> sqlx::Result<ReusedConnection<'a>> {
        let (kept, stale) = {
            let mut idle = self.idle.lock().expect("reused connections lock");
            // Most recently kept last; anything kept before a stale one is staler.
            let fresh_from = idle
                .iter()
                .position(|(_, at)| at.elapsed() < REUSED_IDLE)
                .unwrap_or(idle.len());
            let stale: Vec<_> = idle.drain(..fresh_from).collect();
            (idle.pop(), stale)
        };
        drop(stale);
        let conn = match kept {
            Some((conn, _)) => conn,
            None => pool.acquire().await?,
        };
        Ok(ReusedConnection {
            conn: Some(conn),
            home: self,
            pool,
        })
    }

    /// How many are kept now.
    pub fn kept(&self) -> usize {
        self.idle.lock().expect("reused connections lock").len()
    }

    fn keep(self: &Arc<Self>, pool: &PgPool, conn: PoolConnection<Postgres>) {
        let max = pool.options().get_max_connections();
        let cap = REUSED_KEPT.min(max / 4) as usize;
        // A pool with nothing idle at its size limit has requests waiting
        // (or about to): they get this connection.
        let pool_exhausted = pool.size() >= max && pool.num_idle() == 0;
        if pool.is_closed() || pool_exhausted || cap == 0 {
            return;
        }
        self.watching_close.get_or_init(|| {
            // `Pool::close` waits for every connection out of the pool.
            let home = Arc::downgrade(self);
            let closing = pool.close_event();
            tokio::spawn(async move {
                closing.await;
                if let Some(home) = home.upgrade() {
                    home.idle.lock().expect("reused connections lock").clear();
                }
            });
        });
        let mut idle = self.idle.lock().expect("reused connections lock");
        if idle.len() < cap && !pool.is_closed() {
            idle.push((conn, Instant::now()));
        }
        // Otherwise `conn` drops into the pool's own release.
    }
}

/// A connection from [`ReusedConnections`]: [`finish`](Self::finish) keeps
/// it for the next request; dropping it hands it back to the pool.
pub struct ReusedConnection<'a> {
    conn: Option<PoolConnection<Postgres>>,
    home: &'a Arc<ReusedConnections>,
    pool: &'a PgPool,
}

impl ReusedConnection<'_> {
    /// Call only when the last statement completed and no transaction is open.
    pub fn finish(mut self) {
        if let Some(conn) = self.conn.take() {
            self.home.keep(self.pool, conn);
        }
    }
}

impl std::ops::Deref for ReusedConnection<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("taken until finish")
    }
}

impl std::ops::DerefMut for ReusedConnection<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("taken until finish")
    }
}
