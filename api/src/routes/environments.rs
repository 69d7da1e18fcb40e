//! `/v1/environments`: the SDK's Environment surface, `self_hosted` only.

use crate::auth::operator;
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{check_len, Body, Params, RawBody};
use crate::store::cursor;
use crate::store::environments::{self, EnvironmentRow};
use crate::{ids, metadata};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mango_protocol::{time, EnvironmentDeleted, ErrorCode, Page};
use serde_json::{json, Value};

const FIELDS: &[&str] = &["name", "description", "config", "metadata", "scope"];
const MAX_NAME_CHARS: usize = 256;
const MAX_DESCRIPTION_CHARS: usize = 2048;

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/environments", post(create).get(list))
        .route(
            "/v1/environments/{env}",
            get(retrieve).post(update).delete(delete),
        )
        .route("/v1/environments/{env}/archive", post(archive))
}

fn not_found(env: &str) -> ApiError {
    ApiError::not_found(format!("environment {env} not found")).code(ErrorCode::EnvironmentNotFound)
}

/// `config` must be `{"type":"self_hosted"}` (or null on create: the same).
fn self_hosted_config(value: Option<&Value>, on_update: bool) -> ApiResult<Option<Value>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => match map.get("type").and_then(Value::as_str) {
            Some("self_hosted") => {
                if let Some(extra) = map.keys().find(|k| *k != "type") {
                    return Err(ApiError::invalid_parameter(format!(
                        "config.{extra} is not a self_hosted config field"
                    )));
                }
                Ok(Some(json!({"type": "self_hosted"})))
            }
            Some(other) if on_update => Err(ApiError::bad_request(format!(
                "config.type cannot change from \"self_hosted\" to {other:?}"
            ))
            .code(ErrorCode::InvalidConfigTypeChange)),
            Some(other) => Err(ApiError::bad_request(format!(
                "config.type {other:?} is not supported: Mango runs self_hosted Environments only"
            ))
            .code(ErrorCode::UnsupportedConfigType)),
            None => Err(ApiError::invalid_parameter("config.type is required")),
        },
        Some(_) => Err(ApiError::invalid_parameter("config must be an object")),
    }
}

fn scope(body: &Body) -> ApiResult<Option<Option<String>>> {
    match body.nullable_str("scope")? {
        None => Ok(None),
        Some(None) => Ok(Some(None)),
        Some(Some(s @ ("organization" | "account"))) => Ok(Some(Some(s.to_string()))),
        Some(Some(other)) => Err(ApiError::invalid_parameter(format!(
            "scope must be \"organization\" or \"account\", got {other:?}"
        ))),
    }
}

fn name(value: &str) -> ApiResult<String> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid_parameter("name must not be empty"));
    }
    check_len("name", value, MAX_NAME_CHARS)?;
    Ok(value.to_string())
}

fn description(value: Option<&str>) -> ApiResult<Option<String>> {
    if let Some(d) = value {
        check_len("description", d, MAX_DESCRIPTION_CHARS)?;
    }
    Ok(value.map(str::to_string))
}

async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating an Environment").await?;
    let body = Body::parse(&bytes, FIELDS)?;
    let now = time::now();
    let row = EnvironmentRow {
        id: ids::new_id("env"),
        workspace_id: key.workspace_id.clone(),
        name: name(body.required_str("name")?)?,
        description: description(body.nullable_str("description")?.flatten())?,
        config: self_hosted_config(body.get("config"), false)?
            .unwrap_or_else(|| json!({"type": "self_hosted"})),
        metadata: metadata::to_json(&metadata::validate(body.get("metadata"))?),
        scope: scope(&body)?.flatten(),
        created_at: now,
        updated_at: now,
        archived_at: None,
    };
    let saved = environments::insert(&mut *conn, &row).await?;
    Ok(Json(saved.render()).into_response())
}

async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading an Environment").await?;
    let row = environments::find(&mut *conn, &key.workspace_id, &env)
        .await?
        .ok_or_else(|| not_found(&env))?;
    Ok(Json(row.render()).into_response())
}

async fn update(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating an Environment").await?;
    let body = Body::parse_optional(&bytes, FIELDS)?;
    let mut row = environments::find(&mut *conn, &key.workspace_id, &env)
        .await?
        .ok_or_else(|| not_found(&env))?;
    if row.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {env} is archived and cannot be updated"
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    if let Some(config) = self_hosted_config(body.get("config"), true)? {
        row.config = config;
    }
    if let Some(Some(n)) = body.nullable_str("name")? {
        row.name = name(n)?;
    }
    if let Some(d) = body.nullable_str("description")? {
        row.description = description(d)?;
    }
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(patch)) => {
            row.metadata = metadata::to_json(&metadata::merge(
                &environments::metadata_of(&row),
                patch,
                true,
            )?);
        }
        Some(_) => {
            return Err(ApiError::bad_request("metadata must be an object")
                .code(ErrorCode::InvalidMetadata))
        }
    }
    if let Some(s) = scope(&body)? {
        row.scope = s;
    }
    row.updated_at = time::now();
    let saved = environments::update(&mut *conn, &row)
        .await?
        .ok_or_else(|| not_found(&env))?;
    Ok(Json(saved.render()).into_response())
}

async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Environments").await?;
    let params = Params::parse(query.as_deref());
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let include_archived = params.bool("include_archived")?.unwrap_or(false);
    let after = params
        .str("page")
        .filter(|p| !p.is_empty())
        .map(cursor::decode)
        .transpose()?;
    let mut rows = environments::list(
        &mut *conn,
        &key.workspace_id,
        include_archived,
        after,
        limit + 1,
    )
    .await?;
    let next_page = cursor::next_page(&mut rows, limit, |r| cursor::encode(&r.created_at, &r.id));
    Ok(Json(Page {
        data: rows.iter().map(EnvironmentRow::render).collect(),
        next_page,
    })
    .into_response())
}

async fn delete(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Deleting an Environment").await?;
    if !environments::delete(&mut *conn, &key.workspace_id, &env).await? {
        return Err(not_found(&env));
    }
    Ok(Json(EnvironmentDeleted {
        id: env,
        kind: "environment_deleted".into(),
    })
    .into_response())
}

/// Archive: idempotent; an archived Environment gets no new Work.
async fn archive(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving an Environment").await?;
    let mut row = environments::find(&mut *conn, &key.workspace_id, &env)
        .await?
        .ok_or_else(|| not_found(&env))?;
    if row.archived_at.is_none() {
        let now = time::now();
        row.archived_at = Some(now);
        row.updated_at = now;
        row = environments::update(&mut *conn, &row)
            .await?
            .ok_or_else(|| not_found(&env))?;
    }
    Ok(Json(row.render()).into_response())
}
