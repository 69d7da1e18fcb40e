//! Sessions, their event log and tool calls. Events are numbered per Session
//! while its row is locked (`lock`), so sequence order is commit order and a
//! reader that has seen seq N has seen everything before it.

use crate::ids;
use crate::session_rules::{CallKind, Permission, Status, ToolCall};
use mango_protocol::time::{self, Timestamp};
use serde_json::{json, Map, Value};
use sqlx::{FromRow, PgConnection, PgExecutor};

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

/// Appends events to a Session locked by [`lock`] in this transaction:
/// assigns ids, `processed_at` and sequence numbers, records tool calls that
/// agent events open and results and confirmations that close them, and
/// moves the status projection. With `wake_agent_loop`, also writes the
/// outbox row. The events, the projection and the outbox row go in one
/// statement: the Session lock is held for as few round trips as possible.
pub async fn append(
    db: &mut PgConnection,
    session: &mut SessionRow,
    events: Vec<Map<String, Value>>,
    wake_agent_loop: bool,
    now: Timestamp,
) -> sqlx::Result<Vec<Value>> {
    let mut status = session.status();
    let (mut seqs, mut ids_, mut types, mut bodies) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for mut event in events {
        let event_type = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let id = ids::new_id("sevt");
        event.insert("id".into(), Value::String(id.clone()));
        event.insert("processed_at".into(), Value::String(time::format(&now)));
        record_tool_effects(db, &session.id, &id, &event_type, &mut event).await?;
        session.last_seq += 1;
        status = crate::session_rules::status_after(status, &event_type);
        seqs.push(session.last_seq);
        ids_.push(id);
        types.push(event_type);
        bodies.push(Value::Object(event));
    }
    session.status = status.as_str().to_string();
    session.updated_at = now;
    sqlx::query(
        "WITH events AS (
             INSERT INTO session_events (session_id, seq, id, type, processed_at, body)
             SELECT $1, e.seq, e.id, e.type, $5, e.body
             FROM UNNEST($2::bigint[], $3::text[], $4::text[], $6::jsonb[]) AS e(seq, id, type, body)
         ),
         outbox AS (
             INSERT INTO outbox (session_id, last_seq, created_at) SELECT $1, $7, $5 WHERE $9
         )
         UPDATE sessions SET last_seq = $7, status = $8, updated_at = $5 WHERE id = $1",
    )
    .bind(&session.id)
    .bind(&seqs)
    .bind(&ids_)
    .bind(&types)
    .bind(now)
    .bind(&bodies)
    .bind(session.last_seq)
    .bind(&session.status)
    .bind(wake_agent_loop)
    .execute(&mut *db)
    .await?;
    Ok(bodies)
}

/// Tool-call bookkeeping for one event being appended. Results and
/// confirmations inherit the call's thread, so the server routes them (the
/// SDK sends no thread id).
async fn record_tool_effects(
    db: &mut PgConnection,
    session_id: &str,
    event_id: &str,
    event_type: &str,
    event: &mut Map<String, Value>,
) -> sqlx::Result<()> {
    let str_field =
        |e: &Map<String, Value>, k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    match event_type {
        "agent.tool_use" | "agent.custom_tool_use" => {
            let (kind, permission) = if event_type == "agent.tool_use" {
                (
                    "tool",
                    Permission::from_event(
                        event.get("evaluated_permission").and_then(Value::as_str),
                    ),
                )
            } else {
                ("custom", Permission::Allow)
            };
            sqlx::query(
                "INSERT INTO session_tool_calls (session_id, id, kind, name, thread_id, permission) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(session_id)
            .bind(event_id)
            .bind(kind)
            .bind(str_field(event, "name").unwrap_or_default())
            .bind(str_field(event, "session_thread_id"))
            .bind(permission.as_str())
            .execute(&mut *db)
            .await?;
        }
        "user.tool_result" | "user.custom_tool_result" | "user.tool_confirmation" => {
            let key = if event_type == "user.custom_tool_result" {
                "custom_tool_use_id"
            } else {
                "tool_use_id"
            };
            let call_id = str_field(event, key).unwrap_or_default();
            let thread: Option<(Option<String>,)> = if event_type == "user.tool_confirmation" {
                sqlx::query_as("UPDATE session_tool_calls SET confirmation = $3 WHERE session_id = $1 AND id = $2 RETURNING thread_id")
                    .bind(session_id)
                    .bind(&call_id)
                    .bind(str_field(event, "result"))
                    .fetch_optional(&mut *db)
                    .await?
            } else {
                sqlx::query_as("UPDATE session_tool_calls SET answered_by = $3 WHERE session_id = $1 AND id = $2 RETURNING thread_id")
                    .bind(session_id)
                    .bind(&call_id)
                    .bind(event_id)
                    .fetch_optional(&mut *db)
                    .await?
            };
            if let Some((Some(thread),)) = thread {
                event.insert("session_thread_id".into(), Value::String(thread));
            }
        }
        _ => {}
    }
    Ok(())
}

/// A tool call of the Session, locked for the rest of the transaction.
pub async fn tool_call(
    db: &mut PgConnection,
    session_id: &str,
    id: &str,
) -> sqlx::Result<Option<ToolCall>> {
    let row: Option<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT kind, permission, confirmation, answered_by FROM session_tool_calls
         WHERE session_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(session_id)
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(
        row.map(|(kind, permission, confirmation, answered_by)| ToolCall {
            kind: if kind == "custom" {
                CallKind::Custom
            } else {
                CallKind::Tool
            },
            permission: Permission::parse(&permission).unwrap_or(Permission::Ask),
            confirmation: confirmation.as_deref().and_then(Permission::parse),
            answered_by,
        }),
    )
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
