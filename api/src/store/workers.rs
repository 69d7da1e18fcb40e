//! Worker sightings: which worker ids polled an Environment lately (Stats'
//! `workers_polling`).

use mango_protocol::time::Timestamp;
use sqlx::PgExecutor;

pub async fn record(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    worker_id: &str,
    now: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO worker_sightings (environment_id, worker_id, last_seen_at) VALUES ($1, $2, $3)
         ON CONFLICT (environment_id, worker_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at",
    )
    .bind(environment_id)
    .bind(worker_id)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn forget_old(db: impl PgExecutor<'_>, now: Timestamp) -> sqlx::Result<u64> {
    let done =
        sqlx::query("DELETE FROM worker_sightings WHERE last_seen_at < $1 - interval '5 minutes'")
            .bind(now)
            .execute(db)
            .await?;
    Ok(done.rows_affected())
}
