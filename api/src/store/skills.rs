//! Skills, their immutable versions, and the versions each Session pins.
//! A version row records its archive's object key, length and SHA-256;
//! the bytes are in the object store (`skills::objects`).

use mango_protocol::agents::FrozenSkill;
use mango_protocol::skills::{Skill, SkillObject, SkillVersion, SkillVersionObject};
use mango_protocol::time::Timestamp;
use sqlx::{FromRow, PgConnection, PgExecutor};

#[derive(Debug, Clone, FromRow)]
pub struct SkillRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub display_name: String,
    pub latest_version_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl SkillRow {
    /// The SDK's `BetaSkill`.
    pub fn render(&self) -> Skill {
        Skill {
            id: self.id.clone(),
            kind: SkillObject::Skill,
            display_name: self.display_name.clone(),
            latest_version_id: self.latest_version_id.clone(),
            source: "custom".into(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

#[derive(Debug, Clone, FromRow)]
pub struct VersionRow {
    pub id: String,
    pub skill_id: String,
    pub name: String,
    pub description: String,
    pub archive_key: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub file_count: i32,
    pub expanded_bytes: i64,
    pub created_at: Timestamp,
}

impl VersionRow {
    /// The SDK's `BetaSkillVersion`, with the archive's length and digest.
    pub fn render(&self) -> SkillVersion {
        SkillVersion {
            id: self.id.clone(),
            kind: SkillVersionObject::SkillVersion,
            skill_id: self.skill_id.clone(),
            name: self.name.clone(),
            description: self.description.clone(),
            content_size_bytes: self.size_bytes,
            content_sha256: self.sha256.clone(),
            created_at: self.created_at,
        }
    }

    /// What a Session's snapshot records of this version.
    pub fn frozen(&self) -> FrozenSkill {
        FrozenSkill {
            name: self.name.clone(),
            description: self.description.clone(),
            content_size_bytes: self.size_bytes,
            content_sha256: self.sha256.clone(),
        }
    }
}

const SKILL_COLUMNS: &str =
    "s.id, s.workspace_id, s.name, s.display_name, s.latest_version_id, s.created_at, s.updated_at";
const VERSION_COLUMNS: &str = "v.id, v.skill_id, v.name, v.description, v.archive_key, \
    v.size_bytes, v.sha256, v.file_count, v.expanded_bytes, v.created_at";

pub async fn insert_skill(db: &mut PgConnection, row: &SkillRow) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO skills (id, workspace_id, name, display_name, latest_version_id, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&row.id)
    .bind(&row.workspace_id)
    .bind(&row.name)
    .bind(&row.display_name)
    .bind(&row.latest_version_id)
    .bind(row.created_at)
    .bind(row.updated_at)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn insert_version(db: &mut PgConnection, row: &VersionRow) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO skill_versions
            (id, skill_id, name, description, archive_key, size_bytes, sha256, file_count, expanded_bytes, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&row.id)
    .bind(&row.skill_id)
    .bind(&row.name)
    .bind(&row.description)
    .bind(&row.archive_key)
    .bind(row.size_bytes)
    .bind(&row.sha256)
    .bind(row.file_count)
    .bind(row.expanded_bytes)
    .bind(row.created_at)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn find_skill(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<Option<SkillRow>> {
    let sql =
        format!("SELECT {SKILL_COLUMNS} FROM skills s WHERE s.id = $1 AND s.workspace_id = $2");
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

/// The Skill, locked for the rest of the transaction: versions are added to
/// and deleted from it one writer at a time.
pub async fn lock_skill(
    db: &mut PgConnection,
    workspace_id: &str,
    id: &str,
) -> sqlx::Result<Option<SkillRow>> {
    let sql = format!(
        "SELECT {SKILL_COLUMNS} FROM skills s WHERE s.id = $1 AND s.workspace_id = $2 FOR UPDATE"
    );
    sqlx::query_as(&sql)
        .bind(id)
        .bind(workspace_id)
        .fetch_optional(db)
        .await
}

pub async fn set_latest(
    db: &mut PgConnection,
    skill_id: &str,
    version_id: &str,
    now: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE skills SET latest_version_id = $2, updated_at = $3 WHERE id = $1")
        .bind(skill_id)
        .bind(version_id)
        .bind(now)
        .execute(db)
        .await?;
    Ok(())
}

/// The workspace's Skills, newest first, after the cursor `after`.
pub async fn list_skills(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    after: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<SkillRow>> {
    let (ts, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "SELECT {SKILL_COLUMNS} FROM skills s
         WHERE s.workspace_id = $1 AND ($2::timestamptz IS NULL OR (s.created_at, s.id) < ($2, $3))
         ORDER BY s.created_at DESC, s.id DESC LIMIT $4"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// A version of a workspace's Skill: `version` is a version id or `latest`.
pub async fn find_version(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    skill_id: &str,
    version: &str,
) -> sqlx::Result<Option<VersionRow>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM skill_versions v JOIN skills s ON s.id = v.skill_id
         WHERE s.workspace_id = $1 AND s.id = $2
           AND v.id = CASE WHEN $3 = 'latest' THEN s.latest_version_id ELSE $3 END"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(skill_id)
        .bind(version)
        .fetch_optional(db)
        .await
}

/// [`find_version`] under a share lock, for a Session that pins it: the
/// version cannot be deleted until the pinning transaction ends.
pub async fn find_version_to_pin(
    db: &mut PgConnection,
    workspace_id: &str,
    skill_id: &str,
    version: &str,
) -> sqlx::Result<Option<VersionRow>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM skill_versions v JOIN skills s ON s.id = v.skill_id
         WHERE s.workspace_id = $1 AND s.id = $2
           AND v.id = CASE WHEN $3 = 'latest' THEN s.latest_version_id ELSE $3 END
         FOR SHARE OF v"
    );
    sqlx::query_as(&sql)
        .bind(workspace_id)
        .bind(skill_id)
        .bind(version)
        .fetch_optional(db)
        .await
}

/// Whether `version` is a version id of some other Skill of the workspace
/// (so a 404 can say so).
pub async fn version_skill(
    db: impl PgExecutor<'_>,
    workspace_id: &str,
    version: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT v.skill_id FROM skill_versions v JOIN skills s ON s.id = v.skill_id
         WHERE v.id = $1 AND s.workspace_id = $2",
    )
    .bind(version)
    .bind(workspace_id)
    .fetch_optional(db)
    .await
}

/// A Skill's versions, newest first, after the cursor `after`.
pub async fn list_versions(
    db: impl PgExecutor<'_>,
    skill_id: &str,
    after: Option<(Timestamp, String)>,
    limit: i64,
) -> sqlx::Result<Vec<VersionRow>> {
    let (ts, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM skill_versions v
         WHERE v.skill_id = $1 AND ($2::timestamptz IS NULL OR (v.created_at, v.id) < ($2, $3))
         ORDER BY v.created_at DESC, v.id DESC LIMIT $4"
    );
    sqlx::query_as(&sql)
        .bind(skill_id)
        .bind(ts)
        .bind(id)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// How many Sessions that can still run (not terminated) pin any of
/// `version_ids`. Run with the versions locked, so no Session can pin them
/// meanwhile.
pub async fn live_pins(db: &mut PgConnection, version_ids: &[String]) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT p.session_id) FROM session_skill_pins p
         JOIN sessions se ON se.id = p.session_id
         WHERE p.version_id = ANY($1) AND se.status <> 'terminated'",
    )
    .bind(version_ids)
    .fetch_one(db)
    .await
}

/// Every version of the Skill, locked (newest first).
pub async fn lock_versions(db: &mut PgConnection, skill_id: &str) -> sqlx::Result<Vec<VersionRow>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM skill_versions v WHERE v.skill_id = $1
         ORDER BY v.created_at DESC, v.id DESC FOR UPDATE"
    );
    sqlx::query_as(&sql).bind(skill_id).fetch_all(db).await
}

pub async fn delete_version(db: &mut PgConnection, version_id: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM skill_versions WHERE id = $1")
        .bind(version_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Deletes the Skill and (by cascade) its versions and their pins.
pub async fn delete_skill(db: &mut PgConnection, skill_id: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM skills WHERE id = $1")
        .bind(skill_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Records the versions a new Session pins: `(version id, skill id)` pairs.
pub async fn insert_pins(
    db: &mut PgConnection,
    session_id: &str,
    pins: &[(String, String)],
) -> sqlx::Result<()> {
    if pins.is_empty() {
        return Ok(());
    }
    let (versions, skills): (Vec<String>, Vec<String>) = pins.iter().cloned().unzip();
    sqlx::query(
        "INSERT INTO session_skill_pins (session_id, version_id, skill_id)
         SELECT $1, v, s FROM UNNEST($2::text[], $3::text[]) AS p(v, s)
         ON CONFLICT DO NOTHING",
    )
    .bind(session_id)
    .bind(&versions)
    .bind(&skills)
    .execute(db)
    .await?;
    Ok(())
}

/// The version of `skill_id` Session `session_id` pins, if `version` names
/// it (`latest` names the pinned one: for a Session, latest was frozen).
pub async fn pinned_version(
    db: impl PgExecutor<'_>,
    session_id: &str,
    skill_id: &str,
    version: &str,
) -> sqlx::Result<Option<VersionRow>> {
    let sql = format!(
        "SELECT {VERSION_COLUMNS} FROM session_skill_pins p
         JOIN skill_versions v ON v.id = p.version_id
         WHERE p.session_id = $1 AND p.skill_id = $2 AND ($3 = 'latest' OR p.version_id = $3)"
    );
    sqlx::query_as(&sql)
        .bind(session_id)
        .bind(skill_id)
        .bind(version)
        .fetch_optional(db)
        .await
}
