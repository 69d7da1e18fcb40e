//! The Session tool loop (spec §8): open the event stream first, then
//! reconcile history, run each unanswered call this runner owns (honouring
//! `evaluated_permission` and confirmations), post its result keyed by the
//! call's event id (sized for the api, and a refused one answered with a
//! short error), and end on termination, 60 s after an end-of-turn idle,
//! or when the lease ends. A dropped stream reconnects and reconciles again,
//! so a call is neither repeated nor dropped.

use crate::calls::{Call, Calls};
use crate::tool_result;
use crate::tools::{ToolOutput, Toolset};
use mango_client::{Client, StreamFrame};
use mango_protocol::events::SentEvent;
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
                if let Err(end) = answer(client, session_id, &call, output, started).await {
                    return end;
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

/// How one send of a result ended.
enum Sent {
    Delivered,
    /// A 4xx other than 401, 403 and 404, final: this result will never be
    /// taken (too large, malformed, or the call denied or answered meanwhile).
    Refused(mango_client::ClientError),
    /// Not delivered, and nothing more to do in this activation.
    Ended(SessionEnd),
}

/// Results are idempotent by call id, so the client's retries are safe.
async fn send(client: &Client, session_id: &str, result: SentEvent) -> Sent {
    match client.send_events(session_id, &[result]).await {
        Ok(_) => Sent::Delivered,
        Err(err) if err.is_transient() => {
            Sent::Ended(SessionEnd::ResultUndelivered(err.to_string()))
        }
        Err(err) if matches!(err.status().map(|s| s.as_u16()), Some(401 | 403 | 404)) => {
            Sent::Ended(SessionEnd::Rejected(err.to_string()))
        }
        Err(err) if err.status().is_some_and(|s| s.is_client_error()) => Sent::Refused(err),
        // An answer that is not the api's (a body that does not parse):
        // nothing a resend would change.
        Err(err) => {
            tracing::warn!(session_id, error = %err, "the tool result's answer was unexpected");
            Sent::Delivered
        }
    }
}

/// Posts a call's result, sized for the api ([`tool_result`]). A refused
/// one is answered with a short error instead: a call left open would keep
/// its Session waiting, and the sandbox held, for ever.
async fn answer(
    client: &Client,
    session_id: &str,
    call: &Call,
    output: ToolOutput,
    started: Instant,
) -> Result<(), SessionEnd> {
    let is_error = output.is_error;
    let (result, fitted) = tool_result::result(&call.id, output);
    if fitted.changed() {
        tracing::warn!(
            session_id,
            call_id = %call.id,
            tool = %call.name,
            media_left_out = fitted.media_left_out,
            text_bytes_left_out = fitted.text_left_out,
            "the tool result was cut to fit the api's limit on an event"
        );
    }
    let refusal = match send(client, session_id, result).await {
        Sent::Delivered => {
            tracing::info!(
                session_id,
                call_id = %call.id,
                tool = %call.name,
                is_error,
                ms = started.elapsed().as_millis() as u64,
                "tool call answered"
            );
            return Ok(());
        }
        Sent::Ended(end) => return Err(end),
        Sent::Refused(refusal) => refusal,
    };
    tracing::warn!(session_id, call_id = %call.id, tool = %call.name, error = %refusal, "the api refused the tool result; answering the call with an error");
    match send(
        client,
        session_id,
        tool_result::refused(&call.id, &refusal.to_string()),
    )
    .await
    {
        Sent::Delivered => {
            tracing::info!(session_id, call_id = %call.id, tool = %call.name, "tool call answered with the refusal");
            Ok(())
        }
        Sent::Ended(end) => Err(end),
        // The call itself takes no result any more (denied or answered meanwhile).
        Sent::Refused(err) => {
            tracing::warn!(session_id, call_id = %call.id, error = %err, "the refusal's answer was refused too; the call takes no result");
            Ok(())
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
