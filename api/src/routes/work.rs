//! `/v1/environments/{environment_id}/work`: the Work lease API (spec §3–§4).
//! Each handler parses, authorizes, calls [`crate::service::work`] and answers.

use crate::auth::{authenticate, environment_key_for_lease, operator, Principal};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, check_len, optional_body, Params, RawBody};
use crate::lease;
use crate::metadata;
use crate::openapi::{Conflicts, Missing, PreconditionFailed, Refusals, TooLarge};
use crate::service::environments::find_environment;
use crate::service::fail as fail_service;
use crate::service::poll::{self, PollRequest};
use crate::service::work::{self as work_service, Beat, Fence};
use crate::store::cursor;
use crate::store::sessions;
use crate::store::work::{self, WorkRow};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Duration;
use mango_protocol::time;
use mango_protocol::{
    CheckResult, ClaimState, CreateWork, DeletedSessions, ErrorCode, FailWork, HeartbeatParams,
    HeartbeatResponse, Page, QueueStats, StopWork, UpdateWork, Work, WorkClaims, WorkData,
    WorkResult, WorkStopReason, WorkType, NO_HEARTBEAT,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub const MAX_RESULT_MESSAGE_CHARS: usize = 1024;
pub const MAX_WORKER_ID_CHARS: usize = 256;
const MAX_RECLAIM_MS: i64 = 24 * 3600 * 1000;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(poll))
        .routes(routes!(stats))
        .routes(routes!(claims))
        .routes(routes!(deleted_sessions))
        .routes(routes!(retrieve, update))
        .routes(routes!(ack))
        .routes(routes!(heartbeat))
        .routes(routes!(stop))
        .routes(routes!(result))
        .routes(routes!(fail))
}

/// The item as of now (reads show reconciled state), as a Workspace key
/// reads it: with its holder and lease time left.
fn render_now(ctx: &ApiContext, row: &WorkRow) -> Json<Work> {
    let now = ctx.now();
    Json(row.render_for_operator(&row.lease().reconcile(now), now))
}

// ------------------------------------------------------------------ operator endpoints

/// Create (Workspace key): a healthcheck. Session Work comes from Session admission.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work",
    tag = "Work",
    operation_id = "createWork",
    params(("environment_id" = String, Path, description = "The Environment")),
    request_body = CreateWork,
    responses(
        (status = 201, description = "The new healthcheck, `queued`", body = Work),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating Work").await?;
    let environment = find_environment(&mut conn, &key, &env).await?;
    let CreateWork { data, metadata } = body(&bytes)?;
    if let WorkData::Session { .. } = data {
        return Err(ApiError::invalid_parameter(
            "Session Work is created when a self_hosted Session receives runnable input; only {\"type\":\"healthcheck\"} can be created here",
        ));
    }
    let metadata = metadata::validate(metadata.as_ref())?;
    if environment.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {env} is archived and gets no new Work"
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    let row = work_service::create_healthcheck(&ctx, &mut conn, &env, &metadata).await?;
    Ok((StatusCode::CREATED, render_now(&ctx, &row)).into_response())
}

/// Update merges metadata: a string upserts, null deletes.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/work/{work_id}",
    tag = "Work",
    operation_id = "retrieveWork",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    responses((status = 200, description = "The Work item, time-driven transitions applied", body = Work), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Work>> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading Work").await?;
    find_environment(&mut conn, &key, &env).await?;
    Ok(render_now(
        &ctx,
        &work_service::find(&mut conn, &env, &id).await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}",
    tag = "Work",
    operation_id = "updateWork",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    request_body = UpdateWork,
    responses((status = 200, description = "The updated Work item", body = Work), Refusals, Missing, Conflicts, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn update(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Work>> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating Work").await?;
    find_environment(&mut conn, &key, &env).await?;
    let UpdateWork { metadata } = body(&bytes)?;
    let row = work_service::find(&mut conn, &env, &id).await?;
    let row = match metadata {
        None => row,
        Some(patch) => work_service::update_metadata(&mut conn, row, &patch).await?,
    };
    Ok(render_now(&ctx, &row))
}

/// List: newest first, cursor pages.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/work",
    tag = "Work",
    operation_id = "listWork",
    params(
        ("environment_id" = String, Path, description = "The Environment"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
    ),
    responses((status = 200, description = "A page of Work, newest first", body = Page<Work>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<Work>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Work").await?;
    find_environment(&mut conn, &key, &env).await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let after = params.cursor("page")?;
    let mut rows = work::list(&mut *conn, &env, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    let now = ctx.now();
    let data = rows
        .iter()
        .map(|r| r.render_for_operator(&r.lease().reconcile(now), now))
        .collect();
    Ok(Json(Page { data, next_page }))
}

/// Stats: Workspace key, or the Environment's own key.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/work/stats",
    tag = "Work",
    operation_id = "workStats",
    params(("environment_id" = String, Path, description = "The Environment")),
    responses((status = 200, description = "The Environment's queue", body = QueueStats), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn stats(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<QueueStats>> {
    let mut conn = ctx.db.acquire().await?;
    match authenticate(&ctx, &mut conn, &headers).await? {
        Principal::Workspace(key) => {
            find_environment(&mut conn, &key, &env).await?;
        }
        other => {
            other.environment_key(&env, "Work stats")?;
        }
    }
    let s = work::stats(&mut *conn, &env, ctx.now(), ctx.settings.default_reclaim).await?;
    Ok(Json(QueueStats {
        kind: "work_queue_stats".into(),
        depth: s.depth,
        pending: s.pending,
        oldest_queued_at: s.oldest_queued_at,
        workers_polling: Some(s.workers_polling),
    }))
}

// ------------------------------------------------------------------ supervisor endpoints

/// Poll (Environment key): claim the oldest available item, or wait up to
/// `block_ms` for one; `null` when there is none.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/work/poll",
    tag = "Work",
    operation_id = "pollWork",
    params(
        ("environment_id" = String, Path, description = "The Environment"),
        ("block_ms" = Option<i64>, Query, minimum = 1, maximum = 999, description = "Wait up to this long for an item"),
        ("reclaim_older_than_ms" = Option<i64>, Query, minimum = 0, maximum = 86400000, description = "Reclaim pending claims older than this (default 5000)"),
        ("worker_id" = Option<String>, Query, max_length = 256, description = "The polling worker (or the `anthropic-worker-id` header)"),
        ("anthropic-worker-id" = Option<String>, Header, nullable = false, max_length = 256, description = "The polling worker"),
    ),
    responses(
        (status = 200, description = "The claimed item with its `secret`, or `null` when there is none", body = Option<Work>),
        Refusals, Missing,
    ),
    security(("bearer" = []))
)]
async fn poll(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Option<Work>>> {
    let mut conn = ctx.db.acquire().await?;
    let key = environment_key_for_lease(&ctx, &mut conn, &headers, &env, "Poll").await?;
    let params = Params::parse(query.as_deref())?;
    let block = params
        .int("block_ms", 1, 999)?
        .map(|ms| std::time::Duration::from_millis(ms as u64));
    let reclaim_after = params
        .int("reclaim_older_than_ms", 0, MAX_RECLAIM_MS)?
        .map(Duration::milliseconds)
        .unwrap_or(ctx.settings.default_reclaim);
    let worker_id = worker_id(&headers, &params)?;
    if let Some(worker) = worker_id {
        ctx.note_worker(&env, worker);
    }
    let request = PollRequest {
        environment_id: &env,
        key_id: &key.id,
        block,
        reclaim_after,
        worker_id,
    };
    let claimed = poll::poll(&ctx, request, Some(conn)).await?;
    Ok(Json(claimed.map(|(row, secret)| {
        row.render(&row.lease().reconcile(ctx.now()), Some(secret))
    })))
}

/// The poller's worker id: the `anthropic-worker-id` header, else the
/// `worker_id` query parameter; empty is no id. It is shown to operators
/// (terminals, tables), so it is refused, not cut, when it is longer than
/// [`MAX_WORKER_ID_CHARS`] or holds a control character: a cut id would name
/// a different worker.
fn worker_id<'a>(headers: &'a HeaderMap, params: &'a Params) -> ApiResult<Option<&'a str>> {
    let worker = match headers.get("anthropic-worker-id") {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::invalid_parameter("the anthropic-worker-id header must be printable ASCII")
        })?),
        None => params.str("worker_id"),
    };
    let Some(worker) = worker.filter(|w| !w.is_empty()) else {
        return Ok(None);
    };
    check_len("worker id", worker, MAX_WORKER_ID_CHARS)?;
    if let Some((at, c)) = worker.chars().enumerate().find(|(_, c)| c.is_control()) {
        return Err(ApiError::invalid_parameter(format!(
            "worker id must be printable; character {} is the control character U+{:04X}",
            at + 1,
            c as u32
        )));
    }
    Ok(Some(worker))
}

/// Most items one claims request asks about (a supervisor's live sandboxes).
pub const MAX_CLAIMS_PER_REQUEST: usize = 100;

/// Claims (Environment key; Mango's extension): where the items `ids[]`
/// stand that this key claimed, reconciled as every read is. Items another
/// key claimed, or none, are left out, so a supervisor learns only of its own.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/work/claims",
    tag = "Work",
    operation_id = "workClaims",
    params(
        ("environment_id" = String, Path, description = "The Environment"),
        ("ids[]" = Option<Vec<String>>, Query, style = Form, explode, description = "Work ids, at most 100"),
    ),
    responses((status = 200, description = "The listed items this key claimed, with their state, claim number and whether the lease was lost", body = WorkClaims), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn claims(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<WorkClaims>> {
    let mut conn = ctx.db.acquire().await?;
    let key = authenticate(&ctx, &mut conn, &headers)
        .await?
        .environment_key(&env, "Reading claims")?;
    let params = Params::parse(query.as_deref())?;
    let ids: Vec<String> = params
        .all("ids[]")
        .into_iter()
        .map(str::to_string)
        .collect();
    if ids.len() > MAX_CLAIMS_PER_REQUEST {
        return Err(ApiError::invalid_parameter(format!(
            "{} ids[] in one request; at most {MAX_CLAIMS_PER_REQUEST} are allowed",
            ids.len()
        )));
    }
    let now = ctx.now();
    let data = work::claimed_by(&mut *conn, &env, &key.id, &ids)
        .await?
        .into_iter()
        .map(|row| {
            let lease = row.lease().reconcile(now);
            ClaimState {
                id: row.id,
                state: lease.state,
                claim: row.claim_epoch,
                stop_requested_at: lease.stop_requested_at,
                lease_lost: lease.is_available(now, ctx.settings.default_reclaim),
                keepable: lease.keepable(),
            }
        })
        .collect();
    Ok(Json(WorkClaims {
        kind: "work_claims".into(),
        data,
    }))
}

/// Deleted Sessions (Environment key; Mango's extension): which of the
/// Session ids `ids[]` name no Session of this Environment now, so a
/// supervisor can remove the workspaces it keeps for them. It says nothing
/// of a Session but whether it still exists here.
#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}/sessions/deleted",
    tag = "Work",
    operation_id = "deletedSessions",
    params(
        ("environment_id" = String, Path, description = "The Environment"),
        ("ids[]" = Option<Vec<String>>, Query, style = Form, explode, description = "Session ids, at most 100"),
    ),
    responses((status = 200, description = "The listed ids that name no Session of this Environment now", body = DeletedSessions), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn deleted_sessions(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<DeletedSessions>> {
    let mut conn = ctx.db.acquire().await?;
    authenticate(&ctx, &mut conn, &headers)
        .await?
        .environment_key(&env, "Reading deleted Sessions")?;
    let params = Params::parse(query.as_deref())?;
    let ids: Vec<String> = params
        .all("ids[]")
        .into_iter()
        .map(str::to_string)
        .collect();
    if ids.len() > MAX_CLAIMS_PER_REQUEST {
        return Err(ApiError::invalid_parameter(format!(
            "{} ids[] in one request; at most {MAX_CLAIMS_PER_REQUEST} are allowed",
            ids.len()
        )));
    }
    let existing = sessions::existing_in(&mut *conn, &env, &ids).await?;
    let mut data: Vec<String> = ids
        .into_iter()
        .filter(|id| !existing.contains(id))
        .collect();
    data.sort();
    data.dedup();
    Ok(Json(DeletedSessions {
        kind: "deleted_sessions".into(),
        data,
    }))
}

/// Ack (Environment key): the pending claim becomes `starting`.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}/ack",
    tag = "Work",
    operation_id = "ackWork",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    responses((status = 200, description = "The acknowledged item, `starting`", body = Work), Refusals, Missing, Conflicts),
    security(("bearer" = []))
)]
async fn ack(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Work>> {
    let mut conn = ctx.db.acquire().await?;
    let key = environment_key_for_lease(&ctx, &mut conn, &headers, &env, "Ack").await?;
    let row = work_service::find(&mut conn, &env, &id).await?;
    let (row, lease) = work_service::ack(&ctx, &mut conn, row, &key.id).await?;
    Ok(Json(row.render(&lease, None)))
}

// ------------------------------------------------------------------ holder endpoints (sessions token)

/// Heartbeat (sessions token): `expected_last_heartbeat` and `desired_ttl_seconds`
/// from the query string (as the SDK sends them) or a JSON body.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}/heartbeat",
    tag = "Work",
    operation_id = "heartbeatWork",
    params(
        ("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item"),
        ("expected_last_heartbeat" = Option<String>, Query, description = "`NO_HEARTBEAT` on the first beat, then the previous response's `last_heartbeat` (or in the body)"),
        ("desired_ttl_seconds" = Option<i64>, Query, minimum = 1, maximum = 300, description = "The lease TTL to set (or in the body)"),
    ),
    request_body = Option<HeartbeatParams>,
    responses(
        (status = 200, description = "The lease after this beat", body = HeartbeatResponse),
        Refusals, Missing, Conflicts, PreconditionFailed, TooLarge,
    ),
    security(("bearer" = []))
)]
async fn heartbeat(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<HeartbeatResponse>> {
    let mut conn = ctx.db.acquire().await?;
    let row = authenticate(&ctx, &mut conn, &headers)
        .await?
        .token_for(&env, &id, "Heartbeat")?;
    let params = Params::parse(query.as_deref())?;
    let from_body: HeartbeatParams = optional_body(&bytes)?;
    let expected = match params
        .str("expected_last_heartbeat")
        .or(from_body.expected_last_heartbeat.as_deref())
    {
        None => {
            return Err(ApiError::invalid_parameter(format!(
                "expected_last_heartbeat is required: {NO_HEARTBEAT} on the first beat, then the previous response's last_heartbeat"
            )))
        }
        Some(NO_HEARTBEAT) => None,
        Some(s) => Some(time::parse(s).ok_or_else(|| {
            ApiError::invalid_parameter(format!(
                "expected_last_heartbeat must be {NO_HEARTBEAT} or an RFC 3339 timestamp, got {s:?}"
            ))
        })?),
    };
    let (min, max) = (lease::MIN_TTL_SECONDS, lease::MAX_TTL_SECONDS);
    let desired_ttl = match params.int("desired_ttl_seconds", min, max)? {
        Some(t) => Some(t),
        None => match from_body.desired_ttl_seconds {
            Some(t) if !(min..=max).contains(&t) => {
                return Err(ApiError::invalid_parameter(format!(
                    "desired_ttl_seconds must be an integer from {min} through {max}"
                )))
            }
            t => t,
        },
    };
    let beat = Beat {
        expected,
        desired_ttl,
    };
    Ok(Json(
        work_service::heartbeat(&ctx, &mut conn, row, beat).await?,
    ))
}

/// Stop: the holder's token for its own Work, or a Workspace key for any.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}/stop",
    tag = "Work",
    operation_id = "stopWork",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    request_body = Option<StopWork>,
    responses(
        (status = 204, description = "Stopped, or `stopping` until the lease runs out"),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn stop(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<StatusCode> {
    let mut conn = ctx.db.acquire().await?;
    let principal = authenticate(&ctx, &mut conn, &headers).await?;
    let StopWork { force, reason } = optional_body(&bytes)?;
    let force = force.unwrap_or(false);
    let idle = reason == Some(WorkStopReason::Idle);
    if idle && !force {
        return Err(ApiError::invalid_parameter(
            "reason \"idle\" ends the Work at once: it needs force: true",
        ));
    }
    match principal {
        Principal::Workspace(key) => {
            if idle {
                return Err(ApiError::invalid_parameter(
                    "reason \"idle\" is the holder's: only the Work's sessions token may give it",
                ));
            }
            find_environment(&mut conn, &key, &env).await?;
            let row = work_service::find(&mut conn, &env, &id).await?;
            work_service::stop(&ctx, &mut conn, row, Fence::Operator, force, false).await?;
        }
        other => {
            let row = other.token_for(&env, &id, "Stop")?;
            if idle && row.kind == WorkType::Healthcheck {
                return Err(ApiError::invalid_parameter(
                    "reason \"idle\" is for Session Work; a healthcheck ends with its Result",
                ));
            }
            let digest = row.token_sha256.clone().unwrap_or_default();
            work_service::stop(&ctx, &mut conn, row, Fence::Token(&digest), force, idle).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Result (sessions token, healthchecks): store the outcome and stop, atomically.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}/result",
    tag = "Work",
    operation_id = "workResult",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    request_body = WorkResult,
    responses(
        (status = 200, description = "The stopped healthcheck with its result", body = Work),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []))
)]
async fn result(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Work>> {
    let mut conn = ctx.db.acquire().await?;
    let row =
        authenticate(&ctx, &mut conn, &headers)
            .await?
            .token_for(&env, &id, "Posting a Result")?;
    let WorkResult { status, message } = body(&bytes)?;
    check_len("message", &message, MAX_RESULT_MESSAGE_CHARS)?;
    let outcome = CheckResult {
        status: status.into(),
        message,
    };
    let (row, lease) = work_service::complete(&ctx, &mut conn, row, outcome).await?;
    Ok(Json(row.render(&lease, None)))
}

/// Fail (sessions token): a permanent, immutable-input error ends the Work
/// and terminates its Session.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/work/{work_id}/fail",
    tag = "Work",
    operation_id = "failWork",
    params(("environment_id" = String, Path, description = "The Environment"), ("work_id" = String, Path, description = "The Work item")),
    request_body = FailWork,
    responses(
        (status = 200, description = "The stopped item; its Session is terminated", body = Work),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []))
)]
async fn fail(
    State(ctx): State<ApiContext>,
    Path((env, id)): Path<(String, String)>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Work>> {
    let mut conn = ctx.db.acquire().await?;
    let row = authenticate(&ctx, &mut conn, &headers)
        .await?
        .token_for(&env, &id, "Fail")?;
    let FailWork { error } = body(&bytes)?;
    if error.message.trim().is_empty() {
        return Err(ApiError::invalid_parameter(
            "error.message must be a non-empty string",
        ));
    }
    check_len("error.message", &error.message, MAX_RESULT_MESSAGE_CHARS)?;
    drop(conn);
    let digest = row.token_sha256.clone().unwrap_or_default();
    let (row, lease) = fail_service::fail(&ctx, row, Fence::Token(&digest), &error.message).await?;
    Ok(Json(row.render(&lease, None)))
}
