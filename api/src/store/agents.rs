//! Agents: a head row (`agents`) and immutable numbered versions (`agent_versions`).

use mango_protocol::time::{self, Timestamp};
use serde_json::{json, Value};
use sqlx::{FromRow, PgExecutor};

/// One version of an Agent joined with its head row.
#[derive(Debug, Clone, FromRow)]
pub struct AgentRow {
    pub id: String,
    pub workspace_id: String,
    /// The head's current version.
    pub latest_version: i32,
    pub agent_created_at: Timestamp,
    pub agent_updated_at: Timestamp,
    pub archived_at: Option<Timestamp>,
    /// This row's version.
    pub version: i32,
    pub name: String,
    pub description: Option<String>,
    pub system: Option<String>,
    pub model: Value,
    pub tools: Value,
    pub skills: Value,
    pub mcp_servers: Value,
    pub execution_identity: Value,
    pub metadata: Value,
    pub version_created_at: Timestamp,
}

/// The immutable definition of one version.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub description: Option<String>,
    pub system: Option<String>,
    pub model: Value,
    pub tools: Value,
    pub skills: Value,
    pub mcp_servers: Value,
    pub execution_identity: Value,
    pub metadata: Value,
}

impl AgentRow {
    pub fn definition(&self) -> Definition {
        Definition {
            name: self.name.clone(),
            description: self.description.clone(),
            system: self.system.clone(),
            model: self.model.clone(),
            tools: self.tools.clone(),
            skills: self.skills.clone(),
            mcp_servers: self.mcp_servers.clone(),
            execution_identity: self.execution_identity.clone(),
            metadata: self.metadata.clone(),
        }
    }

    /// The SDK's `BetaManagedAgentsAgent`. An older version reports the time it
    /// was written as `updated_at`; the archive state is the Agent's.
    pub fn render(&self) -> Value {
        let updated_at = if self.version == self.latest_version {
            self.agent_updated_at
        } else {
            self.version_created_at
        };
        json!({
            "type": "agent",
            "id": self.id,
            "version": self.version,
            "name": self.name,
            "description": self.description,
            "system": self.system,
            "model": self.model,
            "tools": self.tools,
            "skills": self.skills,
            "mcp_servers": self.mcp_servers,
            "execution_identity": self.execution_identity,
            "multiagent": Value::Null,
            "metadata": self.metadata,
            "created_at": time::format(&self.agent_created_at),
            "updated_at": time::format(&updated_at),
            "archived_at": self.archived_at.as_ref().map(time::format),
        })
    }
}

const COLUMNS: &str = "a.id, a.workspace_id, a.version AS latest_version,
    a.created_at AS agent_created_at, a.updated_at AS agent_updated_at, a.archived_at,
    v.version, v.name, v.description, v.system, v.model, v.tools, v.skills, v.mcp_servers,
    v.execution_identity, v.metadata, v.created_at AS version_created_at";

async fn insert_version(
    db: impl PgExecutor<'_>,
    id: &str,
    version: i32,
    def: &Definition,
    at: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO agent_versions (agent_id, version, name, description, system, model, tools,
             skills, mcp_servers, execution_identity, metadata, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(id)
    .bind(version)
    .bind(&def.name)
    .bind(&def.description)
    .bind(&def.system)
    .bind(&def.model)
    .bind(&def.tools)
    .bind(&def.skills)
    .bind(&def.mcp_servers)
    .bind(&def.execution_identity)
    .bind(&def.metadata)
    .bind(at)
    .execute(db)
    .await?;
    Ok(())
}

/// Creates the head row and version 1 in one transaction.
pub async fn create(
    conn: &mut sqlx::PgConnection,
    workspace_id: &str,
    id: &str,
    def: &Definition,
    at: Timestamp,
) -> sqlx::Result<AgentRow> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query(
        "INSERT INTO agents (id, workspace_id, version, created_at, updated_at)
         VALUES ($1, $2, 1, $3, $3)",
    )
    .bind(id)
    .bind(workspace_id)
    .bind(at)
    .execute(&mut *tx)
    .await?;
    insert_version(&mut *tx, id, 1, def, at).await?;
    tx.commit().await?;
    Ok(find(&mut *conn, workspace_id, id, None)
        .await?
        .expect("the agent just created"))
}

/// The latest version, or `version` when given.
pub async fn find(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
    version: Option<i32>,
) -> sqlx::Result<Option<AgentRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM agents a
         JOIN agent_versions v ON v.agent_id = a.id AND v.version = COALESCE($3, a.version)
         WHERE a.id = $1 AND a.workspace_id = $2"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .bind(version)
        .fetch_optional(db)
        .await
}

/// Whether the Agent exists in the workspace (to tell a missing version from a missing Agent).
pub async fn exists(db: impl PgExecutor<'_>, workspace_id: &str, id: &str) -> sqlx::Result<bool> {
    let found: Option<(i32,)> =
        sqlx::query_as("SELECT version FROM agents WHERE id = $1 AND workspace_id = $2")
            .bind(id)
            .bind(workspace_id)
            .fetch_optional(db)
            .await?;
    Ok(found.is_some())
}

/// What an update found under the head row's lock.
pub enum Updated {
    NotFound,
    Archived,
    /// `expected` did not match the head: carries the current version.
    Conflict(i32),
    /// The new latest version (or the unchanged head when nothing changed).
    Saved(Box<AgentRow>),
}

/// Locks the head, checks `expected`, computes the new definition from the
/// current one with `apply`, and writes it as version + 1 unless it is unchanged.
pub async fn update<F, E>(
    conn: &mut sqlx::PgConnection,
    workspace_id: &str,
    id: &str,
    expected: Option<i32>,
    at: Timestamp,
    apply: F,
) -> sqlx::Result<Result<Updated, E>>
where
    F: FnOnce(&AgentRow) -> Result<Definition, E>,
{
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let locked: Option<(i32, Option<Timestamp>)> = sqlx::query_as(
        "SELECT version, archived_at FROM agents WHERE id = $1 AND workspace_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((current, archived_at)) = locked else {
        return Ok(Ok(Updated::NotFound));
    };
    if archived_at.is_some() {
        return Ok(Ok(Updated::Archived));
    }
    if expected.is_some_and(|e| e != current) {
        return Ok(Ok(Updated::Conflict(current)));
    }
    let row = find(&mut *tx, workspace_id, id, None)
        .await?
        .expect("the locked agent has its latest version");
    let def = match apply(&row) {
        Ok(def) => def,
        Err(e) => return Ok(Err(e)),
    };
    if def == row.definition() {
        return Ok(Ok(Updated::Saved(Box::new(row))));
    }
    let next = current + 1;
    insert_version(&mut *tx, id, next, &def, at).await?;
    sqlx::query("UPDATE agents SET version = $2, updated_at = $3 WHERE id = $1")
        .bind(id)
        .bind(next)
        .bind(at)
        .execute(&mut *tx)
        .await?;
    let saved = find(&mut *tx, workspace_id, id, None)
        .await?
        .expect("the agent just updated");
    tx.commit().await?;
    Ok(Ok(Updated::Saved(Box::new(saved))))
}

/// Idempotent: sets `archived_at` once. `None` when the Agent does not exist.
pub async fn archive(
    conn: &mut sqlx::PgConnection,
    workspace_id: &str,
    id: &str,
    at: Timestamp,
) -> sqlx::Result<Option<AgentRow>> {
    sqlx::query(
        "UPDATE agents SET archived_at = $3, updated_at = $3
         WHERE id = $1 AND workspace_id = $2 AND archived_at IS NULL",
    )
    .bind(id)
    .bind(workspace_id)
    .bind(at)
    .execute(&mut *conn)
    .await?;
    find(&mut *conn, workspace_id, id, None).await
}

/// Latest versions, newest Agent first.
pub async fn list(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    include_archived: bool,
    created_gte: Option<Timestamp>,
    created_lte: Option<Timestamp>,
    after: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<AgentRow>> {
    let (ts, id) = match after {
        Some((ts, id)) => (Some(ts), Some(id)),
        None => (None, None),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM agents a
         JOIN agent_versions v ON v.agent_id = a.id AND v.version = a.version
         WHERE a.workspace_id = $1 AND ($2 OR a.archived_at IS NULL)
           AND ($3::timestamptz IS NULL OR a.created_at >= $3)
           AND ($4::timestamptz IS NULL OR a.created_at <= $4)
           AND ($5::timestamptz IS NULL OR (a.created_at, a.id) < ($5, $6))
         ORDER BY a.created_at DESC, a.id DESC LIMIT $7"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(include_archived)
        .bind(created_gte)
        .bind(created_lte)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// An Agent's versions, newest first, below `before` when given.
pub async fn versions(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
    before: Option<i32>,
    limit: i64,
) -> sqlx::Result<Vec<AgentRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM agents a
         JOIN agent_versions v ON v.agent_id = a.id
         WHERE a.id = $1 AND a.workspace_id = $2 AND ($3::integer IS NULL OR v.version < $3)
         ORDER BY v.version DESC LIMIT $4"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .bind(before)
        .bind(limit)
        .fetch_all(db)
        .await
}
