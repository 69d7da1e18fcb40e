//! Session Work admission (spec §5): inside ONE transaction that holds the
//! Session row lock, append the admitted events, update the projection, insert
//! a Work item when runnable input finds no live one (coalescing), and write
//! the outbox row that wakes the agent loop. The NOTIFY triggers fire at commit.

use crate::error::{ApiError, ApiResult};
use crate::lease::{Kind, Lease};
use crate::session_rules::{
    self as rules, CallKind, ConfirmationDecision, Permission, ResultDecision, Sender,
};
use crate::store::sessions::{self, ClaimFence, LoggedEvent, SessionRow};
use crate::store::work::{self, NewWork, WorkRow};
use crate::{ids, ApiContext, Settings};
use axum::http::StatusCode;
use mango_protocol::time;
use mango_protocol::{ErrorCode, ErrorType};
use serde_json::{Map, Value};
use sqlx::PgConnection;
use std::collections::BTreeMap;
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
    events: Vec<Map<String, Value>>,
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
    let mut pending: Vec<Map<String, Value>> = Vec::new();
    let mut flushed = false;
    let mut runnable = false;
    for (index, event) in events.into_iter().enumerate() {
        let event_type = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        rules::may_send(sender, &event_type, session.status())
            .map_err(|r| send_refusal(index, r, &session.id))?;
        let mut event = event;
        if answers_a_call(&event_type) {
            // The check reads the call's state, so earlier events of this request must be in.
            if !pending.is_empty() {
                let stored =
                    sessions::append(db, session, std::mem::take(&mut pending), false, now).await?;
                out.extend(stored.iter().map(|e| e.body.clone()));
                appended.extend(stored);
                flushed = true;
            }
            if let Some(existing) =
                settle_against_tool_call(db, session, index, &event_type, &mut event).await?
            {
                out.push(Arc::new(existing));
                continue;
            }
        }
        runnable |= rules::is_runnable(&event_type);
        pending.push(event);
    }
    if pending.is_empty() && !flushed {
        // Only retries of answered calls: nothing changes.
        return Ok(Admission {
            data: out,
            appended,
        });
    }
    if runnable && !has_live_work {
        let lease = Lease::new(Kind::Session, now, settings.default_ttl_seconds);
        work::insert_activation(
            &mut *db,
            NewWork {
                id: &ids::new_id("work"),
                environment_id: &session.environment_id,
                session_id: Some(&session.id),
                metadata: &BTreeMap::new(),
                lease: &lease,
                created_at: now,
            },
        )
        .await?;
    }
    // The last batch (possibly empty) carries the outbox row that wakes the agent loop.
    let stored = sessions::append(db, session, pending, true, now).await?;
    out.extend(stored.iter().map(|e| e.body.clone()));
    appended.extend(stored);
    Ok(Admission {
        data: out,
        appended,
    })
}

/// The hot path of a worker's tool loop: one tool result sent with the
/// item's sessions token (`work`, just authenticated), admitted by one
/// autocommit statement ([`sessions::answer_open_call`]) that decides by the
/// same rules as [`admit`], restated in SQL, and is fenced on the Session and
/// the claim being as it read them: one round trip instead of a locking
/// transaction's five. `None` means "take the locking path": anything but a
/// first, acceptable answer (retries, refusals, a Session or claim that moved
/// on meanwhile) gets its answer from [`admit`].
pub async fn admit_worker_result(
    db: &mut PgConnection,
    work: &WorkRow,
    session_id: &str,
    events: &[Map<String, Value>],
) -> ApiResult<Option<Admission>> {
    let [event] = events else {
        return Ok(None);
    };
    let event_type = event.get("type").and_then(Value::as_str).unwrap_or("");
    let (key, kind) = match call_reference(event_type) {
        Some(reference) if event_type != "user.tool_confirmation" => reference,
        _ => return Ok(None),
    };
    let Some(call_id) = event.get(key).and_then(Value::as_str) else {
        return Ok(None);
    };
    let claim = ClaimFence {
        work_id: &work.id,
        row_version: work.row_version,
    };
    // A result is runnable input and the claim's Work is live: the outbox
    // row wakes the agent loop, and no new activation is needed.
    let written = sessions::answer_open_call(
        db,
        session_id,
        call_id,
        kind,
        event.clone(),
        time::now(),
        claim,
    )
    .await?;
    Ok(written.map(|appended| Admission {
        data: vec![appended.body.clone()],
        appended: vec![appended],
    }))
}

/// For an event that answers a call: the field naming the call, and the kind of call.
fn call_reference(event_type: &str) -> Option<(&'static str, CallKind)> {
    match event_type {
        "user.tool_result" | "user.tool_confirmation" => Some(("tool_use_id", CallKind::Tool)),
        "user.custom_tool_result" => Some(("custom_tool_use_id", CallKind::Custom)),
        _ => None,
    }
}

fn answers_a_call(event_type: &str) -> bool {
    call_reference(event_type).is_some()
}

fn send_refusal(index: usize, why: rules::SendRefusal, session_id: &str) -> ApiError {
    match why {
        rules::SendRefusal::NotSendable(t) if t.starts_with("agent.") || t.starts_with("session.") || t.starts_with("span.") => {
            refusal(index, StatusCode::BAD_REQUEST, ErrorType::InvalidRequestError, ErrorCode::EventNotSendable,
                format!("{t:?} events are produced by the agent loop, not sent by clients"))
        }
        rules::SendRefusal::NotSendable(t) => refusal(index, StatusCode::BAD_REQUEST, ErrorType::InvalidRequestError, ErrorCode::UnknownEventType,
            format!("unknown event type {t:?}; clients send one of {}", rules::SENDABLE.join(", "))),
        rules::SendRefusal::NotPermitted(t) => refusal(index, StatusCode::FORBIDDEN, ErrorType::PermissionError, ErrorCode::PermissionDenied,
            format!("a sessions token may send only user.tool_result and user.custom_tool_result, not {t:?}")),
        rules::SendRefusal::Terminated => ApiError::conflict(format!("session {session_id} is terminated and takes no input"))
            .code(ErrorCode::SessionTerminated)
            .final_answer(),
    }
}

/// Checks a tool result or confirmation against the call it names (the
/// Session is locked). `Some(event)` means it was already answered the same
/// way: a retry to acknowledge without storing anything. An accepted answer
/// takes its call's thread.
async fn settle_against_tool_call(
    db: &mut PgConnection,
    session: &SessionRow,
    index: usize,
    event_type: &str,
    event: &mut Map<String, Value>,
) -> ApiResult<Option<Value>> {
    let Some((key, kind)) = call_reference(event_type) else {
        return Ok(None);
    };
    let call_id = event
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let call_id = call_id.as_str();
    let row = sessions::tool_call(db, &session.id, call_id).await?;
    if let Some(thread) = row.as_ref().and_then(|r| r.thread_id.clone()) {
        event.insert("session_thread_id".into(), Value::String(thread));
    }
    let call = row.map(|r| r.state());
    let unknown = || {
        refusal(
            index,
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            ErrorCode::UnknownToolUseId,
            format!(
                "{key} {call_id:?} names no tool call of session {}",
                session.id
            ),
        )
    };
    if event_type == "user.tool_confirmation" {
        let answer = match event.get("result").and_then(Value::as_str) {
            Some("deny") => Permission::Deny,
            _ => Permission::Allow,
        };
        return match rules::admit_confirmation(call.as_ref(), answer) {
            Ok(ConfirmationDecision::Accept) => Ok(None),
            Ok(ConfirmationDecision::Duplicate) => {
                Ok(Some(earlier_confirmation(db, &session.id, call_id).await?))
            }
            Err(rules::ConfirmationRefusal::UnknownCall) => Err(unknown()),
            Err(rules::ConfirmationRefusal::NotAsked) => Err(refusal(
                index,
                StatusCode::CONFLICT,
                ErrorType::ConflictError,
                ErrorCode::ConfirmationNotRequested,
                format!("tool call {call_id} was not evaluated \"ask\"; it takes no confirmation"),
            )),
            Err(rules::ConfirmationRefusal::AlreadyConfirmed) => Err(refusal(
                index,
                StatusCode::CONFLICT,
                ErrorType::ConflictError,
                ErrorCode::AlreadyConfirmed,
                format!("tool call {call_id} already has a different confirmation"),
            )),
            Err(rules::ConfirmationRefusal::AlreadyAnswered) => Err(refusal(
                index,
                StatusCode::CONFLICT,
                ErrorType::ConflictError,
                ErrorCode::AlreadyAnswered,
                format!("tool call {call_id} already has a result"),
            )),
        };
    }
    match rules::admit_result(call.as_ref(), kind) {
        Ok(ResultDecision::Accept) => Ok(None),
        Ok(ResultDecision::Duplicate { answered_by }) => {
            Ok(sessions::event_by_id(&mut *db, &session.id, &answered_by).await?)
        }
        Err(rules::ResultRefusal::UnknownCall) => Err(unknown()),
        Err(rules::ResultRefusal::WrongKind) => Err(refusal(
            index,
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            ErrorCode::WrongResultType,
            format!(
                "{call_id} is answered with {}",
                if kind == CallKind::Tool {
                    "user.custom_tool_result"
                } else {
                    "user.tool_result"
                }
            ),
        )),
        Err(rules::ResultRefusal::Denied) => Err(refusal(
            index,
            StatusCode::CONFLICT,
            ErrorType::ConflictError,
            ErrorCode::ToolUseDenied,
            format!("tool call {call_id} was denied; a denied call never produces a result"),
        )
        .final_answer()),
        Err(rules::ResultRefusal::AwaitingConfirmation) => Err(refusal(
            index,
            StatusCode::CONFLICT,
            ErrorType::ConflictError,
            ErrorCode::AwaitingConfirmation,
            format!("tool call {call_id} is waiting for an allow confirmation"),
        )
        .final_answer()),
    }
}

async fn earlier_confirmation(
    db: &mut PgConnection,
    session_id: &str,
    call_id: &str,
) -> ApiResult<Value> {
    let row: Option<(Value,)> = sqlx::query_as(
        "SELECT body FROM session_events WHERE session_id = $1 AND type = 'user.tool_confirmation'
           AND body->>'tool_use_id' = $2 ORDER BY seq LIMIT 1",
    )
    .bind(session_id)
    .bind(call_id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(b,)| b).unwrap_or(Value::Null))
}

/// Appends agent-loop events (`agent.*`, `session.*`, `span.*`) in-process: the
/// path the agent loop and tests use; HTTP never exposes it. This process's
/// streams of the Session get them at once; other replicas' by notification.
pub async fn emit(ctx: &ApiContext, session_id: &str, events: Vec<Value>) -> ApiResult<Vec<Value>> {
    let mut conn = ctx.reused.take(&ctx.db).await?;
    let stored = append_logged(&mut conn, session_id, events).await?;
    conn.finish();
    ctx.committed(session_id, &stored, false);
    Ok(stored
        .into_iter()
        .map(|e| Arc::unwrap_or_clone(e.body))
        .collect())
}

/// [`emit`] for a caller without an api in its process (tests, tools): the
/// events reach streams through the database's notification. Not for an api
/// process's own pool: its commits may skip the notification (see
/// [`crate::db::as_api_process`]), and nothing here publishes in-process.
pub async fn append_agent_events(
    db: &sqlx::PgPool,
    session_id: &str,
    events: Vec<Value>,
) -> ApiResult<Vec<Value>> {
    let stored = append_logged(&mut *db.acquire().await?, session_id, events).await?;
    Ok(stored
        .into_iter()
        .map(|e| Arc::unwrap_or_clone(e.body))
        .collect())
}

async fn append_logged(
    db: &mut sqlx::PgConnection,
    session_id: &str,
    events: Vec<Value>,
) -> ApiResult<Vec<LoggedEvent>> {
    let mut tx = sqlx::Connection::begin(db).await?;
    let mut session = sessions::lock(&mut tx, session_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("session {session_id} not found")))?;
    let mut maps = Vec::with_capacity(events.len());
    for (i, e) in events.into_iter().enumerate() {
        let Value::Object(map) = e else {
            return Err(ApiError::invalid_parameter(format!(
                "events[{i}] must be an object"
            )));
        };
        let t = map.get("type").and_then(Value::as_str).unwrap_or("");
        if t.starts_with("user.") || !rules::KNOWN_TYPES.contains(&t) {
            return Err(ApiError::invalid_parameter(format!(
                "events[{i}]: {t:?} is not an agent-loop event"
            )));
        }
        maps.push(map);
    }
    let stored = sessions::append(&mut tx, &mut session, maps, false, time::now()).await?;
    tx.commit().await?;
    Ok(stored)
}
