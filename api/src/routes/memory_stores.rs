//! `/v1/memory_stores`: the SDK's `beta.memory_stores` (create, retrieve,
//! update, list, delete, archive). A Workspace key has full access; the
//! sessions token of a Session's live Work reads the stores its Session
//! attaches (and writes the memories of `read_write` ones, see
//! [`super::memories`]); Environment keys get 403.

use crate::auth::{authenticate, operator, Principal};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, optional_body, Params, RawBody};
use crate::lease::TokenUse;
use crate::memory_rules;
use crate::metadata;
use crate::openapi::{Missing, Refusals, TooLarge};
use crate::service::memory::{self, store_not_found, Writer};
use crate::store::memory::{self as store, StoreFilter, StoreRow};
use crate::store::work::WorkRow;
use crate::store::{cursor, sessions};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use mango_protocol::memory::{
    CreateMemoryStore, MemoryStore, MemoryStoreDeleted, UpdateMemoryStore,
};
use mango_protocol::patch::Patch;
use mango_protocol::sessions::{MemoryAccess, SessionResource};
use mango_protocol::{time, Page};
use sqlx::PgConnection;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, update, delete))
        .routes(routes!(archive))
}

/// Who is using a store.
pub enum Caller {
    /// A Workspace key of the store's workspace.
    Operator { key_id: String },
    /// The sessions token of a Session that attaches the store.
    Runner {
        work: Box<WorkRow>,
        session_id: String,
        access: MemoryAccess,
    },
}

impl Caller {
    /// The writer of a change to the store's memories: a runner only
    /// through a `read_write` attachment.
    pub fn writer(&self, store_id: &str) -> ApiResult<Writer> {
        match self {
            Caller::Operator { key_id } => Ok(Writer::Operator {
                key_id: key_id.clone(),
            }),
            Caller::Runner { access: MemoryAccess::ReadOnly, .. } => Err(ApiError::forbidden(format!(
                "memory store {store_id} is attached read-only to this sessions token's Session: its memories can be read, not written"
            ))),
            Caller::Runner {
                work, session_id, ..
            } => Ok(Writer::Session {
                session_id: session_id.clone(),
                work_id: work.id.clone(),
                claim_epoch: work.claim_epoch,
            }),
        }
    }
}

/// Resolves the caller against store `id`: a Workspace key of its
/// workspace, or a live sessions token whose Session attaches it (any other
/// store is not found for it); Environment keys are refused.
pub async fn store_access(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
    id: &str,
    what: &str,
) -> ApiResult<(StoreRow, Caller)> {
    match authenticate(ctx, conn, headers).await? {
        Principal::Workspace(key) => {
            let row = store::find_store(&mut *conn, Some(&key.workspace_id), id)
                .await?
                .ok_or_else(|| store_not_found(id))?;
            Ok((row, Caller::Operator { key_id: key.id }))
        }
        Principal::Token(work) => {
            let now = time::now();
            work.lease()
                .reconcile(now)
                .admits_token(TokenUse::Session, now)
                .map_err(|r| ApiError::unauthenticated(r.message()))?;
            let Some(session_id) = work.session_id.clone() else {
                return Err(ApiError::forbidden(format!(
                    "{what} is not permitted with a healthcheck's sessions token"
                )));
            };
            let (workspace_id, resources) = sessions::resources(&mut *conn, &session_id)
                .await?
                .ok_or_else(|| store_not_found(id))?;
            let access = resources
                .0
                .iter()
                .find_map(|r| match r {
                    SessionResource::MemoryStore(m) if m.memory_store_id == id => {
                        Some(m.access.unwrap_or(MemoryAccess::ReadWrite))
                    }
                    _ => None,
                })
                .ok_or_else(|| store_not_found(id))?;
            let row = store::find_store(&mut *conn, Some(&workspace_id), id)
                .await?
                .ok_or_else(|| store_not_found(id))?;
            Ok((
                row,
                Caller::Runner {
                    work,
                    session_id,
                    access,
                },
            ))
        }
        Principal::Environment(_) => Err(ApiError::forbidden(format!(
            "{what} is not permitted with an Environment key"
        ))),
    }
}

#[utoipa::path(
    post,
    path = "/v1/memory_stores",
    tag = "Memory Stores",
    operation_id = "createMemoryStore",
    request_body = CreateMemoryStore,
    responses((status = 200, description = "The new Memory Store", body = MemoryStore), Refusals, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<MemoryStore>> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating a memory store").await?;
    let body: CreateMemoryStore = body(&bytes)?;
    memory_rules::check_name(&body.name)?;
    let description = body.description.unwrap_or_default();
    memory_rules::check_description(&description)?;
    let metadata = metadata::validate(body.metadata.as_ref())?;
    let now = time::now();
    let row = store::insert_store(
        &mut *conn,
        &StoreRow {
            id: crate::ids::new_id("memstore"),
            workspace_id: key.workspace_id,
            name: body.name,
            description,
            metadata: metadata::to_json(&metadata),
            created_at: now,
            updated_at: now,
            archived_at: None,
            memory_count: 0,
            content_bytes: 0,
            version_count: 0,
            version_bytes: 0,
        },
    )
    .await?;
    Ok(Json(row.render()))
}

/// A sessions token reads only the stores its Session attaches.
#[utoipa::path(
    get,
    path = "/v1/memory_stores/{memory_store_id}",
    tag = "Memory Stores",
    operation_id = "retrieveMemoryStore",
    params(("memory_store_id" = String, Path, description = "The Memory Store")),
    responses((status = 200, description = "The Memory Store", body = MemoryStore), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryStore>> {
    let mut conn = ctx.db.acquire().await?;
    let (row, _) = store_access(&ctx, &mut conn, &headers, &id, "Reading a memory store").await?;
    Ok(Json(row.render()))
}

/// Name, description and metadata (a patch); refused once archived.
#[utoipa::path(
    post,
    path = "/v1/memory_stores/{memory_store_id}",
    tag = "Memory Stores",
    operation_id = "updateMemoryStore",
    params(("memory_store_id" = String, Path, description = "The Memory Store")),
    request_body = Option<UpdateMemoryStore>,
    responses((status = 200, description = "The updated Memory Store", body = MemoryStore), Refusals, Missing, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn update(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<MemoryStore>> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating a memory store").await?;
    let body: UpdateMemoryStore = optional_body(&bytes)?;
    if let Patch::Set(name) = &body.name {
        memory_rules::check_name(name)?;
    }
    if let Patch::Set(description) = &body.description {
        memory_rules::check_description(description)?;
    }
    let row = memory::update_store(&mut conn, &key.workspace_id, &id, body).await?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    get,
    path = "/v1/memory_stores",
    tag = "Memory Stores",
    operation_id = "listMemoryStores",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
        ("include_archived" = Option<bool>, Query, description = "Also list archived stores"),
        ("created_at[gte]" = Option<String>, Query, format = DateTime, description = "Created at or after (RFC 3339)"),
        ("created_at[lte]" = Option<String>, Query, format = DateTime, description = "Created at or before (RFC 3339)"),
    ),
    responses((status = 200, description = "A page of Memory Stores, newest first", body = Page<MemoryStore>), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<MemoryStore>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing memory stores").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let filter = StoreFilter {
        workspace_id: &key.workspace_id,
        created_gte: params.timestamp("created_at[gte]")?,
        created_lte: params.timestamp("created_at[lte]")?,
        include_archived: params.bool("include_archived")?.unwrap_or(false),
    };
    let after = params.cursor("page")?;
    let mut rows = store::list_stores(&mut *conn, &filter, after, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    Ok(Json(Page {
        data: rows.iter().map(StoreRow::render).collect(),
        next_page,
    }))
}

/// Deletes the store with all its memories and versions; it cannot be undone.
#[utoipa::path(
    delete,
    path = "/v1/memory_stores/{memory_store_id}",
    tag = "Memory Stores",
    operation_id = "deleteMemoryStore",
    params(("memory_store_id" = String, Path, description = "The Memory Store")),
    responses((status = 200, description = "Deleted", body = MemoryStoreDeleted), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryStoreDeleted>> {
    let (mut conn, key) = operator(&ctx, &headers, "Deleting a memory store").await?;
    if !store::delete_store(&mut *conn, &key.workspace_id, &id).await? {
        return Err(store_not_found(&id));
    }
    Ok(Json(MemoryStoreDeleted {
        id,
        kind: "memory_store_deleted".into(),
    }))
}

/// Archive: idempotent and final. An archived store attaches to no new
/// Session and takes no memory writes but deletes.
#[utoipa::path(
    post,
    path = "/v1/memory_stores/{memory_store_id}/archive",
    tag = "Memory Stores",
    operation_id = "archiveMemoryStore",
    params(("memory_store_id" = String, Path, description = "The Memory Store")),
    responses((status = 200, description = "The archived Memory Store", body = MemoryStore), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn archive(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<MemoryStore>> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving a memory store").await?;
    let row = memory::archive_store(&mut conn, &key.workspace_id, &id).await?;
    Ok(Json(row.render()))
}
