//! Environments: the SDK's `BetaEnvironment`, self-hosted only.

use crate::metadata;
use mango_protocol::time::Timestamp;
use mango_protocol::Environment;
use serde_json::Value;
use sqlx::{FromRow, PgExecutor};
use std::collections::BTreeMap;

#[derive(Debug, Clone, FromRow)]
pub struct EnvironmentRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub description: Option<String>,
    pub config: Value,
    pub metadata: Value,
    pub scope: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
}

impl EnvironmentRow {
    pub fn render(&self) -> Environment {
        Environment {
            id: self.id.clone(),
            kind: "environment".into(),
            name: self.name.clone(),
            description: self.description.clone(),
            config: self.config.clone(),
            metadata: metadata::from_json(&self.metadata),
            scope: self.scope.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            archived_at: self.archived_at,
        }
    }
}

const COLUMNS: &str = "id, workspace_id, name, description, config, metadata, scope, created_at, updated_at, archived_at";

pub async fn insert(db: impl PgExecutor<'_>, row: &EnvironmentRow) -> sqlx::Result<EnvironmentRow> {
    let sql = format!(
        "INSERT INTO environments ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.name)
        .bind(&row.description)
        .bind(&row.config)
        .bind(&row.metadata)
        .bind(&row.scope)
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(row.archived_at)
        .fetch_one(db)
        .await
}

pub async fn find(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<Option<EnvironmentRow>> {
    let sql = format!("SELECT {COLUMNS} FROM environments WHERE id = $1 AND workspace_id = $2");
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

/// Writes the mutable fields; `FOR UPDATE` was not needed because the last
/// writer wins field by field exactly as the SDK's update describes.
pub async fn update(
    db: impl PgExecutor<'_>,
    row: &EnvironmentRow,
) -> sqlx::Result<Option<EnvironmentRow>> {
    let sql = format!(
        "UPDATE environments SET name = $3, description = $4, config = $5, metadata = $6, scope = $7,
             updated_at = $8, archived_at = $9
         WHERE id = $1 AND workspace_id = $2 RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.name)
        .bind(&row.description)
        .bind(&row.config)
        .bind(&row.metadata)
        .bind(&row.scope)
        .bind(row.updated_at)
        .bind(row.archived_at)
        .fetch_optional(db)
        .await
}

pub async fn list(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    include_archived: bool,
    after: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<EnvironmentRow>> {
    let (ts, id) = match after {
        Some((ts, id)) => (Some(ts), Some(id)),
        None => (None, None),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM environments
         WHERE workspace_id = $1 AND ($2 OR archived_at IS NULL)
           AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4))
         ORDER BY created_at DESC, id DESC LIMIT $5"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(include_archived)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// Deleting an Environment removes its Work and its Environment keys with it.
pub async fn delete(db: impl PgExecutor<'_>, workspace_id: &str, id: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM environments WHERE id = $1 AND workspace_id = $2")
        .bind(id)
        .bind(workspace_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub fn metadata_of(row: &EnvironmentRow) -> BTreeMap<String, String> {
    metadata::from_json(&row.metadata)
}

/// Locks the Environment row for the rest of the transaction (a Session
/// created meanwhile waits for it); `false` when it does not exist.
pub async fn lock(db: &mut sqlx::PgConnection, workspace_id: &str, id: &str) -> sqlx::Result<bool> {
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM environments WHERE id = $1 AND workspace_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    Ok(found.is_some())
}

/// How many Sessions belong to the Environment.
pub async fn session_count(db: impl PgExecutor<'_>, id: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM sessions WHERE environment_id = $1")
        .bind(id)
        .fetch_one(db)
        .await
}
