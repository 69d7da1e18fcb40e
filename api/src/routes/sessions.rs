//! `/v1/sessions`: Sessions (spec §5). A Workspace key has full access; the
//! sessions token of a Session's live Work reads that Session; Environment
//! keys get 403. Its events are [`super::events`].

use crate::auth::{operator, session_access};
use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::event_shapes;
use crate::extract::{body, check_len, Params, RawBody};
use crate::metadata;
use crate::openapi::{Conflicts, Missing, Refusals, TooLarge};
use crate::service::environments::find_environment;
use crate::service::sessions::{self as session_service, NewSession};
use crate::store::sessions::{self, ListFilter, SessionRow};
use crate::store::{agents, cursor};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use mango_protocol::events::SentEvent;
use mango_protocol::sessions::{
    AgentRef, CreateSession, Session, SessionDeleted, SessionPage, SessionStatus,
};
use mango_protocol::{time, ErrorCode};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const MAX_TITLE_CHARS: usize = 500;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(retrieve, delete))
        .routes(routes!(archive))
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("session {id} not found")).code(ErrorCode::SessionNotFound)
}

#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "Sessions",
    operation_id = "createSession",
    request_body = CreateSession,
    responses(
        (status = 200, description = "The new Session", body = Session),
        Refusals, Missing, Conflicts, TooLarge,
    ),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn create(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> ApiResult<Json<Session>> {
    let (mut conn, key) = operator(&ctx, &headers, "Creating a Session").await?;
    let body: CreateSession = body(&bytes)?;
    let (agent_id, version) = match &body.agent {
        AgentRef::Id(id) => (id.clone(), None),
        AgentRef::Version(v) => {
            let version = match v.version {
                None => None,
                Some(n) => Some(i32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                    ApiError::invalid_parameter("agent.version must be a positive integer")
                })?),
            };
            (v.id.clone(), version)
        }
    };
    let metadata = metadata::validate(body.metadata.as_ref())?;
    if let Some(t) = &body.title {
        check_len("title", t, MAX_TITLE_CHARS)?;
    }
    let resources = session_service::stored_resources(body.resources.unwrap_or_default())?;
    let resources = crate::service::memory::attach(
        &mut conn,
        &key.workspace_id,
        &ctx.settings.memory_mount_root,
        resources,
    )
    .await?;
    if body.vault_ids.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::invalid_parameter(
            "vault_ids are not supported by Mango",
        ));
    }
    if body.budget.as_ref().is_some_and(|b| !b.is_null()) {
        return Err(ApiError::invalid_parameter(
            "budget is not supported by Mango",
        ));
    }
    let initial_events = match body.initial_events {
        None => Vec::new(),
        Some(events) => {
            let checked = event_shapes::check_all(events)?;
            if let Some((i, e)) = checked.iter().enumerate().find(|(_, e)| {
                !matches!(
                    e,
                    SentEvent::UserMessage(_) | SentEvent::UserDefineOutcome(_)
                )
            }) {
                return Err(ApiError::invalid_parameter(format!(
                    "initial_events[{i}]: {:?}; initial events are a user message or an outcome definition",
                    e.type_name()
                )));
            }
            checked
        }
    };
    let environment = find_environment(&mut conn, &key, &body.environment_id).await?;
    if environment.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "environment {} is archived; it takes no new Sessions",
            environment.id
        ))
        .code(ErrorCode::EnvironmentArchived));
    }
    let agent = agents::find(&mut *conn, &key.workspace_id, &agent_id, version)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(match version {
                Some(v) => format!("agent {agent_id} has no version {v}"),
                None => format!("agent {agent_id} not found"),
            })
            .code(ErrorCode::AgentNotFound)
        })?;
    if agent.archived_at.is_some() {
        return Err(ApiError::bad_request(format!(
            "agent {agent_id} is archived; it takes no new Sessions"
        ))
        .code(ErrorCode::AgentArchived));
    }
    drop(conn);
    let session = session_service::create(
        &ctx,
        NewSession {
            workspace_id: key.workspace_id,
            environment_id: environment.id,
            agent,
            title: body.title,
            metadata,
            resources,
            initial_events,
        },
    )
    .await?;
    Ok(Json(session.render()))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}",
    tag = "Sessions",
    operation_id = "retrieveSession",
    params(("session_id" = String, Path, description = "The Session")),
    responses((status = 200, description = "The Session", body = Session), Refusals, Missing),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn retrieve(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Session>> {
    let mut conn = ctx.db.acquire().await?;
    let (session, _) = session_access(&ctx, &mut conn, &headers, &id, "Reading a Session").await?;
    Ok(Json(session.render()))
}

/// List: newest first by default; `next_page` and `prev_page` cursors.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "Sessions",
    operation_id = "listSessions",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items per page (default 20)"),
        ("page" = Option<String>, Query, description = "A `next_page` or `prev_page` cursor of an earlier page"),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "`desc` (default) or `asc` by creation"),
        ("statuses[]" = Option<Vec<SessionStatus>>, Query, style = Form, explode, description = "Only Sessions in these statuses"),
        ("agent_id" = Option<String>, Query, description = "Only this Agent's Sessions"),
        ("include_archived" = Option<bool>, Query, description = "Also list archived Sessions"),
    ),
    responses((status = 200, description = "A page of Sessions", body = SessionPage), Refusals),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn list(
    State(ctx): State<ApiContext>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<SessionPage>> {
    let (mut conn, key) = operator(&ctx, &headers, "Listing Sessions").await?;
    let params = Params::parse(query.as_deref())?;
    let limit = params.int("limit", 1, 100)?.unwrap_or(20);
    let ascending = params.order(false)?;
    let statuses = params
        .all("statuses[]")
        .into_iter()
        .map(|s| {
            SessionStatus::parse(s).ok_or_else(|| {
                ApiError::invalid_parameter(format!(
                    "statuses[] {s:?} is not idle, running, rescheduling or terminated"
                ))
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let (cursor, backwards) = match params.cursor("page")? {
        None => (None, false),
        Some((ts, id)) => match id.strip_prefix('<') {
            Some(id) => (Some((ts, id.to_string())), true),
            None => (Some((ts, id.trim_start_matches('>').to_string())), false),
        },
    };
    let filter = ListFilter {
        workspace_id: &key.workspace_id,
        statuses,
        agent_id: params.str("agent_id"),
        include_archived: params.bool("include_archived")?.unwrap_or(false),
        ascending,
    };
    let mut rows =
        sessions::list(&mut *conn, &filter, cursor.clone(), backwards, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    if more {
        if backwards {
            rows.remove(0);
        } else {
            rows.truncate(limit as usize);
        }
    }
    let next_page = (more || backwards)
        .then(|| {
            rows.last()
                .map(|r| cursor::encode(&r.created_at, &format!(">{}", r.id)))
        })
        .flatten();
    let prev_page = (cursor.is_some() && (!backwards || more))
        .then(|| {
            rows.first()
                .map(|r| cursor::encode(&r.created_at, &format!("<{}", r.id)))
        })
        .flatten();
    Ok(Json(SessionPage {
        data: rows.iter().map(SessionRow::render).collect(),
        next_page,
        prev_page,
    }))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/archive",
    tag = "Sessions",
    operation_id = "archiveSession",
    params(("session_id" = String, Path, description = "The Session")),
    responses((status = 200, description = "The archived Session", body = Session), Refusals, Missing, Conflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn archive(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Session>> {
    let (mut conn, key) = operator(&ctx, &headers, "Archiving a Session").await?;
    sessions::find(&mut *conn, Some(&key.workspace_id), &id)
        .await?
        .ok_or_else(|| not_found(&id))?;
    let row = sessions::set_archived(&mut *conn, &id, time::now())
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(row.render()))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}",
    tag = "Sessions",
    operation_id = "deleteSession",
    params(("session_id" = String, Path, description = "The Session")),
    responses((status = 200, description = "Deleted", body = SessionDeleted), Refusals, Missing, Conflicts),
    security(("bearer" = []), ("x_api_key" = []))
)]
async fn delete(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<SessionDeleted>> {
    let (mut conn, key) = operator(&ctx, &headers, "Deleting a Session").await?;
    if !sessions::delete(&mut *conn, &key.workspace_id, &id).await? {
        return Err(not_found(&id));
    }
    Ok(Json(SessionDeleted {
        id,
        kind: "session_deleted".into(),
    }))
}
