//! One error type for the whole API, rendered as the SDK's error envelope
//! with a `request-id` header; the status and `error_code` pick the SDK class.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mango_protocol::{ErrorCode, ErrorType};
use serde_json::{json, Map, Value};

tokio::task_local! {
    /// The id of the request being served, set by the request-id middleware.
    pub static REQUEST_ID: String;
}

pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(|id| id.clone()).ok()
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: ErrorType,
    pub message: String,
    pub details: Map<String, Value>,
    /// `x-should-retry: false` for answers a retry cannot change (SDK retries 409).
    pub final_answer: bool,
    /// `retry-after`, in whole seconds: when a retry can succeed (429).
    pub retry_after: Option<u64>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, kind: ErrorType, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            details: Map::new(),
            final_answer: false,
            retry_after: None,
        }
    }
    pub fn code(mut self, code: ErrorCode) -> Self {
        self.details
            .insert("error_code".into(), Value::String(code.as_str().into()));
        self
    }
    pub fn detail(mut self, key: &str, value: Value) -> Self {
        self.details.insert(key.into(), value);
        self
    }
    pub fn final_answer(mut self) -> Self {
        self.final_answer = true;
        self
    }
    /// Sends `retry-after: <seconds>` (at least 1).
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            message,
        )
    }
    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::bad_request(message).code(ErrorCode::InvalidParameter)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorType::AuthenticationError,
            message,
        )
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, ErrorType::PermissionError, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorType::NotFoundError, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, ErrorType::ConflictError, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::RequestTooLarge,
            message,
        )
    }
    pub fn rate_limited(message: impl Into<String>, retry_after_seconds: u64) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimitError,
            message,
        )
        .retry_after(retry_after_seconds)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::ApiError,
            message,
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::OverloadedError,
            message,
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        let sqlstate = match &err {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        match &err {
            sqlx::Error::PoolTimedOut => {
                tracing::warn!("database pool exhausted");
                ApiError::unavailable("the database is busy; retry shortly")
            }
            // Class 22, data exception: a value the request carried that
            // PostgreSQL cannot hold (out of range, invalid text). The
            // statement failed, so nothing changed.
            _ if sqlstate.as_deref().is_some_and(|s| s.starts_with("22")) => {
                tracing::debug!(error = %err, request_id = current_request_id(), "request data refused by the database");
                ApiError::invalid_parameter(
                    "a value in the request cannot be stored (out of range or invalid); nothing changed",
                )
            }
            // A row the request refers to went away meanwhile.
            _ if sqlstate.as_deref() == Some("23503") => {
                tracing::debug!(error = %err, request_id = current_request_id(), "foreign key violation");
                ApiError::conflict(
                    "something this request refers to was deleted or is still in use; nothing changed",
                )
            }
            _ => {
                // The message may carry SQL details; keep it in the log, not the response.
                tracing::error!(error = %err, request_id = current_request_id(), "database error");
                ApiError::internal("internal error; the request changed nothing")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        let request_id = current_request_id();
        if !self.details.contains_key("error_code") {
            self.details.insert(
                "error_code".into(),
                Value::String(self.kind.default_code().as_str().into()),
            );
        }
        let error =
            json!({ "type": self.kind.as_str(), "message": self.message, "details": self.details });
        let body = json!({ "type": "error", "error": error, "request_id": request_id });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.final_answer {
            response
                .headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
