//! Workspace and Environment keys. The secret is shown once at creation and
//! only its SHA-256 is stored.

use crate::ids;
use mango_protocol::time::Timestamp;
use serde::Serialize;
use sqlx::{FromRow, PgExecutor, PgPool};

#[derive(Debug, Clone, FromRow, Serialize)]
pub struct KeyRow {
    pub id: String,
    pub kind: String,
    pub workspace_id: String,
    pub environment_id: Option<String>,
    pub label: String,
    #[serde(with = "mango_protocol::time::serde_ts")]
    pub created_at: Timestamp,
    #[serde(with = "mango_protocol::time::serde_ts::option")]
    pub last_used_at: Option<Timestamp>,
    #[serde(with = "mango_protocol::time::serde_ts::option")]
    pub revoked_at: Option<Timestamp>,
}

const COLUMNS: &str =
    "id, kind, workspace_id, environment_id, label, created_at, last_used_at, revoked_at";

#[derive(Debug, thiserror::Error)]
pub enum CreateKeyError {
    #[error("workspace {0} does not exist")]
    NoWorkspace(String),
    #[error("environment {0} does not exist in workspace {1}")]
    NoEnvironment(String, String),
    #[error("label must be 1 to 200 characters")]
    BadLabel,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Creates a key and returns it with its one-time secret.
pub async fn create(
    db: &PgPool,
    workspace_id: &str,
    environment_id: Option<&str>,
    label: &str,
    now: Timestamp,
) -> Result<(KeyRow, String), CreateKeyError> {
    if label.trim().is_empty() || label.chars().count() > 200 {
        return Err(CreateKeyError::BadLabel);
    }
    let exists: Option<(String,)> = sqlx::query_as("SELECT id FROM workspaces WHERE id = $1")
        .bind(workspace_id)
        .fetch_optional(db)
        .await?;
    if exists.is_none() {
        return Err(CreateKeyError::NoWorkspace(workspace_id.into()));
    }
    if let Some(env) = environment_id {
        let found: Option<(String,)> =
            sqlx::query_as("SELECT id FROM environments WHERE id = $1 AND workspace_id = $2")
                .bind(env)
                .bind(workspace_id)
                .fetch_optional(db)
                .await?;
        if found.is_none() {
            return Err(CreateKeyError::NoEnvironment(
                env.into(),
                workspace_id.into(),
            ));
        }
    }
    let (kind, prefix) = match environment_id {
        Some(_) => ("environment", ids::ENVIRONMENT_KEY_PREFIX),
        None => ("workspace", ids::WORKSPACE_KEY_PREFIX),
    };
    let secret = ids::new_secret(prefix);
    let sql = format!(
        "INSERT INTO api_keys (id, kind, workspace_id, environment_id, label, secret_sha256, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    );
    let row = sqlx::query_as(&sql)
        .bind(ids::new_id("key"))
        .bind(kind)
        .bind(workspace_id)
        .bind(environment_id)
        .bind(label)
        .bind(ids::sha256(&secret))
        .bind(now)
        .fetch_one(db)
        .await?;
    Ok((row, secret))
}

pub async fn list(db: impl PgExecutor<'_>, workspace_id: &str) -> sqlx::Result<Vec<KeyRow>> {
    let sql =
        format!("SELECT {COLUMNS} FROM api_keys WHERE workspace_id = $1 ORDER BY created_at, id");
    sqlx::query_as(&sql).bind(workspace_id).fetch_all(db).await
}

/// Revokes a key. The UPDATE row-locks the key, so it waits for Poll/Ack
/// statements holding its share lock; after commit the key claims nothing.
/// Returns `None` for an unknown id; revoking twice keeps the first time.
pub async fn revoke(
    db: impl PgExecutor<'_>,
    key_id: &str,
    now: Timestamp,
) -> sqlx::Result<Option<KeyRow>> {
    let sql = format!(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1 RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(key_id)
        .bind(now)
        .fetch_optional(db)
        .await
}

pub async fn find_by_secret(
    db: impl PgExecutor<'_>,
    secret_sha256: &[u8],
) -> sqlx::Result<Option<KeyRow>> {
    let sql = format!("SELECT {COLUMNS} FROM api_keys WHERE secret_sha256 = $1");
    sqlx::query_as(&sql)
        .bind(secret_sha256)
        .fetch_optional(db)
        .await
}

pub async fn is_live(db: impl PgExecutor<'_>, key_id: &str) -> sqlx::Result<bool> {
    let row: Option<(bool,)> =
        sqlx::query_as("SELECT revoked_at IS NULL FROM api_keys WHERE id = $1")
            .bind(key_id)
            .fetch_optional(db)
            .await?;
    Ok(row.is_some_and(|(live,)| live))
}

/// `last_used_at` is advisory; it is written at most once a minute per key so
/// it never contends with the share locks that Poll and Ack take.
pub async fn touch(db: impl PgExecutor<'_>, key_id: &str, now: Timestamp) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE api_keys SET last_used_at = $2
         WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2 - interval '60 seconds')",
    )
    .bind(key_id)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}
