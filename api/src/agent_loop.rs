//! The agent loop (spec §6): for each Session with a pending outbox row,
//! decide the next step from its events ([`turn::next`]), call the model
//! endpoint, and commit the reply's events. Without an endpoint it runs too,
//! and answers each turn the model would take with a terminal
//! `session.error` that names the settings, so no Session waits in silence.
//! Failed calls the endpoint may answer later (429, 529, 5xx, timeouts, no
//! connection) are retried three times, after the wait the answer
//! asked for (`retry-after`) or else a doubling back-off. Durable by construction:
//! * one step per Session at a time across replicas (an advisory lock);
//! * `span.model_request_start` is appended before the call and the reply's
//!   events plus `span.model_request_end` commit together, so after a restart
//!   an open request is resumed and a stored reply is never requested again.

use crate::context::{ApiContext, NO_MODEL_MESSAGE};
use crate::error::ApiError;
use crate::model::{ModelEndpoint, ModelFailure};
use crate::service::admission::emit;
use crate::service::agent_steps;
use crate::store::{events, outbox, sessions, steps};
use crate::turn::{self, AgentTools, Next};
use mango_protocol::events::{
    EventBody, ModelRequestEnd, RetryStatus, SessionError, SessionErrorDetail, SessionErrorType,
    SessionStatusIdle, StopReason,
};
use mango_protocol::sessions::SessionStatus;
use std::sync::Arc;
use std::time::Duration;

/// Retries of an overloaded or rate-limited model call before giving up.
const MODEL_RETRIES: u32 = 3;

/// Runs the loop until the process exits; `model: None` answers every
/// turn with the error that no model endpoint is configured.
pub async fn run(ctx: ApiContext, model: Option<Arc<ModelEndpoint>>) {
    // Sessions advance side by side: one slow model call must not hold up the
    // others. The advisory lock keeps each Session to one step at a time
    // across replicas; `driving` avoids re-spawning one already in hand here.
    let slots = Arc::new(tokio::sync::Semaphore::new(sessions_at_once(
        ctx.db.options().get_max_connections(),
    )));
    let driving: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
    loop {
        let notified = ctx.agent_wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match outbox::pending_sessions(&ctx.db, 100).await {
            Ok(sessions) => {
                for session_id in sessions {
                    if !driving
                        .lock()
                        .expect("driving lock")
                        .insert(session_id.clone())
                    {
                        continue;
                    }
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (ctx, model, driving) = (ctx.clone(), model.clone(), driving.clone());
                    tokio::spawn(async move {
                        let stepped = match drive(&ctx, model.as_deref(), &session_id).await {
                            Ok(stepped) => stepped,
                            Err(err) => {
                                tracing::warn!(session_id, error = %err.message, "agent loop step failed");
                                true
                            }
                        };
                        driving.lock().expect("driving lock").remove(&session_id);
                        drop(slot);
                        // A step may have left more to do (new input arrived
                        // meanwhile). A Session another process is stepping is
                        // looked at again on the next round, not at once.
                        if stepped {
                            ctx.agent_wake.notify_waiters();
                        }
                    });
                }
            }
            Err(err) => tracing::warn!(error = %err, "agent loop could not read the outbox"),
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
    }
}

/// Sessions one api process advances at most at once.
const CONCURRENT_SESSIONS: usize = 32;

/// Sessions stepped at once on a pool of `pool_size` connections. The
/// LISTEN connection keeps one of them for the process's life. A step
/// holds one for its lock the whole step, the model call included, and
/// takes another for each query: with as many steps as connections, every
/// connection would hold a lock and wait for a second one, and the whole
/// pool would stall until the acquire timeout. With at most half of the
/// rest holding locks, the other half always turns over.
fn sessions_at_once(pool_size: u32) -> usize {
    (pool_size.saturating_sub(1) as usize / 2).clamp(1, CONCURRENT_SESSIONS)
}

/// Advances one Session as far as it can go without new input. `false`: another
/// process is stepping it.
pub async fn drive(
    ctx: &ApiContext,
    model: Option<&ModelEndpoint>,
    session_id: &str,
) -> Result<bool, ApiError> {
    // Held on this connection for the whole step; released on return or when
    // the connection dies with the process.
    let mut lock = ctx.db.acquire().await?;
    if !steps::try_lock(&mut lock, session_id).await? {
        return Ok(false);
    }
    let outcome = step_until_waiting(ctx, model, session_id).await;
    let _ = steps::unlock(&mut lock, session_id).await;
    outcome.map(|()| true)
}

async fn step_until_waiting(
    ctx: &ApiContext,
    model: Option<&ModelEndpoint>,
    session_id: &str,
) -> Result<(), ApiError> {
    let mut failures = 0;
    loop {
        let Some(session) = sessions::find(&ctx.db, None, session_id).await? else {
            // Deleted: its rows went with it (the keys cascade).
            return Ok(());
        };
        let events = events::all(&ctx.db, session_id).await?;
        match turn::next(&events) {
            Next::Wait => {
                let needs_worker = agent_steps::needs_worker(&events);
                // A Session deleted meanwhile took its wake-ups with it.
                agent_steps::settle_wait(
                    ctx,
                    session_id,
                    &session.environment_id,
                    session.last_seq,
                    needs_worker,
                )
                .await?;
                return Ok(());
            }
            Next::EndTurn => {
                emit(ctx, session_id, vec![agent_steps::end_turn()]).await?;
            }
            Next::EndInterruptedRequest { start_id } => {
                let end = EventBody::ModelRequestEnd(ModelRequestEnd {
                    model_request_start_id: start_id,
                    is_error: Some(false),
                    model_usage: turn::model_usage(&serde_json::Value::Null),
                });
                emit(ctx, session_id, vec![end, agent_steps::end_turn()]).await?;
            }
            Next::CallModel { .. } if model.is_none() => {
                // Nothing will answer: say so at once, with what to set.
                let failure = ModelFailure {
                    kind: SessionErrorType::ModelRequestFailedError,
                    message: NO_MODEL_MESSAGE.to_string(),
                    retryable: false,
                    retry_after: None,
                };
                let idle = EventBody::SessionStatusIdle(SessionStatusIdle {
                    stop_reason: StopReason::RetriesExhausted,
                });
                let error = session_error(&failure, RetryStatus::Terminal);
                emit(ctx, session_id, vec![error, idle]).await?;
            }
            Next::CallModel { open_request } => {
                let model = model.expect("matched above");
                let (start_id, events) = match open_request {
                    Some(id) => (id, events),
                    None => {
                        let mut opening = Vec::new();
                        if session.status != SessionStatus::Running {
                            opening.push(EventBody::SessionStatusRunning);
                        }
                        opening.push(EventBody::ModelRequestStart);
                        let stored = emit(ctx, session_id, opening).await?;
                        let start_id = stored.last().map(|e| e.id.clone()).unwrap_or_default();
                        // The request is what the log holds before its start:
                        // input that came while this round read joins it, and
                        // anything later follows its reply.
                        let mut events = events;
                        let seen = events.last().map(|e| e.id.clone()).unwrap_or_default();
                        events.extend(events::after_event(&ctx.db, session_id, &seen).await?);
                        (start_id, events)
                    }
                };
                let before_start = events
                    .iter()
                    .position(|e| e.id == start_id)
                    .map_or(&events[..], |at| &events[..at]);
                let body = turn::request(
                    &session.agent.0,
                    &session.resources.0,
                    before_start,
                    model.max_tokens,
                );
                let asked = std::time::Instant::now();
                let answer = model.messages(&body).await;
                let failure = answer.as_ref().err().map(|f| f.kind);
                ctx.metrics.model.observe(asked.elapsed(), failure);
                match answer {
                    Ok(reply) => {
                        let tools = AgentTools::from_snapshot(&session.agent.0);
                        let reply_events = turn::reply_events(&reply, &tools);
                        let usage = turn::model_usage(&reply);
                        agent_steps::commit_reply(ctx, session_id, &start_id, reply_events, usage)
                            .await?;
                        failures = 0;
                    }
                    Err(failure) if failure.retryable && failures < MODEL_RETRIES => {
                        failures += 1;
                        let retrying = session_error(&failure, RetryStatus::Retrying);
                        emit(ctx, session_id, vec![retrying]).await?;
                        let wait = failure
                            .retry_after
                            .unwrap_or(model.backoff * 2u32.pow(failures - 1));
                        tokio::time::sleep(wait).await;
                    }
                    Err(failure) => {
                        let retry = if failure.retryable {
                            RetryStatus::Exhausted
                        } else {
                            RetryStatus::Terminal
                        };
                        let end = EventBody::ModelRequestEnd(ModelRequestEnd {
                            model_request_start_id: start_id,
                            is_error: Some(true),
                            model_usage: turn::model_usage(&serde_json::Value::Null),
                        });
                        let idle = EventBody::SessionStatusIdle(SessionStatusIdle {
                            stop_reason: StopReason::RetriesExhausted,
                        });
                        emit(
                            ctx,
                            session_id,
                            vec![end, session_error(&failure, retry), idle],
                        )
                        .await?;
                        failures = 0;
                    }
                }
            }
        }
    }
}

fn session_error(failure: &ModelFailure, retry: RetryStatus) -> EventBody {
    EventBody::SessionError(SessionError {
        error: SessionErrorDetail {
            kind: failure.kind,
            message: failure.message.clone(),
            retry_status: retry,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::sessions_at_once;

    #[test]
    fn steps_at_once_leave_half_the_pool_free_within_their_bound() {
        assert_eq!(sessions_at_once(10), 4);
        assert_eq!(sessions_at_once(4), 1);
        assert_eq!(sessions_at_once(3), 1, "the smallest pool still steps");
        assert_eq!(sessions_at_once(65), 32);
        assert_eq!(sessions_at_once(66), 32);
        assert_eq!(sessions_at_once(100), 32);
    }
}
