//! `/v1/environments`: the SDK's Environment surface, `self_hosted` only.

use crate::auth::operator;
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, check_len, optional_body, Params, RawBody};
use crate::openapi::{Conflicts, Missing, Refusals, TooLarge};
use crate::service::environments::{self as environment_service, find_environment};
use crate::store::cursor;
use crate::store::environments::{self, EnvironmentRow};
use crate::{ids, metadata};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use mango_protocol::patch::Patch;
use mango_protocol::{
    time, CreateEnvironment, Environment, EnvironmentConfig, EnvironmentDeleted, ErrorCode, Page,
    UpdateEnvironment,
};
use serde_json::{json, Value};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const MAX_NAME_CHARS: usize = 256;
const MAX_DESCRIPTION_CHARS: usize = 2048;
const SELF_HOSTED: &str = "self_hosted";

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, update, delete))
        .routes(routes!(archive))
}

/// `config` must be `{"type":"self_hosted"}`.
fn self_hosted_config(config: &EnvironmentConfig, on_update: bool) -> ApiResult<Value> {
    match config.kind.as_str() {
        SELF_HOSTED => match config.fields.keys().next() {
            Some(extra) => Err(ApiError::invalid_parameter(format!(
                "config.{extra} is not a {SELF_HOSTED} config field"
            ))),
            None => Ok(json!({"type": SELF_HOSTED})),
        },
        other if on_update => Err(ApiError::bad_request(format!(
            "config.type cannot change from {SELF_HOSTED:?} to {other:?}"
        ))
        .code(ErrorCode::InvalidConfigTypeChange)),
        other => Err(ApiError::bad_request(format!(
            "config.type {other:?} is not supported: Mango runs {SELF_HOSTED} Environments only"
        ))
        .code(ErrorCode::UnsupportedConfigType)),
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

#[utoipa::path(
    post,
    path = "/v1/environments",
    tag = "Environments",
    operation_id = "createEnvironment",
    request_body = CreateEnvironment,
    responses((status = 200, description = "The new Environment", body = Environment), Refusals, Conflicts, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Environment>> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating an Environment").await?;
    let body: CreateEnvironment = body(&bytes)?;
    let now = time::now();
    let config = match &body.config {
        Some(c) => self_hosted_config(c, false)?,
        None => json!({"type": SELF_HOSTED}),
    };
    let row = EnvironmentRow {
        id: ids::new_id("env"),
        workspace_id: key.workspace_id.clone(),
        name: name(&body.name)?,
        description: description(body.description.as_deref())?,
        config,
        metadata: metadata::to_json(&metadata::validate(body.metadata.as_ref())?),
        scope: body.scope.map(|s| s.as_str().to_string()),
        created_at: now,
        updated_at: now,
        archived_at: None,
    };
    let saved = environments::insert(&mut *conn, &row).await?;
    Ok(Json(saved.render()))
}

#[utoipa::path(
    get,
    path = "/v1/environments/{environment_id}",
    tag = "Environments",
    operation_id = "retrieveEnvironment",
    params(("environment_id" = String, Path, description = "The Environment")),
    responses((status = 200, description = "The Environment", body = Environment), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Environment>> {
    let (mut conn, key) = operator(&ctx, &headers, "Reading an Environment").await?;
    Ok(Json(
        find_environment(&mut conn, &key, &env).await?.render(),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}",
    tag = "Environments",
    operation_id = "updateEnvironment",
    params(("environment_id" = String, Path, description = "The Environment")),
    request_body = Option<UpdateEnvironment>,
    responses((status = 200, description = "The updated Environment", body = Environment), Refusals, Missing, Conflicts, TooLarge),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn update(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Environment>> {
    let (mut conn, key) = operator(&ctx, &headers, "Updating an Environment").await?;
    let body: UpdateEnvironment = optional_body(&bytes)?;
    let mut row = find_environment(&mut conn, &key, &env).await?;
    if row.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {env} is archived and cannot be updated"
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    if let Some(config) = &body.config {
        row.config = self_hosted_config(config, true)?;
    }
    if let Patch::Set(n) = &body.name {
        row.name = name(n)?;
    }
    if let Some(d) = body.description.as_ref().into_option() {
        row.description = description(d.map(String::as_str))?;
    }
    if let Some(patch) = &body.metadata {
        row.metadata = metadata::to_json(&metadata::merge(
            &environments::metadata_of(&row),
            patch,
            true,
        )?);
    }
    if let Some(scope) = body.scope.into_option() {
        row.scope = scope.map(|s| s.as_str().to_string());
    }
    row.updated_at = time::now();
    let saved = environments::update(&mut *conn, &row)
        .await?
        .ok_or_else(|| environment_service::not_found(&env))?;
    Ok(Json(saved.render()))
}

#[utoipa::path(
    get,
    path = "/v1/environments",
    tag = "Environments",
    operation_id = "listEnvironments",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` cursor of an earlier page"),
        ("include_archived" = Option<bool>, Query, description = "Also list archived Environments"),
    ),
    responses((status = 200, description = "A page of Environments, newest first", body = Page<Environment>), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Page<Environment>>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Environments").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let include_archived = params.bool("include_archived")?.unwrap_or(false);
    let after = params.cursor("page")?;
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
    }))
}

#[utoipa::path(
    delete,
    path = "/v1/environments/{environment_id}",
    tag = "Environments",
    operation_id = "deleteEnvironment",
    params(("environment_id" = String, Path, description = "The Environment")),
    responses((status = 200, description = "Deleted", body = EnvironmentDeleted), Refusals, Missing, Conflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<EnvironmentDeleted>> {
    let (mut conn, key) = operator(&ctx, &headers, "Deleting an Environment").await?;
    environment_service::delete(&mut conn, &key.workspace_id, &env).await?;
    Ok(Json(EnvironmentDeleted {
        id: env,
        kind: "environment_deleted".into(),
    }))
}

/// Archive: idempotent; an archived Environment gets no new Work.
#[utoipa::path(
    post,
    path = "/v1/environments/{environment_id}/archive",
    tag = "Environments",
    operation_id = "archiveEnvironment",
    params(("environment_id" = String, Path, description = "The Environment")),
    responses((status = 200, description = "The archived Environment", body = Environment), Refusals, Missing, Conflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn archive(
    State(ctx): State<ApiContext>,
    Path(env): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Environment>> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving an Environment").await?;
    let mut row = find_environment(&mut conn, &key, &env).await?;
    if row.archived_at.is_none() {
        let now = time::now();
        row.archived_at = Some(now);
        row.updated_at = now;
        row = environments::update(&mut *conn, &row)
            .await?
            .ok_or_else(|| environment_service::not_found(&env))?;
    }
    Ok(Json(row.render()))
}
