//! `/v1/environments/{environment_id}/work`: the Work lease API (spec §3–§4).
//! Each handler authenticates, checks the credential's scope, parses its input
//! and applies one rule of [`crate::lease`] through [`transition`].

use crate::auth::{authenticate, environment_key_for_lease, operator, Principal};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{check_len, Body, Params, RawBody};
use crate::lease::{
    self, AckError, Completion, Kind, Lease, ResultError, StopError, TokenRejection, TokenUse,
};
use crate::metrics::Metrics;
use crate::store::environments::{self, EnvironmentRow};
use crate::store::keys::KeyRow;
use crate::store::sessions;
use crate::store::work::{self, WorkRow};
use crate::store::{cursor, keys};
use crate::{ids, metadata};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Duration;
use mango_protocol::time::{self, Timestamp};
use mango_protocol::ErrorType;
use mango_protocol::{
    CheckResult, CheckStatus, ErrorCode, HeartbeatResponse, LeaseStateBody, Page, QueueStats,
    NO_HEARTBEAT,
};
use serde_json::Value;
use sqlx::PgConnection;

pub const MAX_RESULT_MESSAGE_CHARS: usize = 1024;
pub const MAX_WORKER_ID_CHARS: usize = 256;
const MAX_RECLAIM_MS: i64 = 24 * 3600 * 1000;

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/environments/{env}/work", post(create).get(list))
        .route("/v1/environments/{env}/work/poll", get(poll))
        .route("/v1/environments/{env}/work/stats", get(stats))
        .route(
            "/v1/environments/{env}/work/{work}",
            get(retrieve).post(update),
        )
        .route("/v1/environments/{env}/work/{work}/ack", post(ack))
        .route(
            "/v1/environments/{env}/work/{work}/heartbeat",
            post(heartbeat),
        )
        .route("/v1/environments/{env}/work/{work}/stop", post(stop))
        .route("/v1/environments/{env}/work/{work}/result", post(result))
        .route("/v1/environments/{env}/work/{work}/fail", post(fail))
}

// ------------------------------------------------------------------ helpers

async fn environment_of(
    conn: &mut PgConnection,
    key: &KeyRow,
    env: &str,
) -> ApiResult<EnvironmentRow> {
    environments::find(&mut *conn, &key.workspace_id, env)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("environment {env} not found"))
                .code(ErrorCode::EnvironmentNotFound)
        })
}

async fn work_of(conn: &mut PgConnection, env: &str, work_id: &str) -> ApiResult<WorkRow> {
    work::find(&mut *conn, env, work_id).await?.ok_or_else(|| {
        ApiError::not_found(format!("work {work_id} not found in environment {env}"))
            .code(ErrorCode::WorkNotFound)
    })
}

fn token_rejected(rejection: TokenRejection) -> ApiError {
    ApiError::unauthenticated(rejection.message())
}

/// Whose write this is: it decides what else the compare-and-set is fenced on.
#[derive(Clone, Copy)]
enum Fence<'a> {
    Operator,
    /// Only while this token is still the item's current claim.
    Token(&'a [u8]),
    /// Only while this Environment key is unrevoked (share-locked in the write).
    Key(&'a str),
}

const MAX_ATTEMPTS: usize = 16;

/// Applies `rule` to the item's reconciled lease and stores the result with a
/// compare-and-set; when another writer got there first, re-reads and re-decides.
/// A refused rule still persists time-driven reconciliation (e.g. `timed_out`).
/// A Session's Work it stores as stopped wakes this process's agent loop.
async fn transition<T>(
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
        let now = time::now();
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
                        wake_loop_if_stopped(ctx, &current);
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
                    return Err(ApiError::unauthenticated("invalid or revoked API key"));
                }
            }
            return Ok((row, next, outcome));
        }
        if let Some(saved) = work::compare_and_set(&mut *conn, &row, &next, key).await? {
            wake_loop_if_stopped(ctx, &next);
            return Ok((saved, next, outcome));
        }
        if let Some(key_id) = key {
            if !keys::is_live(&mut *conn, key_id).await? {
                return Err(ApiError::unauthenticated("invalid or revoked API key"));
            }
        }
        row = work_of(conn, &row.environment_id, &row.id).await?;
        if let Fence::Token(digest) = fence {
            if row.token_sha256.as_deref() != Some(digest) {
                return Err(ApiError::unauthenticated(
                    "sessions token was replaced by a newer claim",
                ));
            }
        }
    }
    Err(ApiError::unavailable(
        "the Work item is changing too fast; retry",
    ))
}

/// A Session's Work that stopped with input waiting got an outbox row (see
/// migration `…_stopped_session_work_wakes_the_loop`) for a new activation:
/// this process's agent loop looks now; other processes are notified. (Inside
/// Fail's transaction this is early; Fail wakes the loop again after commit.)
fn wake_loop_if_stopped(ctx: &ApiContext, lease: &Lease) {
    if lease.kind == Kind::Session && lease.state == mango_protocol::WorkState::Stopped {
        ctx.agent_wake.notify_waiters();
    }
}

fn respond(row: &WorkRow, lease: &Lease) -> Response {
    Json(row.render(lease, None)).into_response()
}

fn render_now(row: &WorkRow) -> Response {
    respond(row, &row.lease().reconcile(time::now()))
}

// ------------------------------------------------------------------ operator endpoints

/// Create (Workspace key): a healthcheck. Session Work comes from Session admission.
async fn create(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating Work").await?;
    let environment = environment_of(&mut conn, &key, &env).await?;
    let body = Body::parse(&bytes, &["data", "metadata"])?;
    let data = body.required("data")?;
    match data.get("type").and_then(Value::as_str) {
        Some("healthcheck") => {
            if let Some(extra) = data.as_object().and_then(|o| o.keys().find(|k| *k != "type")) {
                return Err(ApiError::invalid_parameter(format!("data.{extra} is not a healthcheck field")));
            }
        }
        Some("session") => {
            return Err(ApiError::invalid_parameter(
                "Session Work is created when a self_hosted Session receives runnable input; only {\"type\":\"healthcheck\"} can be created here",
            ))
        }
        Some(other) => return Err(ApiError::invalid_parameter(format!("unknown data.type {other:?}; expected \"healthcheck\""))),
        None => return Err(ApiError::invalid_parameter("data.type is required")),
    }
    let meta = metadata::validate(body.get("metadata"))?;
    if environment.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {env} is archived and gets no new Work"
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    let now = time::now();
    let lease = Lease::new(Kind::Healthcheck, now, ctx.settings.default_ttl_seconds);
    let id = ids::new_id("work");
    let row = work::insert(
        &mut *conn,
        work::NewWork {
            id: &id,
            environment_id: &env,
            session_id: None,
            metadata: &meta,
            lease: &lease,
            created_at: now,
        },
    )
    .await?;
    Ok((StatusCode::CREATED, render_now(&row)).into_response())
}

async fn retrieve(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading Work").await?;
    environment_of(&mut conn, &key, &env).await?;
    Ok(render_now(&work_of(&mut conn, &env, &id).await?))
}

/// Update merges metadata: a string upserts, null deletes.
async fn update(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating Work").await?;
    environment_of(&mut conn, &key, &env).await?;
    let body = Body::parse(&bytes, &["metadata"])?;
    let patch = match body.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map.clone()),
        Some(_) => {
            return Err(ApiError::bad_request("metadata must be an object")
                .code(ErrorCode::InvalidMetadata))
        }
    };
    let mut row = work_of(&mut conn, &env, &id).await?;
    let Some(patch) = patch else {
        return Ok(render_now(&row));
    };
    for _ in 0..MAX_ATTEMPTS {
        let merged = metadata::merge(&row.metadata_map(), &patch, false)?;
        if let Some(saved) = work::set_metadata(&mut *conn, &row, &merged).await? {
            return Ok(render_now(&saved));
        }
        row = work_of(&mut conn, &env, &id).await?;
    }
    Err(ApiError::unavailable(
        "the Work item is changing too fast; retry",
    ))
}

/// List: newest first, cursor pages.
async fn list(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Work").await?;
    environment_of(&mut conn, &key, &env).await?;
    let params = Params::parse(query.as_deref());
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let after = params
        .str("page")
        .filter(|p| !p.is_empty())
        .map(cursor::decode)
        .transpose()?;
    let mut rows = work::list(&mut *conn, &env, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    let now = time::now();
    let data = rows
        .iter()
        .map(|r| r.render(&r.lease().reconcile(now), None))
        .collect();
    Ok(Json(Page { data, next_page }).into_response())
}

/// Stats: Workspace key, or the Environment's own key.
async fn stats(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    match authenticate(&ctx, &mut conn, &headers).await? {
        Principal::Workspace(key) => {
            environment_of(&mut conn, &key, &env).await?;
        }
        other => {
            other.environment_key(&env, "Work stats")?;
        }
    }
    let s = work::stats(&mut *conn, &env, time::now(), ctx.settings.default_reclaim).await?;
    Ok(Json(QueueStats {
        kind: "work_queue_stats".into(),
        depth: s.depth,
        pending: s.pending,
        oldest_queued_at: s.oldest_queued_at,
        workers_polling: Some(s.workers_polling),
    })
    .into_response())
}

// ------------------------------------------------------------------ supervisor endpoints

/// Poll (Environment key): claim the oldest available item, or wait up to
/// `block_ms` for one; `null` when there is none.
async fn poll(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // Held only while querying: a blocked Poll waits without a connection.
    let mut held = Some(ctx.db.acquire().await?);
    let conn = held.as_mut().expect("just acquired");
    let key = environment_key_for_lease(&ctx, conn, &headers, &env, "Poll").await?;
    let params = Params::parse(query.as_deref());
    let block_ms = params.int("block_ms", 1, 999)?;
    let reclaim = params
        .int("reclaim_older_than_ms", 0, MAX_RECLAIM_MS)?
        .map(Duration::milliseconds)
        .unwrap_or(ctx.settings.default_reclaim);
    let worker_id = headers
        .get("anthropic-worker-id")
        .and_then(|v| v.to_str().ok())
        .or_else(|| params.str("worker_id"))
        .filter(|w| !w.is_empty());
    if let Some(worker) = worker_id {
        check_len("worker id", worker, MAX_WORKER_ID_CHARS)?;
        ctx.note_worker(&env, worker);
    }

    let deadline = block_ms
        .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms as u64));
    let notifier = ctx.wake.notifier(&env);
    loop {
        // Registered before the query, so a commit between query and wait still wakes us.
        let woken = notifier.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();

        let mut conn = match held.take() {
            Some(conn) => conn,
            None => ctx.db.acquire().await?,
        };
        let token = ids::new_secret(ids::SESSIONS_TOKEN_PREFIX);
        let now = time::now();
        if let Some(row) = work::claim(
            &mut *conn,
            &env,
            &key.id,
            now,
            reclaim,
            &ids::sha256(&token),
        )
        .await?
        {
            Metrics::count(&ctx.metrics.claims);
            if row.claim_epoch > 1 {
                Metrics::count(&ctx.metrics.reclaims);
            }
            let lease = row.lease().reconcile(now);
            return Ok(
                Json(row.render(&lease, Some(ids::encode_work_secret(&token)))).into_response(),
            );
        }
        if !keys::is_live(&mut *conn, &key.id).await? {
            return Err(ApiError::unauthenticated("invalid or revoked API key"));
        }
        drop(conn);
        let Some(deadline) = deadline else { break };
        tokio::select! {
            _ = &mut woken => continue,
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    Metrics::count(&ctx.metrics.empty_polls);
    Ok(Json(Value::Null).into_response())
}

/// Ack (Environment key): the pending claim becomes `starting`.
async fn ack(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let key = environment_key_for_lease(&ctx, &mut conn, &headers, &env, "Ack").await?;
    let row = work_of(&mut conn, &env, &id).await?;
    let ttl = ctx.settings.default_ttl_seconds;
    let (row, lease, ()) =
        transition(
            &ctx,
            &mut conn,
            row,
            Fence::Key(&key.id),
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
    Ok(respond(&row, &lease))
}

// ------------------------------------------------------------------ holder endpoints (sessions token)

fn lease_state(lease: &Lease) -> LeaseStateBody {
    LeaseStateBody {
        last_heartbeat: lease.last_heartbeat().map(|t| time::format(&t)),
        lease_extended: false,
        state: lease.state,
        ttl_seconds: lease.ttl_seconds,
    }
}

fn precondition_failed(lease: &Lease) -> ApiError {
    ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        ErrorType::InvalidRequestError,
        "expected_last_heartbeat does not match the lease, or the lease expired: another holder may own this Work",
    )
    .code(ErrorCode::HeartbeatPreconditionFailed)
    .detail("current_state", serde_json::to_value(lease_state(lease)).expect("serializable"))
}

/// Heartbeat (sessions token): `expected_last_heartbeat` and `desired_ttl_seconds`
/// from the query string (as the SDK sends them) or a JSON body.
async fn heartbeat(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let row = authenticate(&ctx, &mut conn, &headers)
        .await?
        .token_for(&env, &id, "Heartbeat")?;
    let params = Params::parse(query.as_deref());
    let body = Body::parse_optional(&bytes, &["expected_last_heartbeat", "desired_ttl_seconds"])?;
    let expected_raw = match params.str("expected_last_heartbeat") {
        Some(s) => Some(s.to_string()),
        None => body
            .nullable_str("expected_last_heartbeat")?
            .flatten()
            .map(str::to_string),
    };
    let expected = match expected_raw.as_deref() {
        None => {
            return Err(ApiError::invalid_parameter(format!(
                "expected_last_heartbeat is required: {NO_HEARTBEAT} on the first beat, then the previous response's last_heartbeat"
            )))
        }
        Some(NO_HEARTBEAT) => None,
        Some(s) => Some(time::parse(s).ok_or_else(|| {
            ApiError::invalid_parameter(format!("expected_last_heartbeat must be {NO_HEARTBEAT} or an RFC 3339 timestamp, got {s:?}"))
        })?),
    };
    let ttl = match params.int(
        "desired_ttl_seconds",
        lease::MIN_TTL_SECONDS,
        lease::MAX_TTL_SECONDS,
    )? {
        Some(t) => Some(t),
        None => body.optional_int(
            "desired_ttl_seconds",
            lease::MIN_TTL_SECONDS,
            lease::MAX_TTL_SECONDS,
        )?,
    };
    let default_ttl = ctx.settings.default_ttl_seconds;
    let digest = row
        .token_sha256
        .clone()
        .expect("a token principal has a token");
    let beat = transition(
        &ctx,
        &mut conn,
        row,
        Fence::Token(&digest),
        |current, now| {
            current
                .admits_token(TokenUse::Heartbeat, now)
                .map_err(token_rejected)?;
            current
                .heartbeat(expected, ttl, now, default_ttl)
                .map_err(|_| precondition_failed(current))
        },
    )
    .await;
    if beat
        .as_ref()
        .is_err_and(|e| e.status == StatusCode::PRECONDITION_FAILED)
    {
        Metrics::count(&ctx.metrics.heartbeat_precondition_failures);
    }
    let (_, lease, beat) = beat?;
    Metrics::count(&ctx.metrics.heartbeats);
    Ok(Json(HeartbeatResponse {
        kind: "work_heartbeat".into(),
        last_heartbeat: lease
            .last_heartbeat()
            .map(|t| time::format(&t))
            .unwrap_or_default(),
        lease_extended: beat.extended,
        state: lease.state,
        ttl_seconds: lease.ttl_seconds,
    })
    .into_response())
}

fn already_stopped(id: &str) -> ApiError {
    ApiError::conflict(format!("work {id} is already stopped"))
        .code(ErrorCode::WorkAlreadyStopped)
        .final_answer()
}

/// Stop: the holder's token for its own Work, or a Workspace key for any.
async fn stop(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let principal = authenticate(&ctx, &mut conn, &headers).await?;
    let body = Body::parse_optional(&bytes, &["force"])?;
    let force = body.optional_bool("force")?.unwrap_or(false);
    let rule = |use_token: bool| {
        let id = id.clone();
        move |current: &Lease, now: Timestamp| {
            if use_token {
                current
                    .admits_token(TokenUse::Stop, now)
                    .map_err(token_rejected)?;
            }
            current
                .stop(force, now)
                .map(|next| (next, ()))
                .map_err(|StopError::AlreadyStopped| already_stopped(&id))
        }
    };
    match principal {
        Principal::Workspace(key) => {
            environment_of(&mut conn, &key, &env).await?;
            let row = work_of(&mut conn, &env, &id).await?;
            transition(&ctx, &mut conn, row, Fence::Operator, rule(false)).await?;
        }
        other => {
            let row = other.token_for(&env, &id, "Stop")?;
            let digest = row
                .token_sha256
                .clone()
                .expect("a token principal has a token");
            transition(&ctx, &mut conn, row, Fence::Token(&digest), rule(true)).await?;
        }
    }
    Metrics::count(&ctx.metrics.stops);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Result (sessions token, healthchecks): store the outcome and stop, atomically.
async fn result(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let row =
        authenticate(&ctx, &mut conn, &headers)
            .await?
            .token_for(&env, &id, "Posting a Result")?;
    let body = Body::parse(&bytes, &["status", "message"])?;
    let status = match body.required_str("status")? {
        "succeeded" => CheckStatus::Succeeded,
        "failed" => CheckStatus::Failed,
        other => {
            return Err(ApiError::invalid_parameter(format!(
                "status must be \"succeeded\" or \"failed\", got {other:?}"
            )))
        }
    };
    let message = body.required_str("message")?;
    check_len("message", message, MAX_RESULT_MESSAGE_CHARS)?;
    let outcome = CheckResult {
        status,
        message: message.to_string(),
    };
    let digest = row
        .token_sha256
        .clone()
        .expect("a token principal has a token");
    let (row, lease, _stored_or_replayed): (_, _, Completion) = transition(&ctx, &mut conn, row, Fence::Token(&digest), |current, now| {
        current.admits_token(TokenUse::Result, now).map_err(token_rejected)?;
        current.complete(&outcome, now).map_err(|e| match e {
            ResultError::NotAHealthcheck => {
                ApiError::bad_request("only healthcheck Work has a result; Session Work ends with Stop or Fail").code(ErrorCode::NotAHealthcheck)
            }
            ResultError::NotActive => ApiError::conflict(format!(
                "work {id} is {}: only an active lease (after its first heartbeat) may post a result",
                current.state.as_str()
            ))
            .code(ErrorCode::WorkNotActive)
            .final_answer(),
            ResultError::Conflict => ApiError::conflict("a different result was already stored for this Work")
                .code(ErrorCode::ResultConflict)
                .final_answer(),
        })
    })
    .await?;
    Metrics::count(&ctx.metrics.results);
    Ok(respond(&row, &lease))
}

/// Fail (sessions token): a permanent, immutable-input error ends the Work.
async fn fail(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let row = authenticate(&ctx, &mut conn, &headers)
        .await?
        .token_for(&env, &id, "Fail")?;
    let body = Body::parse(&bytes, &["error"])?;
    let error = body.required("error")?;
    let Some(error) = error.as_object() else {
        return Err(ApiError::invalid_parameter(
            "error must be an object {\"message\": …}",
        ));
    };
    if let Some(extra) = error.keys().find(|k| *k != "message") {
        return Err(ApiError::invalid_parameter(format!(
            "unknown field error.{extra}"
        )));
    }
    let message = match error.get("message") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(ApiError::invalid_parameter(
                "error.message is required and must be a non-empty string",
            ))
        }
    };
    check_len("error.message", &message, MAX_RESULT_MESSAGE_CHARS)?;
    let digest = row
        .token_sha256
        .clone()
        .expect("a token principal has a token");
    drop(conn);
    // One transaction: the Work stops and its Session terminates together.
    let mut tx = ctx.db.begin().await?;
    let mut session = match &row.session_id {
        Some(session_id) => sessions::lock(&mut tx, session_id).await?,
        None => None,
    };
    let (row, lease, ()) = transition(&ctx, &mut tx, row, Fence::Token(&digest), |current, now| {
        current
            .admits_token(TokenUse::Fail, now)
            .map_err(token_rejected)?;
        current
            .fail(&message, now)
            .map(|next| (next, ()))
            .map_err(|StopError::AlreadyStopped| already_stopped(&id))
    })
    .await?;
    if let Some(session) = session.as_mut() {
        let error = serde_json::json!({
            "type": "session.error",
            "error": {"type": "session_input_failed_error", "message": message, "retry_status": {"type": "terminal"}},
        });
        let terminated = serde_json::json!({"type": "session.status_terminated"});
        let events = [error, terminated]
            .into_iter()
            .filter_map(|e| e.as_object().cloned())
            .collect();
        let appended = sessions::append(&mut tx, session, events, false, time::now()).await?;
        tx.commit().await?;
        ctx.committed(&session.id, &appended, false);
    } else {
        tx.commit().await?;
    }
    wake_loop_if_stopped(&ctx, &lease);
    Metrics::count(&ctx.metrics.fails);
    Ok(respond(&row, &lease))
}
