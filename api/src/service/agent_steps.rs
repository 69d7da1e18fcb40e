//! The agent loop's writes that need more than an append: storing a model
//! reply with what it implies (Work for its tool calls, the turn's idle),
//! and settling a Session that waits (its wake-ups handled, an activation
//! for calls left without Work).

use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::service::activation;
use crate::store::events::{self, LoggedEvent};
use crate::store::{outbox, sessions};
use crate::turn::{self, SinceRequest};
use mango_protocol::events::{
    EventBody, ModelRequestEnd, ModelUsage, Permission, SessionStatusIdle, StopReason,
};
use mango_protocol::sessions::SessionStatus;
use mango_protocol::time;

/// The reply's events, its `span.model_request_end` and the idle status
/// commit together; tool calls for the worker also make sure the Session
/// has live Work. What was stored while the model was asked decides how
/// much of that stands ([`SinceRequest`]): an interrupt leaves only the end
/// and the idle, a new message keeps the turn open (no idle) so the model
/// answers it next. A Session terminated meanwhile (Fail) takes nothing,
/// and a reply already stored for this request (another step got there
/// after a lost lock) is stored once only.
pub async fn commit_reply(
    ctx: &ApiContext,
    session_id: &str,
    start_id: &str,
    reply: Vec<EventBody>,
    usage: ModelUsage,
) -> ApiResult<()> {
    let mut tx = ctx.db.begin().await?;
    let mut session = sessions::lock(&mut tx, session_id)
        .await?
        .ok_or_else(|| ApiError::not_found("session vanished"))?;
    if session.status == SessionStatus::Terminated {
        return Ok(());
    }
    let since = events::after_event(&mut *tx, session_id, start_id).await?;
    let fate = turn::since_request(start_id, &since);
    let end = EventBody::ModelRequestEnd(ModelRequestEnd {
        model_request_start_id: start_id.to_string(),
        is_error: Some(false),
        model_usage: usage,
    });
    let now = time::now();
    let stored_events = match fate {
        SinceRequest::Answered => return Ok(()),
        SinceRequest::Interrupted => {
            let stored =
                events::append(&mut tx, &mut session, vec![end, end_turn()], false, now).await?;
            tx.commit().await?;
            ctx.committed(session_id, &stored, false);
            return Ok(());
        }
        SinceRequest::MoreInput | SinceRequest::Quiet => {
            let mut stored_events = reply;
            stored_events.push(end);
            stored_events
        }
    };
    let mut stored = events::append(&mut tx, &mut session, stored_events, false, now).await?;
    // Each call the reply made, and whether a worker or the operator runs it.
    let calls: Vec<(String, bool)> = stored
        .iter()
        .filter_map(LoggedEvent::event)
        .filter_map(|e| match e.body {
            EventBody::AgentToolUse(call) => {
                Some((e.id, call.evaluated_permission != Some(Permission::Deny)))
            }
            EventBody::AgentCustomToolUse(_) => Some((e.id, true)),
            _ => None,
        })
        .collect();
    let worker_calls = stored
        .iter()
        .filter_map(LoggedEvent::event)
        .any(|e| matches!(&e.body, EventBody::AgentToolUse(c) if c.evaluated_permission != Some(Permission::Deny)));
    if worker_calls {
        activation::ensure(
            &mut tx,
            ctx.settings.default_ttl_seconds,
            &session.environment_id,
            session_id,
            now,
        )
        .await?;
    }
    let needs_action: Vec<String> = calls
        .iter()
        .filter(|(_, runs)| *runs)
        .map(|(id, _)| id.clone())
        .collect();
    // A reply of denied calls only goes straight back to the model, and so
    // does one that ends a turn a new message has already continued.
    let idle = if !needs_action.is_empty() {
        Some(EventBody::SessionStatusIdle(SessionStatusIdle {
            stop_reason: StopReason::RequiresAction {
                event_ids: needs_action,
            },
        }))
    } else {
        let denied_only = !calls.is_empty();
        (!denied_only && fate == SinceRequest::Quiet).then(end_turn)
    };
    if let Some(idle) = idle {
        stored.extend(events::append(&mut tx, &mut session, vec![idle], false, now).await?);
    }
    tx.commit().await?;
    ctx.committed(session_id, &stored, false);
    Ok(())
}

/// The idle that ends a turn.
pub fn end_turn() -> EventBody {
    EventBody::SessionStatusIdle(SessionStatusIdle {
        stop_reason: StopReason::EndTurn,
    })
}

/// A Session whose next step is to wait: its wake-ups up to the log head
/// `last_seq` it was read at are handled, and calls a worker could run but
/// no Work runs (it stopped meanwhile) get a new activation. One
/// transaction, taking the rows in the order a Session's deletion does (the
/// Session, then its wake-ups), so the two cannot deadlock; a Work that
/// stops meanwhile is either seen stopped here, or its wake-up row commits
/// after the delete and brings the loop back. A Session deleted meanwhile
/// took its wake-ups with it (the keys cascade): nothing to do.
pub async fn settle_wait(
    ctx: &ApiContext,
    session_id: &str,
    environment_id: &str,
    last_seq: i64,
    needs_worker: bool,
) -> ApiResult<()> {
    let mut tx = ctx.db.begin().await?;
    if !sessions::hold(&mut tx, session_id).await? {
        return Ok(());
    }
    outbox::handled(&mut *tx, session_id, last_seq).await?;
    if needs_worker {
        activation::ensure(
            &mut tx,
            ctx.settings.default_ttl_seconds,
            environment_id,
            session_id,
            time::now(),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether the events leave calls a worker could run.
pub fn needs_worker(events: &[mango_protocol::events::Event]) -> bool {
    !turn::runnable_worker_calls(events).is_empty()
}
