//! What the database tells api processes: the NOTIFY channels the schema's
//! triggers send on, and the registry of listening processes (migration
//! `…_notify_only_when_another_process_listens`): a commit notifies unless
//! its process is the only one registered.

use sqlx::PgExecutor;

/// Payload: the Environment id whose queue gained available work.
pub const WORK_CHANNEL: &str = "mango_work";
/// Payload: `"<session id> <last_seq>"`, the Session whose event log grew and how far.
pub const EVENTS_CHANNEL: &str = "mango_events";
/// Payload: the Session id with new input for the agent loop.
pub const OUTBOX_CHANNEL: &str = "mango_outbox";

pub const CHANNELS: [&str; 3] = [WORK_CHANNEL, EVENTS_CHANNEL, OUTBOX_CHANNEL];

/// Registers `process` under this (listening) connection's backend,
/// clearing registrations whose backend is gone.
pub async fn register(db: impl PgExecutor<'_>, process: &str) -> sqlx::Result<()> {
    sqlx::query(
        "WITH gone AS (
             DELETE FROM listeners
             WHERE process <> $1
               AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
         )
         INSERT INTO listeners (process, backend_pid) VALUES ($1, pg_backend_pid())
         ON CONFLICT (process) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, registered_at = now()",
    )
    .bind(process)
    .execute(db)
    .await?;
    Ok(())
}
