//! The connection pool, configured the same way for `mango serve` and the bench.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::time::Duration;

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
