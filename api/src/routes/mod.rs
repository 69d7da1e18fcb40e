//! The HTTP surface: one router, a request-id middleware, health endpoints,
//! and API-envelope answers for unknown routes and panics.

pub mod agents;
pub mod environments;
pub mod events;
pub mod memories;
pub mod memory_stores;
pub mod sessions;
pub mod skills;
pub mod work;

use crate::context::ApiContext;
use crate::error::{ApiError, REQUEST_ID};
use crate::extract::MAX_BODY_BYTES;
use crate::ids;
use crate::openapi::{self, Health};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use mango_protocol::{ErrorEnvelope, ErrorType};
use std::sync::LazyLock;
use std::time::Instant;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Every operation, with its OpenAPI description: the router that serves
/// them is the one that documents them (`utoipa_axum::routes!`).
fn operations() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(agents::router())
        .merge(environments::router())
        .merge(work::router())
        .merge(sessions::router())
        .merge(events::router())
        .merge(memory_stores::router())
        .merge(memories::router())
        .merge(skills::router())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
}

/// The OpenAPI document of every route [`router`] serves.
pub fn openapi() -> utoipa::openapi::OpenApi {
    openapi::finish(operations().split_for_parts().1)
}

pub fn router(ctx: ApiContext) -> Router {
    let (routes, _) = operations().split_for_parts();
    routes
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                ErrorType::InvalidRequestError,
                "method not allowed on this endpoint",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(refuse_nul_in_path))
        .layer(middleware::from_fn_with_state(ctx.clone(), request_context))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::internal("internal error").into_response()
        }))
        .with_state(ctx)
}

/// Liveness: the process serves requests.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "Operations",
    operation_id = "healthz",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Health))
)]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "Operations",
    operation_id = "readyz",
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = Health),
        (status = 503, description = "The database is unreachable (`overloaded_error`)", body = ErrorEnvelope),
    )
)]
async fn readyz(State(ctx): State<ApiContext>) -> Response {
    match crate::store::ping(&ctx.db).await {
        Ok(_) => Json(Health {
            status: "ready".into(),
        })
        .into_response(),
        Err(_) => ApiError::unavailable("database unreachable").into_response(),
    }
}

/// A path holding `%00`, which axum would decode into an id, names nothing:
/// PostgreSQL text cannot hold U+0000, so no id does. Refused as a NUL in a
/// body or query is, rather than with the database's refusal of the lookup.
async fn refuse_nul_in_path(req: Request, next: Next) -> Response {
    if req.uri().path().contains("%00") {
        return ApiError::invalid_parameter(
            "the path must not contain the NUL character (U+0000, %00): no id holds one",
        )
        .into_response();
    }
    next.run(req).await
}

/// Prometheus counters, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "Operations",
    operation_id = "metrics",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String))
)]
async fn metrics(State(ctx): State<ApiContext>) -> String {
    crate::metrics::render(&ctx.metrics, &ctx.db).await
}

/// This document (docs/openapi.json).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "Operations",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", content_type = "application/json", body = Object))
)]
async fn openapi_json() -> Response {
    static DOCUMENT: LazyLock<String> = LazyLock::new(|| openapi::to_json(&openapi()));
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}

/// Gives every request an id (in the `request-id` header and any error body)
/// and logs it; server errors at WARN, the rest at DEBUG.
async fn request_context(State(ctx): State<ApiContext>, req: Request, next: Next) -> Response {
    let id = ids::new_id("req");
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = Instant::now();
    let mut response = REQUEST_ID.scope(id.clone(), next.run(req)).await;
    let status = response.status().as_u16();
    ctx.metrics.response(status);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::warn!(request_id = %id, %method, %path, status, elapsed_ms, "request failed");
    } else {
        tracing::debug!(request_id = %id, %method, %path, status, elapsed_ms, "request");
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("request-id", value);
    }
    response
}
