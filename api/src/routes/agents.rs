//! `/v1/agents`: the SDK's Managed Agents `agent` surface. Every update writes
//! a new immutable version; older versions stay readable with `?version=N`.

use crate::agent_definition::{self, shape_error_code};
use crate::auth::operator;
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body_coded, optional_body_coded, Params, RawBody};
use crate::ids;
use crate::openapi::{Conflicts, Missing, Refusals, TooLarge};
use crate::service::agents::{self as agent_service, Updated};
use crate::store::agents::{self, AgentRow};
use crate::store::cursor;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use mango_protocol::agents::{Agent, CreateAgent, UpdateAgent};
use mango_protocol::{time, ErrorCode, Page};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, update))
        .routes(routes!(archive))
        .routes(routes!(versions))
}

fn not_found(agent: &str) -> ApiError {
    ApiError::not_found(format!("agent {agent} not found")).code(ErrorCode::AgentNotFound)
}

// ---- handlers ---------------------------------------------------------------

#[utoipa::path(
    post,
    path = "/v1/agents",
    tag = "Agents",
    operation_id = "createAgent",
    request_body = CreateAgent,
    responses((status = 200, description = "The new Agent, version 1", body = Agent), Refusals, Conflicts, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Agent>> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating an Agent").await?;
    let body: CreateAgent = body_coded(&bytes, shape_error_code)?;
    let version = agent_definition::create(body)?;
    let row = agent_service::create(
        &mut conn,
        &key.workspace_id,
        &ids::new_id("agent"),
        &version,
        time::now(),
    )
    .await?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    get,
    path = "/v1/agents/{agent_id}",
    tag = "Agents",
    operation_id = "retrieveAgent",
    params(
        ("agent_id" = String, Path, description = "The Agent"),
        ("version" = Option<i64>, Query, minimum = 1, maximum = 2147483647, description = "A version (default the latest)"),
    ),
    responses((status = 200, description = "The Agent at that version", body = Agent), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Agent>> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading an Agent").await?;
    let params = Params::parse(query.as_deref())?;
    let version = params.int("version", 1, i32::MAX as i64)?.map(|v| v as i32);
    match agents::find(&mut *conn, &key.workspace_id, &agent, version).await? {
        Some(row) => Ok(Json(row.render())),
        None => match version {
            Some(v) if agents::exists(&mut *conn, &key.workspace_id, &agent).await? => Err(
                ApiError::not_found(format!("agent {agent} has no version {v}"))
                    .code(ErrorCode::AgentNotFound),
            ),
            _ => Err(not_found(&agent)),
        },
    }
}

#[utoipa::path(
    post,
    path = "/v1/agents/{agent_id}",
    tag = "Agents",
    operation_id = "updateAgent",
    params(("agent_id" = String, Path, description = "The Agent")),
    request_body = Option<UpdateAgent>,
    responses(
        (status = 200, description = "The Agent at its new version (or unchanged when nothing changed)", body = Agent),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn update(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Agent>> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating an Agent").await?;
    let body: UpdateAgent = optional_body_coded(&bytes, shape_error_code)?;
    let expected = match body.version {
        None => None,
        Some(v) => Some(i32::try_from(v).ok().filter(|v| *v >= 1).ok_or_else(|| {
            ApiError::invalid_parameter(format!(
                "version must be an integer from 1 through {}",
                i32::MAX
            ))
        })?),
    };
    let outcome = agent_service::update(
        &mut conn,
        &key.workspace_id,
        &agent,
        expected,
        time::now(),
        |current| agent_definition::update(current, body),
    )
    .await?;
    match outcome {
        Updated::Saved(row) => Ok(Json(row.render())),
        Updated::NotFound => Err(not_found(&agent)),
        Updated::Archived => Err(ApiError::bad_request(format!(
            "agent {agent} is archived and cannot be updated"
        ))
        .code(ErrorCode::AgentArchived)),
        Updated::Conflict(current) => Err(ApiError::conflict(format!(
            "agent {agent} is at version {current}, not {}; retrieve it and retry",
            expected.unwrap_or_default()
        ))
        .code(ErrorCode::AgentVersionConflict)
        .detail("current_version", json!(current))
        .final_answer()),
    }
}

#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "Agents",
    operation_id = "listAgents",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
        ("include_archived" = Option<bool>, Query, description = "Also list archived Agents"),
        ("created_at[gte]" = Option<String>, Query, format = DateTime, description = "Created at or after (RFC 3339)"),
        ("created_at[lte]" = Option<String>, Query, format = DateTime, description = "Created at or before (RFC 3339)"),
    ),
    responses((status = 200, description = "A page of Agents (their latest versions), newest first", body = Page<Agent>), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<Agent>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Agents").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let include_archived = params.bool("include_archived")?.unwrap_or(false);
    let gte = params.timestamp("created_at[gte]")?;
    let lte = params.timestamp("created_at[lte]")?;
    let after = params
        .str("page")
        .filter(|p| !p.is_empty())
        .map(cursor::decode)
        .transpose()?;
    let mut rows = agents::list(
        &mut *conn,
        &key.workspace_id,
        include_archived,
        gte,
        lte,
        after,
        limit + 1,
    )
    .await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| {
        cursor::encode(&r.agent_created_at, &r.id)
    });
    Ok(Json(Page {
        data: rows.iter().map(AgentRow::render).collect(),
        next_page,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/agents/{agent_id}/versions",
    tag = "Agents",
    operation_id = "listAgentVersions",
    params(
        ("agent_id" = String, Path, description = "The Agent"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
    ),
    responses((status = 200, description = "A page of the Agent's versions, newest first", body = Page<Agent>), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn versions(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<Agent>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing an Agent's versions").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let before = match params.str("page").filter(|p| !p.is_empty()) {
        None => None,
        Some(page) => {
            let (_, v) = cursor::decode(page)?;
            Some(v.parse::<i32>().map_err(|_| {
                ApiError::invalid_parameter(format!(
                    "page {page:?} is not a cursor this API issued"
                ))
                .code(ErrorCode::InvalidCursor)
            })?)
        }
    };
    if !agents::exists(&mut *conn, &key.workspace_id, &agent).await? {
        return Err(not_found(&agent));
    }
    let mut rows =
        agents::versions(&mut *conn, &key.workspace_id, &agent, before, limit + 1).await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| {
        cursor::encode(&r.version_created_at, &r.version.to_string())
    });
    Ok(Json(Page {
        data: rows.iter().map(AgentRow::render).collect(),
        next_page,
    }))
}

#[utoipa::path(
    post,
    path = "/v1/agents/{agent_id}/archive",
    tag = "Agents",
    operation_id = "archiveAgent",
    params(("agent_id" = String, Path, description = "The Agent")),
    responses((status = 200, description = "The archived Agent", body = Agent), Refusals, Missing, Conflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn archive(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Agent>> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving an Agent").await?;
    let row = agents::archive(&mut conn, &key.workspace_id, &agent, time::now())
        .await?
        .ok_or_else(|| not_found(&agent))?;
    Ok(Json(row.render()))
}
