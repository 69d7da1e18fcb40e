//! The Work lease store. Reads return whole rows; every write is either the
//! one-statement claim or a compare-and-set of a [`Lease`] computed by the
//! pure state machine, fenced on the row version and claim epoch it read.

use crate::lease::{Lease, WorkEnd};
use crate::metadata;
use chrono::Duration;
use mango_protocol::time::Timestamp;
use mango_protocol::{CheckResult, WireEnum, Work, WorkData, WorkLease, WorkState, WorkType};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgExecutor, Row};
use std::collections::BTreeMap;

/// A Work row, its text columns decoded into the wire enums. This module
/// is where Work's state, type and result status meet SQL: rows decode
/// them here and statements bind `as_str()`.
#[derive(Debug, Clone)]
pub struct WorkRow {
    pub id: String,
    pub environment_id: String,
    pub kind: WorkType,
    pub session_id: Option<String>,
    pub metadata: Value,
    pub state: WorkState,
    pub row_version: i64,
    pub claim_epoch: i64,
    pub token_sha256: Option<Vec<u8>>,
    pub claimed_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub acknowledged_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub latest_heartbeat_at: Option<Timestamp>,
    pub previous_heartbeat_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    pub ttl_seconds: i32,
    pub stop_requested_at: Option<Timestamp>,
    pub stopped_at: Option<Timestamp>,
    pub expires_at: Option<Timestamp>,
    pub result: Option<CheckResult>,
    pub result_committed_at: Option<Timestamp>,
    pub end_reason: Option<WorkEnd>,
    /// The worker id its current or last claim's poller named, if any.
    pub worker_id: Option<String>,
}

fn decoded<T: WireEnum>(column: &str, text: &str) -> sqlx::Result<T> {
    T::parse(text).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: format!("{text:?} is not a valid value").into(),
    })
}

impl<'r> FromRow<'r, PgRow> for WorkRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let result_status: Option<String> = row.try_get("result_status")?;
        let result_message: Option<String> = row.try_get("result_message")?;
        let result = match (result_status, result_message) {
            (Some(status), Some(message)) => Some(CheckResult {
                status: decoded("result_status", &status)?,
                message,
            }),
            _ => None,
        };
        let end_reason: Option<String> = row.try_get("end_reason")?;
        Ok(WorkRow {
            id: row.try_get("id")?,
            environment_id: row.try_get("environment_id")?,
            kind: decoded("kind", row.try_get("kind")?)?,
            session_id: row.try_get("session_id")?,
            metadata: row.try_get("metadata")?,
            state: decoded("state", row.try_get("state")?)?,
            row_version: row.try_get("row_version")?,
            claim_epoch: row.try_get("claim_epoch")?,
            token_sha256: row.try_get("token_sha256")?,
            claimed_at: row.try_get("claimed_at")?,
            created_at: row.try_get("created_at")?,
            acknowledged_at: row.try_get("acknowledged_at")?,
            started_at: row.try_get("started_at")?,
            latest_heartbeat_at: row.try_get("latest_heartbeat_at")?,
            previous_heartbeat_at: row.try_get("previous_heartbeat_at")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            ttl_seconds: row.try_get("ttl_seconds")?,
            stop_requested_at: row.try_get("stop_requested_at")?,
            stopped_at: row.try_get("stopped_at")?,
            expires_at: row.try_get("expires_at")?,
            result,
            result_committed_at: row.try_get("result_committed_at")?,
            end_reason: end_reason
                .map(|text| {
                    WorkEnd::parse(&text).ok_or_else(|| sqlx::Error::ColumnDecode {
                        index: "end_reason".into(),
                        source: format!("{text:?} is not a valid value").into(),
                    })
                })
                .transpose()?,
            worker_id: row.try_get("worker_id")?,
        })
    }
}

impl WorkRow {
    pub fn lease(&self) -> Lease {
        Lease {
            kind: self.kind,
            state: self.state,
            claim_epoch: self.claim_epoch,
            claimed_at: self.claimed_at,
            acknowledged_at: self.acknowledged_at,
            started_at: self.started_at,
            latest_heartbeat_at: self.latest_heartbeat_at,
            previous_heartbeat_at: self.previous_heartbeat_at,
            lease_expires_at: self.lease_expires_at,
            ttl_seconds: i64::from(self.ttl_seconds),
            stop_requested_at: self.stop_requested_at,
            stopped_at: self.stopped_at,
            expires_at: self.expires_at,
            result: self.result.clone(),
            result_committed_at: self.result_committed_at,
            end: self.end_reason,
        }
    }

    pub fn metadata_map(&self) -> BTreeMap<String, String> {
        metadata::from_json(&self.metadata)
    }

    /// The wire object, as of `lease` (normally `self.lease().reconcile(now)`).
    pub fn render(&self, lease: &Lease, secret: Option<String>) -> Work {
        // The claim number goes with the secret: only Poll answers it.
        let claim = secret.as_ref().map(|_| self.claim_epoch);
        Work {
            id: self.id.clone(),
            kind: "work".into(),
            environment_id: self.environment_id.clone(),
            data: match &self.session_id {
                Some(id) => WorkData::Session { id: id.clone() },
                None => WorkData::Healthcheck,
            },
            metadata: self.metadata_map(),
            state: lease.state,
            created_at: self.created_at,
            acknowledged_at: lease.acknowledged_at,
            started_at: lease.started_at,
            latest_heartbeat_at: lease.latest_heartbeat_at,
            stop_requested_at: lease.stop_requested_at,
            stopped_at: lease.stopped_at,
            secret,
            expires_at: lease.expires_at,
            result: lease.result.clone(),
            claim,
            lease: None,
        }
    }

    /// The wire object a Workspace key reads: [`Self::render`] with who
    /// holds the item and its lease's time left as of `now` (the api's
    /// clock, so every client shows the same).
    pub fn render_for_operator(&self, lease: &Lease, now: Timestamp) -> Work {
        let mut work = self.render(lease, None);
        work.lease = Some(WorkLease {
            claim: self.claim_epoch,
            worker_id: self.worker_id.clone(),
            expires_at: lease.lease_expires_at,
            remaining_ms: lease
                .lease_expires_at
                .map(|at| (at - now).num_milliseconds().max(0)),
        });
        work
    }
}

const COLUMNS: &str = "id, environment_id, kind, session_id, metadata, state, row_version, claim_epoch, \
    token_sha256, claimed_at, created_at, acknowledged_at, started_at, latest_heartbeat_at, \
    previous_heartbeat_at, lease_expires_at, ttl_seconds, stop_requested_at, stopped_at, expires_at, \
    result_status, result_message, result_committed_at, end_reason, worker_id";

pub struct NewWork<'a> {
    pub id: &'a str,
    pub environment_id: &'a str,
    pub session_id: Option<&'a str>,
    pub metadata: &'a BTreeMap<String, String>,
    pub lease: &'a Lease,
    pub created_at: Timestamp,
}

const INSERT: &str = "INSERT INTO work (id, environment_id, kind, session_id, metadata, state, ttl_seconds, created_at, expires_at)
     VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8)";

fn bind_new<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, WorkRow, sqlx::postgres::PgArguments>,
    new: &NewWork<'q>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, WorkRow, sqlx::postgres::PgArguments> {
    query
        .bind(new.id)
        .bind(new.environment_id)
        .bind(new.lease.kind.as_str())
        .bind(new.session_id)
        .bind(metadata::to_json(new.metadata))
        .bind(new.lease.ttl_seconds as i32)
        .bind(new.created_at)
        .bind(new.lease.expires_at)
}

/// Inserts a queued item; the insert trigger wakes pollers at commit.
pub async fn insert(db: impl PgExecutor<'_>, new: NewWork<'_>) -> sqlx::Result<WorkRow> {
    let sql = format!("{INSERT} RETURNING {COLUMNS}");
    bind_new(sqlx::query_as(&sql), &new).fetch_one(db).await
}

/// Inserts a Session's activation unless it already has Work that is not
/// stopped (the `work_one_live_per_session` index decides, so a stale read of
/// "no live Work" cannot make a second one). `None`: coalesced.
pub async fn insert_activation(
    db: impl PgExecutor<'_>,
    new: NewWork<'_>,
) -> sqlx::Result<Option<WorkRow>> {
    let sql = format!(
        "{INSERT} ON CONFLICT (session_id) WHERE kind = 'session' AND state <> 'stopped' DO NOTHING RETURNING {COLUMNS}"
    );
    bind_new(sqlx::query_as(&sql), &new)
        .fetch_optional(db)
        .await
}

pub async fn find(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    work_id: &str,
) -> sqlx::Result<Option<WorkRow>> {
    let sql = format!("SELECT {COLUMNS} FROM work WHERE id = $1 AND environment_id = $2");
    sqlx::query_as(&sql)
        .bind(work_id)
        .bind(environment_id)
        .fetch_optional(db)
        .await
}

pub async fn find_by_token(
    db: impl PgExecutor<'_>,
    token_sha256: &[u8],
) -> sqlx::Result<Option<WorkRow>> {
    let sql = format!("SELECT {COLUMNS} FROM work WHERE token_sha256 = $1");
    sqlx::query_as(&sql)
        .bind(token_sha256)
        .fetch_optional(db)
        .await
}

/// The claim statement's text, for the bench's EXPLAIN only (feature
/// `bench-hooks`; [`claim`] is its one user otherwise).
#[cfg(feature = "bench-hooks")]
pub fn claim_statement() -> &'static str {
    claim_sql()
}

/// The claim statement's text.
/// Parameters: environment id, key id, now, reclaim cutoff, token digest,
/// worker id.
fn claim_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH key AS (
                 SELECT id FROM api_keys WHERE id = $2 AND revoked_at IS NULL FOR SHARE
             ),
             candidate AS MATERIALIZED (
                 SELECT id FROM work
                 WHERE environment_id = $1
                   AND state IN ('queued', 'starting', 'active')
                   AND (expires_at IS NULL OR expires_at > $3)
                   AND (   (state = 'queued' AND (claimed_at IS NULL OR claimed_at <= $4))
                        OR (state IN ('starting', 'active') AND lease_expires_at <= $3))
                   AND EXISTS (SELECT 1 FROM key)
                 ORDER BY created_at, id
                 LIMIT 1
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE work SET
                 state = 'queued', claim_epoch = work.claim_epoch + 1, token_sha256 = $5,
                 claimed_by = $2, worker_id = $6,
                 claimed_at = $3, acknowledged_at = NULL, started_at = NULL,
                 latest_heartbeat_at = NULL, previous_heartbeat_at = NULL,
                 lease_expires_at = NULL, stop_requested_at = NULL, end_reason = NULL,
                 row_version = work.row_version + 1
             FROM candidate WHERE work.id = candidate.id
             RETURNING {}",
            COLUMNS
                .split(", ")
                .map(|c| format!("work.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    &SQL
}

/// Poll's claim: one statement. The oldest available item of the Environment is
/// locked (`SKIP LOCKED`, so pollers never queue behind each other) and turned
/// into a pending claim with a new epoch and token. Available mirrors
/// [`Lease::is_available`]. The Environment key row is share-locked in the same
/// statement: a concurrent revoke waits for it, and after the revoke commits
/// this statement claims nothing.
pub async fn claim(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    key_id: &str,
    now: Timestamp,
    reclaim_after: Duration,
    token_sha256: &[u8],
    worker_id: Option<&str>,
) -> sqlx::Result<Option<WorkRow>> {
    sqlx::query_as(claim_sql())
        .bind(environment_id)
        .bind(key_id)
        .bind(now)
        .bind(now - reclaim_after)
        .bind(token_sha256)
        .bind(worker_id)
        .fetch_optional(db)
        .await
}

/// Writes `next` if the row is still exactly as `row` was read (same version,
/// same claim). With `key_fence`, also only while that key is unrevoked,
/// share-locking it like the claim does. `None` means someone else won the race.
pub async fn compare_and_set(
    db: impl PgExecutor<'_>,
    row: &WorkRow,
    next: &Lease,
    key_fence: Option<&str>,
) -> sqlx::Result<Option<WorkRow>> {
    debug_assert_eq!(
        next.claim_epoch, row.claim_epoch,
        "only the claim statement changes the epoch"
    );
    let sql = format!(
        "WITH fence AS (
             SELECT id FROM api_keys WHERE id = $17 AND revoked_at IS NULL FOR SHARE
         )
         UPDATE work SET
             state = $3, claimed_at = $5, acknowledged_at = $6, started_at = $7,
             latest_heartbeat_at = $8, previous_heartbeat_at = $9, lease_expires_at = $10,
             ttl_seconds = $11, stop_requested_at = $12, stopped_at = $13,
             result_status = $14, result_message = $15, result_committed_at = $16,
             end_reason = $18, row_version = row_version + 1
         WHERE id = $1 AND row_version = $2 AND claim_epoch = $4
           AND ($17::text IS NULL OR EXISTS (SELECT 1 FROM fence))
         RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(row.row_version)
        .bind(next.state.as_str())
        .bind(row.claim_epoch)
        .bind(next.claimed_at)
        .bind(next.acknowledged_at)
        .bind(next.started_at)
        .bind(next.latest_heartbeat_at)
        .bind(next.previous_heartbeat_at)
        .bind(next.lease_expires_at)
        .bind(next.ttl_seconds as i32)
        .bind(next.stop_requested_at)
        .bind(next.stopped_at)
        .bind(next.result.as_ref().map(|r| r.status.as_str()))
        .bind(next.result.as_ref().map(|r| r.message.as_str()))
        .bind(next.result_committed_at)
        .bind(key_fence)
        .bind(next.end.map(WorkEnd::as_str))
        .fetch_optional(db)
        .await
}

pub async fn set_metadata(
    db: impl PgExecutor<'_>,
    row: &WorkRow,
    metadata: &BTreeMap<String, String>,
) -> sqlx::Result<Option<WorkRow>> {
    let sql = format!(
        "UPDATE work SET metadata = $3, row_version = row_version + 1
         WHERE id = $1 AND row_version = $2 RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(row.row_version)
        .bind(metadata::to_json(metadata))
        .fetch_optional(db)
        .await
}

/// Newest first, after the cursor's (created_at, id) when one is given.
pub async fn list(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    after: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<WorkRow>> {
    let (ts, id) = match after {
        Some((ts, id)) => (Some(ts), Some(id)),
        None => (None, None),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM work
         WHERE environment_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
         ORDER BY created_at DESC, id DESC
         LIMIT $4"
    );
    sqlx::query_as(&sql)
        .bind(environment_id)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

#[derive(Debug, FromRow)]
pub struct StatsRow {
    pub depth: i64,
    pub pending: i64,
    pub oldest_queued_at: Option<Timestamp>,
    pub workers_polling: i64,
}

/// depth: waiting to be picked up (unclaimed, stale claims, lost leases);
/// pending: polled but not acknowledged; overdue checks count as neither.
pub async fn stats(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    now: Timestamp,
    reclaim_after: Duration,
) -> sqlx::Result<StatsRow> {
    sqlx::query_as(
        "SELECT
             count(*) FILTER (WHERE (state = 'queued' AND (claimed_at IS NULL OR claimed_at <= $3))
                                 OR (state IN ('starting', 'active') AND lease_expires_at <= $2)) AS depth,
             count(*) FILTER (WHERE state = 'queued' AND claimed_at > $3) AS pending,
             min(created_at) FILTER (WHERE state = 'queued') AS oldest_queued_at,
             (SELECT count(*) FROM worker_sightings
               WHERE environment_id = $1 AND last_seen_at > $2 - interval '30 seconds') AS workers_polling
         FROM work
         WHERE environment_id = $1 AND state IN ('queued', 'starting', 'active')
           AND (expires_at IS NULL OR expires_at > $2)",
    )
    .bind(environment_id)
    .bind(now)
    .bind(now - reclaim_after)
    .fetch_one(db)
    .await
}

/// Rows whose stored state lags time: overdue checks and run-out stopping leases.
pub async fn due_for_reconcile(
    db: impl PgExecutor<'_>,
    now: Timestamp,
    limit: i64,
) -> sqlx::Result<Vec<WorkRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM work
         WHERE (kind = 'healthcheck' AND state <> 'stopped' AND expires_at <= $1)
            OR (state = 'stopping' AND lease_expires_at <= $1)
         LIMIT $2"
    );
    sqlx::query_as(&sql)
        .bind(now)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// Where the items `ids` of the Environment stand, for the key that made
/// their current claim (other items are left out).
pub async fn claimed_by(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    key_id: &str,
    ids: &[String],
) -> sqlx::Result<Vec<WorkRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM work
         WHERE environment_id = $1 AND claimed_by = $2 AND id = ANY($3)
         ORDER BY id"
    );
    sqlx::query_as(&sql)
        .bind(environment_id)
        .bind(key_id)
        .bind(ids)
        .fetch_all(db)
        .await
}

/// Holds claim `claim_epoch` of Work `id` for the rest of the transaction
/// (`FOR SHARE`): a Stop, a heartbeat or a reclaim of the item waits for
/// the transaction, so a write fenced on it commits only while the claim
/// it checked is the item's current one. `None`: another claim took it.
pub async fn hold_claim(
    db: &mut sqlx::PgConnection,
    id: &str,
    claim_epoch: i64,
) -> sqlx::Result<Option<WorkRow>> {
    let sql = format!("SELECT {COLUMNS} FROM work WHERE id = $1 AND claim_epoch = $2 FOR SHARE");
    sqlx::query_as(&sql)
        .bind(id)
        .bind(claim_epoch)
        .fetch_optional(db)
        .await
}
