//! `/v1/skills`: custom Skills and their immutable versions, in the SDK's
//! shapes (`beta.skills.*`, `beta.skills.versions.*`). A Workspace key has
//! full access to its workspace's Skills. A sessions token may read and
//! download exactly the versions its Session pins, while its Work's lease
//! lives (any other version is 404 to it). Environment keys get 403.

use crate::auth::{authenticate, operator, worker_may_use, Principal};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::Params;
use crate::openapi::{Conflicts, Missing, Refusals, SkillArchive, UploadTooLarge};
use crate::service::skills::{self as skill_service, skill_not_found, version_not_found};
use crate::skills::archive::UploadedFile;
use crate::store::cursor;
use crate::store::skills::{self, SkillRow, VersionRow};
use axum::extract::multipart::{Multipart, MultipartError, MultipartRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use mango_protocol::skills::{
    upload_limits, Skill, SkillDeleted, SkillUpload, SkillVersion, SkillVersionDeleted,
};
use mango_protocol::{ErrorCode, ErrorType, Page};
use sqlx::PgConnection;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Multipart framing and `display_name` around the files themselves.
const UPLOAD_OVERHEAD_BYTES: usize = 256 * 1024;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, delete))
        .routes(routes!(create_version, list_versions))
        .routes(routes!(retrieve_version, delete_version))
        .routes(routes!(download))
        .layer(DefaultBodyLimit::max(
            upload_limits::MAX_ARCHIVE_BYTES as usize + UPLOAD_OVERHEAD_BYTES,
        ))
}

// ---- reading the upload -------------------------------------------------------

fn multipart_error(err: MultipartError) -> ApiError {
    if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::RequestTooLarge,
            format!(
                "the upload is larger than {} bytes",
                upload_limits::MAX_ARCHIVE_BYTES
            ),
        );
    }
    ApiError::bad_request(format!(
        "the multipart/form-data body cannot be read: {}",
        err.body_text()
    ))
}

/// The parts of a Skill upload: the files and, when `display_name_allowed`,
/// the label. Read after the caller is authenticated.
async fn upload_parts(
    multipart: Result<Multipart, MultipartRejection>,
    display_name_allowed: bool,
) -> ApiResult<(Vec<UploadedFile>, Option<String>)> {
    let mut multipart = multipart.map_err(|rejection| {
        ApiError::bad_request(format!(
            "send the Skill as multipart/form-data with its files in parts named files[]: {}",
            rejection.body_text()
        ))
    })?;
    let mut files = Vec::new();
    let mut display_name = None;
    while let Some(field) = multipart.next_field().await.map_err(multipart_error)? {
        let name = field.name().unwrap_or_default().to_string();
        if name == "files" || name.starts_with("files[") {
            if files.len() >= upload_limits::MAX_FILES {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorType::RequestTooLarge,
                    format!(
                        "the upload has more than {} files",
                        upload_limits::MAX_FILES
                    ),
                ));
            }
            let filename = field.file_name().unwrap_or_default().to_string();
            let bytes = field.bytes().await.map_err(multipart_error)?;
            files.push(UploadedFile { filename, bytes });
        } else if name == "display_name" && display_name_allowed {
            let text = field.text().await.map_err(multipart_error)?;
            display_name = Some(text);
        } else {
            let allowed = if display_name_allowed {
                "files[] and display_name"
            } else {
                "files[]"
            };
            return Err(ApiError::invalid_parameter(format!(
                "unknown form field {:?}; this upload takes {allowed}",
                name.chars().take(64).collect::<String>()
            )));
        }
    }
    if display_name.as_deref().is_some_and(|n| n.contains('\0')) {
        return Err(ApiError::invalid_parameter(
            "display_name must not contain the NUL character (U+0000)",
        ));
    }
    Ok((files, display_name))
}

// ---- who reads a version --------------------------------------------------------

/// A version as its reader may see it: an operator any of the workspace's,
/// a sessions token only its Session's pins.
async fn readable_version(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
    skill_id: &str,
    version: &str,
    what: &str,
) -> ApiResult<VersionRow> {
    match authenticate(ctx, conn, headers).await? {
        Principal::Workspace(key) => {
            match skills::find_version(&mut *conn, &key.workspace_id, skill_id, version).await? {
                Some(row) => Ok(row),
                None if skills::find_skill(&mut *conn, &key.workspace_id, skill_id)
                    .await?
                    .is_none() =>
                {
                    Err(skill_not_found(skill_id))
                }
                None => {
                    Err(version_not_found(&mut *conn, &key.workspace_id, skill_id, version).await)
                }
            }
        }
        Principal::Token(work) => {
            let Some(session_id) = work.session_id.clone() else {
                return Err(ApiError::forbidden(format!(
                    "{what} is not permitted with a healthcheck's sessions token"
                )));
            };
            worker_may_use(&work, &session_id, what)?;
            skills::pinned_version(&mut *conn, &session_id, skill_id, version)
                .await?
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "skill {skill_id} version {version} is not among the Skills this Session pins"
                    ))
                    .code(ErrorCode::SkillVersionNotFound)
                })
        }
        Principal::Environment(_) => Err(ApiError::forbidden(format!(
            "{what} is not permitted with an Environment key"
        ))),
    }
}

// ---- handlers -------------------------------------------------------------------

#[utoipa::path(
    post,
    path = "/v1/skills",
    tag = "Skills",
    operation_id = "createSkill",
    request_body(content = SkillUpload, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The new Skill, with its first version as `latest_version_id`", body = Skill),
        Refusals, UploadTooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> ApiResult<Json<Skill>> {
    let (conn, key) = operator(&ctx, &headers, "Creating a Skill").await?;
    drop(conn);
    let (files, display_name) = upload_parts(multipart, true).await?;
    let row = skill_service::create_skill(&ctx, &key.workspace_id, display_name, files).await?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    get,
    path = "/v1/skills",
    tag = "Skills",
    operation_id = "listSkills",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
        ("source" = Option<String>, Query, description = "`custom` (every Skill Mango stores) or `anthropic` (none)"),
    ),
    responses((status = 200, description = "A page of Skills, newest first", body = Page<Skill>), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<Skill>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Skills").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 1000)?.unwrap_or(20);
    let after = params.cursor("page")?;
    let rows = match params.str("source").filter(|s| !s.is_empty()) {
        None | Some("custom") => {
            skills::list_skills(&mut *conn, &key.workspace_id, after, limit + 1).await?
        }
        Some("anthropic") => Vec::new(),
        Some(other) => {
            return Err(ApiError::invalid_parameter(format!(
                "source must be custom or anthropic, got {:?}",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    let mut rows = rows;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    Ok(Json(Page {
        data: rows.iter().map(SkillRow::render).collect(),
        next_page,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/skills/{skill_id}",
    tag = "Skills",
    operation_id = "retrieveSkill",
    params(("skill_id" = String, Path, description = "The Skill")),
    responses((status = 200, description = "The Skill", body = Skill), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(skill_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Skill>> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading a Skill").await?;
    let row = skills::find_skill(&mut *conn, &key.workspace_id, &skill_id)
        .await?
        .ok_or_else(|| skill_not_found(&skill_id))?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    delete,
    path = "/v1/skills/{skill_id}",
    tag = "Skills",
    operation_id = "deleteSkill",
    params(("skill_id" = String, Path, description = "The Skill")),
    responses(
        (status = 200, description = "Deleted, with every version and archive", body = SkillDeleted),
        Refusals, Missing, Conflicts,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete(
    State(ctx): State<ApiContext>,
    Path(skill_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<SkillDeleted>> {
    let (conn, key) = operator(&ctx, &headers, "Deleting a Skill").await?;
    drop(conn);
    skill_service::delete_skill(&ctx, &key.workspace_id, &skill_id).await?;
    Ok(Json(SkillDeleted {
        id: skill_id,
        kind: "skill_deleted".into(),
    }))
}

#[utoipa::path(
    post,
    path = "/v1/skills/{skill_id}/versions",
    tag = "Skills",
    operation_id = "createSkillVersion",
    params(("skill_id" = String, Path, description = "The Skill")),
    request_body(content = SkillUpload, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The new version, now the Skill's `latest`", body = SkillVersion),
        Refusals, Missing, UploadTooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create_version(
    State(ctx): State<ApiContext>,
    Path(skill_id): Path<String>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> ApiResult<Json<SkillVersion>> {
    let (conn, key) = operator(&ctx, &headers, "Creating a Skill version").await?;
    drop(conn);
    let (files, _) = upload_parts(multipart, false).await?;
    let row = skill_service::create_version(&ctx, &key.workspace_id, &skill_id, files).await?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    get,
    path = "/v1/skills/{skill_id}/versions",
    tag = "Skills",
    operation_id = "listSkillVersions",
    params(
        ("skill_id" = String, Path, description = "The Skill"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
    ),
    responses((status = 200, description = "A page of the Skill's versions, newest first", body = Page<SkillVersion>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list_versions(
    State(ctx): State<ApiContext>,
    Path(skill_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<SkillVersion>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing a Skill's versions").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 1000)?.unwrap_or(20);
    let after = params.cursor("page")?;
    skills::find_skill(&mut *conn, &key.workspace_id, &skill_id)
        .await?
        .ok_or_else(|| skill_not_found(&skill_id))?;
    let mut rows = skills::list_versions(&mut *conn, &skill_id, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    Ok(Json(Page {
        data: rows.iter().map(VersionRow::render).collect(),
        next_page,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/skills/{skill_id}/versions/{version}",
    tag = "Skills",
    operation_id = "retrieveSkillVersion",
    params(
        ("skill_id" = String, Path, description = "The Skill"),
        ("version" = String, Path, description = "A version id, or `latest` (for a sessions token: the version its Session pins)"),
    ),
    responses((status = 200, description = "The version", body = SkillVersion), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve_version(
    State(ctx): State<ApiContext>,
    Path((skill_id, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<SkillVersion>> {
    let mut conn = ctx.db.acquire().await?;
    let row = readable_version(
        &ctx,
        &mut conn,
        &headers,
        &skill_id,
        &version,
        "Reading a Skill version",
    )
    .await?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    delete,
    path = "/v1/skills/{skill_id}/versions/{version}",
    tag = "Skills",
    operation_id = "deleteSkillVersion",
    params(
        ("skill_id" = String, Path, description = "The Skill"),
        ("version" = String, Path, description = "A version id"),
    ),
    responses(
        (status = 200, description = "Deleted, with its archive", body = SkillVersionDeleted),
        Refusals, Missing, Conflicts,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete_version(
    State(ctx): State<ApiContext>,
    Path((skill_id, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<SkillVersionDeleted>> {
    let (conn, key) = operator(&ctx, &headers, "Deleting a Skill version").await?;
    drop(conn);
    let id = skill_service::delete_version(&ctx, &key.workspace_id, &skill_id, &version).await?;
    Ok(Json(SkillVersionDeleted {
        id,
        kind: "skill_version_deleted".into(),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/skills/{skill_id}/versions/{version}/content",
    tag = "Skills",
    operation_id = "downloadSkillVersion",
    params(
        ("skill_id" = String, Path, description = "The Skill"),
        ("version" = String, Path, description = "A version id, or `latest` (for a sessions token: the version its Session pins)"),
    ),
    responses(
        (status = 200, description = "The version's zip archive, exactly the `content_size_bytes` bytes whose SHA-256 is `content_sha256`", content_type = "application/zip", body = SkillArchive),
        Refusals, Missing,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn download(
    State(ctx): State<ApiContext>,
    Path((skill_id, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut conn = ctx.db.acquire().await?;
    let row = readable_version(
        &ctx,
        &mut conn,
        &headers,
        &skill_id,
        &version,
        "Downloading a Skill version",
    )
    .await?;
    drop(conn);
    let archives = &ctx.settings.skill_archives;
    // Served as stored: the reader checks the length and digest it was
    // given, so a damaged archive is its to refuse.
    let bytes = archives.get(&row.archive_key).await.map_err(|err| {
        tracing::error!(store = %archives.location(), key = %row.archive_key, error = %err, "cannot read a Skill archive");
        match err {
            object_store::Error::NotFound { .. } => ApiError::internal(format!(
                "the archive of skill version {} is missing from the object store",
                row.id
            )),
            _ => ApiError::unavailable("the Skill archive store is unavailable; retry shortly"),
        }
    })?;
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{}.zip\"", row.name))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/zip"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        bytes,
    )
        .into_response())
}
