//! One agent-loop step per Session at a time across replicas: a session-level
//! advisory lock, held on one connection for the whole step and released
//! with it if the process dies.

use sqlx::PgConnection;

/// Namespaces the lock key so it cannot collide with other advisory locks.
const STEP_LOCK_SEED: i64 = 77;

/// `false`: another process is stepping the Session.
pub async fn try_lock(conn: &mut PgConnection, session_id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, $2))")
        .bind(session_id)
        .bind(STEP_LOCK_SEED)
        .fetch_one(conn)
        .await
}

pub async fn unlock(conn: &mut PgConnection, session_id: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, $2))")
        .bind(session_id)
        .bind(STEP_LOCK_SEED)
        .execute(conn)
        .await?;
    Ok(())
}
