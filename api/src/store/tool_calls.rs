//! Tool calls: one row per `agent.tool_use` / `agent.custom_tool_use`, with
//! its permission, any confirmation, and the result that answered it. The
//! rows are written by [`super::events::append`]; this module reads them,
//! and holds the worker's one-statement answer.

use crate::ids;
use crate::session_rules::{CallKind, ToolCall};
use crate::store::events::LoggedEvent;
use mango_protocol::events::{Event, EventBody, Permission};
use mango_protocol::time::Timestamp;
use sqlx::{FromRow, PgConnection};
use std::sync::Arc;

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
pub async fn find(
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

/// `session_rules::may_send` for a worker's result and
/// `session_rules::admit_result` = `Accept`, restated in SQL over a Session
/// row `s` and its call row `c` (`$3`: the result's call kind). The schema
/// constrains every column it reads, and a test checks it against those
/// rules for every combination of values the schema allows; where it says
/// no, the locking path decides.
pub const WORKER_RESULT_ACCEPTED_SQL: &str = "s.status <> 'terminated' AND s.archived_at IS NULL
      AND c.kind = $3 AND c.answered_by IS NULL
      AND c.permission <> 'deny' AND c.confirmation IS DISTINCT FROM 'deny'
      AND (c.permission = 'allow' OR c.confirmation = 'allow')";

/// The claim a write relied on: it goes through only if the Work row still
/// has this version (nothing about the claim changed since it was read).
#[derive(Debug, Clone, Copy)]
pub struct ClaimFence<'a> {
    pub work_id: &'a str,
    pub row_version: i64,
}

/// A worker's first answer to an open call (`body`, a tool result naming
/// `call_id`), admitted by ONE statement without the Session lock: it
/// reads the Session and the call, writes only if
/// [`WORKER_RESULT_ACCEPTED_SQL`] holds and the claim's Work row still has
/// its version, and moves the log head fenced on the `last_seq` it read, so
/// a commit that lands in between (another answer, a status change, an
/// archival) makes it write nothing. What it writes is what
/// [`super::events::append`] writes for the same event: the event (with the
/// call's thread copied in), the call answered, the log head, the outbox
/// row that wakes the agent loop. `None`: nothing was written, and the
/// locking path must decide.
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
    body: EventBody,
    now: Timestamp,
    claim: ClaimFence<'_>,
) -> sqlx::Result<Option<LoggedEvent>> {
    let event = Event {
        id: ids::new_id("sevt"),
        body,
        processed_at: Some(now),
    };
    let mut stored = serde_json::to_value(&event).expect("an event serializes");
    let written: Option<(i64, Option<String>)> = sqlx::query_as(ANSWER_OPEN_CALL.as_str())
        .bind(session_id)
        .bind(call_id)
        .bind(kind.as_str())
        .bind(&event.id)
        .bind(now)
        .bind(&stored)
        .bind(claim.work_id)
        .bind(claim.row_version)
        .fetch_optional(db)
        .await?;
    Ok(written.map(|(seq, thread)| {
        if let (Some(thread), Some(fields)) = (thread, stored.as_object_mut()) {
            fields.insert(
                "session_thread_id".into(),
                serde_json::Value::String(thread),
            );
        }
        LoggedEvent {
            seq,
            body: Arc::new(stored),
        }
    }))
}

static ANSWER_OPEN_CALL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH seen AS (
             SELECT s.id, s.last_seq, c.thread_id
             FROM sessions s JOIN session_tool_calls c ON c.session_id = s.id AND c.id = $2
             WHERE s.id = $1 AND {WORKER_RESULT_ACCEPTED_SQL}
               AND EXISTS (SELECT 1 FROM work WHERE id = $7 AND row_version = $8)
         ),
         fence AS (
             UPDATE sessions s SET last_seq = s.last_seq + 1, updated_at = $5
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
             INSERT INTO outbox (session_id, last_seq, created_at)
             SELECT fence.id, fence.last_seq, $5 FROM fence
         )
         SELECT last_seq, thread_id FROM fence"
    )
});
