//! Session Work admission (spec §5): inside ONE transaction that holds the
//! Session row lock, append the admitted events, update the projection,
//! insert a Work item when runnable input finds no live one (coalescing),
//! and write the outbox row that wakes the agent loop. The NOTIFY triggers
//! fire at commit.

use crate::context::{ApiContext, Settings};
use crate::error::{ApiError, ApiResult};
use crate::service::activation;
use crate::session_rules::{
    self as rules, CallKind, ConfirmationDecision, ConfirmationRefusal, ResultDecision,
    ResultRefusal, Sender,
};
use crate::store::events::{self, LoggedEvent};
use crate::store::sessions::{self, SessionRow};
use crate::store::tool_calls::{self, ClaimFence};
use crate::store::work::WorkRow;
use axum::http::StatusCode;
use mango_protocol::events::{CallAnswer, Event, EventBody, SentEvent};
use mango_protocol::time;
use mango_protocol::{ErrorCode, ErrorType};
use serde_json::Value;
use sqlx::PgConnection;
use std::sync::Arc;

fn refusal(
    index: usize,
    status: StatusCode,
    kind: ErrorType,
    code: ErrorCode,
    message: String,
) -> ApiError {
    ApiError::new(status, kind, format!("events[{index}]: {message}")).code(code)
}

/// What an admission did: the answer for each event sent, and the events it
/// appended, to publish to this process's streams once the transaction commits.
pub struct Admission {
    /// Per event sent, the event as stored; a retried tool result or
    /// confirmation gets the event that already answered.
    pub data: Vec<Arc<Value>>,
    pub appended: Vec<LoggedEvent>,
}

impl Admission {
    /// Whether it wrote an outbox row: whatever an admission appends, its
    /// last write carries one (only retries of answered calls append nothing).
    pub fn wrote_outbox(&self) -> bool {
        !self.appended.is_empty()
    }
}

/// Admits checked events from `sender` into `session`, which the caller has
/// locked (with [`sessions::lock_for_admission`], which also told whether the
/// Session `has_live_work`) in the transaction `db`. Accepted events are
/// written together with the outbox row in one statement.
pub async fn admit(
    db: &mut PgConnection,
    session: &mut SessionRow,
    has_live_work: bool,
    sender: Sender,
    events: Vec<SentEvent>,
    settings: &Settings,
) -> ApiResult<Admission> {
    if session.archived_at.is_some() {
        return Err(ApiError::conflict(format!(
            "session {} is archived and takes no input",
            session.id
        ))
        .code(ErrorCode::SessionArchived)
        .final_answer());
    }
    // One clock reading for the whole admission: its events, Work and outbox row.
    let now = time::now();
    let mut out = Vec::with_capacity(events.len());
    let mut appended: Vec<LoggedEvent> = Vec::with_capacity(events.len());
    let mut pending: Vec<EventBody> = Vec::new();
    let mut flushed = false;
    let mut runnable = false;
    for (index, event) in events.into_iter().enumerate() {
        rules::may_send(sender, &event, session.status)
            .map_err(|r| send_refusal(index, r, &session.id))?;
        let mut event = EventBody::from(event);
        if event.answers().is_some() {
            // The check reads the call's state, so earlier events of this request must be in.
            if !pending.is_empty() {
                let stored =
                    events::append(db, session, std::mem::take(&mut pending), false, now).await?;
                out.extend(stored.iter().map(|e| e.body.clone()));
                appended.extend(stored);
                flushed = true;
            }
            if let Some(existing) = settle_against_call(db, session, index, &mut event).await? {
                out.push(Arc::new(existing));
                continue;
            }
        }
        runnable |= rules::is_runnable(&event);
        pending.push(event);
    }
    if pending.is_empty() && !flushed {
        // Only retries of answered calls: nothing changes.
        return Ok(Admission {
            data: out,
            appended,
        });
    }
    // Input that nothing will answer (no model endpoint) starts no Work: the
    // agent loop answers it with an error instead.
    if runnable && !has_live_work && settings.input_activates() {
        activation::ensure(
            db,
            settings.default_ttl_seconds,
            &session.environment_id,
            &session.id,
            now,
        )
        .await?;
    }
    // The last batch (possibly empty) carries the outbox row that wakes the agent loop.
    let stored = events::append(db, session, pending, true, now).await?;
    out.extend(stored.iter().map(|e| e.body.clone()));
    appended.extend(stored);
    Ok(Admission {
        data: out,
        appended,
    })
}

/// Admits `events` sent to Session `session_id` (of `workspace_id`, for an
/// operator): by [`admit_unlocked`] when nothing needs the Session's lock,
/// otherwise by [`admit`] in a transaction that locks it. Also says whether
/// it took the lock.
pub async fn send(
    db: &mut PgConnection,
    session_id: &str,
    workspace_id: Option<&str>,
    sender: Sender,
    events: Vec<SentEvent>,
    settings: &Settings,
) -> ApiResult<(Admission, bool)> {
    let activates = settings.input_activates();
    if let Some(admitted) =
        admit_unlocked(db, session_id, workspace_id, sender, &events, activates).await?
    {
        return Ok((admitted, false));
    }
    let mut tx = sqlx::Connection::begin(&mut *db).await?;
    let (mut session, has_live_work) =
        sessions::lock_for_admission(&mut tx, session_id, workspace_id)
            .await?
            .ok_or_else(|| {
                ApiError::not_found(format!("session {session_id} not found"))
                    .code(ErrorCode::SessionNotFound)
            })?;
    let admitted = admit(
        &mut tx,
        &mut session,
        has_live_work,
        sender,
        events,
        settings,
    )
    .await?;
    tx.commit().await?;
    Ok((admitted, true))
}

/// The common case of input, without a locking transaction: the Session
/// read as it is, the same rules as [`admit`] decided on it, and one
/// autocommit append fenced on the facts they used (its status and
/// archival; [`events::append_if_unchanged`]). Two round trips instead of
/// the locking transaction's four. `None` means "take the locking path":
/// anything [`admit`] must look into further (a Session not found or
/// archived, a refusal, an answer to a tool call, input that needs a new
/// activation, a Session that moved on meanwhile) gets its answer there.
/// `activates`: whether runnable input makes Work ([`Settings::input_activates`]).
pub async fn admit_unlocked(
    db: &mut PgConnection,
    session_id: &str,
    workspace_id: Option<&str>,
    sender: Sender,
    events: &[SentEvent],
    activates: bool,
) -> ApiResult<Option<Admission>> {
    let bodies: Vec<EventBody> = events.iter().cloned().map(EventBody::from).collect();
    if bodies.iter().any(|e| e.answers().is_some()) {
        return Ok(None);
    }
    let Some((mut session, has_live_work)) =
        sessions::read_for_admission(db, session_id, workspace_id).await?
    else {
        return Ok(None);
    };
    let refused = events
        .iter()
        .any(|e| rules::may_send(sender, e, session.status).is_err());
    let needs_activation = activates && !has_live_work && bodies.iter().any(rules::is_runnable);
    if session.archived_at.is_some() || refused || needs_activation {
        return Ok(None);
    }
    let appended = events::append_if_unchanged(db, &mut session, bodies, true, time::now()).await?;
    Ok(appended.map(|appended| Admission {
        data: appended.iter().map(|e| e.body.clone()).collect(),
        appended,
    }))
}

/// The hot path of a worker's tool loop: one tool result sent with the
/// item's sessions token (`work`, just authenticated), admitted by one
/// autocommit statement ([`tool_calls::answer_open_call`]) that decides by
/// the same rules as [`admit`], restated in SQL, and is fenced on the
/// Session and the claim being as it read them: one round trip instead of a
/// locking transaction's five. `None` means "take the locking path":
/// anything but a first, acceptable answer (retries, refusals, a Session or
/// claim that moved on meanwhile) gets its answer from [`admit`].
pub async fn admit_worker_result(
    db: &mut PgConnection,
    work: &WorkRow,
    session_id: &str,
    events: &[SentEvent],
) -> ApiResult<Option<Admission>> {
    let [event] = events else {
        return Ok(None);
    };
    let (call_id, kind) = match event {
        SentEvent::UserToolResult(r) => (r.tool_use_id.as_str(), CallKind::Tool),
        SentEvent::UserCustomToolResult(r) => (r.custom_tool_use_id.as_str(), CallKind::Custom),
        _ => return Ok(None),
    };
    let claim = ClaimFence {
        work_id: &work.id,
        row_version: work.row_version,
    };
    // A result is runnable input and the claim's Work is live: the outbox
    // row wakes the agent loop, and no new activation is needed.
    let written = tool_calls::answer_open_call(
        db,
        session_id,
        call_id,
        kind,
        EventBody::from(event.clone()),
        time::now(),
        claim,
    )
    .await?;
    Ok(written.map(|appended| Admission {
        data: vec![appended.body.clone()],
        appended: vec![appended],
    }))
}

fn send_refusal(index: usize, why: rules::SendRefusal, session_id: &str) -> ApiError {
    match why {
        rules::SendRefusal::NotPermitted(t) => refusal(
            index,
            StatusCode::FORBIDDEN,
            ErrorType::PermissionError,
            ErrorCode::PermissionDenied,
            format!(
                "a sessions token may send only tool results ({}), not {t:?}",
                SentEvent::TYPES
                    .iter()
                    .filter(|t| t.ends_with("tool_result"))
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        rules::SendRefusal::Terminated => ApiError::conflict(format!(
            "session {session_id} is terminated and takes no input"
        ))
        .code(ErrorCode::SessionTerminated)
        .final_answer(),
    }
}

/// Checks a tool result or confirmation against the call it names (the
/// Session is locked). `Some(event)` means it was already answered the same
/// way: a retry to acknowledge without storing anything. An accepted answer
/// takes its call's thread.
async fn settle_against_call(
    db: &mut PgConnection,
    session: &SessionRow,
    index: usize,
    event: &mut EventBody,
) -> ApiResult<Option<Value>> {
    let Some(answer) = event.answers() else {
        return Ok(None);
    };
    let (call_id, field) = (answer.call_id().to_string(), answer.field());
    let call_id = call_id.as_str();
    let row = tool_calls::find(db, &session.id, call_id).await?;
    let thread = row.as_ref().and_then(|r| r.thread_id.clone());
    let call = row.map(|r| r.state());
    let unknown = || {
        refusal(
            index,
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            ErrorCode::UnknownToolUseId,
            format!(
                "{field} {call_id:?} names no tool call of session {}",
                session.id
            ),
        )
    };
    let conflict = |code: ErrorCode, message: String| {
        refusal(
            index,
            StatusCode::CONFLICT,
            ErrorType::ConflictError,
            code,
            message,
        )
    };
    let kind = match answer {
        CallAnswer::Confirmation(_, result) => {
            return match rules::admit_confirmation(call.as_ref(), result) {
                Ok(ConfirmationDecision::Accept) => {
                    route_to_thread(event, thread);
                    Ok(None)
                }
                Ok(ConfirmationDecision::Duplicate) => Ok(Some(
                    events::first_confirmation(&mut *db, &session.id, call_id)
                        .await?
                        .unwrap_or(Value::Null),
                )),
                Err(ConfirmationRefusal::UnknownCall) => Err(unknown()),
                Err(ConfirmationRefusal::NotAsked) => Err(conflict(
                    ErrorCode::ConfirmationNotRequested,
                    format!(
                        "tool call {call_id} was not evaluated \"ask\"; it takes no confirmation"
                    ),
                )),
                Err(ConfirmationRefusal::AlreadyConfirmed) => Err(conflict(
                    ErrorCode::AlreadyConfirmed,
                    format!("tool call {call_id} already has a different confirmation"),
                )),
                Err(ConfirmationRefusal::AlreadyAnswered) => Err(conflict(
                    ErrorCode::AlreadyAnswered,
                    format!("tool call {call_id} already has a result"),
                )),
            };
        }
        CallAnswer::ToolResult(_) => CallKind::Tool,
        CallAnswer::CustomToolResult(_) => CallKind::Custom,
    };
    match rules::admit_result(call.as_ref(), kind) {
        Ok(ResultDecision::Accept) => {
            route_to_thread(event, thread);
            Ok(None)
        }
        Ok(ResultDecision::Duplicate { answered_by }) => {
            Ok(events::event_by_id(&mut *db, &session.id, &answered_by).await?)
        }
        Err(ResultRefusal::UnknownCall) => Err(unknown()),
        Err(ResultRefusal::WrongKind) => Err(refusal(
            index,
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            ErrorCode::WrongResultType,
            format!(
                "{call_id} is a {} call; answer it with the other result type",
                match kind {
                    CallKind::Tool => "custom tool",
                    CallKind::Custom => "toolset",
                }
            ),
        )),
        Err(ResultRefusal::Denied) => Err(conflict(
            ErrorCode::ToolUseDenied,
            format!("tool call {call_id} was denied; a denied call never produces a result"),
        )
        .final_answer()),
        Err(ResultRefusal::AwaitingConfirmation) => Err(conflict(
            ErrorCode::AwaitingConfirmation,
            format!("tool call {call_id} is waiting for an allow confirmation"),
        )
        .final_answer()),
    }
}

/// An accepted answer carries its call's thread, so it is routed there.
fn route_to_thread(event: &mut EventBody, thread: Option<String>) {
    let Some(thread) = thread else { return };
    match event {
        EventBody::UserToolResult(r) => r.session_thread_id = Some(thread),
        EventBody::UserCustomToolResult(r) => r.session_thread_id = Some(thread),
        EventBody::UserToolConfirmation(c) => c.session_thread_id = Some(thread),
        _ => {}
    }
}

/// Appends agent-loop events (`agent.*`, `session.*`, `span.*`) in-process:
/// the path the agent loop takes; HTTP never exposes it. This process's
/// streams of the Session get them at once; other replicas' by notification.
pub async fn emit(
    ctx: &ApiContext,
    session_id: &str,
    events: Vec<EventBody>,
) -> ApiResult<Vec<Event>> {
    let stored = append_logged(&mut *ctx.db.acquire().await?, session_id, events).await?;
    ctx.committed(session_id, &stored, false);
    Ok(typed(&stored))
}

/// [`emit`] for a caller without an api in its process (tests, tools): the
/// events reach streams through the database's notification. Not for an api
/// process's own pool: its commits may skip the notification (see
/// [`crate::db::as_api_process`]), and nothing here publishes in-process.
pub async fn append_agent_events(
    db: &sqlx::PgPool,
    session_id: &str,
    events: Vec<EventBody>,
) -> ApiResult<Vec<Event>> {
    let stored = append_logged(&mut *db.acquire().await?, session_id, events).await?;
    Ok(typed(&stored))
}

fn typed(stored: &[LoggedEvent]) -> Vec<Event> {
    stored.iter().filter_map(LoggedEvent::event).collect()
}

async fn append_logged(
    db: &mut PgConnection,
    session_id: &str,
    events: Vec<EventBody>,
) -> ApiResult<Vec<LoggedEvent>> {
    if let Some((i, e)) = events
        .iter()
        .enumerate()
        .find(|(_, e)| rules::is_client_input(e))
    {
        return Err(ApiError::invalid_parameter(format!(
            "events[{i}]: {:?} is client input, not an agent-loop event",
            e.type_name()
        )));
    }
    let mut tx = sqlx::Connection::begin(db).await?;
    let mut session = sessions::lock(&mut tx, session_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("session {session_id} not found")))?;
    let stored = events::append(&mut tx, &mut session, events, false, time::now()).await?;
    tx.commit().await?;
    Ok(stored)
}
