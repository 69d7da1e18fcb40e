//! The outbox: pending wake-ups of the agent loop, one row per commit that
//! left a Session with something to do. Rows are written by
//! [`super::events::append`] and by the schema's trigger on a Session's
//! Work stopping; the loop deletes what it has handled.

use sqlx::PgExecutor;

/// Sessions with a pending wake-up, at most `limit`.
pub async fn pending_sessions(db: impl PgExecutor<'_>, limit: i64) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT DISTINCT session_id FROM outbox LIMIT $1")
        .bind(limit)
        .fetch_all(db)
        .await
}

/// Deletes the Session's wake-ups up to the log head `last_seq` (later
/// input keeps its row and brings the loop back).
pub async fn handled(db: impl PgExecutor<'_>, session_id: &str, last_seq: i64) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM outbox WHERE session_id = $1 AND last_seq <= $2")
        .bind(session_id)
        .bind(last_seq)
        .execute(db)
        .await?;
    Ok(())
}
