//! A Session's event log. Events are numbered per Session while its row is
//! locked ([`super::sessions::lock`]), so sequence order is commit order and
//! a reader that has seen seq N has seen everything before it. The AFTER
//! triggers of the schema notify other processes at commit.

use crate::ids;
use crate::session_rules::{self, CallKind};
use crate::store::sessions::SessionRow;
use mango_protocol::events::{CallAnswer, Event, EventBody};
use mango_protocol::time::Timestamp;
use serde_json::Value;
use sqlx::{FromRow, PgConnection, PgExecutor};
use std::sync::Arc;

#[derive(Debug, Clone, FromRow)]
pub struct EventRow {
    pub seq: i64,
    pub body: Value,
}

/// An event in the log with its sequence number; the body, as stored, is
/// shared by the admission's response and every stream that forwards it.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    pub seq: i64,
    pub body: Arc<Value>,
}

impl From<EventRow> for LoggedEvent {
    fn from(row: EventRow) -> Self {
        LoggedEvent {
            seq: row.seq,
            body: Arc::new(row.body),
        }
    }
}

impl LoggedEvent {
    /// The event, typed (the log holds only what the api wrote).
    pub fn event(&self) -> Option<Event> {
        serde_json::from_value(Value::clone(&self.body)).ok()
    }
}

/// Appends events to a Session locked by [`super::sessions::lock`] in this
/// transaction: assigns ids, `processed_at` and sequence numbers, records
/// the tool calls that agent events open and the results and confirmations
/// that close them, and moves the status projection. With
/// `wake_agent_loop`, also writes the outbox row. All of it is one
/// statement, so the Session lock is held for as few round trips as possible.
pub async fn append(
    db: &mut PgConnection,
    session: &mut SessionRow,
    events: Vec<EventBody>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Vec<LoggedEvent>> {
    let mut status = session.status;
    let mut rows = EventColumns::default();
    let mut calls = ToolCallWrites::default();
    let mut last_seq = session.last_seq;
    for body in events {
        let event = Event {
            id: ids::new_id("sevt"),
            body,
            processed_at: Some(now),
        };
        calls.record(&event);
        status = session_rules::status_after(status, &event.body);
        last_seq += 1;
        rows.seqs.push(last_seq);
        rows.types.push(event.body.type_name().to_string());
        rows.ids.push(event.id.clone());
        rows.bodies
            .push(serde_json::to_value(&event).expect("an event serializes"));
    }
    let written: i64 = sqlx::query_scalar(APPEND)
        .bind(&session.id)
        .bind(&rows.seqs)
        .bind(&rows.ids)
        .bind(&rows.types)
        .bind(now)
        .bind(&rows.bodies)
        .bind(last_seq)
        .bind(status.as_str())
        .bind(wake_agent_loop)
        .bind(session.last_seq)
        .bind(session.archived_at)
        .bind(&calls.opened_ids)
        .bind(&calls.opened_kinds)
        .bind(&calls.opened_names)
        .bind(&calls.opened_threads)
        .bind(&calls.opened_permissions)
        .bind(&calls.answered_calls)
        .bind(&calls.answered_by)
        .bind(&calls.confirmed_calls)
        .bind(&calls.confirmations)
        .fetch_one(&mut *db)
        .await?;
    if written == 0 {
        // The caller holds the row lock, so only a bug gets here.
        return Err(sqlx::Error::Protocol(format!(
            "session {} changed under its row lock",
            session.id
        )));
    }
    session.last_seq = last_seq;
    session.status = status;
    session.updated_at = now;
    Ok(rows
        .seqs
        .into_iter()
        .zip(rows.bodies)
        .map(|(seq, body)| LoggedEvent {
            seq,
            body: Arc::new(body),
        })
        .collect())
}

/// [`append`]'s statement, fenced on the Session row being as the caller
/// read it (same `last_seq`, same archival). An `UNNEST` of empty arrays
/// writes nothing, so one statement serves every mix of events.
///
/// $1 session, $2–$4 and $6 the events' seqs, ids, types and bodies, $5
/// now, $7 the new last_seq, $8 the new status, $9 whether to write the
/// outbox row, $10 the last_seq and $11 the archival the caller read,
/// $12–$16 opened calls, $17/$18 answered calls, $19/$20 confirmations.
const APPEND: &str = "WITH fence AS (
         UPDATE sessions SET last_seq = $7, status = $8, updated_at = $5
         WHERE id = $1 AND last_seq = $10 AND archived_at IS NOT DISTINCT FROM $11
         RETURNING id
     ),
     events AS (
         INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
         SELECT fence.id, e.seq, e.id, e.type, $5, e.body
         FROM fence, UNNEST($2::bigint[], $3::text[], $4::text[], $6::jsonb[]) AS e(seq, id, type, body)
     ),
     opened AS (
         INSERT INTO session_tool_calls (session_id, id, kind, name, thread_id, permission)
         SELECT fence.id, c.id, c.kind, c.name, c.thread_id, c.permission
         FROM fence, UNNEST($12::text[], $13::text[], $14::text[], $15::text[], $16::text[])
              AS c(id, kind, name, thread_id, permission)
     ),
     answered AS (
         -- FROM fence: nothing is updated unless the fence moved.
         UPDATE session_tool_calls t SET answered_by = a.event_id
         FROM fence, UNNEST($17::text[], $18::text[]) AS a(call_id, event_id)
         WHERE t.session_id = $1 AND t.id = a.call_id
     ),
     confirmed AS (
         UPDATE session_tool_calls t SET confirmation = c.result
         FROM fence, UNNEST($19::text[], $20::text[]) AS c(call_id, result)
         WHERE t.session_id = $1 AND t.id = c.call_id
     ),
     outbox AS (
         INSERT INTO outbox (session_id, last_seq, created_at)
         SELECT fence.id, $7, $5 FROM fence WHERE $9
     )
     SELECT count(*) FROM fence";

#[derive(Default)]
struct EventColumns {
    seqs: Vec<i64>,
    ids: Vec<String>,
    types: Vec<String>,
    bodies: Vec<Value>,
}

/// Tool-call bookkeeping of the events being appended, as columns: calls that
/// agent events open, and the results and confirmations that close them.
/// Results and confirmations carry their call's thread already (admission
/// copies it from the call), so the server routes them without the SDK
/// sending a thread id.
#[derive(Default)]
struct ToolCallWrites {
    opened_ids: Vec<String>,
    opened_kinds: Vec<&'static str>,
    opened_names: Vec<String>,
    opened_threads: Vec<Option<String>>,
    opened_permissions: Vec<&'static str>,
    answered_calls: Vec<String>,
    answered_by: Vec<String>,
    confirmed_calls: Vec<String>,
    confirmations: Vec<&'static str>,
}

impl ToolCallWrites {
    fn record(&mut self, event: &Event) {
        let opened = match &event.body {
            EventBody::AgentToolUse(call) => Some((
                CallKind::Tool,
                &call.name,
                &call.session_thread_id,
                call.permission(),
            )),
            EventBody::AgentCustomToolUse(call) => Some((
                CallKind::Custom,
                &call.name,
                &call.session_thread_id,
                mango_protocol::events::Permission::Allow,
            )),
            _ => None,
        };
        if let Some((kind, name, thread, permission)) = opened {
            self.opened_ids.push(event.id.clone());
            self.opened_kinds.push(kind.as_str());
            self.opened_names.push(name.clone());
            self.opened_threads.push(thread.clone());
            self.opened_permissions.push(permission.as_str());
        }
        match event.body.answers() {
            Some(CallAnswer::Confirmation(call, result)) => {
                self.confirmed_calls.push(call.to_string());
                self.confirmations
                    .push(session_rules::confirmation_str(result));
            }
            Some(answer) => {
                self.answered_calls.push(answer.call_id().to_string());
                self.answered_by.push(event.id.clone());
            }
            None => {}
        }
    }
}

pub async fn event_by_id(
    db: impl PgExecutor<'_>,
    session_id: &str,
    id: &str,
) -> sqlx::Result<Option<Value>> {
    sqlx::query_scalar("SELECT body FROM session_events WHERE session_id = $1 AND id = $2")
        .bind(session_id)
        .bind(id)
        .fetch_optional(db)
        .await
}

/// The first confirmation stored for a call (what a retried one gets back).
pub async fn first_confirmation(
    db: impl PgExecutor<'_>,
    session_id: &str,
    call_id: &str,
) -> sqlx::Result<Option<Value>> {
    sqlx::query_scalar(
        "SELECT body FROM session_events WHERE session_id = $1 AND type = 'user.tool_confirmation'
           AND body->>'tool_use_id' = $2 ORDER BY seq LIMIT 1",
    )
    .bind(session_id)
    .bind(call_id)
    .fetch_optional(db)
    .await
}

/// Whether a reply to the model request `start_id` is already in the log.
pub async fn model_request_ended(
    db: impl PgExecutor<'_>,
    session_id: &str,
    start_id: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM session_events WHERE session_id = $1
           AND type = 'span.model_request_end' AND body->>'model_request_start_id' = $2)",
    )
    .bind(session_id)
    .bind(start_id)
    .fetch_one(db)
    .await
}

pub struct EventFilter {
    pub types: Vec<String>,
    pub gt: Option<Timestamp>,
    pub gte: Option<Timestamp>,
    pub lt: Option<Timestamp>,
    pub lte: Option<Timestamp>,
    pub ascending: bool,
}

impl EventFilter {
    /// Every event, oldest first.
    pub fn all() -> EventFilter {
        EventFilter {
            types: Vec::new(),
            gt: None,
            gte: None,
            lt: None,
            lte: None,
            ascending: true,
        }
    }
}

/// A page of events after (in the filter's order) the cursor's sequence number.
pub async fn list(
    db: impl PgExecutor<'_>,
    session_id: &str,
    filter: &EventFilter,
    after_seq: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<EventRow>> {
    let (cmp, dir) = if filter.ascending {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    let sql = format!(
        "SELECT seq, body FROM session_events
         WHERE session_id = $1
           AND (cardinality($2::text[]) = 0 OR type = ANY($2))
           AND ($3::timestamptz IS NULL OR processed_at > $3)
           AND ($4::timestamptz IS NULL OR processed_at >= $4)
           AND ($5::timestamptz IS NULL OR processed_at < $5)
           AND ($6::timestamptz IS NULL OR processed_at <= $6)
           AND ($7::bigint IS NULL OR seq {cmp} $7)
         ORDER BY seq {dir}
         LIMIT $8"
    );
    sqlx::query_as(&sql)
        .bind(session_id)
        .bind(&filter.types)
        .bind(filter.gt)
        .bind(filter.gte)
        .bind(filter.lt)
        .bind(filter.lte)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// Every event of a Session, typed, oldest first (what the agent loop reads).
pub async fn all(db: &sqlx::PgPool, session_id: &str) -> sqlx::Result<Vec<Event>> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = list(db, session_id, &EventFilter::all(), after, 1000).await?;
        let full = page.len() == 1000;
        after = page.last().map(|r| r.seq);
        for row in page {
            let event =
                serde_json::from_value(row.body).map_err(|err| sqlx::Error::ColumnDecode {
                    index: "body".into(),
                    source: Box::new(err),
                })?;
            out.push(event);
        }
        if !full {
            return Ok(out);
        }
    }
}

/// Events with a sequence number above `seq`, oldest first (for streams).
pub async fn after(
    db: impl PgExecutor<'_>,
    session_id: &str,
    seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<EventRow>> {
    sqlx::query_as(
        "SELECT seq, body FROM session_events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(session_id)
    .bind(seq)
    .bind(limit)
    .fetch_all(db)
    .await
}

pub async fn last_seq(db: impl PgExecutor<'_>, session_id: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT last_seq FROM sessions WHERE id = $1")
        .bind(session_id)
        .fetch_optional(db)
        .await
}
