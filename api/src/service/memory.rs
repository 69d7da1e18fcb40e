//! Writing memories: each change of a memory and its version commit
//! together with the store's counts, under the store's row lock (writes to
//! one store take turns; an archive or delete of the store waits), checked
//! against the store's quotas, its oldest history pruned past its bounds
//! ([`crate::memory_quota`]); for a Session's runner, fenced on its Work
//! claim and charged to that claim's write allowance in the same
//! transaction: the write commits only while that claim is live, and a
//! refused write charges nothing.
//! Also: a store's own update and archive, each under its row lock, and
//! checking and snapshotting the stores a new Session attaches.

use crate::error::{ApiError, ApiResult};
use crate::ids;
use crate::lease::TokenUse;
use crate::memory_quota::{self, Allowance, MemoryLimits, Usage};
use crate::memory_rules::{self, MAX_INSTRUCTIONS_CHARS};
use crate::metadata;
use crate::store::memory::{self as store, MemoryRow, StoreRow, VersionRow};
use crate::store::work;
use mango_protocol::memory::{Actor, MemoryOperation, UpdateMemoryStore};
use mango_protocol::patch::Patch;
use mango_protocol::sessions::{MemoryAccess, SessionResource};
use mango_protocol::time::{self, Timestamp};
use mango_protocol::{ErrorCode, ErrorType};
use serde_json::json;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// At most this many Memory Stores attach to one Session.
pub const MAX_ATTACHED_STORES: usize = 8;
/// A write prunes at most this many of its store's oldest versions (more
/// than the one it adds, so a history past lowered bounds shrinks with
/// every write without any one write doing it all).
const PRUNE_BATCH: i64 = 500;

/// Who writes.
#[derive(Debug, Clone)]
pub enum Writer {
    /// A Workspace key.
    Operator { key_id: String },
    /// A Session's runner: its Work claim fences the write.
    Session {
        session_id: String,
        work_id: String,
        claim_epoch: i64,
    },
}

impl Writer {
    fn actor(&self) -> Actor {
        match self {
            Writer::Operator { key_id } => Actor::ApiActor {
                api_key_id: key_id.clone(),
            },
            Writer::Session { session_id, .. } => Actor::SessionActor {
                session_id: session_id.clone(),
            },
        }
    }
}

pub fn store_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("memory store {id} not found")).code(ErrorCode::MemoryStoreNotFound)
}

pub fn memory_not_found(store: &str, id: &str) -> ApiError {
    ApiError::not_found(format!("memory {id} not found in memory store {store}"))
        .code(ErrorCode::MemoryNotFound)
}

fn archived(store: &StoreRow) -> ApiError {
    ApiError::bad_request(format!(
        "memory store {} is archived: its memories can be read and deleted, not created or changed",
        store.id
    ))
    .code(ErrorCode::MemoryStoreArchived)
}

fn precondition_failed(memory: &MemoryRow, expected: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::CONFLICT,
        ErrorType::MemoryPreconditionFailedError,
        format!(
            "memory {} no longer has content_sha256 {expected}; it changed since it was read, and nothing was written",
            memory.id
        ),
    )
    .code(ErrorCode::MemoryPreconditionFailed)
    .detail("current_content_sha256", json!(memory.content_sha256))
    .final_answer()
}

fn path_conflict(path: &str, holder: Option<String>) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::CONFLICT,
        ErrorType::MemoryPathConflictError,
        format!("another memory of this store has the path {path:?}; nothing was written"),
    )
    .code(ErrorCode::MemoryPathConflict)
    .detail("memory_id", json!(holder))
    .final_answer()
}

/// The writer's claim, held for the transaction; 401 once it is not live.
async fn fence(tx: &mut PgConnection, writer: &Writer, now: Timestamp) -> ApiResult<()> {
    let Writer::Session {
        work_id,
        claim_epoch,
        ..
    } = writer
    else {
        return Ok(());
    };
    let Some(row) = work::hold_claim(tx, work_id, *claim_epoch).await? else {
        return Err(ApiError::unauthenticated(
            "this sessions token's claim was replaced: a newer holder serves its Work",
        ));
    };
    row.lease()
        .reconcile(now)
        .admits_token(TokenUse::Session, now)
        .map_err(|r| ApiError::unauthenticated(r.message()))
}

/// The store, locked for a write; refused when archived and `writing`.
async fn held_store(tx: &mut PgConnection, store_id: &str, writing: bool) -> ApiResult<StoreRow> {
    let store = store::lock_store_for_write(tx, store_id)
        .await?
        .ok_or_else(|| store_not_found(store_id))?;
    if writing && store.archived_at.is_some() {
        return Err(archived(&store));
    }
    Ok(store)
}

/// A runner's write charged to its claim's allowance (a Workspace key's
/// writes are not rate limited); 429 with `retry-after` when it is spent.
async fn charge(
    tx: &mut PgConnection,
    writer: &Writer,
    limits: &MemoryLimits,
    now: Timestamp,
) -> ApiResult<()> {
    let Writer::Session {
        work_id,
        claim_epoch,
        ..
    } = writer
    else {
        return Ok(());
    };
    let allowance = Allowance::of(limits);
    let refused = store::take_write_allowance(
        tx,
        work_id,
        *claim_epoch,
        now,
        allowance.interval_us,
        allowance.tolerance_us,
    )
    .await?;
    let Some(next_write_at) = refused else {
        return Ok(());
    };
    let due_in_us = (next_write_at - now).num_microseconds().unwrap_or(i64::MAX);
    let seconds = allowance.retry_after_seconds(due_in_us);
    Err(ApiError::rate_limited(
        format!(
            "this sessions token wrote memories faster than its allowance ({} a minute, {} at once); nothing was written, retry in {seconds} s",
            limits.writes_per_minute, limits.write_burst
        ),
        seconds,
    )
    .code(ErrorCode::MemoryWriteRateLimited))
}

/// The start of every memory write: the writer fenced on its claim and
/// charged, then the store locked (in this order everywhere).
async fn begin_write<'c>(
    db: &'c PgPool,
    store_id: &str,
    writer: &Writer,
    limits: &MemoryLimits,
    writing: bool,
    now: Timestamp,
) -> ApiResult<(Transaction<'c, Postgres>, StoreRow)> {
    let mut tx = db.begin().await?;
    fence(&mut tx, writer, now).await?;
    charge(&mut tx, writer, limits, now).await?;
    let store = held_store(&mut tx, store_id, writing).await?;
    Ok((tx, store))
}

/// Writes the store's counts as `usage` after pruning its oldest history
/// past the bounds (never a version holding a live memory's content).
async fn settle_usage(
    tx: &mut PgConnection,
    store_id: &str,
    limits: &MemoryLimits,
    mut usage: Usage,
) -> ApiResult<()> {
    let excess = memory_quota::history_excess(limits, &usage);
    if excess.any() {
        let oldest = store::oldest_history(tx, store_id, PRUNE_BATCH).await?;
        let sizes: Vec<i64> = oldest.iter().map(|(_, size)| *size).collect();
        let n = memory_quota::prune_count(&sizes, excess);
        let ids: Vec<String> = oldest[..n].iter().map(|(id, _)| id.clone()).collect();
        store::delete_versions(tx, &ids).await?;
        usage.version_count -= n as i64;
        usage.version_bytes -= sizes[..n].iter().sum::<i64>();
    }
    store::set_usage(tx, store_id, &usage).await?;
    Ok(())
}

fn version(
    memory: &MemoryRow,
    operation: MemoryOperation,
    writer: &Writer,
    now: Timestamp,
) -> VersionRow {
    let deleted = operation == MemoryOperation::Deleted;
    VersionRow {
        id: memory.memory_version_id.clone(),
        memory_store_id: memory.memory_store_id.clone(),
        memory_id: memory.id.clone(),
        operation,
        path: Some(memory.path.clone()),
        content: (!deleted).then(|| memory.content.clone()),
        content_sha256: (!deleted).then(|| memory.content_sha256.clone()),
        content_size_bytes: (!deleted).then_some(memory.content_size_bytes),
        created_by: Some(Json(writer.actor())),
        created_at: now,
        redacted_at: None,
        redacted_by: None,
    }
}

/// A new memory at `path` (checked) with `content` (checked).
pub async fn create(
    db: &PgPool,
    limits: &MemoryLimits,
    store_id: &str,
    writer: &Writer,
    path: &str,
    content: String,
) -> ApiResult<MemoryRow> {
    let now = time::now();
    let (mut tx, store) = begin_write(db, store_id, writer, limits, true, now).await?;
    let size = content.len() as i64;
    let usage = store.usage().created(size);
    memory_quota::check_quota(store_id, limits, store.usage(), usage)?;
    let row = MemoryRow {
        id: ids::new_id("mem"),
        memory_store_id: store_id.to_string(),
        path: path.to_string(),
        content_sha256: memory_rules::content_sha256(&content),
        content_size_bytes: size as i32,
        content,
        memory_version_id: ids::new_id("memver"),
        created_at: now,
        updated_at: now,
    };
    let Some(saved) = store::insert_memory(&mut tx, &row).await? else {
        let holder = store::memory_at(&mut *tx, store_id, path).await?;
        return Err(path_conflict(path, holder));
    };
    store::insert_version(
        &mut tx,
        &version(&saved, MemoryOperation::Created, writer, now),
    )
    .await?;
    settle_usage(&mut tx, store_id, limits, usage).await?;
    tx.commit().await?;
    Ok(saved)
}

/// A change of a memory (both checked); nothing changes and no version is
/// written when neither differs from what is stored.
pub struct Change {
    pub content: Option<String>,
    pub path: Option<String>,
    pub expected_sha256: Option<String>,
}

pub async fn update(
    db: &PgPool,
    limits: &MemoryLimits,
    store_id: &str,
    memory_id: &str,
    writer: &Writer,
    change: Change,
) -> ApiResult<MemoryRow> {
    let now = time::now();
    let (mut tx, store) = begin_write(db, store_id, writer, limits, true, now).await?;
    let current = store::lock_memory(&mut tx, store_id, memory_id)
        .await?
        .ok_or_else(|| memory_not_found(store_id, memory_id))?;
    if let Some(expected) = &change.expected_sha256 {
        if *expected != current.content_sha256 {
            return Err(precondition_failed(&current, expected));
        }
    }
    let mut next = current.clone();
    if let Some(path) = change.path {
        next.path = path;
    }
    if let Some(content) = change.content {
        next.content_sha256 = memory_rules::content_sha256(&content);
        next.content_size_bytes = content.len() as i32;
        next.content = content;
    }
    if next.path == current.path && next.content == current.content {
        tx.commit().await?;
        return Ok(current);
    }
    let usage = store.usage().modified(
        i64::from(current.content_size_bytes),
        i64::from(next.content_size_bytes),
    );
    memory_quota::check_quota(store_id, limits, store.usage(), usage)?;
    next.memory_version_id = ids::new_id("memver");
    next.updated_at = now;
    let Some(saved) = store::update_memory(&mut tx, &next).await? else {
        let holder = store::memory_at(&mut *tx, store_id, &next.path).await?;
        return Err(path_conflict(&next.path, holder));
    };
    store::insert_version(
        &mut tx,
        &version(&saved, MemoryOperation::Modified, writer, now),
    )
    .await?;
    settle_usage(&mut tx, store_id, limits, usage).await?;
    tx.commit().await?;
    Ok(saved)
}

/// Deletes a memory (an archived store's too), if its digest is `expected`.
pub async fn delete(
    db: &PgPool,
    limits: &MemoryLimits,
    store_id: &str,
    memory_id: &str,
    writer: &Writer,
    expected: Option<&str>,
) -> ApiResult<()> {
    let now = time::now();
    let (mut tx, store) = begin_write(db, store_id, writer, limits, false, now).await?;
    let mut current = store::lock_memory(&mut tx, store_id, memory_id)
        .await?
        .ok_or_else(|| memory_not_found(store_id, memory_id))?;
    if let Some(expected) = expected {
        if expected != current.content_sha256 {
            return Err(precondition_failed(&current, expected));
        }
    }
    store::delete_memory(&mut tx, memory_id).await?;
    current.memory_version_id = ids::new_id("memver");
    store::insert_version(
        &mut tx,
        &version(&current, MemoryOperation::Deleted, writer, now),
    )
    .await?;
    let usage = store.usage().deleted(i64::from(current.content_size_bytes));
    settle_usage(&mut tx, store_id, limits, usage).await?;
    tx.commit().await?;
    Ok(())
}

/// Redacts a version: its content, path and digest are cleared for good
/// (and its content no longer counts toward the store's history). The
/// version holding a live memory's content is refused (update or delete
/// the memory first).
pub async fn redact(
    db: &PgPool,
    store_id: &str,
    version_id: &str,
    writer: &Writer,
) -> ApiResult<VersionRow> {
    let mut tx = db.begin().await?;
    let store = held_store(&mut tx, store_id, false).await?;
    let missing = || {
        ApiError::not_found(format!(
            "memory version {version_id} not found in memory store {store_id}"
        ))
        .code(ErrorCode::MemoryVersionNotFound)
    };
    let before = store::find_version(&mut *tx, store_id, version_id)
        .await?
        .ok_or_else(missing)?;
    if store::version_is_current(&mut tx, version_id).await? {
        return Err(ApiError::conflict(format!(
            "memory version {version_id} holds its memory's current content; update or delete the memory before redacting it"
        ))
        .code(ErrorCode::MemoryVersionCurrent)
        .final_answer());
    }
    let row = store::redact_version(&mut tx, store_id, version_id, &writer.actor(), time::now())
        .await?
        .ok_or_else(missing)?;
    let mut usage = store.usage();
    usage.version_bytes -= i64::from(before.content_size_bytes.unwrap_or(0));
    store::set_usage(&mut tx, store_id, &usage).await?;
    tx.commit().await?;
    Ok(row)
}

/// Store `store_id` of the workspace patched (name and description already
/// checked; metadata merged here), under its row lock: refused once
/// archived, and `updated_at` moves only when something changed.
pub async fn update_store(
    conn: &mut PgConnection,
    workspace_id: &str,
    store_id: &str,
    patch: UpdateMemoryStore,
) -> ApiResult<StoreRow> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let mut row = store::lock_store(&mut tx, workspace_id, store_id)
        .await?
        .ok_or_else(|| store_not_found(store_id))?;
    if row.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "memory store {store_id} is archived and cannot be updated"
        ))
        .code(ErrorCode::MemoryStoreArchived));
    }
    let before = row.clone();
    if let Patch::Set(name) = patch.name {
        row.name = name;
    }
    if let Patch::Set(description) = patch.description {
        row.description = description;
    }
    if let Some(patch) = &patch.metadata {
        let merged = metadata::merge(&metadata::from_json(&row.metadata), patch, false)?;
        row.metadata = metadata::to_json(&merged);
    }
    let changed = row.name != before.name
        || row.description != before.description
        || row.metadata != before.metadata;
    if changed {
        row.updated_at = time::now();
        row = store::update_store(&mut tx, &row).await?;
    }
    tx.commit().await?;
    Ok(row)
}

/// Archives store `store_id` of the workspace under its row lock:
/// idempotent (an archived store is returned as it is) and final.
pub async fn archive_store(
    conn: &mut PgConnection,
    workspace_id: &str,
    store_id: &str,
) -> ApiResult<StoreRow> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let mut row = store::lock_store(&mut tx, workspace_id, store_id)
        .await?
        .ok_or_else(|| store_not_found(store_id))?;
    if row.archived_at.is_none() {
        let now = time::now();
        row.archived_at = Some(now);
        row.updated_at = now;
        row = store::update_store(&mut tx, &row).await?;
    }
    tx.commit().await?;
    Ok(row)
}

/// The Memory Store resources of a new Session, checked and completed: each
/// names a store of the workspace that is not archived, once; `access`
/// defaults to `read_write`; `name` and `description` are the store's as of
/// now; `mount_path` is `<mount_root>/<slug of the name>`. Other resources
/// pass through unchanged.
pub async fn attach(
    conn: &mut PgConnection,
    workspace_id: &str,
    mount_root: &str,
    resources: Vec<SessionResource>,
) -> ApiResult<Vec<SessionResource>> {
    let mut wanted = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        let SessionResource::MemoryStore(m) = r else {
            continue;
        };
        for (field, given) in [
            ("mount_path", &m.mount_path),
            ("name", &m.name),
            ("description", &m.description),
        ] {
            if given.is_some() {
                return Err(ApiError::invalid_parameter(format!(
                    "resources[{i}].{field} is output-only: a memory store's {field} comes from the store{}",
                    if field == "mount_path" { "'s name" } else { "" }
                )));
            }
        }
        if let Some(instructions) = &m.instructions {
            crate::extract::check_len(
                &format!("resources[{i}].instructions"),
                instructions,
                MAX_INSTRUCTIONS_CHARS,
            )?;
        }
        if wanted.contains(&m.memory_store_id) {
            return Err(ApiError::invalid_parameter(format!(
                "resources[{i}]: memory store {} is attached twice",
                m.memory_store_id
            )));
        }
        wanted.push(m.memory_store_id.clone());
    }
    if wanted.is_empty() {
        return Ok(resources);
    }
    if wanted.len() > MAX_ATTACHED_STORES {
        return Err(ApiError::invalid_parameter(format!(
            "resources attach {} memory stores; a Session attaches at most {MAX_ATTACHED_STORES}",
            wanted.len()
        )));
    }
    let found = store::stores_in(&mut *conn, workspace_id, &wanted).await?;
    let mut taken: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(resources.len());
    for (i, r) in resources.into_iter().enumerate() {
        let SessionResource::MemoryStore(mut m) = r else {
            out.push(r);
            continue;
        };
        let Some(s) = found.iter().find(|s| s.id == m.memory_store_id) else {
            return Err(ApiError::not_found(format!(
                "resources[{i}]: memory store {} not found",
                m.memory_store_id
            ))
            .code(ErrorCode::MemoryStoreNotFound));
        };
        if s.archived_at.is_some() {
            return Err(ApiError::bad_request(format!(
                "resources[{i}]: memory store {} is archived; it attaches to no new Session",
                s.id
            ))
            .code(ErrorCode::MemoryStoreArchived));
        }
        let path =
            memory_rules::mount_path(mount_root, &memory_rules::slug(&s.name, &s.id), &taken);
        taken.push(path.clone());
        m.access = Some(m.access.unwrap_or(MemoryAccess::ReadWrite));
        m.name = Some(s.name.clone());
        m.description = Some(s.description.clone());
        m.mount_path = Some(path);
        out.push(SessionResource::MemoryStore(m));
    }
    Ok(out)
}
