//! SQL, and only here: one module per table or concern, next to the row
//! types it reads. Runtime-checked queries (`sqlx::query_as`) keep the build
//! free of a database; every statement runs in the PostgreSQL tests.
//!
//! Text columns that hold wire enums (Work state and type, result status,
//! Session status) are decoded from and bound as the enums' wire names
//! (`mango_protocol::WireEnum`).

pub mod agents;
pub mod cursor;
pub mod environments;
pub mod events;
pub mod gauges;
pub mod keys;
pub mod listeners;
pub mod memory;
pub mod outbox;
pub mod sessions;
pub mod skills;
pub mod steps;
pub mod tool_calls;
pub mod work;
pub mod workers;

/// One round trip: the readiness probe.
pub async fn ping(db: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::query("SELECT 1").execute(db).await?;
    Ok(())
}
