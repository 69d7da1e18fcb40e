//! Sessions: the row that owns a log, its status projection and the Agent
//! snapshot frozen at creation. The log itself is [`super::events`].

use crate::metadata;
use mango_protocol::agents::AgentSnapshot;
use mango_protocol::sessions::{
    Session, SessionObject, SessionResource, SessionStats, SessionStatus,
};
use mango_protocol::time::Timestamp;
use serde_json::{Map, Value};
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, PgExecutor};

#[derive(Debug, Clone, FromRow)]
pub struct SessionRow {
    pub id: String,
    pub workspace_id: String,
    pub environment_id: String,
    pub agent_id: String,
    pub agent_version: i32,
    pub agent: Json<AgentSnapshot>,
    #[sqlx(try_from = "String")]
    pub status: SessionStatus,
    pub title: Option<String>,
    pub metadata: Value,
    pub resources: Json<Vec<SessionResource>>,
    pub last_seq: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
}

impl SessionRow {
    /// The SDK's `BetaManagedAgentsSession`.
    pub fn render(&self) -> Session {
        Session {
            id: self.id.clone(),
            kind: SessionObject::Session,
            status: self.status,
            environment_id: self.environment_id.clone(),
            agent: self.agent.0.clone(),
            resources: self.resources.0.clone(),
            metadata: metadata::from_json(&self.metadata),
            title: self.title.clone(),
            outcome_evaluations: Vec::new(),
            stats: SessionStats::default(),
            usage: Map::new(),
            vault_ids: Vec::new(),
            budget: None,
            deployment_id: None,
            created_at: self.created_at,
            updated_at: self.updated_at,
            archived_at: self.archived_at,
        }
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
        .bind(row.status.as_str())
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

/// What a sessions token's memory calls need of its Session: the workspace
/// and the attached resources, without the Agent snapshot (which may pin
/// hundreds of Skills and is read on every such call otherwise).
pub async fn resources(
    db: impl PgExecutor<'_>,
    id: &str,
) -> sqlx::Result<Option<(String, Json<Vec<SessionResource>>)>> {
    sqlx::query_as("SELECT workspace_id, resources FROM sessions WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Locks the Session row for the rest of the transaction: admission, Fail and
/// in-process appends serialize here, which numbers events in commit order.
///
/// `FOR NO KEY UPDATE`, the lock an update of the row takes anyway: it
/// serializes these writers and a deletion, but leaves the row's key free
/// for the foreign-key checks of rows that reference the Session. A Work
/// stopping meanwhile writes its wake-up row without waiting, so Fail, which
/// takes this lock and then stops its Work, cannot deadlock with that stop.
pub async fn lock(db: &mut PgConnection, id: &str) -> sqlx::Result<Option<SessionRow>> {
    let sql = format!("SELECT {COLUMNS} FROM sessions WHERE id = $1 FOR NO KEY UPDATE");
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
    admission_view(db, id, workspace_id, "FOR NO KEY UPDATE OF sessions").await
}

/// [`lock_for_admission`]'s read without the lock, for an admission whose
/// write is fenced on what it read ([`super::events::append_if_unchanged`]).
pub async fn read_for_admission(
    db: &mut PgConnection,
    id: &str,
    workspace_id: Option<&str>,
) -> sqlx::Result<Option<(SessionRow, bool)>> {
    admission_view(db, id, workspace_id, "").await
}

async fn admission_view(
    db: &mut PgConnection,
    id: &str,
    workspace_id: Option<&str>,
    locking: &str,
) -> sqlx::Result<Option<(SessionRow, bool)>> {
    let sql = format!(
        "SELECT {COLUMNS},
                EXISTS (SELECT 1 FROM work w WHERE w.session_id = sessions.id
                          AND w.kind = 'session' AND w.state <> 'stopped') AS has_live_work
         FROM sessions WHERE id = $1 AND ($2::text IS NULL OR workspace_id = $2)
         {locking}"
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
    pub statuses: Vec<SessionStatus>,
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
        .bind(
            filter
                .statuses
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
        )
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

/// The Session's live (not stopped) Work item, if any.
/// Which of `ids` are Sessions of Environment `environment_id` now.
pub async fn existing_in(
    db: impl PgExecutor<'_>,
    environment_id: &str,
    ids: &[String],
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT id FROM sessions WHERE environment_id = $1 AND id = ANY($2)")
        .bind(environment_id)
        .bind(ids)
        .fetch_all(db)
        .await
}

pub async fn has_live_work(db: impl PgExecutor<'_>, session_id: &str) -> sqlx::Result<bool> {
    let row: Option<(i32,)> =
        sqlx::query_as("SELECT 1 FROM work WHERE session_id = $1 AND kind = 'session' AND state <> 'stopped' LIMIT 1")
            .bind(session_id)
            .fetch_optional(db)
            .await?;
    Ok(row.is_some())
}

/// Holds the Session against deletion for the rest of the transaction
/// (`FOR KEY SHARE`); `false` when it is gone.
pub async fn hold(db: &mut PgConnection, id: &str) -> sqlx::Result<bool> {
    let found: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(found.is_some())
}
