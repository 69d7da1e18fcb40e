//! `/v1/sessions`: Sessions, their events and the event stream (spec §5).
//! A Workspace key has full access; the sessions token of a Session's live
//! Work reads that Session and sends only tool results; Environment keys get 403.

use crate::admission::{self, Admission};
use crate::auth::{self, authenticate, operator, Principal};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::event_shapes;
use crate::extract::{check_len, Body, Params, RawBody};
use crate::lease::TokenUse;
use crate::metrics::Metrics;
use crate::session_rules::{self as rules, Sender};
use crate::store::sessions::{self, EventFilter, ListFilter, SessionRow};
use crate::store::work::{self, WorkRow};
use crate::store::{agents, cursor, environments};
use crate::{ids, metadata};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mango_protocol::{time, ErrorCode};
use serde_json::{json, Value};
use sqlx::PgConnection;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast;

/// A live stream re-checks its sessions token this often (spec §2).
const TOKEN_RECHECK: Duration = Duration::from_secs(1);
/// Every this many rechecks a stream also reads the log itself, in case a
/// notification was lost; the shared feed covers everything else.
const SAFETY_READ_EVERY_TICKS: u64 = 5;
const MAX_TITLE_CHARS: usize = 500;

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", get(retrieve).delete(delete))
        .route("/v1/sessions/{id}/archive", post(archive))
        .route(
            "/v1/sessions/{id}/events",
            get(list_events).post(send_events),
        )
        .route("/v1/sessions/{id}/events/stream", get(stream))
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("session {id} not found")).code(ErrorCode::SessionNotFound)
}

/// Who may touch this Session, and as what.
enum Access {
    Operator,
    /// The sessions token of this Session's Work; `digest` names the claim.
    Worker {
        digest: Vec<u8>,
    },
}

/// Resolves the caller against Session `id`: a Workspace key of its workspace,
/// or a live sessions token whose Work serves this Session.
async fn access(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
    id: &str,
    what: &str,
) -> ApiResult<(SessionRow, Access)> {
    match authenticate(ctx, conn, headers).await? {
        Principal::Workspace(key) => {
            let session = sessions::find(&mut *conn, Some(&key.workspace_id), id)
                .await?
                .ok_or_else(|| not_found(id))?;
            Ok((session, Access::Operator))
        }
        Principal::Token(row) => {
            let now = time::now();
            row.lease()
                .reconcile(now)
                .admits_token(TokenUse::Session, now)
                .map_err(|r| ApiError::unauthenticated(r.message()))?;
            if row.session_id.as_deref() != Some(id) {
                return Err(ApiError::forbidden(format!(
                    "{what}: this sessions token belongs to another Session"
                )));
            }
            let session = sessions::find(&mut *conn, None, id)
                .await?
                .ok_or_else(|| not_found(id))?;
            Ok((
                session,
                Access::Worker {
                    digest: row.token_sha256.clone().unwrap_or_default(),
                },
            ))
        }
        other => Err(ApiError::forbidden(format!(
            "{what} is not permitted with {}",
            match other {
                Principal::Environment(_) => "an Environment key",
                _ => "this credential",
            }
        ))),
    }
}

// ------------------------------------------------------------------ sessions

async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating a Session").await?;
    let body = Body::parse(
        &bytes,
        &[
            "agent",
            "environment_id",
            "resources",
            "metadata",
            "title",
            "initial_events",
            "vault_ids",
            "budget",
        ],
    )?;
    let (agent_id, version) = match body.required("agent")? {
        Value::String(id) => (id.clone(), None),
        Value::Object(a) => {
            if let Some(extra) = a
                .keys()
                .find(|k| !["type", "id", "version"].contains(&k.as_str()))
            {
                return Err(ApiError::invalid_parameter(format!(
                    "unknown field agent.{extra}"
                )));
            }
            let id = a
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid_parameter("agent.id is required"))?;
            let version = match a.get("version") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_i64()
                        .and_then(|v| i32::try_from(v).ok())
                        .filter(|v| *v >= 1)
                        .ok_or_else(|| {
                            ApiError::invalid_parameter("agent.version must be a positive integer")
                        })?,
                ),
            };
            (id.to_string(), version)
        }
        _ => {
            return Err(ApiError::invalid_parameter(
                "agent must be an agent id or {\"id\", \"version\"}",
            ))
        }
    };
    let environment_id = body.required_str("environment_id")?;
    let meta = metadata::validate(body.get("metadata"))?;
    let title = body.nullable_str("title")?.flatten();
    if let Some(t) = title {
        check_len("title", t, MAX_TITLE_CHARS)?;
    }
    let resources = check_resources(body.get("resources"))?;
    if body
        .get("vault_ids")
        .and_then(Value::as_array)
        .is_some_and(|v| !v.is_empty())
    {
        return Err(ApiError::invalid_parameter(
            "vault_ids are not supported by Mango",
        ));
    }
    if body.get("budget").is_some_and(|b| !b.is_null()) {
        return Err(ApiError::invalid_parameter(
            "budget is not supported by Mango",
        ));
    }
    let initial = match body.get("initial_events") {
        None | Some(Value::Null) => Vec::new(),
        Some(events) => {
            let checked = event_shapes::check_all(events)?;
            if let Some((i, t)) = checked
                .iter()
                .map(|e| e.get("type").and_then(Value::as_str).unwrap_or(""))
                .enumerate()
                .find(|(_, t)| !matches!(*t, "user.message" | "user.define_outcome"))
            {
                return Err(ApiError::invalid_parameter(format!(
                    "initial_events[{i}]: {t:?}; initial events are user.message or user.define_outcome"
                )));
            }
            checked
        }
    };

    let environment = environments::find(&mut *conn, &key.workspace_id, environment_id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("environment {environment_id} not found"))
                .code(ErrorCode::EnvironmentNotFound)
        })?;
    if environment.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {environment_id} is archived; it takes no new Sessions"
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    let agent = agents::find(&mut *conn, &key.workspace_id, &agent_id, version)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(match version {
                Some(v) => format!("agent {agent_id} has no version {v}"),
                None => format!("agent {agent_id} not found"),
            })
            .code(ErrorCode::AgentNotFound)
        })?;
    if agent.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "agent {agent_id} is archived; it takes no new Sessions"
        ))
        .code(ErrorCode::AgentArchived));
    }
    let mut snapshot = agent.render();
    if let Value::Object(map) = &mut snapshot {
        for k in ["created_at", "updated_at", "archived_at", "metadata"] {
            map.remove(k);
        }
    }

    let now = time::now();
    let row = SessionRow {
        id: ids::new_id("sesn"),
        workspace_id: key.workspace_id.clone(),
        environment_id: environment_id.to_string(),
        agent_id: agent.id.clone(),
        agent_version: agent.version,
        agent: snapshot,
        status: rules::Status::Idle.as_str().into(),
        title: title.map(str::to_string),
        metadata: metadata::to_json(&meta),
        resources,
        last_seq: 0,
        created_at: now,
        updated_at: now,
        archived_at: None,
    };
    // The Session and its initial input (and so its first Work) commit together.
    let mut tx = ctx.db.begin().await?;
    let mut session = sessions::insert(&mut *tx, &row).await?;
    let admitted = if initial.is_empty() {
        None
    } else {
        let admission = admission::admit(
            &mut tx,
            &mut session,
            false,
            Sender::Operator,
            initial,
            &ctx.settings,
        )
        .await?;
        Some(admission)
    };
    tx.commit().await?;
    if let Some(admitted) = admitted {
        ctx.committed(&session.id, &admitted.appended, admitted.wrote_outbox());
    }
    Ok(Json(session.render()).into_response())
}

/// `resources`: `memory_store` attachments (with `access`), `file`, `github_repository`.
fn check_resources(value: Option<&Value>) -> ApiResult<Value> {
    let list = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid_parameter("resources must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, r) in list.iter().enumerate() {
        let Some(obj) = r.as_object() else {
            return Err(ApiError::invalid_parameter(format!(
                "resources[{i}] must be an object"
            )));
        };
        let (allowed, required): (&[&str], &[&str]) = match obj.get("type").and_then(Value::as_str)
        {
            Some("memory_store") => (
                &[
                    "type",
                    "memory_store_id",
                    "access",
                    "mount_path",
                    "name",
                    "description",
                    "instructions",
                ],
                &["memory_store_id"],
            ),
            Some("file") => (&["type", "file_id", "mount_path"], &["file_id"]),
            Some("github_repository") => (
                &[
                    "type",
                    "url",
                    "mount_path",
                    "checkout",
                    "authorization_token",
                ],
                &["url"],
            ),
            other => {
                return Err(ApiError::invalid_parameter(format!(
                    "resources[{i}].type {other:?} is not memory_store, file or github_repository"
                )))
            }
        };
        if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::invalid_parameter(format!(
                "resources[{i}]: unknown field {k:?}"
            )));
        }
        for k in required {
            if obj
                .get(*k)
                .and_then(Value::as_str)
                .is_none_or(|s| s.is_empty())
            {
                return Err(ApiError::invalid_parameter(format!(
                    "resources[{i}].{k} is required"
                )));
            }
        }
        if let Some(access) = obj.get("access").filter(|a| !a.is_null()) {
            if !matches!(access.as_str(), Some("read_write" | "read_only")) {
                return Err(ApiError::invalid_parameter(format!(
                    "resources[{i}].access must be read_write or read_only"
                )));
            }
        }
        let mut stored = obj.clone();
        // A credential is used once to clone, never stored or echoed.
        stored.remove("authorization_token");
        out.push(Value::Object(stored));
    }
    Ok(Value::Array(out))
}

async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let (session, _) = access(&ctx, &mut conn, &headers, &id, "Reading a Session").await?;
    Ok(Json(session.render()).into_response())
}

/// List: newest first by default; `next_page` and `prev_page` cursors.
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Sessions").await?;
    let params = Params::parse(query.as_deref());
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let ascending = match params.str("order") {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::invalid_parameter(format!(
                "order must be asc or desc, got {other:?}"
            )))
        }
    };
    let statuses = params.all("statuses[]");
    if let Some(bad) = statuses.iter().find(|s| rules::Status::parse(s).is_none()) {
        return Err(ApiError::invalid_parameter(format!(
            "statuses[] {bad:?} is not idle, running, rescheduling or terminated"
        )));
    }
    let (cursor, backwards) = match params.str("page").filter(|p| !p.is_empty()) {
        None => (None, false),
        Some(page) => {
            let (ts, id) = cursor::decode(page)?;
            match id.strip_prefix('<') {
                Some(id) => (Some((ts, id.to_string())), true),
                None => (Some((ts, id.trim_start_matches('>').to_string())), false),
            }
        }
    };
    let filter = ListFilter {
        workspace_id: &key.workspace_id,
        statuses: statuses.into_iter().map(str::to_string).collect(),
        agent_id: params.str("agent_id"),
        include_archived: params.bool("include_archived")?.unwrap_or(false),
        ascending,
    };
    let mut rows =
        sessions::list(&mut *conn, &filter, cursor.clone(), backwards, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    if more {
        if backwards {
            rows.remove(0);
        } else {
            rows.truncate(limit as usize);
        }
    }
    let next_page = (more || backwards)
        .then(|| {
            rows.last()
                .map(|r| cursor::encode(&r.created_at, &format!(">{}", r.id)))
        })
        .flatten();
    let prev_page = (cursor.is_some() && (!backwards || more))
        .then(|| {
            rows.first()
                .map(|r| cursor::encode(&r.created_at, &format!("<{}", r.id)))
        })
        .flatten();
    let data: Vec<Value> = rows.iter().map(SessionRow::render).collect();
    Ok(Json(json!({"data": data, "next_page": next_page, "prev_page": prev_page})).into_response())
}

async fn archive(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving a Session").await?;
    sessions::find(&mut *conn, Some(&key.workspace_id), &id)
        .await?
        .ok_or_else(|| not_found(&id))?;
    let row = sessions::set_archived(&mut *conn, &id, time::now())
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(row.render()).into_response())
}

async fn delete(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Deleting a Session").await?;
    if !sessions::delete(&mut *conn, &key.workspace_id, &id).await? {
        return Err(not_found(&id));
    }
    Ok(Json(json!({"id": id, "type": "session_deleted"})).into_response())
}

// ------------------------------------------------------------------ events

/// List: ascending by default, `limit` up to 1000, complete cursor pages.
async fn list_events(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let (session, _) = access(&ctx, &mut conn, &headers, &id, "Listing events").await?;
    let params = Params::parse(query.as_deref());
    let limit = params.int("limit", 1, 1000)?.unwrap_or(100);
    let ascending = match params.str("order") {
        None | Some("asc") => true,
        Some("desc") => false,
        Some(other) => {
            return Err(ApiError::invalid_parameter(format!(
                "order must be asc or desc, got {other:?}"
            )))
        }
    };
    let types: Vec<String> = params
        .all("types[]")
        .into_iter()
        .map(str::to_string)
        .collect();
    if let Some(bad) = types
        .iter()
        .find(|t| !rules::KNOWN_TYPES.contains(&t.as_str()))
    {
        return Err(ApiError::invalid_parameter(format!(
            "types[] {bad:?} is not an event type"
        )));
    }
    let filter = EventFilter {
        types,
        gt: params.timestamp("created_at[gt]")?,
        gte: params.timestamp("created_at[gte]")?,
        lt: params.timestamp("created_at[lt]")?,
        lte: params.timestamp("created_at[lte]")?,
        ascending,
    };
    let after = match params.str("page").filter(|p| !p.is_empty()) {
        None => None,
        Some(page) => Some(cursor::decode(page)?.1.parse::<i64>().map_err(|_| {
            ApiError::invalid_parameter("page is not a cursor this API issued")
                .code(ErrorCode::InvalidCursor)
        })?),
    };
    let mut rows =
        sessions::list_events(&mut *conn, &session.id, &filter, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| {
        cursor::encode(&session.created_at, &r.seq.to_string())
    });
    let data: Vec<Value> = rows.into_iter().map(|r| r.body).collect();
    Ok(Json(json!({"data": data, "next_page": next_page})).into_response())
}

/// Send: `{events: […]}` → `{data: […]}`, admitted in one transaction that
/// holds the Session's row lock — except a worker's single tool result, which
/// takes the one-statement fenced path when nothing stands in its way.
async fn send_events(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let body = Body::parse(&bytes, &["events"])?;
    let mut conn = ctx.reused.take(&ctx.db).await?;
    // A worker's next result, with the claim this process just saw.
    if let Some(work) = auth::recent_claim(&ctx, &headers) {
        if worker_may_send(&work, &id).is_ok() {
            let events = event_shapes::check_all(body.required("events")?)?;
            if let Some(admitted) =
                admission::admit_worker_result(&mut conn, &work, &id, &events).await?
            {
                conn.finish();
                return Ok(admitted_reply(&ctx, &id, admitted, true));
            }
        }
    }
    let (sender, workspace, claim) = match authenticate(&ctx, &mut conn, &headers).await? {
        Principal::Workspace(key) => (Sender::Operator, Some(key.workspace_id), None),
        Principal::Token(row) => {
            worker_may_send(&row, &id)?;
            auth::remember_claim(&ctx, &headers, &row);
            (Sender::Worker, None, Some(row))
        }
        Principal::Environment(_) => {
            return Err(ApiError::forbidden(
                "Sending events is not permitted with an Environment key",
            ))
        }
    };
    let events = event_shapes::check_all(body.required("events")?)?;
    if let Some(work) = &claim {
        if let Some(admitted) =
            admission::admit_worker_result(&mut conn, work, &id, &events).await?
        {
            conn.finish();
            return Ok(admitted_reply(&ctx, &id, admitted, true));
        }
    }
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let (mut session, has_live_work) =
        sessions::lock_for_admission(&mut tx, &id, workspace.as_deref())
            .await?
            .ok_or_else(|| not_found(&id))?;
    let admitted = admission::admit(
        &mut tx,
        &mut session,
        has_live_work,
        sender,
        events,
        &ctx.settings,
    )
    .await?;
    tx.commit().await?;
    conn.finish();
    Ok(admitted_reply(&ctx, &id, admitted, false))
}

/// A sessions token may send events to its own Session while its lease lives.
fn worker_may_send(work: &WorkRow, session_id: &str) -> ApiResult<()> {
    let now = time::now();
    work.lease()
        .reconcile(now)
        .admits_token(TokenUse::Session, now)
        .map_err(|r| ApiError::unauthenticated(r.message()))?;
    if work.session_id.as_deref() != Some(session_id) {
        return Err(ApiError::forbidden(
            "Sending events: this sessions token belongs to another Session",
        ));
    }
    Ok(())
}

/// Hands the committed events to this process's streams, then answers.
fn admitted_reply(
    ctx: &ApiContext,
    session_id: &str,
    admitted: Admission,
    fenced: bool,
) -> Response {
    Metrics::count(if fenced {
        &ctx.metrics.fenced_results
    } else {
        &ctx.metrics.locked_admissions
    });
    ctx.committed(session_id, &admitted.appended, admitted.wrote_outbox());
    Json(json!({ "data": admitted.data })).into_response()
}

/// SSE: every frame carries `event:`; `event: ping` keeps it alive. Starts
/// after the events committed when it opened, so history listed after opening
/// plus the stream covers every event. A sessions token is re-checked each
/// second and the stream closes once it is no longer valid.
async fn stream(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let (session, access) = access(&ctx, &mut conn, &headers, &id, "Streaming events").await?;
    // Subscribe before reading the starting point, so nothing committed in between is missed.
    let feed = ctx.events.subscribe(&session.id);
    let last_seq = sessions::last_seq(&mut *conn, &session.id)
        .await?
        .unwrap_or(session.last_seq);
    drop(conn);

    let ping_every = ctx.settings.stream_ping_interval;
    let mut recheck = tokio::time::interval(TOKEN_RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = Forwarding {
        ctx,
        id,
        access,
        feed,
        last_seq,
        recheck,
        ticks: 0,
        ready: VecDeque::new(),
    };
    // Polled by the connection itself: a committed event goes from the feed
    // to the socket without another task or channel in between.
    let body = futures::stream::unfold(state, |mut state| async move {
        let event = state.next().await?;
        let kind = event
            .body
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_string();
        let frame = Event::default().event(kind).data(event.body.to_string());
        Some((Ok::<_, Infallible>(frame), state))
    });
    let ping = Event::default().event("ping").data("{}");
    Ok(Sse::new(body)
        .keep_alive(KeepAlive::new().interval(ping_every).event(ping))
        .into_response())
}

/// One stream's position: the feed it listens to, the last sequence number
/// it forwarded, and events read from the database but not yet forwarded.
struct Forwarding {
    ctx: ApiContext,
    id: String,
    access: Access,
    feed: broadcast::Receiver<sessions::LoggedEvent>,
    last_seq: i64,
    recheck: tokio::time::Interval,
    ticks: u64,
    ready: VecDeque<sessions::LoggedEvent>,
}

impl Forwarding {
    /// The next event to forward, in sequence; `None` ends the stream (the
    /// sessions token is no longer valid, or the feed closed).
    async fn next(&mut self) -> Option<sessions::LoggedEvent> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                if event.seq <= self.last_seq {
                    continue;
                }
                self.last_seq = event.seq;
                return Some(event);
            }
            let fed = tokio::select! {
                fed = self.feed.recv() => fed,
                _ = self.recheck.tick() => {
                    if let Access::Worker { digest } = &self.access {
                        if !token_still_valid(&self.ctx, digest, &self.id).await {
                            return None;
                        }
                    }
                    self.ticks += 1;
                    if !self.ticks.is_multiple_of(SAFETY_READ_EVERY_TICKS) {
                        continue;
                    }
                    // Safety net: anything a lost notification held back.
                    Err(broadcast::error::RecvError::Lagged(0))
                }
            };
            match fed {
                Ok(event) if event.seq <= self.last_seq => {}
                Ok(event) if event.seq == self.last_seq + 1 => self.ready.push_back(event),
                // A gap, a lag or a tick: the database has every event after last_seq.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(events) = catch_up(&self.ctx, &self.id, self.last_seq).await {
                        self.ready.extend(events);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// Every event after `seq`, read from the database (bounded per call; the
/// next tick or event continues from where this left off).
async fn catch_up(
    ctx: &ApiContext,
    session_id: &str,
    seq: i64,
) -> Option<Vec<sessions::LoggedEvent>> {
    match sessions::events_after(&ctx.db, session_id, seq, 1000).await {
        Ok(rows) => Some(rows.into_iter().map(Into::into).collect()),
        Err(err) => {
            tracing::warn!(error = %err, session_id, "event stream catch-up failed");
            None
        }
    }
}

async fn token_still_valid(ctx: &ApiContext, digest: &[u8], session_id: &str) -> bool {
    let now = time::now();
    match work::find_by_token(&ctx.db, digest).await {
        Ok(Some(row)) => {
            row.session_id.as_deref() == Some(session_id)
                && row
                    .lease()
                    .reconcile(now)
                    .admits_token(TokenUse::Session, now)
                    .is_ok()
        }
        Ok(None) => false,
        // A database hiccup is not proof of invalidation; the next tick decides.
        Err(_) => true,
    }
}
