//! Writing Agents: a new Agent is its head row and version 1; an update
//! writes the next immutable version under the head's lock, or nothing when
//! the definition did not change.

use crate::error::ApiResult;
use crate::store::agents::{self, AgentRow, Version};
use mango_protocol::time::Timestamp;
use sqlx::PgConnection;

pub async fn create(
    conn: &mut PgConnection,
    workspace_id: &str,
    id: &str,
    version: &Version,
    at: Timestamp,
) -> ApiResult<AgentRow> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    agents::insert_head(&mut *tx, workspace_id, id, at).await?;
    agents::insert_version(&mut *tx, id, 1, version, at).await?;
    tx.commit().await?;
    Ok(agents::find(&mut *conn, workspace_id, id, None)
        .await?
        .expect("the agent just created"))
}

/// What an update found under the head row's lock.
pub enum Updated {
    NotFound,
    Archived,
    /// `expected` did not match the head: carries the current version.
    Conflict(i32),
    /// The new latest version (or the unchanged head when nothing changed).
    Saved(Box<AgentRow>),
}

/// Locks the head, checks `expected`, computes the next version from the
/// current one with `apply`, and writes it unless it is unchanged.
pub async fn update(
    conn: &mut PgConnection,
    workspace_id: &str,
    id: &str,
    expected: Option<i32>,
    at: Timestamp,
    apply: impl FnOnce(&Version) -> ApiResult<Version>,
) -> ApiResult<Updated> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let Some((current, archived_at)) = agents::lock_head(&mut tx, workspace_id, id).await? else {
        return Ok(Updated::NotFound);
    };
    if archived_at.is_some() {
        return Ok(Updated::Archived);
    }
    if expected.is_some_and(|e| e != current) {
        return Ok(Updated::Conflict(current));
    }
    let row = agents::find(&mut *tx, workspace_id, id, None)
        .await?
        .expect("the locked agent has its latest version");
    let next = apply(&row.version())?;
    if next == row.version() {
        return Ok(Updated::Saved(Box::new(row)));
    }
    agents::insert_version(&mut *tx, id, current + 1, &next, at).await?;
    agents::set_head_version(&mut *tx, id, current + 1, at).await?;
    let saved = agents::find(&mut *tx, workspace_id, id, None)
        .await?
        .expect("the agent just updated");
    tx.commit().await?;
    Ok(Updated::Saved(Box::new(saved)))
}
