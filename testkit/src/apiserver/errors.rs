//! Refusals as a real apiserver writes them: a `Status` body whose code,
//! reason, message and `details.causes` follow
//! k8s.io/apimachinery/pkg/api/errors/errors.go and
//! pkg/util/validation/field/errors.go.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// One `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, …
    pub reason: &'static str,
    pub field: String,
    /// The cause's message: the error without its field.
    pub message: String,
}

/// Go's `%#v` of a value as field errors quote it.
fn quoted(value: &Value) -> String {
    match value {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

impl FieldError {
    pub fn invalid(field: &str, value: Value, detail: String) -> FieldError {
        let mut message = format!("Invalid value: {}", quoted(&value));
        if !detail.is_empty() {
            message.push_str(&format!(": {detail}"));
        }
        FieldError {
            reason: "FieldValueInvalid",
            field: field.into(),
            message,
        }
    }

    pub fn required(field: &str, detail: &str) -> FieldError {
        FieldError {
            reason: "FieldValueRequired",
            field: field.into(),
            message: if detail.is_empty() {
                "Required value".into()
            } else {
                format!("Required value: {detail}")
            },
        }
    }

    pub fn forbidden(field: &str, detail: &str) -> FieldError {
        FieldError {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    pub fn duplicate(field: &str, value: Value) -> FieldError {
        FieldError {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {}", quoted(&value)),
        }
    }

    pub fn not_found(field: &str, value: Value) -> FieldError {
        FieldError {
            reason: "FieldValueNotFound",
            field: field.into(),
            message: format!("Not found: {}", quoted(&value)),
        }
    }

    pub fn not_supported(field: &str, value: Value, supported: &[&str]) -> FieldError {
        let supported: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        FieldError {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                quoted(&value),
                supported.join(", ")
            ),
        }
    }

    /// `field.TooLong` (1.30+ wording).
    pub fn too_long(field: &str, max: usize, unit: &str) -> FieldError {
        FieldError {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: format!("Too long: may not be more than {max} {unit}"),
        }
    }

    pub fn type_invalid(field: &str, value: Value, detail: &str) -> FieldError {
        FieldError {
            reason: "FieldValueTypeInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", quoted(&value)),
        }
    }

    fn line(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// What a request is refused with.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> ApiError {
        ApiError {
            code,
            reason,
            message,
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message.into())
    }

    /// `NewNotFound`: `pods "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let qualified = qualified_resource(group, plural);
        ApiError::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(details(group, plural, name))
    }

    /// No such resource or path.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
        .with_details(json!({}))
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        let qualified = qualified_resource(group, plural);
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(details(group, plural, name))
    }

    /// `NewConflict` for a stale `resourceVersion` (or a failed precondition).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> ApiError {
        let qualified = qualified_resource(group, plural);
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with_details(details(group, plural, name))
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> ApiError {
        ApiError::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// A server-side apply conflict with other field managers
    /// (apiserver/pkg/endpoints/handlers/fieldmanager: `NewConflictError`).
    pub fn apply_conflicts(conflicts: &[(String, String, String)]) -> ApiError {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, api_version, field)| {
                json!({"reason": "FieldManagerConflict",
                       "message": format!("conflict with \"{manager}\" using {api_version}"),
                       "field": field})
            })
            .collect();
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(manager, api_version, field)| {
                format!("conflict with \"{manager}\" using {api_version}: {field}")
            })
            .collect();
        let message = if lines.len() == 1 {
            format!("Apply failed with 1 conflict: {}", lines[0])
        } else {
            format!(
                "Apply failed with {} conflicts: {}",
                lines.len(),
                lines.join("\n")
            )
        };
        ApiError::new(409, "Conflict", message).with_details(json!({"causes": causes}))
    }

    /// `NewInvalid`: 422 with one cause per field error.
    pub fn invalid(group: &str, kind: &str, name: &str, errs: &[FieldError]) -> ApiError {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let lines: Vec<String> = errs.iter().map(FieldError::line).collect();
        let joined = if lines.len() == 1 {
            lines[0].clone()
        } else {
            format!("[{}]", lines.join(", "))
        };
        let causes: Vec<Value> = errs
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        let mut details = json!({"name": name, "kind": kind, "causes": causes});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {joined}"),
        )
        .with_details(details)
    }

    /// `NewForbidden`.
    pub fn forbidden(group: &str, plural: &str, name: &str, why: &str) -> ApiError {
        let qualified = qualified_resource(group, plural);
        ApiError::new(
            403,
            "Forbidden",
            format!("{qualified} \"{name}\" is forbidden: {why}"),
        )
        .with_details(details(group, plural, name))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message.into()).with_details(json!({}))
    }

    /// `NewGone`/`NewResourceExpired`: a resourceVersion compacted away.
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message.into())
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message.into()).with_details(json!({}))
    }

    /// `NewTimeoutError` for a resourceVersion the server has not reached.
    pub fn too_large_resource_version(asked: u64, current: u64) -> ApiError {
        ApiError::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {asked}, current: {current}"),
        )
        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge",
            "message": "Too large resource version"}], "retryAfterSeconds": 1}))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({"causes": [{"message": message}]}))
    }

    /// API Priority and Fairness shedding a request (`Retry-After: 1`).
    pub fn too_many_requests() -> ApiError {
        ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
        )
        .with_details(json!({"retryAfterSeconds": 1}))
    }

    /// The `Status` body.
    pub fn status(&self) -> Value {
        let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `pods`, or `workerpools.mango.dev` for a grouped resource.
pub fn qualified_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    let mut details = json!({"name": name, "kind": plural});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    details
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = self
            .details
            .as_ref()
            .and_then(|d| d["retryAfterSeconds"].as_u64());
        let mut response = (
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(self.status()),
        )
            .into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}
