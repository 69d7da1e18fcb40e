//! Skills' transactions. An upload is checked and its archive built off the
//! async threads, the archive is written to the object store, and only then
//! do its rows commit; if they cannot, the archive is removed again, so a
//! refused or failed request leaves nothing behind. Deletions remove rows
//! first and archives after. A Session's pins are frozen in the
//! transaction that creates it ([`freeze_pins`], [`record_pins`]).

use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::ids;
use crate::skills::archive::{self, BuiltVersion, UploadError, UploadedFile};
use crate::skills::objects::Archives;
use crate::store::skills::{self, SkillRow, VersionRow};
use mango_protocol::agents::{AgentSnapshot, SkillKind};
use mango_protocol::skills::upload_limits;
use mango_protocol::{time, ErrorCode, ErrorType};
use sqlx::PgConnection;

pub fn skill_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("skill {id} not found")).code(ErrorCode::SkillNotFound)
}

/// A version that is not one of `skill_id`'s; says so when it is another
/// Skill's (a version id names one version of one Skill).
pub async fn version_not_found(
    conn: &mut PgConnection,
    workspace_id: &str,
    skill_id: &str,
    version: &str,
) -> ApiError {
    let other = match skills::version_skill(&mut *conn, workspace_id, version).await {
        Ok(other) => other.filter(|s| s != skill_id),
        Err(err) => return err.into(),
    };
    let message = match other {
        Some(other) => {
            format!("skill version {version} belongs to skill {other}, not to skill {skill_id}")
        }
        None => format!("skill {skill_id} has no version {version}"),
    };
    ApiError::not_found(message).code(ErrorCode::SkillVersionNotFound)
}

fn upload_error(err: UploadError) -> ApiError {
    match err {
        UploadError::Invalid(m) => ApiError::bad_request(m).code(ErrorCode::InvalidSkill),
        UploadError::TooLarge(m) => ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::RequestTooLarge,
            m,
        ),
    }
}

fn store_unavailable(archives: &Archives, err: object_store::Error) -> ApiError {
    tracing::error!(store = %archives.location(), error = %err, "the Skill archive store failed");
    ApiError::unavailable(
        "the Skill archive store is unavailable; nothing was changed, retry shortly",
    )
}

/// Checks an upload and builds its archive (CPU work, off the async threads).
async fn built(files: Vec<UploadedFile>) -> ApiResult<BuiltVersion> {
    tokio::task::spawn_blocking(move || archive::build(files))
        .await
        .map_err(|_| ApiError::internal("internal error; nothing was created"))?
        .map_err(upload_error)
}

/// `display_name`: one line of at most 255 characters.
pub fn check_display_name(name: &str) -> ApiResult<()> {
    if name.trim().is_empty() {
        return Err(ApiError::invalid_parameter(
            "display_name must not be empty",
        ));
    }
    if name.contains(['\n', '\r']) {
        return Err(ApiError::invalid_parameter(
            "display_name must be a single line",
        ));
    }
    crate::extract::check_len("display_name", name, upload_limits::MAX_DISPLAY_NAME_CHARS)
}

/// Writes the archive before its rows commit, and removes it again if they
/// cannot: a refused or failed request leaves nothing behind.
async fn put_archive(ctx: &ApiContext, key: &str, bytes: Vec<u8>) -> ApiResult<()> {
    let archives = &ctx.settings.skill_archives;
    archives
        .put(key, bytes)
        .await
        .map_err(|e| store_unavailable(archives, e))
}

async fn unless_committed<T>(ctx: &ApiContext, key: &str, committed: ApiResult<T>) -> ApiResult<T> {
    if committed.is_err() {
        ctx.settings
            .skill_archives
            .delete_all(&[key.to_string()])
            .await;
    }
    committed
}

fn version_row(skill_id: &str, key: String, built: &BuiltVersion, id: String) -> VersionRow {
    VersionRow {
        id,
        skill_id: skill_id.to_string(),
        name: built.name.clone(),
        description: built.description.clone(),
        archive_key: key,
        size_bytes: built.archive.len() as i64,
        sha256: built.sha256.clone(),
        file_count: built.file_count as i32,
        expanded_bytes: built.expanded_bytes as i64,
        created_at: time::now(),
    }
}

/// `POST /v1/skills`: a Skill and its first version.
pub async fn create_skill(
    ctx: &ApiContext,
    workspace_id: &str,
    display_name: Option<String>,
    files: Vec<UploadedFile>,
) -> ApiResult<SkillRow> {
    if let Some(name) = &display_name {
        check_display_name(name)?;
    }
    let mut built = built(files).await?;
    let skill_id = ids::new_id("skill");
    let version_id = ids::new_id("skillver");
    let key = Archives::key(workspace_id, &skill_id, &version_id);
    let version = version_row(&skill_id, key.clone(), &built, version_id.clone());
    let display_name = display_name.unwrap_or_else(|| built.title.clone());
    let skill = SkillRow {
        id: skill_id,
        workspace_id: workspace_id.to_string(),
        name: built.name.clone(),
        display_name,
        latest_version_id: version_id,
        created_at: version.created_at,
        updated_at: version.created_at,
    };
    put_archive(ctx, &key, std::mem::take(&mut built.archive)).await?;
    let committed = async {
        let mut tx = ctx.db.begin().await?;
        skills::insert_skill(&mut tx, &skill).await?;
        skills::insert_version(&mut tx, &version).await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    unless_committed(ctx, &key, committed).await?;
    Ok(skill)
}

/// `POST /v1/skills/{id}/versions`: a new version, which becomes `latest`.
pub async fn create_version(
    ctx: &ApiContext,
    workspace_id: &str,
    skill_id: &str,
    files: Vec<UploadedFile>,
) -> ApiResult<VersionRow> {
    let skill = skills::find_skill(&ctx.db, workspace_id, skill_id)
        .await?
        .ok_or_else(|| skill_not_found(skill_id))?;
    let mut built = built(files).await?;
    if built.name != skill.name {
        return Err(ApiError::bad_request(format!(
            "SKILL.md names the Skill {:?}, but skill {skill_id} is {:?}: every version keeps the Skill's name",
            built.name, skill.name
        ))
        .code(ErrorCode::SkillNameMismatch));
    }
    let version_id = ids::new_id("skillver");
    let key = Archives::key(workspace_id, skill_id, &version_id);
    let version = version_row(skill_id, key.clone(), &built, version_id);
    put_archive(ctx, &key, std::mem::take(&mut built.archive)).await?;
    let committed = async {
        let mut tx = ctx.db.begin().await?;
        // Deleted meanwhile: nothing to add a version to.
        skills::lock_skill(&mut tx, workspace_id, skill_id)
            .await?
            .ok_or_else(|| skill_not_found(skill_id))?;
        skills::insert_version(&mut tx, &version).await?;
        skills::set_latest(&mut tx, skill_id, &version.id, version.created_at).await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    unless_committed(ctx, &key, committed).await?;
    Ok(version)
}

fn in_use(what: &str, sessions: i64) -> ApiError {
    ApiError::conflict(format!(
        "{what} is pinned by {sessions} Session(s) that can still run; delete or wait for them to terminate first"
    ))
    .code(ErrorCode::SkillInUse)
    .final_answer()
}

/// `DELETE /v1/skills/{id}/versions/{version}`.
pub async fn delete_version(
    ctx: &ApiContext,
    workspace_id: &str,
    skill_id: &str,
    version: &str,
) -> ApiResult<String> {
    let mut tx = ctx.db.begin().await?;
    skills::lock_skill(&mut tx, workspace_id, skill_id)
        .await?
        .ok_or_else(|| skill_not_found(skill_id))?;
    let versions = skills::lock_versions(&mut tx, skill_id).await?;
    let target = match version {
        "latest" => versions.first(),
        id => versions.iter().find(|v| v.id == id),
    };
    let Some(target) = target.cloned() else {
        return Err(version_not_found(&mut tx, workspace_id, skill_id, version).await);
    };
    if versions.len() == 1 {
        return Err(ApiError::conflict(format!(
            "version {} is the only version of skill {skill_id}; delete the Skill itself instead",
            target.id
        ))
        .code(ErrorCode::LastSkillVersion)
        .final_answer());
    }
    let pinned = skills::live_pins(&mut tx, std::slice::from_ref(&target.id)).await?;
    if pinned > 0 {
        return Err(in_use(&format!("skill version {}", target.id), pinned));
    }
    skills::delete_version(&mut tx, &target.id).await?;
    if let Some(newest) = versions.iter().find(|v| v.id != target.id) {
        skills::set_latest(&mut tx, skill_id, &newest.id, time::now()).await?;
    }
    tx.commit().await?;
    ctx.settings
        .skill_archives
        .delete_all(std::slice::from_ref(&target.archive_key))
        .await;
    Ok(target.id)
}

/// `DELETE /v1/skills/{id}`: the Skill and every version.
pub async fn delete_skill(ctx: &ApiContext, workspace_id: &str, skill_id: &str) -> ApiResult<()> {
    let mut tx = ctx.db.begin().await?;
    skills::lock_skill(&mut tx, workspace_id, skill_id)
        .await?
        .ok_or_else(|| skill_not_found(skill_id))?;
    let versions = skills::lock_versions(&mut tx, skill_id).await?;
    let ids: Vec<String> = versions.iter().map(|v| v.id.clone()).collect();
    let pinned = skills::live_pins(&mut tx, &ids).await?;
    if pinned > 0 {
        return Err(in_use(&format!("skill {skill_id}"), pinned));
    }
    skills::delete_skill(&mut tx, skill_id).await?;
    tx.commit().await?;
    let keys: Vec<String> = versions.into_iter().map(|v| v.archive_key).collect();
    ctx.settings.skill_archives.delete_all(&keys).await;
    Ok(())
}

/// Resolves every custom Skill the snapshot pins to an exact version of the
/// workspace (`latest` to the current latest) and records in the snapshot
/// what it froze, under a share lock until the caller's transaction ends.
/// Returns the `(version id, skill id)` pins for [`record_pins`].
pub async fn freeze_pins(
    tx: &mut PgConnection,
    workspace_id: &str,
    snapshot: &mut AgentSnapshot,
) -> ApiResult<Vec<(String, String)>> {
    let mut pins = Vec::new();
    for pin in snapshot
        .definition
        .skills
        .iter_mut()
        .filter(|p| p.kind == SkillKind::Custom)
    {
        let Some(row) =
            skills::find_version_to_pin(&mut *tx, workspace_id, &pin.skill_id, &pin.version)
                .await?
        else {
            if skills::find_skill(&mut *tx, workspace_id, &pin.skill_id)
                .await?
                .is_none()
            {
                return Err(ApiError::not_found(format!(
                    "the Agent pins custom skill {}, which does not exist in this workspace",
                    pin.skill_id
                ))
                .code(ErrorCode::SkillNotFound));
            }
            let err = version_not_found(&mut *tx, workspace_id, &pin.skill_id, &pin.version).await;
            return Err(ApiError {
                message: format!(
                    "the Agent pins a version that does not exist: {}",
                    err.message
                ),
                ..err
            });
        };
        pin.version = row.id.clone();
        pin.freeze(row.frozen());
        pins.push((row.id, row.skill_id));
    }
    Ok(pins)
}

/// Records the pins [`freeze_pins`] resolved, once the Session row exists.
pub async fn record_pins(
    tx: &mut PgConnection,
    session_id: &str,
    pins: &[(String, String)],
) -> ApiResult<()> {
    Ok(skills::insert_pins(tx, session_id, pins).await?)
}
