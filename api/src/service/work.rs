//! Work transitions (spec §3–§4), each once: the handlers and the sweeper
//! call these. Every write applies one rule of [`crate::lease`] to the
//! reconciled lease and stores it with a compare-and-set fenced on the row
//! version and claim epoch it read ([`transition`]).

use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::lease::{
    AckError, Completion, Lease, ResultError, StopError, Stopper, TokenRejection, TokenUse,
};
use crate::metrics::Metrics;
use crate::store::keys;
use crate::store::work::{self, NewWork, WorkRow};
use crate::{ids, metadata};
use axum::http::StatusCode;
use mango_protocol::time::{self, Timestamp};
use mango_protocol::{
    CheckResult, ErrorCode, ErrorType, HeartbeatResponse, LeaseStateBody, WorkState, WorkType,
};
use serde_json::{Map, Value};
use sqlx::PgConnection;
use std::collections::BTreeMap;

/// Whose write this is: it decides what else the compare-and-set is fenced on.
#[derive(Clone, Copy)]
pub enum Fence<'a> {
    Operator,
    /// Only while this token is still the item's current claim.
    Token(&'a [u8]),
    /// Only while this Environment key is unrevoked (share-locked in the write).
    Key(&'a str),
}

impl<'a> Fence<'a> {
    /// The fence of a sessions-token principal's own Work row.
    pub fn token(row: &'a WorkRow) -> Fence<'a> {
        Fence::Token(row.token_sha256.as_deref().unwrap_or_default())
    }
}

const MAX_ATTEMPTS: usize = 16;

fn changing_too_fast() -> ApiError {
    ApiError::unavailable("the Work item is changing too fast; retry")
}

pub(crate) fn revoked() -> ApiError {
    ApiError::unauthenticated("invalid or revoked API key")
}

pub fn not_found(env: &str, work_id: &str) -> ApiError {
    ApiError::not_found(format!("work {work_id} not found in environment {env}"))
        .code(ErrorCode::WorkNotFound)
}

pub async fn find(conn: &mut PgConnection, env: &str, work_id: &str) -> ApiResult<WorkRow> {
    work::find(&mut *conn, env, work_id)
        .await?
        .ok_or_else(|| not_found(env, work_id))
}

/// Applies `rule` to the item's reconciled lease and stores the result with
/// a compare-and-set; when another writer got there first, re-reads and
/// re-decides. A refused rule still persists time-driven reconciliation
/// (e.g. `timed_out`).
pub async fn transition<T>(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    mut row: WorkRow,
    fence: Fence<'_>,
    rule: impl Fn(&Lease, Timestamp) -> ApiResult<(Lease, T)>,
) -> ApiResult<(WorkRow, Lease, T)> {
    let key = match fence {
        Fence::Key(k) => Some(k),
        _ => None,
    };
    for _ in 0..MAX_ATTEMPTS {
        let now = ctx.now();
        let stored = row.lease();
        let current = stored.reconcile(now);
        let (next, outcome) = match rule(&current, now) {
            Ok(decided) => decided,
            Err(refusal) => {
                if current != stored {
                    // Best effort: a lost race here only means someone else wrote first.
                    if let Ok(Some(_)) =
                        work::compare_and_set(&mut *conn, &row, &current, None).await
                    {
                        stored_as(ctx, &current);
                    }
                }
                return Err(refusal);
            }
        };
        if next == stored {
            // Nothing to write, so no fenced statement checks the key: ask directly,
            // or a key revoked since authentication could still "Ack again".
            if let Some(key_id) = key {
                if !keys::is_live(&mut *conn, key_id).await? {
                    return Err(revoked());
                }
            }
            return Ok((row, next, outcome));
        }
        if let Some(saved) = work::compare_and_set(&mut *conn, &row, &next, key).await? {
            stored_as(ctx, &next);
            return Ok((saved, next, outcome));
        }
        if let Some(key_id) = key {
            if !keys::is_live(&mut *conn, key_id).await? {
                return Err(revoked());
            }
        }
        row = find(conn, &row.environment_id, &row.id).await?;
        if let Fence::Token(digest) = fence {
            if row.token_sha256.as_deref() != Some(digest) {
                return Err(ApiError::unauthenticated(
                    "sessions token was replaced by a newer claim",
                ));
            }
        }
    }
    Err(changing_too_fast())
}

/// What follows a stored transition: a Session's Work that stopped with
/// input waiting got an outbox row (migration
/// `…_stopped_session_work_wakes_the_loop`) for a new activation, so this
/// process's agent loop looks now; other processes are notified. Inside a
/// transaction this is early: its caller wakes the loop again after commit.
fn stored_as(ctx: &ApiContext, lease: &Lease) {
    if lease.kind == WorkType::Session && lease.state == WorkState::Stopped {
        ctx.agent_wake.notify_waiters();
    }
}

fn token_rejected(rejection: TokenRejection) -> ApiError {
    ApiError::unauthenticated(rejection.message())
}

fn already_stopped(id: &str) -> ApiError {
    ApiError::conflict(format!("work {id} is already stopped"))
        .code(ErrorCode::WorkAlreadyStopped)
        .final_answer()
}

// ------------------------------------------------------------------ operator

/// A new healthcheck: queued, with its deadline.
pub async fn create_healthcheck(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    environment_id: &str,
    metadata: &BTreeMap<String, String>,
) -> ApiResult<WorkRow> {
    let now = ctx.now();
    let lease = Lease::new(WorkType::Healthcheck, now, ctx.settings.default_ttl_seconds);
    Ok(work::insert(
        &mut *conn,
        NewWork {
            id: &ids::new_id("work"),
            environment_id,
            session_id: None,
            metadata,
            lease: &lease,
            created_at: now,
        },
    )
    .await?)
}

/// Merges a metadata patch (a string upserts, null deletes), retrying when
/// the row changed under it.
pub async fn update_metadata(
    conn: &mut PgConnection,
    mut row: WorkRow,
    patch: &Map<String, Value>,
) -> ApiResult<WorkRow> {
    for _ in 0..MAX_ATTEMPTS {
        let merged = metadata::merge(&row.metadata_map(), patch, false)?;
        if let Some(saved) = work::set_metadata(&mut *conn, &row, &merged).await? {
            return Ok(saved);
        }
        row = find(conn, &row.environment_id, &row.id).await?;
    }
    Err(changing_too_fast())
}

/// Stop with a Workspace key (any Work) or the holder's token (its own).
pub async fn stop(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    row: WorkRow,
    fence: Fence<'_>,
    force: bool,
    idle: bool,
) -> ApiResult<()> {
    let id = row.id.clone();
    let by = match (fence, idle) {
        (Fence::Token(_), true) => Stopper::HolderIdle,
        (Fence::Token(_), false) => Stopper::Holder,
        _ => Stopper::Operator,
    };
    transition(ctx, conn, row, fence, |current, now| {
        if by != Stopper::Operator {
            current
                .admits_token(TokenUse::Stop, now)
                .map_err(token_rejected)?;
        }
        current
            .stop(force, by, now)
            .map(|next| (next, ()))
            .map_err(|StopError::AlreadyStopped| already_stopped(&id))
    })
    .await?;
    Metrics::count(&ctx.metrics.stops);
    Ok(())
}

// ------------------------------------------------------------------ supervisor (Environment key)

/// Ack: the pending claim becomes `starting`; a repeat answers the same.
pub async fn ack(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    row: WorkRow,
    key_id: &str,
) -> ApiResult<(WorkRow, Lease)> {
    let ttl = ctx.settings.default_ttl_seconds;
    let id = row.id.clone();
    let (row, lease, ()) =
        transition(
            ctx,
            conn,
            row,
            Fence::Key(key_id),
            |current, now| match current.ack(now, ttl) {
                Ok(next) => Ok((next, ())),
                Err(AckError::NotClaimed) => Err(ApiError::conflict(format!(
                    "work {id} has not been polled; Poll claims it first"
                ))
                .code(ErrorCode::WorkNotClaimed)
                .final_answer()),
                Err(AckError::Stopped) => Err(ApiError::conflict(format!("work {id} is stopped"))
                    .code(ErrorCode::WorkAlreadyStopped)
                    .final_answer()),
            },
        )
        .await?;
    Metrics::count(&ctx.metrics.acks);
    Ok((row, lease))
}

// ------------------------------------------------------------------ holder (sessions token)

/// What a heartbeat asks for.
pub struct Beat {
    /// `None` is `NO_HEARTBEAT`: the first beat claims the lease.
    pub expected: Option<Timestamp>,
    pub desired_ttl: Option<i64>,
}

fn precondition_failed(lease: &Lease) -> ApiError {
    let state = LeaseStateBody {
        last_heartbeat: lease.last_heartbeat().map(|t| time::format(&t)),
        lease_extended: false,
        state: lease.state,
        ttl_seconds: lease.ttl_seconds,
    };
    ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        ErrorType::InvalidRequestError,
        "expected_last_heartbeat does not match the lease, or the lease expired: another holder may own this Work",
    )
    .code(ErrorCode::HeartbeatPreconditionFailed)
    .detail("current_state", serde_json::to_value(state).expect("serializable"))
}

pub async fn heartbeat(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    row: WorkRow,
    beat: Beat,
) -> ApiResult<HeartbeatResponse> {
    let default_ttl = ctx.settings.default_ttl_seconds;
    let digest = row.token_sha256.clone().unwrap_or_default();
    let outcome = transition(ctx, conn, row, Fence::Token(&digest), |current, now| {
        current
            .admits_token(TokenUse::Heartbeat, now)
            .map_err(token_rejected)?;
        current
            .heartbeat(beat.expected, beat.desired_ttl, now, default_ttl)
            .map_err(|_| precondition_failed(current))
    })
    .await;
    if outcome
        .as_ref()
        .is_err_and(|e| e.status == StatusCode::PRECONDITION_FAILED)
    {
        Metrics::count(&ctx.metrics.heartbeat_precondition_failures);
    }
    let (_, lease, extended) = outcome?;
    Metrics::count(&ctx.metrics.heartbeats);
    Ok(HeartbeatResponse {
        kind: "work_heartbeat".into(),
        last_heartbeat: lease
            .last_heartbeat()
            .map(|t| time::format(&t))
            .unwrap_or_default(),
        lease_extended: extended.extended,
        state: lease.state,
        ttl_seconds: lease.ttl_seconds,
    })
}

/// Result (healthchecks): stores the outcome and stops the Work, atomically;
/// an identical retry in the result window answers the same.
pub async fn complete(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    row: WorkRow,
    outcome: CheckResult,
) -> ApiResult<(WorkRow, Lease)> {
    let id = row.id.clone();
    let digest = row.token_sha256.clone().unwrap_or_default();
    let (row, lease, _stored_or_replayed): (_, _, Completion) =
        transition(ctx, conn, row, Fence::Token(&digest), |current, now| {
            current
                .admits_token(TokenUse::Result, now)
                .map_err(token_rejected)?;
            current.complete(&outcome, now).map_err(|e| match e {
                ResultError::NotAHealthcheck => ApiError::bad_request(
                    "only healthcheck Work has a result; Session Work ends with Stop or Fail",
                )
                .code(ErrorCode::NotAHealthcheck),
                ResultError::NotActive => ApiError::conflict(format!(
                    "work {id} is {}: only an active lease (after its first heartbeat) may post a result",
                    current.state.as_str()
                ))
                .code(ErrorCode::WorkNotActive)
                .final_answer(),
                ResultError::Conflict => {
                    ApiError::conflict("a different result was already stored for this Work")
                        .code(ErrorCode::ResultConflict)
                        .final_answer()
                }
            })
        })
        .await?;
    Metrics::count(&ctx.metrics.results);
    Ok((row, lease))
}

/// Fail's Work half, inside the caller's transaction (which terminates the
/// Session too: [`crate::service::fail`]). With the holder's token it needs
/// a live claim; the operator fence (Poll giving up on an item) does not.
pub async fn fail(
    ctx: &ApiContext,
    tx: &mut PgConnection,
    row: WorkRow,
    fence: Fence<'_>,
    message: &str,
) -> ApiResult<(WorkRow, Lease)> {
    let id = row.id.clone();
    let by_token = matches!(fence, Fence::Token(_));
    let (row, lease, ()) = transition(ctx, tx, row, fence, |current, now| {
        if by_token {
            current
                .admits_token(TokenUse::Fail, now)
                .map_err(token_rejected)?;
        }
        current
            .fail(message, now)
            .map(|next| (next, ()))
            .map_err(|StopError::AlreadyStopped| already_stopped(&id))
    })
    .await?;
    Ok((row, lease))
}

// ------------------------------------------------------------------ background

/// The sweeper's pass: persists time-driven transitions (overdue checks,
/// run-out stopping leases) that reads already show; a lost compare-and-set
/// means a request did it first. Returns how many rows moved.
pub async fn reconcile_due(ctx: &ApiContext) -> sqlx::Result<usize> {
    let now = ctx.now();
    let mut moved = 0;
    for row in work::due_for_reconcile(&ctx.db, now, 500).await? {
        let next = row.lease().reconcile(now);
        if next != row.lease()
            && work::compare_and_set(&ctx.db, &row, &next, None)
                .await?
                .is_some()
        {
            moved += 1;
            Metrics::count(&ctx.metrics.swept);
            stored_as(ctx, &next);
        }
    }
    crate::store::workers::forget_old(&ctx.db, now).await?;
    Ok(moved)
}
