//! `/v1/sessions/{id}/events`: a Session's event log, the events clients
//! send, and the live stream (spec §5). A sessions token reads its own
//! Session and sends only tool results.

use crate::auth::{self, authenticate, session_access, worker_may_use, Principal, SessionAccess};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::event_shapes;
use crate::extract::{body, Params, RawBody};
use crate::metrics::Metrics;
use crate::openapi::{Conflicts, EventTypeName, Missing, Refusals, StreamFrame, TooLarge};
use crate::service::admission::{self, Admission};
use crate::session_rules::Sender;
use crate::store::cursor;
use crate::store::events::{self, EventFilter, LoggedEvent};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use mango_protocol::events::EVENT_TYPES;
use mango_protocol::sessions::{SendEvents, SentEvents};
use mango_protocol::ErrorCode;
use mango_protocol::Page;
use serde::Serialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// A live stream re-checks its credential this often (spec §2).
const CREDENTIAL_RECHECK: Duration = Duration::from_secs(1);
/// Every this many rechecks a stream also reads the log itself, in case a
/// notification was lost; the shared feed covers everything else.
const SAFETY_READ_EVERY_TICKS: u64 = 5;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(list_events, send_events))
        .routes(routes!(stream))
}

/// A page of events, as stored.
#[derive(Serialize)]
pub struct EventPage {
    pub data: Vec<Value>,
    pub next_page: Option<String>,
}

/// The answer to a send: each event as stored.
#[derive(Serialize)]
pub struct SentEventBodies {
    pub data: Vec<Arc<Value>>,
}

/// List: ascending by default, `limit` up to 1000, complete cursor pages.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/events",
    tag = "Events",
    operation_id = "listEvents",
    params(
        ("session_id" = String, Path, description = "The Session"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "Events per page (default 100)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "`asc` (default) or `desc`"),
        ("types[]" = Option<Vec<EventTypeName>>, Query, style = Form, explode, description = "Only events of these types"),
        ("created_at[gt]" = Option<String>, Query, format = DateTime, description = "Created after (RFC 3339)"),
        ("created_at[gte]" = Option<String>, Query, format = DateTime, description = "Created at or after (RFC 3339)"),
        ("created_at[lt]" = Option<String>, Query, format = DateTime, description = "Created before (RFC 3339)"),
        ("created_at[lte]" = Option<String>, Query, format = DateTime, description = "Created at or before (RFC 3339)"),
    ),
    responses((status = 200, description = "A page of the Session's events, as stored", body = Page<mango_protocol::events::Event>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list_events(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<EventPage>> {
    let mut conn = ctx.db.acquire().await?;
    let (session, _) = session_access(&ctx, &mut conn, &headers, &id, "Listing events").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 1000)?.unwrap_or(100);
    let ascending = params.order(true)?;
    let types: Vec<String> = params
        .all("types[]")
        .into_iter()
        .map(str::to_string)
        .collect();
    if let Some(bad) = types.iter().find(|t| !EVENT_TYPES.contains(&t.as_str())) {
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
    let after = match params.cursor("page")? {
        None => None,
        Some((_, seq)) => Some(seq.parse::<i64>().map_err(|_| {
            ApiError::invalid_parameter("page is not a cursor this API issued")
                .code(ErrorCode::InvalidCursor)
        })?),
    };
    let mut rows = events::list(&mut *conn, &session.id, &filter, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| {
        cursor::encode(&session.created_at, &r.seq.to_string())
    });
    Ok(Json(EventPage {
        data: rows.into_iter().map(|r| r.body).collect(),
        next_page,
    }))
}

/// Send: `{events: […]}` → `{data: […]}`, admitted in one transaction that
/// holds the Session's row lock, except a worker's single tool result,
/// which takes the one-statement fenced path when nothing stands in its way.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/events",
    tag = "Events",
    operation_id = "sendEvents",
    params(("session_id" = String, Path, description = "The Session")),
    request_body = SendEvents,
    responses(
        (status = 200, description = "Each event as stored", body = SentEvents),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn send_events(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<SentEventBodies>> {
    // The body is read only once the caller is known: a bad credential is
    // 401 whatever it sent.
    let parse = || -> ApiResult<_> {
        let SendEvents { events } = body(&bytes)?;
        event_shapes::check_all(events)
    };
    let mut checked = None;
    let mut conn = ctx.db.acquire().await?;
    // A worker's next result, with the claim this process just saw.
    if let Some(work) = auth::recent_claim(&ctx, &headers) {
        if worker_may_use(&work, &id, "Sending events").is_ok() {
            let events = parse()?;
            if let Some(admitted) =
                admission::admit_worker_result(&mut conn, &work, &id, &events).await?
            {
                return Ok(admitted_reply(
                    &ctx,
                    &id,
                    admitted,
                    AdmissionPath::FencedResult,
                ));
            }
            checked = Some(events);
        }
    }
    let (sender, workspace, claim) = match authenticate(&ctx, &mut conn, &headers).await? {
        Principal::Workspace(key) => (Sender::Operator, Some(key.workspace_id), None),
        Principal::Token(row) => {
            worker_may_use(&row, &id, "Sending events")?;
            auth::remember_claim(&ctx, &headers, &row);
            (Sender::Worker, None, Some(row))
        }
        Principal::Environment(_) => {
            return Err(ApiError::forbidden(
                "Sending events is not permitted with an Environment key",
            ))
        }
    };
    let events = match checked {
        Some(events) => events,
        None => parse()?,
    };
    if let Some(work) = &claim {
        if let Some(admitted) =
            admission::admit_worker_result(&mut conn, work, &id, &events).await?
        {
            return Ok(admitted_reply(
                &ctx,
                &id,
                admitted,
                AdmissionPath::FencedResult,
            ));
        }
    }
    let (admitted, locked) = admission::send(
        &mut conn,
        &id,
        workspace.as_deref(),
        sender,
        events,
        &ctx.settings,
    )
    .await?;
    let path = if locked {
        AdmissionPath::Locked
    } else {
        AdmissionPath::Unlocked
    };
    Ok(admitted_reply(&ctx, &id, admitted, path))
}

/// Which way an admission went, for the metrics.
enum AdmissionPath {
    FencedResult,
    Unlocked,
    Locked,
}

/// Hands the committed events to this process's streams, then answers.
fn admitted_reply(
    ctx: &ApiContext,
    session_id: &str,
    admitted: Admission,
    path: AdmissionPath,
) -> Json<SentEventBodies> {
    Metrics::count(match path {
        AdmissionPath::FencedResult => &ctx.metrics.fenced_results,
        AdmissionPath::Unlocked => &ctx.metrics.unlocked_admissions,
        AdmissionPath::Locked => &ctx.metrics.locked_admissions,
    });
    ctx.committed(session_id, &admitted.appended, admitted.wrote_outbox());
    Json(SentEventBodies {
        data: admitted.data,
    })
}

/// SSE: every frame carries `event:`; `event: ping` keeps it alive. Starts
/// after the events committed when it opened, so history listed after
/// opening plus the stream covers every event. The credential is re-checked
/// each second and the stream closes once it is no longer valid (a stopped
/// or reclaimed token, a revoked Workspace key).
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/events/stream",
    tag = "Events",
    operation_id = "streamEvents",
    params(("session_id" = String, Path, description = "The Session")),
    responses(
        (status = 200, description = "Server-sent events: each frame's `event:` is the event's `type` and its `data:` the event as JSON (an `Event`); `event: ping` with `{}` keeps the stream alive", content_type = "text/event-stream", body = StreamFrame),
        Refusals, Missing,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn stream(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let (session, access) =
        session_access(&ctx, &mut conn, &headers, &id, "Streaming events").await?;
    // Subscribe before reading the starting point, so nothing committed in between is missed.
    let feed = ctx.events.subscribe(&session.id);
    let last_seq = events::last_seq(&mut *conn, &session.id)
        .await?
        .unwrap_or(session.last_seq);
    drop(conn);

    let ping_every = ctx.settings.stream_ping_interval;
    let mut recheck = tokio::time::interval(CREDENTIAL_RECHECK);
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
    access: SessionAccess,
    feed: broadcast::Receiver<LoggedEvent>,
    last_seq: i64,
    recheck: tokio::time::Interval,
    ticks: u64,
    ready: VecDeque<LoggedEvent>,
}

impl Forwarding {
    /// The next event to forward, in sequence; `None` ends the stream (the
    /// credential is no longer valid, or the feed closed).
    async fn next(&mut self) -> Option<LoggedEvent> {
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
                    if !auth::still_valid(&self.ctx, &self.access, &self.id).await {
                        return None;
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
async fn catch_up(ctx: &ApiContext, session_id: &str, seq: i64) -> Option<Vec<LoggedEvent>> {
    match events::after(&ctx.db, session_id, seq, 1000).await {
        Ok(rows) => Some(rows.into_iter().map(Into::into).collect()),
        Err(err) => {
            tracing::warn!(error = %err, session_id, "event stream catch-up failed");
            None
        }
    }
}
