//! The Session tool loop (spec §8): open the event stream first, then
//! reconcile history, run each unanswered call this runner owns (honouring
//! `evaluated_permission` and confirmations), post its result keyed by the
//! call's event id, and end on termination, 60 s after an end-of-turn idle,
//! or when the lease ends. A dropped stream reconnects and reconciles again,
//! so a call is neither repeated nor dropped.

use crate::calls::{Call, Calls};
use crate::tools::{ToolOutput, Toolset};
use mango_client::{Client, StreamFrame};
use mango_protocol::events::{SentEvent, UserToolResult};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const IDLE_AFTER_END_TURN: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// `session.status_terminated` or `session.deleted`.
    Terminated,
    /// Nothing happened for the idle limit after a turn ended.
    IdleAfterTurn,
    /// The lease ended (stopping, lost, unreachable): work was cancelled.
    LeaseEnded,
    /// The server refused this runner's credential or the Session for good.
    Rejected(String),
    /// A tool result could not be delivered even after retries: the Session
    /// would wait for it forever, so the lease is left to expire and Poll
    /// hands the item to another worker, which runs the call again.
    ResultUndelivered(String),
    /// An input the frozen snapshot pins cannot exist (spec §9): the Work is
    /// Failed with this message, which terminates the Session.
    InvalidInput(String),
    /// Preparation could not reach what it needs right now: the lease is left
    /// to expire and the item is reclaimed.
    PreparationUnavailable(String),
}

impl SessionEnd {
    /// An end after which the Session's files are final: the Memory Stores
    /// get their last full sync.
    pub fn is_clean(&self) -> bool {
        matches!(self, SessionEnd::Terminated | SessionEnd::IdleAfterTurn)
    }
}

pub async fn run(
    client: &Client,
    session_id: &str,
    toolset: &mut Toolset,
    idle_limit: Duration,
    lost: &CancellationToken,
    memory: &mut crate::memory::Mounted,
) -> SessionEnd {
    let mut calls = Calls::default();
    let mut backoff = FIRST_BACKOFF;
    let mut idle_since: Option<Instant> = None;
    'connect: loop {
        if lost.is_cancelled() {
            return SessionEnd::LeaseEnded;
        }
        // The stream first, then history: nothing committed in between is missed.
        let opened = match client.stream_events(session_id).await {
            Ok(stream) => client
                .all_events(session_id)
                .await
                .map(|history| (stream, history)),
            Err(err) => Err(err),
        };
        let mut stream = match opened {
            Ok((stream, history)) => {
                for event in &history {
                    calls.apply(event);
                }
                backoff = FIRST_BACKOFF;
                stream
            }
            Err(err) if err.is_transient() => {
                tracing::warn!(session_id, error = %err, ?backoff, "event stream unavailable; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = lost.cancelled() => return SessionEnd::LeaseEnded,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue 'connect;
            }
            Err(err) => return SessionEnd::Rejected(err.to_string()),
        };
        loop {
            if calls.over().is_some() {
                return SessionEnd::Terminated;
            }
            while let Some(call) = calls.next_runnable(Toolset::owns) {
                calls.mark_started(&call.id);
                let started = Instant::now();
                let output = run_announced(toolset, &call, lost.child_token(), session_id).await;
                if lost.is_cancelled() {
                    return SessionEnd::LeaseEnded;
                }
                let result = SentEvent::UserToolResult(UserToolResult {
                    tool_use_id: call.id.clone(),
                    content: Some(output.content),
                    is_error: Some(output.is_error),
                    session_thread_id: None,
                });
                // Results are idempotent by call id, so the client's retries are safe.
                match client.send_events(session_id, &[result]).await {
                    Ok(_) => tracing::info!(
                        session_id,
                        call_id = %call.id,
                        tool = %call.name,
                        is_error = output.is_error,
                        ms = started.elapsed().as_millis() as u64,
                        "tool call answered"
                    ),
                    Err(err) if err.is_transient() => {
                        return SessionEnd::ResultUndelivered(err.to_string());
                    }
                    Err(err)
                        if matches!(err.status().map(|s| s.as_u16()), Some(401 | 403 | 404)) =>
                    {
                        return SessionEnd::Rejected(err.to_string());
                    }
                    // Refused for good (e.g. the call was answered or denied meanwhile): carry on.
                    Err(err) => {
                        tracing::warn!(session_id, call_id = %call.id, error = %err, "the tool result was refused")
                    }
                }
                // Memory reconciles after tool calls, at most every 15 s.
                tokio::select! {
                    _ = memory.sync_if_due() => {}
                    _ = lost.cancelled() => return SessionEnd::LeaseEnded,
                }
            }
            idle_since = match (calls.is_idle_after_end_turn(), idle_since) {
                (true, None) => Some(Instant::now()),
                (true, since) => since,
                (false, _) => None,
            };
            let idle_deadline = idle_since.map(|t| t + idle_limit);
            let frame = tokio::select! {
                frame = stream.next() => frame,
                _ = lost.cancelled() => return SessionEnd::LeaseEnded,
                _ = sleep_until_some(idle_deadline) => return SessionEnd::IdleAfterTurn,
            };
            match frame {
                Some(Ok(StreamFrame::Event(event))) => calls.apply(&event),
                Some(Ok(StreamFrame::Ping)) => {}
                Some(Ok(StreamFrame::Error(body))) => {
                    tracing::warn!(session_id, %body, "event stream reported an error; reconnecting");
                    continue 'connect;
                }
                Some(Err(err)) => {
                    tracing::warn!(session_id, error = %err, "event stream broke; reconnecting");
                    continue 'connect;
                }
                // Closed by the server: the token may be gone; reconnecting tells.
                None => continue 'connect,
            }
        }
    }
}

/// A call still running after this is logged as it runs; every call is
/// logged once answered. (A line before every call cost a quick call about a
/// twentieth of its round trip on a 2-vCPU machine, in the runner's CPU and
/// its wake-up of the shell.)
const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);

async fn run_announced(
    toolset: &mut Toolset,
    call: &Call,
    cancel: CancellationToken,
    session_id: &str,
) -> ToolOutput {
    let run = toolset.run(&call.name, &call.input, cancel);
    tokio::pin!(run);
    tokio::select! {
        biased;
        output = &mut run => output,
        _ = tokio::time::sleep(ANNOUNCE_AFTER) => {
            tracing::info!(session_id, call_id = %call.id, tool = %call.name, "tool call running");
            run.await
        }
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
