//! Agents: a head row (`agents`) and immutable numbered versions
//! (`agent_versions`), whose definition columns hold the protocol's types as
//! JSON.

use crate::metadata;
use mango_protocol::agents::{
    Agent, AgentDefinition, AgentObject, AgentTool, ExecutionIdentity, McpServer, ModelConfig,
    SkillPin,
};
use mango_protocol::time::Timestamp;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, PgExecutor};

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
    pub model: Json<ModelConfig>,
    pub tools: Json<Vec<AgentTool>>,
    pub skills: Json<Vec<SkillPin>>,
    pub mcp_servers: Json<Vec<McpServer>>,
    pub execution_identity: Json<ExecutionIdentity>,
    pub metadata: Value,
    pub version_created_at: Timestamp,
}

/// The immutable content of one version: its definition and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub definition: AgentDefinition,
    pub metadata: Value,
}

impl AgentRow {
    pub fn version(&self) -> Version {
        Version {
            definition: AgentDefinition {
                name: self.name.clone(),
                description: self.description.clone(),
                system: self.system.clone(),
                model: self.model.0.clone(),
                tools: self.tools.0.clone(),
                skills: self.skills.0.clone(),
                mcp_servers: self.mcp_servers.0.clone(),
                execution_identity: self.execution_identity.0.clone(),
            },
            metadata: self.metadata.clone(),
        }
    }

    /// The SDK's `BetaManagedAgentsAgent`. An older version reports the time it
    /// was written as `updated_at`; the archive state is the Agent's.
    pub fn render(&self) -> Agent {
        let updated_at = if self.version == self.latest_version {
            self.agent_updated_at
        } else {
            self.version_created_at
        };
        Agent {
            kind: AgentObject::Agent,
            id: self.id.clone(),
            version: self.version,
            definition: self.version().definition,
            multiagent: None,
            metadata: metadata::from_json(&self.metadata),
            created_at: self.agent_created_at,
            updated_at,
            archived_at: self.archived_at,
        }
    }
}

const COLUMNS: &str = "a.id, a.workspace_id, a.version AS latest_version,
    a.created_at AS agent_created_at, a.updated_at AS agent_updated_at, a.archived_at,
    v.version, v.name, v.description, v.system, v.model, v.tools, v.skills, v.mcp_servers,
    v.execution_identity, v.metadata, v.created_at AS version_created_at";

pub async fn insert_version(
    db: impl PgExecutor<'_>,
    id: &str,
    version: i32,
    content: &Version,
    at: Timestamp,
) -> sqlx::Result<()> {
    let def = &content.definition;
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
    .bind(Json(&def.model))
    .bind(Json(&def.tools))
    .bind(Json(&def.skills))
    .bind(Json(&def.mcp_servers))
    .bind(Json(&def.execution_identity))
    .bind(&content.metadata)
    .bind(at)
    .execute(db)
    .await?;
    Ok(())
}

/// Inserts the head row of a new Agent at version 1 (its version row follows
/// in the same transaction).
pub async fn insert_head(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
    at: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO agents (id, workspace_id, version, created_at, updated_at)
         VALUES ($1, $2, 1, $3, $3)",
    )
    .bind(id)
    .bind(workspace_id)
    .bind(at)
    .execute(db)
    .await?;
    Ok(())
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
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM agents WHERE id = $1 AND workspace_id = $2)")
        .bind(id)
        .bind(workspace_id)
        .fetch_one(db)
        .await
}

/// The head of an Agent, locked for the rest of the transaction: its
/// current version and archival.
pub async fn lock_head(
    db: &mut PgConnection,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<Option<(i32, Option<Timestamp>)>> {
    sqlx::query_as(
        "SELECT version, archived_at FROM agents WHERE id = $1 AND workspace_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await
}

/// Moves the head to `version`.
pub async fn set_head_version(
    db: impl PgExecutor<'_>,
    id: &str,
    version: i32,
    at: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE agents SET version = $2, updated_at = $3 WHERE id = $1")
        .bind(id)
        .bind(version)
        .bind(at)
        .execute(db)
        .await?;
    Ok(())
}

/// Idempotent: sets `archived_at` once. `None` when the Agent does not exist.
pub async fn archive(
    conn: &mut PgConnection,
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
