//! The gauges `/metrics` reads from the database at each scrape. Each query
//! stays on a partial index of live rows, so its cost follows the live
//! queue, not the history.

use sqlx::PgPool;

/// Live Work of one Environment in one state.
#[derive(Debug, sqlx::FromRow)]
pub struct WorkCount {
    pub environment_id: String,
    pub state: String,
    pub count: i64,
    /// Seconds since the oldest of them was created.
    pub oldest_seconds: f64,
    /// Of them, how many hold a lease that has run out (not yet reclaimed).
    pub expired: i64,
}

pub async fn live_work(db: &PgPool) -> sqlx::Result<Vec<WorkCount>> {
    sqlx::query_as(
        "SELECT environment_id, state, count(*) AS count,
                COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 AS oldest_seconds,
                count(*) FILTER (WHERE lease_expires_at < now()) AS expired
           FROM work WHERE state IN ('queued', 'starting', 'active')
          GROUP BY environment_id, state
         UNION ALL
         SELECT environment_id, state, count(*),
                COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8, 0
           FROM work WHERE state = 'stopping'
          GROUP BY environment_id, state",
    )
    .fetch_all(db)
    .await
}

/// Sessions by status, archived ones apart.
pub async fn sessions_by_status(db: &PgPool) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(
        "SELECT CASE WHEN archived_at IS NULL THEN status ELSE 'archived' END, count(*)
           FROM sessions GROUP BY 1",
    )
    .fetch_all(db)
    .await
}
