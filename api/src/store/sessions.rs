//! Sessions, their event log and tool calls. Events are numbered per Session
//! while its row is locked (`lock`), so sequence order is commit order and a
//! reader that has seen seq N has seen everything before it.

use crate::ids;
use crate::session_rules::{CallKind, Permission, Status, ToolCall, WORKER_RESULT_ACCEPTED_SQL};
use crate::wake;
use mango_protocol::time::{self, Timestamp};
use serde_json::{json, Map, Value};
use sqlx::{FromRow, PgConnection, PgExecutor};
use std::sync::Arc;

#[derive(Debug, Clone, FromRow)]
pub struct SessionRow {
    pub id: String,
    pub workspace_id: String,
    pub environment_id: String,
    pub agent_id: String,
    pub agent_version: i32,
    pub agent: Value,
    pub status: String,
    pub title: Option<String>,
    pub metadata: Value,
    pub resources: Value,
    pub last_seq: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
}

impl SessionRow {
    pub fn status(&self) -> Status {
        Status::parse(&self.status).expect("status is constrained by the schema")
    }

    /// The SDK's `BetaManagedAgentsSession`.
    pub fn render(&self) -> Value {
        json!({
            "id": self.id,
            "type": "session",
            "status": self.status,
            "environment_id": self.environment_id,
            "agent": self.agent,
            "resources": self.resources,
            "metadata": self.metadata,
            "title": self.title,
            "outcome_evaluations": [],
            "stats": {"active_seconds": null, "duration_seconds": null},
            "usage": {},
            "vault_ids": [],
            "budget": null,
            "deployment_id": null,
            "created_at": time::format(&self.created_at),
            "updated_at": time::format(&self.updated_at),
            "archived_at": self.archived_at.map(|t| time::format(&t)),
        })
    }
}

const COLUMNS: &str =
    "id, workspace_id, environment_id, agent_id, agent_version, agent, status, title, \
    metadata, resources, last_seq, created_at, updated_at, archived_at";

pub async fn insert(db: impl PgExecutor<'_>, row: &SessionRow) -> sqlx::Result<SessionRow> {
    let sql = format!(
        "INSERT INTO sessions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
         RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.environment_id)
        .bind(&row.agent_id)
        .bind(row.agent_version)
        .bind(&row.agent)
        .bind(&row.status)
        .bind(&row.title)
        .bind(&row.metadata)
        .bind(&row.resources)
        .bind(row.last_seq)
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(row.archived_at)
        .fetch_one(db)
        .await
}

/// A Session of the workspace (`None` for any workspace: a sessions token's own Session).
pub async fn find(
    db: impl PgExecutor<'_>,
    workspace_id: Option<&str>,
    id: &str,
) -> sqlx::Result<Option<SessionRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM sessions WHERE id = $1 AND ($2::text IS NULL OR workspace_id = $2)"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

/// Locks the Session row for the rest of the transaction: admission, Fail and
/// in-process appends serialize here, which numbers events in commit order.
pub async fn lock(db: &mut PgConnection, id: &str) -> sqlx::Result<Option<SessionRow>> {
    let sql = format!("SELECT {COLUMNS} FROM sessions WHERE id = $1 FOR UPDATE");
    sqlx::query_as(&sql).bind(id).fetch_optional(db).await
}

#[derive(FromRow)]
struct LockedSession {
    #[sqlx(flatten)]
    session: SessionRow,
    has_live_work: bool,
}

/// [`lock`] for admission: also says whether the Session has Work that is not
/// yet stopped, and (with `workspace_id`) checks the Session's workspace, so
/// admission needs no other read while it holds the lock.
pub async fn lock_for_admission(
    db: &mut PgConnection,
    id: &str,
    workspace_id: Option<&str>,
) -> sqlx::Result<Option<(SessionRow, bool)>> {
    let sql = format!(
        "SELECT {COLUMNS},
                EXISTS (SELECT 1 FROM work w WHERE w.session_id = sessions.id
                          AND w.kind = 'session' AND w.state <> 'stopped') AS has_live_work
         FROM sessions WHERE id = $1 AND ($2::text IS NULL OR workspace_id = $2)
         FOR UPDATE OF sessions"
    );
    let row: Option<LockedSession> = sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| (r.session, r.has_live_work)))
}

pub struct ListFilter<'a> {
    pub workspace_id: &'a str,
    pub statuses: Vec<String>,
    pub agent_id: Option<&'a str>,
    pub include_archived: bool,
    pub ascending: bool,
}

/// One page in `filter`'s order, strictly after (or, with `backwards`, before) the cursor.
pub async fn list(
    db: impl PgExecutor<'_>,
    filter: &ListFilter<'_>,
    cursor: Option<(Timestamp, String)>,
    backwards: bool,
    limit: i64,
) -> sqlx::Result<Vec<SessionRow>> {
    // Walking backwards is walking forwards in the opposite order, then reversing.
    let ascending = filter.ascending != backwards;
    let (cmp, dir) = if ascending {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    let (ts, id) = match cursor {
        Some((ts, id)) => (Some(ts), Some(id)),
        None => (None, None),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM sessions
         WHERE workspace_id = $1
           AND (cardinality($2::text[]) = 0 OR status = ANY($2))
           AND ($3::text IS NULL OR agent_id = $3)
           AND ($4 OR archived_at IS NULL)
           AND ($5::timestamptz IS NULL OR (created_at, id) {cmp} ($5, $6))
         ORDER BY created_at {dir}, id {dir}
         LIMIT $7"
    );
    let mut rows: Vec<SessionRow> = sqlx::query_as(&sql)
        .bind(filter.workspace_id)
        .bind(&filter.statuses)
        .bind(filter.agent_id)
        .bind(filter.include_archived)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await?;
    if backwards {
        rows.reverse();
    }
    Ok(rows)
}

pub async fn set_archived(
    db: impl PgExecutor<'_>,
    id: &str,
    now: Timestamp,
) -> sqlx::Result<Option<SessionRow>> {
    let sql = format!(
        "UPDATE sessions SET archived_at = COALESCE(archived_at, $2), updated_at = $2 WHERE id = $1 RETURNING {COLUMNS}"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(now)
        .fetch_optional(db)
        .await
}

pub async fn delete(db: impl PgExecutor<'_>, workspace_id: &str, id: &str) -> sqlx::Result<bool> {
    let done = sqlx::query("DELETE FROM sessions WHERE id = $1 AND workspace_id = $2")
        .bind(id)
        .bind(workspace_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

// ------------------------------------------------------------------ events

#[derive(Debug, Clone, FromRow)]
pub struct EventRow {
    pub seq: i64,
    pub body: Value,
}

/// An event in the log with its sequence number; the body is shared by the
/// admission's response and every stream that forwards it.
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

/// Appends events to a Session locked by [`lock`] in this transaction:
/// assigns ids, `processed_at` and sequence numbers, records tool calls that
/// agent events open and results and confirmations that close them, and
/// moves the status projection. With `wake_agent_loop`, also writes the
/// outbox row. All of it is one statement: the Session lock is held for as
/// few round trips as possible.
pub async fn append(
    db: &mut PgConnection,
    session: &mut SessionRow,
    events: Vec<Map<String, Value>>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Vec<LoggedEvent>> {
    let mut head = LogHead::of(session);
    let appended = append_if_unchanged(db, &mut head, events, wake_agent_loop, now)
        .await?
        .ok_or_else(|| {
            // The caller holds the row lock, so only a bug gets here.
            sqlx::Error::Protocol(format!("session {} changed under its row lock", head.id))
        })?;
    session.last_seq = head.last_seq;
    session.status = head.status;
    session.updated_at = head.updated_at;
    Ok(appended)
}

/// The part of a Session an append reads and moves: its log's end, status
/// and archival (not the frozen agent snapshot, which can be large).
#[derive(Debug, Clone, FromRow)]
pub struct LogHead {
    pub id: String,
    pub status: String,
    pub last_seq: i64,
    pub archived_at: Option<Timestamp>,
    pub updated_at: Timestamp,
}

impl LogHead {
    pub fn of(session: &SessionRow) -> LogHead {
        LogHead {
            id: session.id.clone(),
            status: session.status.clone(),
            last_seq: session.last_seq,
            archived_at: session.archived_at,
            updated_at: session.updated_at,
        }
    }

    pub fn status(&self) -> Status {
        Status::parse(&self.status).expect("status is constrained by the schema")
    }
}

/// The Work whose claim a write relied on: it goes through only if the row
/// still has this version (nothing about the claim changed since it was read).
#[derive(Debug, Clone, Copy)]
pub struct ClaimFence<'a> {
    pub work_id: &'a str,
    pub row_version: i64,
}

/// [`append`]'s statement, fenced on the Session row being as `session`
/// shows it (same `last_seq`, same archival); `None` if it is not, which
/// under the row lock only a bug can cause.
async fn append_if_unchanged(
    db: &mut PgConnection,
    session: &mut LogHead,
    events: Vec<Map<String, Value>>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Option<Vec<LoggedEvent>>> {
    let seen_last_seq = session.last_seq;
    let mut last_seq = session.last_seq;
    let mut status = session.status();
    let mut rows = EventColumns::default();
    let mut calls = ToolCallWrites::default();
    for mut event in events {
        let event_type = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let id = ids::new_id("sevt");
        event.insert("id".into(), Value::String(id.clone()));
        event.insert("processed_at".into(), Value::String(time::format(&now)));
        calls.record(&id, &event_type, &event);
        last_seq += 1;
        status = crate::session_rules::status_after(status, &event_type);
        rows.seqs.push(last_seq);
        rows.ids.push(id);
        rows.types.push(event_type);
        rows.bodies.push(Value::Object(event));
    }
    let done = sqlx::query(append_statement(StatementParts {
        opened: !calls.opened_ids.is_empty(),
        answered: !calls.answered_calls.is_empty(),
        confirmed: !calls.confirmed_calls.is_empty(),
        outbox: wake_agent_loop,
    }))
    .bind(&session.id)
    .bind(&rows.seqs)
    .bind(&rows.ids)
    .bind(&rows.types)
    .bind(now)
    .bind(&rows.bodies)
    .bind(last_seq)
    .bind(status.as_str())
    .bind(wake_agent_loop)
    .bind(seen_last_seq)
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
    let (written, _notified): (i64, i64) = sqlx::FromRow::from_row(&done)?;
    if written == 0 {
        return Ok(None);
    }
    session.last_seq = last_seq;
    session.status = status.as_str().to_string();
    session.updated_at = now;
    Ok(Some(
        rows.seqs
            .into_iter()
            .zip(rows.bodies)
            .map(|(seq, body)| LoggedEvent {
                seq,
                body: Arc::new(body),
            })
            .collect(),
    ))
}

/// Which optional parts an append needs; the statement carries only those
/// (every variant binds the same 20 parameters, so the call site is one).
#[derive(Clone, Copy)]
struct StatementParts {
    opened: bool,
    answered: bool,
    confirmed: bool,
    outbox: bool,
}

fn append_statement(parts: StatementParts) -> &'static str {
    static VARIANTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        (0..16u8)
            .map(|bits| {
                build_append_statement(StatementParts {
                    opened: bits & 1 != 0,
                    answered: bits & 2 != 0,
                    confirmed: bits & 4 != 0,
                    outbox: bits & 8 != 0,
                })
            })
            .collect()
    });
    let index = usize::from(parts.opened)
        | usize::from(parts.answered) << 1
        | usize::from(parts.confirmed) << 2
        | usize::from(parts.outbox) << 3;
    &VARIANTS[index]
}

/// Parameters: $1 session, $2–$4 and $6 the events' seqs, ids, types and
/// bodies, $5 now, $7 the new last_seq, $8 the new status, $9 (unused here:
/// whether to write the outbox row), $10 the last_seq and $11 the archival
/// the caller read, $12–$16 opened calls, $17/$18 answered calls, $19/$20
/// confirmations.
fn build_append_statement(parts: StatementParts) -> String {
    let mut sql = String::from(
        "WITH fence AS (
             UPDATE sessions SET last_seq = $7, status = $8, updated_at = $5, notified_seq = $7
             WHERE id = $1 AND last_seq = $10 AND archived_at IS NOT DISTINCT FROM $11
             RETURNING id, last_seq
         ),
         events AS (
             INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
             SELECT fence.id, e.seq, e.id, e.type, $5, e.body
             FROM fence, UNNEST($2::bigint[], $3::text[], $4::text[], $6::jsonb[]) AS e(seq, id, type, body)
         )",
    );
    if parts.opened {
        sql.push_str(
            ",
         opened AS (
             INSERT INTO session_tool_calls (session_id, id, kind, name, thread_id, permission)
             SELECT fence.id, c.id, c.kind, c.name, c.thread_id, c.permission
             FROM fence, UNNEST($12::text[], $13::text[], $14::text[], $15::text[], $16::text[])
                  AS c(id, kind, name, thread_id, permission)
         )",
        );
    }
    if parts.answered {
        sql.push_str(
            ",
         answered AS (
             -- FROM fence: nothing is updated unless the fence moved.
             UPDATE session_tool_calls t SET answered_by = a.event_id
             FROM fence, UNNEST($17::text[], $18::text[]) AS a(call_id, event_id)
             WHERE t.session_id = $1 AND t.id = a.call_id
         )",
        );
    }
    if parts.confirmed {
        sql.push_str(
            ",
         confirmed AS (
             UPDATE session_tool_calls t SET confirmation = c.result
             FROM fence, UNNEST($19::text[], $20::text[]) AS c(call_id, result)
             WHERE t.session_id = $1 AND t.id = c.call_id
         )",
        );
    }
    if parts.outbox {
        sql.push_str(
            ",
         outbox AS (
             INSERT INTO outbox (session_id, last_seq, created_at, notified)
             SELECT fence.id, $7, $5, true FROM fence
         )",
        );
    }
    sql.push_str(",\n         ");
    sql.push_str(&wake::notify_cte(parts.outbox));
    sql.push_str("\n         SELECT count(*), (SELECT count(*) FROM notify) FROM fence");
    sql
}

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
    opened_kinds: Vec<String>,
    opened_names: Vec<String>,
    opened_threads: Vec<Option<String>>,
    opened_permissions: Vec<String>,
    answered_calls: Vec<String>,
    answered_by: Vec<String>,
    confirmed_calls: Vec<String>,
    confirmations: Vec<Option<String>>,
}

impl ToolCallWrites {
    fn record(&mut self, event_id: &str, event_type: &str, event: &Map<String, Value>) {
        let field = |k: &str| event.get(k).and_then(Value::as_str).map(str::to_string);
        match event_type {
            "agent.tool_use" | "agent.custom_tool_use" => {
                let (kind, permission) = if event_type == "agent.tool_use" {
                    (
                        CallKind::Tool,
                        Permission::from_event(
                            event.get("evaluated_permission").and_then(Value::as_str),
                        ),
                    )
                } else {
                    (CallKind::Custom, Permission::Allow)
                };
                self.opened_ids.push(event_id.to_string());
                self.opened_kinds.push(kind.as_str().to_string());
                self.opened_names.push(field("name").unwrap_or_default());
                self.opened_threads.push(field("session_thread_id"));
                self.opened_permissions
                    .push(permission.as_str().to_string());
            }
            "user.tool_result" | "user.custom_tool_result" => {
                let key = if event_type == "user.custom_tool_result" {
                    "custom_tool_use_id"
                } else {
                    "tool_use_id"
                };
                self.answered_calls.push(field(key).unwrap_or_default());
                self.answered_by.push(event_id.to_string());
            }
            "user.tool_confirmation" => {
                self.confirmed_calls
                    .push(field("tool_use_id").unwrap_or_default());
                self.confirmations.push(field("result"));
            }
            _ => {}
        }
    }
}

/// A tool call's state, and the thread it was made in.
#[derive(Debug, Clone, FromRow)]
pub struct CallRow {
    kind: String,
    permission: String,
    confirmation: Option<String>,
    answered_by: Option<String>,
    pub thread_id: Option<String>,
}

impl CallRow {
    pub fn state(&self) -> ToolCall {
        ToolCall {
            kind: if self.kind == CallKind::Custom.as_str() {
                CallKind::Custom
            } else {
                CallKind::Tool
            },
            permission: Permission::parse(&self.permission).unwrap_or(Permission::Ask),
            confirmation: self.confirmation.as_deref().and_then(Permission::parse),
            answered_by: self.answered_by.clone(),
        }
    }
}

/// A tool call of the Session (whose row the caller has locked).
pub async fn tool_call(
    db: &mut PgConnection,
    session_id: &str,
    id: &str,
) -> sqlx::Result<Option<CallRow>> {
    sqlx::query_as(
        "SELECT kind, permission, confirmation, answered_by, thread_id FROM session_tool_calls
         WHERE session_id = $1 AND id = $2",
    )
    .bind(session_id)
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A worker's first answer to an open call (`event`, a `user.tool_result`
/// or `user.custom_tool_result` naming `call_id`), admitted by ONE statement
/// without the Session lock: it reads the Session and the call, writes only
/// if [`WORKER_RESULT_ACCEPTED_SQL`] holds and the claim's Work row still has
/// its version, and moves the log head fenced on the `last_seq` it read, so
/// a commit that lands in between (another answer, a status change, an
/// archival) makes it write nothing. What it writes is what [`append`]
/// writes for the same event: the event (with the call's thread copied in),
/// the call answered, the log head, the outbox row that wakes the agent loop.
/// `None`: nothing was written, and the locking path must decide.
///
/// The Work row is checked, not locked: Fail locks the Session and then
/// updates the Work, so a share lock taken here (which PostgreSQL takes
/// before it waits for the Session row) could deadlock with it. A Stop that
/// commits while this statement runs can therefore still see one last result
/// land, as the locking path always could.
pub async fn answer_open_call(
    db: &mut PgConnection,
    session_id: &str,
    call_id: &str,
    kind: CallKind,
    mut event: Map<String, Value>,
    now: Timestamp,
    claim: ClaimFence<'_>,
) -> sqlx::Result<Option<LoggedEvent>> {
    static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH seen AS (
                 SELECT s.id, s.last_seq, c.thread_id
                 FROM sessions s JOIN session_tool_calls c ON c.session_id = s.id AND c.id = $2
                 WHERE s.id = $1 AND {WORKER_RESULT_ACCEPTED_SQL}
                   AND EXISTS (SELECT 1 FROM work WHERE id = $7 AND row_version = $8)
             ),
             fence AS (
                 UPDATE sessions s SET last_seq = s.last_seq + 1, updated_at = $5,
                                       notified_seq = s.last_seq + 1
                 FROM seen
                 WHERE s.id = seen.id AND s.last_seq = seen.last_seq
                   AND s.archived_at IS NULL AND s.status <> 'terminated'
                 RETURNING s.id, s.last_seq, seen.thread_id
             ),
             events AS (
                 INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
                 SELECT fence.id, fence.last_seq, $4, $6::jsonb->>'type', $5,
                        CASE WHEN fence.thread_id IS NULL THEN $6::jsonb
                             ELSE $6::jsonb || jsonb_build_object('session_thread_id', fence.thread_id)
                        END
                 FROM fence
             ),
             answered AS (
                 -- FROM fence: nothing is updated unless the fence moved.
                 UPDATE session_tool_calls t SET answered_by = $4
                 FROM fence WHERE t.session_id = $1 AND t.id = $2
             ),
             outbox AS (
                 INSERT INTO outbox (session_id, last_seq, created_at, notified)
                 SELECT fence.id, fence.last_seq, $5, true FROM fence
             ),
             {notify}
             SELECT last_seq, thread_id, (SELECT count(*) FROM notify) FROM fence",
            notify = wake::notify_cte(true)
        )
    });
    let id = ids::new_id("sevt");
    event.insert("id".into(), Value::String(id.clone()));
    event.insert("processed_at".into(), Value::String(time::format(&now)));
    let mut body = Value::Object(event);
    let written: Option<(i64, Option<String>, i64)> = sqlx::query_as(STATEMENT.as_str())
        .bind(session_id)
        .bind(call_id)
        .bind(kind.as_str())
        .bind(&id)
        .bind(now)
        .bind(&body)
        .bind(claim.work_id)
        .bind(claim.row_version)
        .fetch_optional(db)
        .await?;
    Ok(written.map(|(seq, thread, _notified)| {
        if let (Some(thread), Value::Object(fields)) = (thread, &mut body) {
            fields.insert("session_thread_id".into(), Value::String(thread));
        }
        LoggedEvent {
            seq,
            body: Arc::new(body),
        }
    }))
}

pub async fn event_by_id(
    db: impl PgExecutor<'_>,
    session_id: &str,
    id: &str,
) -> sqlx::Result<Option<Value>> {
    let row: Option<(Value,)> =
        sqlx::query_as("SELECT body FROM session_events WHERE session_id = $1 AND id = $2")
            .bind(session_id)
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(b,)| b))
}

pub struct EventFilter {
    pub types: Vec<String>,
    pub gt: Option<Timestamp>,
    pub gte: Option<Timestamp>,
    pub lt: Option<Timestamp>,
    pub lte: Option<Timestamp>,
    pub ascending: bool,
}

/// A page of events after (in the filter's order) the cursor's sequence number.
pub async fn list_events(
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

/// Events with a sequence number above `seq`, oldest first (for streams).
pub async fn events_after(
    db: impl PgExecutor<'_>,
    session_id: &str,
    seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<EventRow>> {
    sqlx::query_as("SELECT seq, body FROM session_events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
        .bind(session_id)
        .bind(seq)
        .bind(limit)
        .fetch_all(db)
        .await
}

pub async fn last_seq(db: impl PgExecutor<'_>, session_id: &str) -> sqlx::Result<Option<i64>> {
    let row: Option<(i64,)> = sqlx::query_as("SELECT last_seq FROM sessions WHERE id = $1")
        .bind(session_id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(s,)| s))
}

/// The Session's live (not stopped) Work item, if any.
pub async fn has_live_work(db: impl PgExecutor<'_>, session_id: &str) -> sqlx::Result<bool> {
    let row: Option<(i32,)> =
        sqlx::query_as("SELECT 1 FROM work WHERE session_id = $1 AND kind = 'session' AND state <> 'stopped' LIMIT 1")
            .bind(session_id)
            .fetch_optional(db)
            .await?;
    Ok(row.is_some())
}
