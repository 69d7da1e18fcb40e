//! One measured turn: a Session's `user.message` sent, and the time from
//! the send returning to the Session's first `user.tool_result`, stamped
//! as the api publishes it to the Session's streams.

use crate::harness::Bench;
use crate::http::Api;
use crate::measure::{ms, percentile};
use crate::runner::{admissions, result_text, Arrival};
use anyhow::{bail, Context};
use mango_controller::core::stages::{Stage, Stamps};
use mango_protocol::events::types;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the scripted model asks `bash` to run, and what its result must say.
pub const COMMAND: &str = "echo ttfi-ok";
const OUTPUT: &str = "ttfi-ok";
/// From the send to the first result, on a machine shared with other work
/// (a cold sandbox, or a Python interpreter starting, is inside it).
const FIRST_RESULT: Duration = Duration::from_secs(90);

/// A Session the bench watches: its first `user.tool_result`, or a
/// `session.error` that ends the wait early.
pub struct Watched {
    pub session: String,
    events: mpsc::UnboundedReceiver<Arrival>,
    reader: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Watched {
    /// A new Session of `agent` in `env_id`, watched before anything is sent.
    pub async fn open(bench: &Bench, api: &Api, agent: &str, env_id: &str) -> anyhow::Result<Self> {
        let session = api.create_session(agent, env_id).await?;
        Ok(Watched::again(bench, session))
    }

    /// Session `session` watched from now on, for a follow-up turn: what it
    /// published before is not seen.
    pub fn again(bench: &Bench, session: String) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let reader = admissions(
            bench,
            &session,
            &[
                types::USER_TOOL_RESULT,
                types::SESSION_ERROR,
                types::SESSION_STATUS_IDLE,
            ],
            tx,
        );
        Watched {
            session,
            events,
            reader,
        }
    }

    /// Sends the turn's `user.message`; the instant the send returned.
    pub async fn send(&self, api: &Api) -> anyhow::Result<Instant> {
        api.send_message(&self.session, "run one command")
            .await
            .with_context(|| format!("sending to {}", self.session))?;
        Ok(Instant::now())
    }

    /// Milliseconds from `sent` to the first `user.tool_result`, which must
    /// be the command's output.
    pub async fn first_result(&mut self, sent: Instant) -> anyhow::Result<f64> {
        let session = self.session.clone();
        let deadline = tokio::time::Instant::from_std(sent) + FIRST_RESULT;
        loop {
            let (at, event) = self.next(deadline, "a tool result").await?;
            if event["type"] == types::SESSION_STATUS_IDLE {
                // Not the turn's end: a tool result comes first.
                continue;
            }
            let text = result_text(&event);
            if event["type"] != types::USER_TOOL_RESULT
                || event["is_error"] == true
                || !text.contains(OUTPUT)
            {
                bail!("{session}: the first tool result is not the command's output: {event}");
            }
            return Ok(ms(at.saturating_duration_since(sent)));
        }
    }

    /// Until the turn ends (`session.status_idle`, `end_turn`).
    pub async fn until_idle(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + FIRST_RESULT;
        loop {
            let (_, event) = self.next(deadline, "the turn's end").await?;
            if event["type"] == types::SESSION_STATUS_IDLE {
                if event["stop_reason"]["type"] == "end_turn" {
                    return Ok(());
                }
                bail!("{}: the turn ended otherwise: {event}", self.session);
            }
        }
    }

    /// The next watched event before `deadline`; a `session.error` is an error.
    async fn next(
        &mut self,
        deadline: tokio::time::Instant,
        what: &str,
    ) -> anyhow::Result<Arrival> {
        let session = &self.session;
        let (at, event) = match tokio::time::timeout_at(deadline, self.events.recv()).await {
            Ok(Some(arrival)) => arrival,
            Ok(None) => bail!("{session}: its feed ended before {what}"),
            Err(_) => bail!("{session}: no {what} in time"),
        };
        if event["type"] == types::SESSION_ERROR {
            bail!("{session}: session.error before {what}: {event}");
        }
        Ok((at, event))
    }

    /// Stops watching.
    pub fn close(self, bench: &Bench) {
        self.reader.abort();
        bench.forget_publications(&self.session);
    }
}

/// Each step of an item's stamps from `from` to delivered, named
/// `acked→bound`, in ms.
pub fn steps_of(stamps: &Stamps, from: Stage) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let mut before: Option<(Stage, Instant)> = None;
    for stage in Stage::ALL.into_iter().skip_while(|s| *s != from) {
        let Some(at) = stamps.get(stage) else {
            continue;
        };
        if let Some((was, then)) = before {
            out.push((
                format!("{}→{}", was.as_str(), stage.as_str()),
                ms(at.saturating_duration_since(then)),
            ));
        }
        before = Some((stage, at));
        if stage == Stage::Delivered {
            break;
        }
    }
    out
}

/// `acked→bound 1.20 ms, bound→delivered 3.40 ms`.
pub fn said(steps: &[(String, f64)]) -> String {
    steps
        .iter()
        .map(|(step, ms)| format!("{step} {ms:.2} ms"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// p50, p90 and p99 of one figure's samples, ms.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub n: usize,
}

impl Spread {
    /// `None` without samples.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        Some(Spread {
            p50: percentile(&mut s, 50.0),
            p90: percentile(&mut s, 90.0),
            p99: percentile(&mut s, 99.0),
            n: s.len(),
        })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms (n={})",
            self.p50, self.p90, self.p99, self.n
        )
    }
}
