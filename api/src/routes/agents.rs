//! `/v1/agents`: the SDK's Managed Agents `agent` surface. Every update writes
//! a new immutable version; older versions stay readable with `?version=N`.

use crate::auth::operator;
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{Body, Params, RawBody};
use crate::store::agents::{self, AgentRow, Definition, Updated};
use crate::store::cursor;
use crate::{ids, metadata};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mango_protocol::{time, ErrorCode, Page};
use serde_json::{json, Value};

use crate::agent_definition::{
    check_mcp_references, execution_identity, mcp_servers, model, name, no_multiagent, skills,
    text, tools, CREATE_FIELDS, MAX_DESCRIPTION_CHARS, MAX_SYSTEM_CHARS, UPDATE_FIELDS,
};

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/agents", post(create).get(list))
        .route("/v1/agents/{agent}", get(retrieve).post(update))
        .route("/v1/agents/{agent}/archive", post(archive))
        .route("/v1/agents/{agent}/versions", get(versions))
}

fn not_found(agent: &str) -> ApiError {
    ApiError::not_found(format!("agent {agent} not found")).code(ErrorCode::AgentNotFound)
}

// ---- handlers ---------------------------------------------------------------

async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating an Agent").await?;
    let body = Body::parse(&bytes, CREATE_FIELDS)?;
    no_multiagent(&body)?;
    let def = Definition {
        name: name(body.required_str("name")?)?,
        description: text(
            "description",
            body.nullable_str("description")?.flatten(),
            MAX_DESCRIPTION_CHARS,
        )?,
        system: text(
            "system",
            body.nullable_str("system")?.flatten(),
            MAX_SYSTEM_CHARS,
        )?,
        model: model(body.required("model")?)?,
        tools: tools(body.get("tools"))?,
        skills: skills(body.get("skills"))?,
        mcp_servers: mcp_servers(body.get("mcp_servers"))?,
        execution_identity: execution_identity(body.get("execution_identity"))?,
        metadata: metadata::to_json(&metadata::validate(body.get("metadata"))?),
    };
    check_mcp_references(&def.tools, &def.mcp_servers)?;
    let row = agents::create(
        &mut conn,
        &key.workspace_id,
        &ids::new_id("agent"),
        &def,
        time::now(),
    )
    .await?;
    Ok(Json(row.render()).into_response())
}

async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading an Agent").await?;
    let params = Params::parse(query.as_deref());
    let version = params.int("version", 1, i32::MAX as i64)?.map(|v| v as i32);
    match agents::find(&mut *conn, &key.workspace_id, &agent, version).await? {
        Some(row) => Ok(Json(row.render()).into_response()),
        None => match version {
            Some(v) if agents::exists(&mut *conn, &key.workspace_id, &agent).await? => Err(
                ApiError::not_found(format!("agent {agent} has no version {v}"))
                    .code(ErrorCode::AgentNotFound),
            ),
            _ => Err(not_found(&agent)),
        },
    }
}

/// Applies the update body to the current definition (omitted fields are kept).
fn apply(body: &Body, current: &AgentRow) -> ApiResult<Definition> {
    let mut def = current.definition();
    if body.has("name") {
        def.name = match body.get("name") {
            Some(Value::String(s)) => name(s)?,
            _ => {
                return Err(ApiError::invalid_parameter(
                    "name must be a non-empty string; it cannot be cleared",
                ))
            }
        };
    }
    if let Some(d) = body.nullable_str("description")? {
        def.description = text("description", d, MAX_DESCRIPTION_CHARS)?;
    }
    if let Some(s) = body.nullable_str("system")? {
        def.system = text("system", s, MAX_SYSTEM_CHARS)?;
    }
    if let Some(m) = body.get("model") {
        if m.is_null() {
            return Err(ApiError::invalid_parameter("model cannot be cleared"));
        }
        def.model = model(m)?;
    }
    if body.has("tools") {
        def.tools = tools(body.get("tools"))?;
    }
    if body.has("skills") {
        def.skills = skills(body.get("skills"))?;
    }
    if body.has("mcp_servers") {
        def.mcp_servers = mcp_servers(body.get("mcp_servers"))?;
    }
    if body.has("execution_identity") {
        def.execution_identity = execution_identity(body.get("execution_identity"))?;
    }
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(patch)) => {
            def.metadata = metadata::to_json(&metadata::merge(
                &metadata::from_json(&current.metadata),
                patch,
                false,
            )?);
        }
        Some(_) => {
            return Err(ApiError::bad_request("metadata must be an object")
                .code(ErrorCode::InvalidMetadata))
        }
    }
    check_mcp_references(&def.tools, &def.mcp_servers)?;
    Ok(def)
}

async fn update(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating an Agent").await?;
    let body = Body::parse_optional(&bytes, UPDATE_FIELDS)?;
    no_multiagent(&body)?;
    let expected = body
        .optional_int("version", 1, i32::MAX as i64)?
        .map(|v| v as i32);
    let outcome = agents::update(
        &mut conn,
        &key.workspace_id,
        &agent,
        expected,
        time::now(),
        |current| apply(&body, current),
    )
    .await??;
    match outcome {
        Updated::Saved(row) => Ok(Json(row.render()).into_response()),
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

async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Agents").await?;
    let params = Params::parse(query.as_deref());
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
    })
    .into_response())
}

async fn versions(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing an Agent's versions").await?;
    let params = Params::parse(query.as_deref());
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
    })
    .into_response())
}

async fn archive(
    State(ctx): State<ApiContext>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving an Agent").await?;
    let row = agents::archive(&mut conn, &key.workspace_id, &agent, time::now())
        .await?
        .ok_or_else(|| not_found(&agent))?;
    Ok(Json(row.render()).into_response())
}
