//! The connection pool, configured the same way for `mango serve` and the bench.

use sqlx::postgres::PgPoolOptions;
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
