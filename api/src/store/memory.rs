//! Memory Stores, their memories and memory versions
//! (`memory_stores`, `memories`, `memory_versions`).

use crate::memory_quota::Usage;
use crate::metadata;
use mango_protocol::memory::{
    Actor, Memory, MemoryItem, MemoryListItem, MemoryOperation, MemoryPrefix, MemoryStore,
    MemoryVersion,
};
use mango_protocol::time::Timestamp;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, PgExecutor};

// ------------------------------------------------------------------ stores

#[derive(Debug, Clone, FromRow)]
pub struct StoreRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub description: String,
    pub metadata: Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
    pub memory_count: i64,
    pub content_bytes: i64,
    pub version_count: i64,
    pub version_bytes: i64,
}

impl StoreRow {
    /// What the store holds, as its counts say.
    pub fn usage(&self) -> Usage {
        Usage {
            memory_count: self.memory_count,
            content_bytes: self.content_bytes,
            version_count: self.version_count,
            version_bytes: self.version_bytes,
        }
    }

    pub fn render(&self) -> MemoryStore {
        MemoryStore {
            id: self.id.clone(),
            kind: "memory_store".into(),
            name: self.name.clone(),
            description: self.description.clone(),
            metadata: metadata::from_json(&self.metadata),
            created_at: self.created_at,
            updated_at: self.updated_at,
            archived_at: self.archived_at,
        }
    }
}

const STORE_COLUMNS: &str = "id, workspace_id, name, description, metadata, created_at, \
    updated_at, archived_at, memory_count, content_bytes, version_count, version_bytes";

/// Inserts a new, empty store (its counts start at zero).
pub async fn insert_store(db: impl PgExecutor<'_>, row: &StoreRow) -> sqlx::Result<StoreRow> {
    let sql = format!(
        "INSERT INTO memory_stores (id, workspace_id, name, description, metadata, created_at, updated_at, archived_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {STORE_COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.name)
        .bind(&row.description)
        .bind(&row.metadata)
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(row.archived_at)
        .fetch_one(db)
        .await
}

/// A store of the workspace (`None`: of any workspace, for a Session's token).
pub async fn find_store(
    db: impl PgExecutor<'_>,
    workspace_id: Option<&str>,
    id: &str,
) -> sqlx::Result<Option<StoreRow>> {
    let sql = format!(
        "SELECT {STORE_COLUMNS} FROM memory_stores WHERE id = $1 AND ($2::text IS NULL OR workspace_id = $2)"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

/// The stores of `ids` in the workspace, for attaching them to a Session.
pub async fn stores_in(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    ids: &[String],
) -> sqlx::Result<Vec<StoreRow>> {
    let sql = format!(
        "SELECT {STORE_COLUMNS} FROM memory_stores WHERE workspace_id = $1 AND id = ANY($2)"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(ids)
        .fetch_all(db)
        .await
}

/// Locks the store for a write to its memories or versions. Writes to one
/// store take turns (each changes the store's counts, which its quota
/// checks read), and an archive or a delete of the store waits for them
/// and they for it. Every write locks the store before any memory, so a
/// store's delete (which locks its memories) cannot deadlock with one.
pub async fn lock_store_for_write(
    db: &mut PgConnection,
    id: &str,
) -> sqlx::Result<Option<StoreRow>> {
    let sql = format!("SELECT {STORE_COLUMNS} FROM memory_stores WHERE id = $1 FOR NO KEY UPDATE");
    sqlx::query_as(&sql).bind(id).fetch_optional(db).await
}

/// Writes the store's counts (under [`lock_store_for_write`]).
pub async fn set_usage(db: &mut PgConnection, id: &str, usage: &Usage) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE memory_stores SET memory_count = $2, content_bytes = $3, version_count = $4, version_bytes = $5
         WHERE id = $1",
    )
    .bind(id)
    .bind(usage.memory_count)
    .bind(usage.content_bytes)
    .bind(usage.version_count)
    .bind(usage.version_bytes)
    .execute(db)
    .await?;
    Ok(())
}

/// Locks the store for a change of the store itself.
pub async fn lock_store(
    db: &mut PgConnection,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<Option<StoreRow>> {
    let sql = format!(
        "SELECT {STORE_COLUMNS} FROM memory_stores WHERE id = $1 AND workspace_id = $2 FOR UPDATE"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

pub async fn update_store(db: &mut PgConnection, row: &StoreRow) -> sqlx::Result<StoreRow> {
    let sql = format!(
        "UPDATE memory_stores SET name = $2, description = $3, metadata = $4, updated_at = $5, archived_at = $6
         WHERE id = $1 RETURNING {STORE_COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.name)
        .bind(&row.description)
        .bind(&row.metadata)
        .bind(row.updated_at)
        .bind(row.archived_at)
        .fetch_one(db)
        .await
}

pub async fn delete_store(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM memory_stores WHERE id = $1 AND workspace_id = $2")
        .bind(id)
        .bind(workspace_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub struct StoreFilter<'a> {
    pub workspace_id: &'a str,
    pub created_gte: Option<Timestamp>,
    pub created_lte: Option<Timestamp>,
    pub include_archived: bool,
}

/// Newest first, strictly after the cursor.
pub async fn list_stores(
    db: impl PgExecutor<'_>,
    filter: &StoreFilter<'_>,
    cursor: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<StoreRow>> {
    let (ts, id) = cursor.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "SELECT {STORE_COLUMNS} FROM memory_stores
         WHERE workspace_id = $1
           AND ($2::timestamptz IS NULL OR created_at >= $2)
           AND ($3::timestamptz IS NULL OR created_at <= $3)
           AND ($4 OR archived_at IS NULL)
           AND ($5::timestamptz IS NULL OR (created_at, id) < ($5, $6))
         ORDER BY created_at DESC, id DESC
         LIMIT $7"
    );
    sqlx::query_as(&sql)
        .bind(filter.workspace_id)
        .bind(filter.created_gte)
        .bind(filter.created_lte)
        .bind(filter.include_archived)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

// ------------------------------------------------------------------ memories

#[derive(Debug, Clone, FromRow)]
pub struct MemoryRow {
    pub id: String,
    pub memory_store_id: String,
    pub path: String,
    pub content: String,
    pub content_sha256: String,
    pub content_size_bytes: i32,
    pub memory_version_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl MemoryRow {
    pub fn render(&self, full: bool) -> Memory {
        Memory {
            id: self.id.clone(),
            kind: "memory".into(),
            memory_store_id: self.memory_store_id.clone(),
            memory_version_id: self.memory_version_id.clone(),
            path: self.path.clone(),
            content: full.then(|| self.content.clone()),
            content_sha256: self.content_sha256.clone(),
            content_size_bytes: i64::from(self.content_size_bytes),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

const MEMORY_COLUMNS: &str = "id, memory_store_id, path, content, content_sha256, \
    content_size_bytes, memory_version_id, created_at, updated_at";

/// Inserts a memory unless its path is taken (`None`).
pub async fn insert_memory(
    db: &mut PgConnection,
    row: &MemoryRow,
) -> sqlx::Result<Option<MemoryRow>> {
    let sql = format!(
        "INSERT INTO memories ({MEMORY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT ON CONSTRAINT memories_one_per_path DO NOTHING RETURNING {MEMORY_COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.memory_store_id)
        .bind(&row.path)
        .bind(&row.content)
        .bind(&row.content_sha256)
        .bind(row.content_size_bytes)
        .bind(&row.memory_version_id)
        .bind(row.created_at)
        .bind(row.updated_at)
        .fetch_optional(db)
        .await
}

pub async fn find_memory(
    db: impl PgExecutor<'_>,
    store_id: &str,
    id: &str,
) -> sqlx::Result<Option<MemoryRow>> {
    let sql =
        format!("SELECT {MEMORY_COLUMNS} FROM memories WHERE id = $1 AND memory_store_id = $2");
    sqlx::query_as(&sql)
        .bind(id)
        .bind(store_id)
        .fetch_optional(db)
        .await
}

/// The memory at `path`, if any.
pub async fn memory_at(
    db: impl PgExecutor<'_>,
    store_id: &str,
    path: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT id FROM memories WHERE memory_store_id = $1 AND path = $2")
        .bind(store_id)
        .bind(path)
        .fetch_optional(db)
        .await
}

/// Locks a memory for its update or deletion.
pub async fn lock_memory(
    db: &mut PgConnection,
    store_id: &str,
    id: &str,
) -> sqlx::Result<Option<MemoryRow>> {
    let sql = format!(
        "SELECT {MEMORY_COLUMNS} FROM memories WHERE id = $1 AND memory_store_id = $2 FOR UPDATE"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(store_id)
        .fetch_optional(db)
        .await
}

/// Writes a memory's new path and content. `Ok(None)`: another memory has the path.
pub async fn update_memory(
    db: &mut PgConnection,
    row: &MemoryRow,
) -> sqlx::Result<Option<MemoryRow>> {
    let sql = format!(
        "UPDATE memories SET path = $2, content = $3, content_sha256 = $4, content_size_bytes = $5,
                memory_version_id = $6, updated_at = $7
         WHERE id = $1 RETURNING {MEMORY_COLUMNS}"
    );
    // A rename onto a taken path breaks the unique constraint; the savepoint
    // keeps the transaction usable so the caller can answer with a conflict.
    let mut savepoint = sqlx::Connection::begin(&mut *db).await?;
    let done = sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.path)
        .bind(&row.content)
        .bind(&row.content_sha256)
        .bind(row.content_size_bytes)
        .bind(&row.memory_version_id)
        .bind(row.updated_at)
        .fetch_one(&mut *savepoint)
        .await;
    match done {
        Ok(row) => {
            savepoint.commit().await?;
            Ok(Some(row))
        }
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("memories_one_per_path") => {
            savepoint.rollback().await?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

pub async fn delete_memory(db: &mut PgConnection, id: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM memories WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

pub struct MemoryFilter<'a> {
    pub store_id: &'a str,
    /// `/`, or whole segments ending in `/`.
    pub prefix: &'a str,
    /// 0: every memory below the prefix; N: memories at most N segments
    /// below it, deeper ones rolled up into their N-segment prefix.
    pub depth: i32,
    pub full: bool,
}

#[derive(FromRow)]
struct ListedRow {
    key: String,
    #[sqlx(flatten)]
    memory: OptionalMemory,
}

#[derive(FromRow)]
struct OptionalMemory {
    id: Option<String>,
    memory_store_id: Option<String>,
    path: Option<String>,
    content: Option<String>,
    content_sha256: Option<String>,
    content_size_bytes: Option<i32>,
    memory_version_id: Option<String>,
    created_at: Option<Timestamp>,
    updated_at: Option<Timestamp>,
}

/// One page of a store's memories and prefixes, by key (a memory's path, or
/// a prefix ending in `/`) in byte order, strictly after `after`. A page
/// reads one index range: the prefix's paths sort between the prefix and the
/// prefix with its closing `/` raised to `0`.
///
/// With depth 0 (every memory below the prefix, what workers list) the keys
/// are the paths, so the range is read from the cursor only as far as the
/// page. With a depth, deeper paths roll up into prefixes that must be told
/// apart first, which reads the rest of the range after the cursor.
pub async fn list_memories(
    db: impl PgExecutor<'_>,
    filter: &MemoryFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<(String, MemoryListItem)>> {
    let upper = format!("{}0", &filter.prefix[..filter.prefix.len() - 1]);
    let content = if filter.full {
        "m.content"
    } else {
        "NULL::text"
    };
    let columns = format!(
        "m.id, m.memory_store_id, m.path, {content} AS content, m.content_sha256, \
         m.content_size_bytes, m.memory_version_id, m.created_at, m.updated_at"
    );
    let rows: Vec<ListedRow> = if filter.depth == 0 {
        let sql = format!(
            "SELECT m.path AS key, {columns}
             FROM memories m
             WHERE m.memory_store_id = $1 AND m.path >= $2 AND m.path < $3
               AND ($4::text IS NULL OR m.path > $4)
             ORDER BY m.path
             LIMIT $5"
        );
        sqlx::query_as(&sql)
            .bind(filter.store_id)
            .bind(filter.prefix)
            .bind(&upper)
            .bind(after)
            .bind(limit)
            .fetch_all(db)
            .await?
    } else {
        let sql = format!(
            "WITH keys AS (
                 SELECT DISTINCT
                        CASE WHEN cardinality(string_to_array(substr(path, char_length($2) + 1), '/')) <= $4
                             THEN path
                             ELSE $2 || array_to_string((string_to_array(substr(path, char_length($2) + 1), '/'))[1:$4], '/') || '/'
                        END COLLATE \"C\" AS key
                 FROM memories
                 WHERE memory_store_id = $1 AND path >= $2 AND path < $3
                   AND ($5::text IS NULL OR path > $5)
             ),
             page AS (
                 SELECT key FROM keys WHERE $5::text IS NULL OR key > $5 ORDER BY key LIMIT $6
             )
             SELECT page.key, {columns}
             FROM page LEFT JOIN memories m ON m.memory_store_id = $1 AND m.path = page.key
             ORDER BY page.key"
        );
        sqlx::query_as(&sql)
            .bind(filter.store_id)
            .bind(filter.prefix)
            .bind(&upper)
            .bind(filter.depth)
            .bind(after)
            .bind(limit)
            .fetch_all(db)
            .await?
    };
    Ok(rows
        .into_iter()
        .map(|r| {
            let m = r.memory;
            let item = match (
                m.id,
                m.memory_store_id,
                m.path,
                m.content_sha256,
                m.content_size_bytes,
                m.memory_version_id,
                m.created_at,
                m.updated_at,
            ) {
                (
                    Some(id),
                    Some(memory_store_id),
                    Some(path),
                    Some(content_sha256),
                    Some(size),
                    Some(memory_version_id),
                    Some(created_at),
                    Some(updated_at),
                ) => MemoryListItem::Memory(MemoryItem {
                    id,
                    memory_store_id,
                    memory_version_id,
                    path,
                    content: m.content,
                    content_sha256,
                    content_size_bytes: i64::from(size),
                    created_at,
                    updated_at,
                }),
                _ => MemoryListItem::MemoryPrefix(MemoryPrefix {
                    path: r.key.clone(),
                }),
            };
            (r.key, item)
        })
        .collect())
}

// ------------------------------------------------------------------ write allowances

/// Takes one memory write from the allowance of the claim `claim_epoch` of
/// Work `work_id` (GCRA: admitted while the next write due is at most
/// `tolerance_us` ahead of `now`; each write moves it `interval_us` on; a
/// new claim starts afresh). `None`: admitted; otherwise when the next
/// write is due, and nothing changed.
pub async fn take_write_allowance(
    db: &mut PgConnection,
    work_id: &str,
    claim_epoch: i64,
    now: Timestamp,
    interval_us: i64,
    tolerance_us: i64,
) -> sqlx::Result<Option<Timestamp>> {
    let admitted: Option<Timestamp> = sqlx::query_scalar(
        "INSERT INTO memory_write_allowances AS a (work_id, claim_epoch, next_write_at)
         VALUES ($1, $2, $3 + $4 * interval '1 microsecond')
         ON CONFLICT (work_id) DO UPDATE
         SET claim_epoch = EXCLUDED.claim_epoch,
             next_write_at = CASE WHEN a.claim_epoch = EXCLUDED.claim_epoch
                                  THEN greatest(a.next_write_at, $3) ELSE $3 END
                             + $4 * interval '1 microsecond'
         WHERE a.claim_epoch <> EXCLUDED.claim_epoch
            OR a.next_write_at <= $3 + $5 * interval '1 microsecond'
         RETURNING next_write_at",
    )
    .bind(work_id)
    .bind(claim_epoch)
    .bind(now)
    .bind(interval_us)
    .bind(tolerance_us)
    .fetch_optional(&mut *db)
    .await?;
    if admitted.is_some() {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT next_write_at FROM memory_write_allowances WHERE work_id = $1")
        .bind(work_id)
        .fetch_optional(db)
        .await
}

// ------------------------------------------------------------------ versions

#[derive(Debug, Clone, FromRow)]
pub struct VersionRow {
    pub id: String,
    pub memory_store_id: String,
    pub memory_id: String,
    #[sqlx(try_from = "String")]
    pub operation: MemoryOperation,
    pub path: Option<String>,
    pub content: Option<String>,
    pub content_sha256: Option<String>,
    pub content_size_bytes: Option<i32>,
    pub created_by: Option<Json<Actor>>,
    pub created_at: Timestamp,
    pub redacted_at: Option<Timestamp>,
    pub redacted_by: Option<Json<Actor>>,
}

impl VersionRow {
    pub fn render(&self, full: bool) -> MemoryVersion {
        MemoryVersion {
            id: self.id.clone(),
            kind: "memory_version".into(),
            memory_id: self.memory_id.clone(),
            memory_store_id: self.memory_store_id.clone(),
            operation: self.operation,
            content: self.content.clone().filter(|_| full),
            content_sha256: self.content_sha256.clone(),
            content_size_bytes: self.content_size_bytes.map(i64::from),
            path: self.path.clone(),
            created_by: self.created_by.as_ref().map(|a| a.0.clone()),
            created_at: self.created_at,
            redacted_at: self.redacted_at,
            redacted_by: self.redacted_by.as_ref().map(|a| a.0.clone()),
        }
    }
}

const VERSION_COLUMNS: &str = "id, memory_store_id, memory_id, operation, path, content, \
    content_sha256, content_size_bytes, created_by, created_at, redacted_at, redacted_by";

pub async fn insert_version(db: &mut PgConnection, row: &VersionRow) -> sqlx::Result<()> {
    let sql = format!(
        "INSERT INTO memory_versions ({VERSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    );
    sqlx::query(&sql)
        .bind(&row.id)
        .bind(&row.memory_store_id)
        .bind(&row.memory_id)
        .bind(row.operation.as_str())
        .bind(&row.path)
        .bind(&row.content)
        .bind(&row.content_sha256)
        .bind(row.content_size_bytes)
        .bind(&row.created_by)
        .bind(row.created_at)
        .bind(row.redacted_at)
        .bind(&row.redacted_by)
        .execute(db)
        .await?;
    Ok(())
}

pub async fn find_version(
    db: impl PgExecutor<'_>,
    store_id: &str,
    id: &str,
) -> sqlx::Result<Option<VersionRow>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM memory_versions WHERE id = $1 AND memory_store_id = $2"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(store_id)
        .fetch_optional(db)
        .await
}

/// Up to `limit` of the store's versions that are no memory's current one,
/// oldest first: their ids and the content bytes each holds.
pub async fn oldest_history(
    db: &mut PgConnection,
    store_id: &str,
    limit: i64,
) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(
        "SELECT v.id, coalesce(v.content_size_bytes, 0)::bigint
         FROM memory_versions v
         WHERE v.memory_store_id = $1
           AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.memory_version_id = v.id)
         ORDER BY v.created_at, v.id
         LIMIT $2",
    )
    .bind(store_id)
    .bind(limit)
    .fetch_all(db)
    .await
}

pub async fn delete_versions(db: &mut PgConnection, ids: &[String]) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM memory_versions WHERE id = ANY($1)")
        .bind(ids)
        .execute(db)
        .await?;
    Ok(())
}

/// Whether version `id` holds a live memory's current content.
pub async fn version_is_current(db: &mut PgConnection, id: &str) -> sqlx::Result<bool> {
    let found: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM memories WHERE memory_version_id = $1 FOR SHARE")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(found.is_some())
}

pub async fn redact_version(
    db: &mut PgConnection,
    store_id: &str,
    id: &str,
    by: &Actor,
    now: Timestamp,
) -> sqlx::Result<Option<VersionRow>> {
    let sql = format!(
        "UPDATE memory_versions
         SET content = NULL, path = NULL, content_sha256 = NULL, content_size_bytes = NULL,
             redacted_at = COALESCE(redacted_at, $3), redacted_by = COALESCE(redacted_by, $4)
         WHERE id = $1 AND memory_store_id = $2 RETURNING {VERSION_COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(store_id)
        .bind(now)
        .bind(Json(by))
        .fetch_optional(db)
        .await
}

pub struct VersionFilter<'a> {
    pub store_id: &'a str,
    pub memory_id: Option<&'a str>,
    pub operation: Option<MemoryOperation>,
    pub session_id: Option<&'a str>,
    pub api_key_id: Option<&'a str>,
    pub service_account_id: Option<&'a str>,
    pub created_gte: Option<Timestamp>,
    pub created_lte: Option<Timestamp>,
}

/// Newest first, strictly after the cursor.
pub async fn list_versions(
    db: impl PgExecutor<'_>,
    filter: &VersionFilter<'_>,
    cursor: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<VersionRow>> {
    let (ts, id) = cursor.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM memory_versions
         WHERE memory_store_id = $1
           AND ($2::text IS NULL OR memory_id = $2)
           AND ($3::text IS NULL OR operation = $3)
           AND ($4::text IS NULL OR created_by->>'session_id' = $4)
           AND ($5::text IS NULL OR created_by->>'api_key_id' = $5)
           AND ($6::text IS NULL OR created_by->>'service_account_id' = $6)
           AND ($7::timestamptz IS NULL OR created_at >= $7)
           AND ($8::timestamptz IS NULL OR created_at <= $8)
           AND ($9::timestamptz IS NULL OR (created_at, id) < ($9, $10))
         ORDER BY created_at DESC, id DESC
         LIMIT $11"
    );
    sqlx::query_as(&sql)
        .bind(filter.store_id)
        .bind(filter.memory_id)
        .bind(filter.operation.map(|o| o.as_str()))
        .bind(filter.session_id)
        .bind(filter.api_key_id)
        .bind(filter.service_account_id)
        .bind(filter.created_gte)
        .bind(filter.created_lte)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}
