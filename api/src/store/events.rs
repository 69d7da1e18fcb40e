//! A Session's event log. Events are numbered per Session while its row is
//! locked ([`super::sessions::lock`]), so sequence order is commit order and
//! a reader that has seen seq N has seen everything before it. The AFTER
//! triggers of the schema notify other processes at commit.

use crate::ids;
use crate::session_rules::{self, CallKind};
use crate::store::sessions::SessionRow;
use mango_protocol::events::{CallAnswer, Event, EventBody};
use mango_protocol::sessions::SessionStatus;
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
/// transaction: assigns ids, `processed_at` and sequence numbers, moves the
/// status projection and, with `wake_agent_loop`, writes the outbox row, in
/// one statement; then, only for a batch that opens tool calls or answers
/// them, records that in a second ([`record_calls`]).
pub async fn append(
    db: &mut PgConnection,
    session: &mut SessionRow,
    events: Vec<EventBody>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Vec<LoggedEvent>> {
    let mut batch = Batch::new(session, events, now);
    let calls = std::mem::take(&mut batch.calls);
    let id = session.id.clone();
    let logged = write_log(db, session, batch, wake_agent_loop, now)
        .await?
        // The caller holds the row lock, so only a bug gets here.
        .ok_or_else(|| sqlx::Error::Protocol(format!("session {id} changed under its row lock")))?;
    if !calls.is_empty() {
        record_calls(db, &id, &calls).await?;
    }
    Ok(logged)
}

/// [`append`] without the caller holding the Session's lock, for events that
/// neither open nor answer a tool call (a caller that sends those takes the
/// lock): the statement takes the lock, numbers the events after whatever
/// was appended meanwhile, and writes nothing (`None`) unless the Session's
/// status and archival are still what `session` says, the facts the caller
/// decided on. The row lock is held until the statement's own commit, so
/// sequence order stays commit order.
pub async fn append_if_unchanged(
    db: &mut PgConnection,
    session: &mut SessionRow,
    events: Vec<EventBody>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Option<Vec<LoggedEvent>>> {
    let batch = Batch::new(session, events, now);
    if !batch.calls.is_empty() {
        return Err(sqlx::Error::Protocol(
            "an append that opens or answers tool calls needs the Session's lock".into(),
        ));
    }
    write_log(db, session, batch, wake_agent_loop, now).await
}

/// The rows of a batch of events, and the Session status after them.
struct Batch {
    rows: EventColumns,
    calls: ToolCallWrites,
    status: SessionStatus,
}

impl Batch {
    fn new(session: &SessionRow, events: Vec<EventBody>, now: Timestamp) -> Batch {
        let mut batch = Batch {
            rows: EventColumns::default(),
            calls: ToolCallWrites::default(),
            status: session.status,
        };
        for body in events {
            let event = Event {
                id: ids::new_id("sevt"),
                body,
                processed_at: Some(now),
            };
            batch.calls.record(&event);
            batch.status = session_rules::status_after(batch.status, &event.body);
            batch.rows.types.push(event.body.type_name().to_string());
            batch.rows.ids.push(event.id.clone());
            batch
                .rows
                .bodies
                .push(serde_json::to_value(&event).expect("an event serializes"));
        }
        batch
    }
}

async fn write_log(
    db: &mut PgConnection,
    session: &mut SessionRow,
    batch: Batch,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Option<Vec<LoggedEvent>>> {
    let Batch { rows, status, .. } = batch;
    let last_seq: Option<i64> = sqlx::query_scalar(APPEND)
        .bind(&session.id)
        .bind(&rows.ids)
        .bind(&rows.types)
        .bind(&rows.bodies)
        .bind(now)
        .bind(status.as_str())
        .bind(wake_agent_loop)
        .bind(session.status.as_str())
        .bind(session.archived_at)
        .fetch_optional(&mut *db)
        .await?;
    let Some(last_seq) = last_seq else {
        return Ok(None);
    };
    session.last_seq = last_seq;
    session.status = status;
    session.updated_at = now;
    let first_seq = last_seq - rows.bodies.len() as i64 + 1;
    Ok(Some(
        (first_seq..)
            .zip(rows.bodies)
            .map(|(seq, body)| LoggedEvent {
                seq,
                body: Arc::new(body),
            })
            .collect(),
    ))
}

/// [`write_log`]'s statement. The UPDATE takes the Session's row lock
/// (waiting for a writer that holds it) and re-checks the fence on the row
/// as that writer left it; the events are numbered after its `last_seq` in
/// their order.
///
/// $1 session, $2–$4 the events' ids, types and bodies, $5 now, $6 the new
/// status, $7 whether to write the outbox row, $8 the status and $9 the
/// archival the caller decided on.
const APPEND: &str = "WITH fence AS (
         UPDATE sessions SET last_seq = last_seq + cardinality($2::text[]), status = $6, updated_at = $5
         WHERE id = $1 AND status = $8 AND archived_at IS NOT DISTINCT FROM $9
         RETURNING id, last_seq
     ),
     events AS (
         INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
         SELECT fence.id, fence.last_seq - cardinality($2::text[]) + e.n, e.id, e.type, $5, e.body
         FROM fence, UNNEST($2::text[], $3::text[], $4::jsonb[]) WITH ORDINALITY AS e(id, type, body, n)
     ),
     outbox AS (
         INSERT INTO outbox (session_id, last_seq, created_at)
         SELECT fence.id, fence.last_seq, $5 FROM fence WHERE $7
     )
     SELECT last_seq FROM fence";

/// The tool calls a batch opened, and the results and confirmations that
/// closed calls, in the appending transaction. A statement of its own, so
/// the log's append (every event sent) does not carry three empty writes
/// to `session_tool_calls`: their setup alone cost about a tenth of an
/// admission (docs/performance.md, "Integrity before micro-gains").
async fn record_calls(
    db: &mut PgConnection,
    session_id: &str,
    calls: &ToolCallWrites,
) -> sqlx::Result<()> {
    sqlx::query(RECORD_CALLS)
        .bind(session_id)
        .bind(&calls.opened_ids)
        .bind(&calls.opened_kinds)
        .bind(&calls.opened_names)
        .bind(&calls.opened_threads)
        .bind(&calls.opened_permissions)
        .bind(&calls.answered_calls)
        .bind(&calls.answered_by)
        .bind(&calls.confirmed_calls)
        .bind(&calls.confirmations)
        .execute(&mut *db)
        .await?;
    Ok(())
}

/// $1 session, $2–$6 opened calls, $7/$8 answered calls, $9/$10
/// confirmations. An `UNNEST` of empty arrays writes nothing, so one
/// statement serves every mix.
const RECORD_CALLS: &str = "WITH opened AS (
         INSERT INTO session_tool_calls (session_id, id, kind, name, thread_id, permission)
         SELECT $1, c.id, c.kind, c.name, c.thread_id, c.permission
         FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
              AS c(id, kind, name, thread_id, permission)
     ),
     answered AS (
         UPDATE session_tool_calls t SET answered_by = a.event_id
         FROM UNNEST($7::text[], $8::text[]) AS a(call_id, event_id)
         WHERE t.session_id = $1 AND t.id = a.call_id
     ),
     confirmed AS (
         UPDATE session_tool_calls t SET confirmation = c.result
         FROM UNNEST($9::text[], $10::text[]) AS c(call_id, result)
         WHERE t.session_id = $1 AND t.id = c.call_id
     )
     SELECT 1";

#[derive(Default)]
struct EventColumns {
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
    fn is_empty(&self) -> bool {
        self.opened_ids.is_empty()
            && self.answered_calls.is_empty()
            && self.confirmed_calls.is_empty()
    }

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

/// The events stored after the event `id`, typed, oldest first.
pub async fn after_event(
    db: impl PgExecutor<'_>,
    session_id: &str,
    id: &str,
) -> sqlx::Result<Vec<Event>> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "SELECT seq, body FROM session_events WHERE session_id = $1
           AND seq > (SELECT seq FROM session_events WHERE session_id = $1 AND id = $2)
         ORDER BY seq",
    )
    .bind(session_id)
    .bind(id)
    .fetch_all(db)
    .await?;
    rows.into_iter().map(typed).collect()
}

fn typed(row: EventRow) -> sqlx::Result<Event> {
    serde_json::from_value(row.body).map_err(|err| sqlx::Error::ColumnDecode {
        index: "body".into(),
        source: Box::new(err),
    })
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
            out.push(typed(row)?);
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
