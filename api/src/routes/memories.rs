//! `/v1/memory_stores/{id}/memories` and `…/memory_versions`: the SDK's
//! `beta.memory_stores.memories` and `.memory_versions`. Who may call is
//! [`super::memory_stores::store_access`]: a Workspace key, or the sessions
//! token of a Session attaching the store (writing only through a
//! `read_write` attachment, fenced on its live claim).

use super::memory_stores::store_access;
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, optional_body, Params, RawBody};
use crate::memory_rules;
use crate::openapi::{MemoryConflicts, MemoryWriteLimits, Missing, RateLimited, Refusals};
use crate::service::memory::{self as service, memory_not_found, Change};
use crate::store::cursor;
use crate::store::memory::{self as store, MemoryFilter, VersionFilter, VersionRow};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use mango_protocol::memory::{
    CreateMemory, Memory, MemoryDeleted, MemoryListItem, MemoryOperation, MemoryVersion,
    MemoryView, UpdateMemory,
};
use mango_protocol::patch::Patch;
use mango_protocol::{ErrorCode, Page};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, update, delete))
        .routes(routes!(list_versions))
        .routes(routes!(retrieve_version))
        .routes(routes!(redact_version))
}

/// Most items on a page with `view=full`.
const FULL_PAGE_LIMIT: i64 = 20;

/// `view`: whether content comes back; absent means `default`.
fn full_view(params: &Params, default: MemoryView) -> ApiResult<bool> {
    let view = match params.str("view") {
        None | Some("") => default,
        Some(v) => MemoryView::parse(v).ok_or_else(|| {
            ApiError::invalid_parameter(format!("view must be basic or full, got {v:?}"))
        })?,
    };
    Ok(view == MemoryView::Full)
}

/// `limit` (1..100, default 20), at most 20 with `view=full`.
fn page_limit(params: &Params, full: bool) -> ApiResult<i64> {
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    Ok(if full {
        limit.min(FULL_PAGE_LIMIT)
    } else {
        limit
    })
}

fn version_not_found(store: &str, id: &str) -> ApiError {
    ApiError::not_found(format!(
        "memory version {id} not found in memory store {store}"
    ))
    .code(ErrorCode::MemoryVersionNotFound)
}

#[utoipa::path(
    post,
    path = "/v1/memory_stores/{memory_store_id}/memories",
    tag = "Memory Stores",
    operation_id = "createMemory",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("view" = Option<MemoryView>, Query, description = "`basic` (default: no content) or `full`"),
    ),
    request_body = CreateMemory,
    responses(
        (status = 200, description = "The new memory", body = Memory),
        Refusals, Missing, MemoryConflicts, MemoryWriteLimits,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    Path(store_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Memory>> {
    let mut conn = ctx.db.acquire().await?;
    let (_, caller) =
        store_access(&ctx, &mut conn, &headers, &store_id, "Creating a memory").await?;
    drop(conn);
    let writer = caller.writer(&store_id)?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Basic)?;
    let body: CreateMemory = body(&bytes)?;
    let content = match body.content {
        Patch::Absent => {
            return Err(ApiError::invalid_parameter(
                "content is required: the memory's text (\"\" for an empty memory)",
            ))
        }
        Patch::Null => String::new(),
        Patch::Set(c) => c,
    };
    memory_rules::check_path("path", &body.path)?;
    memory_rules::check_content(&content)?;
    let row = service::create(
        &ctx.db,
        &ctx.settings.memory_limits,
        &store_id,
        &writer,
        &body.path,
        content,
    )
    .await?;
    Ok(Json(row.render(full)))
}

/// Memories (and, with `depth`, prefixes rolling up deeper ones) in path order.
#[utoipa::path(
    get,
    path = "/v1/memory_stores/{memory_store_id}/memories",
    tag = "Memory Stores",
    operation_id = "listMemories",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("path_prefix" = Option<String>, Query, description = "Only memories below this prefix of whole segments, ending in `/` (default `/`)"),
        ("depth" = Option<i32>, Query, minimum = 0, maximum = 20, description = "0 (default): every memory below the prefix; N: memories at most N segments below it, deeper ones as `memory_prefix` items"),
        ("view" = Option<MemoryView>, Query, description = "`basic` (default: no content) or `full` (at most 20 items a page)"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20; at most 20 with `view=full`)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
    ),
    responses((status = 200, description = "A page of memories and prefixes, by path", body = Page<MemoryListItem>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    Path(store_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<MemoryListItem>>> {
    let mut conn = ctx.db.acquire().await?;
    store_access(&ctx, &mut conn, &headers, &store_id, "Listing memories").await?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Basic)?;
    let limit = page_limit(&params, full)?;
    let prefix = params
        .str("path_prefix")
        .filter(|p| !p.is_empty())
        .unwrap_or("/");
    memory_rules::check_prefix(prefix)?;
    let depth = params
        .int("depth", 0, memory_rules::MAX_SEGMENTS as i64)?
        .unwrap_or(0) as i32;
    let after = params
        .str("page")
        .filter(|p| !p.is_empty())
        .map(memory_rules::decode_cursor)
        .transpose()?;
    let filter = MemoryFilter {
        store_id: &store_id,
        prefix,
        depth,
        full,
    };
    let mut rows = store::list_memories(&mut *conn, &filter, after.as_deref(), limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |(key, _)| {
        memory_rules::encode_cursor(key)
    });
    Ok(Json(Page {
        data: rows.into_iter().map(|(_, item)| item).collect(),
        next_page,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/memory_stores/{memory_store_id}/memories/{memory_id}",
    tag = "Memory Stores",
    operation_id = "retrieveMemory",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_id" = String, Path, description = "The memory"),
        ("view" = Option<MemoryView>, Query, description = "`full` (default) or `basic`"),
    ),
    responses((status = 200, description = "The memory", body = Memory), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Memory>> {
    let mut conn = ctx.db.acquire().await?;
    store_access(&ctx, &mut conn, &headers, &store_id, "Reading a memory").await?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Full)?;
    let row = store::find_memory(&mut *conn, &store_id, &memory_id)
        .await?
        .ok_or_else(|| memory_not_found(&store_id, &memory_id))?;
    Ok(Json(row.render(full)))
}

/// New content, a new path (a rename: the id stays), or both; with a
/// `content_sha256` precondition, only if the stored content still has it.
#[utoipa::path(
    post,
    path = "/v1/memory_stores/{memory_store_id}/memories/{memory_id}",
    tag = "Memory Stores",
    operation_id = "updateMemory",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_id" = String, Path, description = "The memory"),
        ("view" = Option<MemoryView>, Query, description = "`basic` (default: no content) or `full`"),
    ),
    request_body = Option<UpdateMemory>,
    responses(
        (status = 200, description = "The memory as it is now", body = Memory),
        Refusals, Missing, MemoryConflicts, MemoryWriteLimits,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn update(
    State(ctx): State<ApiContext>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Memory>> {
    let mut conn = ctx.db.acquire().await?;
    let (_, caller) =
        store_access(&ctx, &mut conn, &headers, &store_id, "Updating a memory").await?;
    drop(conn);
    let writer = caller.writer(&store_id)?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Basic)?;
    let body: UpdateMemory = optional_body(&bytes)?;
    if let Some(path) = &body.path {
        memory_rules::check_path("path", path)?;
    }
    if let Some(content) = &body.content {
        memory_rules::check_content(content)?;
    }
    let expected_sha256 = match body.precondition {
        None => None,
        Some(p) => {
            if p.kind != "content_sha256" {
                return Err(ApiError::invalid_parameter(format!(
                    "precondition.type must be content_sha256, got {:?}",
                    p.kind
                )));
            }
            let sha = p.content_sha256.ok_or_else(|| {
                ApiError::invalid_parameter(
                    "precondition.content_sha256 is required: the stored content's SHA-256 in 64 lowercase hex characters",
                )
            })?;
            memory_rules::check_sha256("precondition.content_sha256", &sha)?;
            Some(sha)
        }
    };
    let change = Change {
        content: body.content,
        path: body.path,
        expected_sha256,
    };
    let row = service::update(
        &ctx.db,
        &ctx.settings.memory_limits,
        &store_id,
        &memory_id,
        &writer,
        change,
    )
    .await?;
    Ok(Json(row.render(full)))
}

/// With `expected_content_sha256`, only if the stored content still has it.
/// The memory's versions stay (with a `deleted` one).
#[utoipa::path(
    delete,
    path = "/v1/memory_stores/{memory_store_id}/memories/{memory_id}",
    tag = "Memory Stores",
    operation_id = "deleteMemory",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_id" = String, Path, description = "The memory"),
        ("expected_content_sha256" = Option<String>, Query, pattern = "^[0-9a-f]{64}$", description = "Delete only if the stored content has this SHA-256"),
    ),
    responses((status = 200, description = "Deleted", body = MemoryDeleted), Refusals, Missing, MemoryConflicts, RateLimited),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete(
    State(ctx): State<ApiContext>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryDeleted>> {
    let mut conn = ctx.db.acquire().await?;
    let (_, caller) =
        store_access(&ctx, &mut conn, &headers, &store_id, "Deleting a memory").await?;
    drop(conn);
    let writer = caller.writer(&store_id)?;
    let params = Params::parse(query.as_deref())?;
    let expected = params.str("expected_content_sha256");
    if let Some(sha) = expected {
        memory_rules::check_sha256("expected_content_sha256", sha)?;
    }
    service::delete(
        &ctx.db,
        &ctx.settings.memory_limits,
        &store_id,
        &memory_id,
        &writer,
        expected,
    )
    .await?;
    Ok(Json(MemoryDeleted {
        id: memory_id,
        kind: "memory_deleted".into(),
    }))
}

/// Every change of the store's memories, newest first; versions of deleted
/// memories included.
#[utoipa::path(
    get,
    path = "/v1/memory_stores/{memory_store_id}/memory_versions",
    tag = "Memory Stores",
    operation_id = "listMemoryVersions",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_id" = Option<String>, Query, description = "Only this memory's versions"),
        ("operation" = Option<MemoryOperation>, Query, description = "Only versions recording this change"),
        ("session_id" = Option<String>, Query, description = "Only versions a Session's runner wrote"),
        ("api_key_id" = Option<String>, Query, description = "Only versions written with this Workspace key"),
        ("service_account_id" = Option<String>, Query, description = "Only versions a service account wrote (Mango has none)"),
        ("created_at[gte]" = Option<String>, Query, format = DateTime, description = "Written at or after (RFC 3339)"),
        ("created_at[lte]" = Option<String>, Query, format = DateTime, description = "Written at or before (RFC 3339)"),
        ("view" = Option<MemoryView>, Query, description = "`basic` (default: no content) or `full` (at most 20 a page)"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20; at most 20 with `view=full`)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
    ),
    responses((status = 200, description = "A page of memory versions, newest first", body = Page<MemoryVersion>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list_versions(
    State(ctx): State<ApiContext>,
    Path(store_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<MemoryVersion>>> {
    let mut conn = ctx.db.acquire().await?;
    store_access(
        &ctx,
        &mut conn,
        &headers,
        &store_id,
        "Listing memory versions",
    )
    .await?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Basic)?;
    let limit = page_limit(&params, full)?;
    let operation = match params.str("operation").filter(|o| !o.is_empty()) {
        None => None,
        Some(o) => Some(MemoryOperation::parse(o).ok_or_else(|| {
            ApiError::invalid_parameter(format!(
                "operation must be created, modified or deleted, got {o:?}"
            ))
        })?),
    };
    let nonempty = |name| params.str(name).filter(|v| !v.is_empty());
    let filter = VersionFilter {
        store_id: &store_id,
        memory_id: nonempty("memory_id"),
        operation,
        session_id: nonempty("session_id"),
        api_key_id: nonempty("api_key_id"),
        service_account_id: nonempty("service_account_id"),
        created_gte: params.timestamp("created_at[gte]")?,
        created_lte: params.timestamp("created_at[lte]")?,
    };
    let after = params.cursor("page")?;
    let mut rows = store::list_versions(&mut *conn, &filter, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    Ok(Json(Page {
        data: rows.iter().map(|r| r.render(full)).collect(),
        next_page,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/memory_stores/{memory_store_id}/memory_versions/{memory_version_id}",
    tag = "Memory Stores",
    operation_id = "retrieveMemoryVersion",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_version_id" = String, Path, description = "The memory version"),
        ("view" = Option<MemoryView>, Query, description = "`full` (default) or `basic`"),
    ),
    responses((status = 200, description = "The memory version", body = MemoryVersion), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve_version(
    State(ctx): State<ApiContext>,
    Path((store_id, version_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryVersion>> {
    let mut conn = ctx.db.acquire().await?;
    store_access(
        &ctx,
        &mut conn,
        &headers,
        &store_id,
        "Reading a memory version",
    )
    .await?;
    let params = Params::parse(query.as_deref())?;
    let full = full_view(&params, MemoryView::Full)?;
    let row = store::find_version(&mut *conn, &store_id, &version_id)
        .await?
        .ok_or_else(|| version_not_found(&store_id, &version_id))?;
    Ok(Json(row.render(full)))
}

/// Clears a version's content, path and digest for good (Workspace key
/// only). The version holding a live memory's current content is refused.
#[utoipa::path(
    post,
    path = "/v1/memory_stores/{memory_store_id}/memory_versions/{memory_version_id}/redact",
    tag = "Memory Stores",
    operation_id = "redactMemoryVersion",
    params(
        ("memory_store_id" = String, Path, description = "The Memory Store"),
        ("memory_version_id" = String, Path, description = "The memory version"),
    ),
    responses((status = 200, description = "The redacted version", body = MemoryVersion), Refusals, Missing, MemoryConflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn redact_version(
    State(ctx): State<ApiContext>,
    Path((store_id, version_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryVersion>> {
    let mut conn = ctx.db.acquire().await?;
    let (_, caller) = store_access(
        &ctx,
        &mut conn,
        &headers,
        &store_id,
        "Redacting a memory version",
    )
    .await?;
    drop(conn);
    let super::memory_stores::Caller::Operator { key_id } = caller else {
        return Err(ApiError::forbidden(
            "Redacting a memory version is not permitted with a sessions token",
        ));
    };
    let writer = service::Writer::Operator { key_id };
    let row: VersionRow = service::redact(&ctx.db, &store_id, &version_id, &writer).await?;
    Ok(Json(row.render(true)))
}
