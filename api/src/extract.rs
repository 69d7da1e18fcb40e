//! Request parsing with precise errors in the API envelope: query parameters
//! and JSON bodies are checked field by field, unknown fields are refused.

use crate::error::{ApiError, ApiResult};
use crate::store::cursor;
use mango_protocol::strict::{self, FieldError};
use mango_protocol::time::Timestamp;
use mango_protocol::{ErrorCode, ErrorType};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// Query parameters, in order, repeated keys kept (for `types[]=a&types[]=b`).
pub struct Params(Vec<(String, String)>);

impl Params {
    /// Refuses a NUL character in any name or value.
    pub fn parse(raw: Option<&str>) -> ApiResult<Params> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if let Some((k, _)) = pairs
            .iter()
            .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return Err(ApiError::invalid_parameter(format!(
                "query parameter {:?} must not contain the NUL character (U+0000)",
                k.replace('\0', "\\0")
            )));
        }
        Ok(Params(pairs))
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated parameter (`types[]=a&types[]=b`).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn int(&self, name: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        let Some(raw) = self.str(name) else {
            return Ok(None);
        };
        let value: i64 = raw.trim().parse().map_err(|_| {
            ApiError::invalid_parameter(format!("{name} must be an integer, got {raw:?}"))
        })?;
        if value < min || value > max {
            return Err(ApiError::invalid_parameter(format!(
                "{name} must be from {min} through {max}, got {value}"
            )));
        }
        Ok(Some(value))
    }

    /// An RFC 3339 timestamp (`created_at[gte]=…`); empty counts as absent.
    pub fn timestamp(&self, name: &str) -> ApiResult<Option<mango_protocol::time::Timestamp>> {
        match self.str(name) {
            None | Some("") => Ok(None),
            Some(raw) => mango_protocol::time::parse(raw).map(Some).ok_or_else(|| {
                ApiError::invalid_parameter(format!(
                    "{name} must be an RFC 3339 timestamp, got {raw:?}"
                ))
            }),
        }
    }

    /// A page cursor this API issued; empty counts as absent.
    pub fn cursor(&self, name: &str) -> ApiResult<Option<(Timestamp, String)>> {
        match self.str(name) {
            None | Some("") => Ok(None),
            Some(page) => cursor::decode(page).map(Some),
        }
    }

    /// `order=asc|desc`; absent is `ascending_by_default`.
    pub fn order(&self, ascending_by_default: bool) -> ApiResult<bool> {
        match self.str("order") {
            None => Ok(ascending_by_default),
            Some("asc") => Ok(true),
            Some("desc") => Ok(false),
            Some(other) => Err(ApiError::invalid_parameter(format!(
                "order must be asc or desc, got {other:?}"
            ))),
        }
    }

    pub fn bool(&self, name: &str) -> ApiResult<Option<bool>> {
        match self.str(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(ApiError::invalid_parameter(format!(
                "{name} must be true or false, got {other:?}"
            ))),
        }
    }
}

/// A required typed body, parsed strictly: a JSON object with exactly the
/// fields of `T` (unknown fields and wrong types refused with their path),
/// and no NUL character in any string. Handlers call it after they have
/// authenticated the caller, so a stranger learns nothing from a 400.
pub fn body<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> ApiResult<T> {
    if is_blank(bytes) {
        return Err(
            ApiError::bad_request("request body is required: send a JSON object")
                .code(ErrorCode::InvalidJson),
        );
    }
    typed(object(bytes)?)
}

/// [`body`] where an empty body means `{}` (SDK body-less POSTs send
/// `Content-Length: 0`).
pub fn optional_body<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> ApiResult<T> {
    if is_blank(bytes) {
        return typed(Value::Object(Map::new()));
    }
    typed(object(bytes)?)
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| b.is_ascii_whitespace())
}

fn object(bytes: &[u8]) -> ApiResult<Value> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!("request body is not valid JSON: {e}"))
            .code(ErrorCode::InvalidJson)
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request("request body must be a JSON object")
            .code(ErrorCode::InvalidJson));
    }
    no_nul(&value, "")?;
    Ok(value)
}

/// [`body`] whose shape errors get the code `code_of` picks.
pub fn body_coded<T: DeserializeOwned + Serialize>(
    bytes: &[u8],
    code_of: fn(&FieldError) -> ErrorCode,
) -> ApiResult<T> {
    body::<Value>(bytes).and_then(|v| typed_coded(v, code_of))
}

/// [`optional_body`] whose shape errors get the code `code_of` picks.
pub fn optional_body_coded<T: DeserializeOwned + Serialize>(
    bytes: &[u8],
    code_of: fn(&FieldError) -> ErrorCode,
) -> ApiResult<T> {
    optional_body::<Value>(bytes).and_then(|v| typed_coded(v, code_of))
}

/// Parses a checked JSON value as `T`; a wrong field is a 400 naming it
/// (`invalid_metadata` for anything under `metadata`).
pub fn typed<T: DeserializeOwned + Serialize>(value: Value) -> ApiResult<T> {
    typed_coded(value, default_code)
}

fn typed_coded<T: DeserializeOwned + Serialize>(
    value: Value,
    code_of: fn(&FieldError) -> ErrorCode,
) -> ApiResult<T> {
    strict::from_value(value).map_err(|err| {
        let code = code_of(&err);
        ApiError::bad_request(err.to_string()).code(code)
    })
}

fn default_code(err: &FieldError) -> ErrorCode {
    if err.path == "metadata" || err.path.starts_with("metadata.") {
        ErrorCode::InvalidMetadata
    } else {
        ErrorCode::InvalidParameter
    }
}

/// A [`FieldError`] as the API answers it.
pub fn field_error(err: FieldError) -> ApiError {
    let code = default_code(&err);
    ApiError::bad_request(err.to_string()).code(code)
}

/// PostgreSQL text cannot hold U+0000, so no string or key may carry one;
/// refused with its path, before anything reaches the store.
pub fn no_nul(value: &Value, path: &str) -> ApiResult<()> {
    let refuse = |at: &str| {
        let at = if at.is_empty() { "the body" } else { at };
        Err(ApiError::invalid_parameter(format!(
            "{at}: strings must not contain the NUL character (U+0000)"
        )))
    };
    match value {
        Value::String(s) if s.contains('\0') => refuse(path),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| no_nul(v, &format!("{path}[{i}]"))),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let here = strict::join(path, k);
            if k.contains('\0') {
                return refuse(&here);
            }
            no_nul(v, &here)
        }),
        _ => Ok(()),
    }
}

/// Refuses strings over `max` characters with a message naming the field.
pub fn check_len(name: &str, value: &str, max: usize) -> ApiResult<()> {
    let n = value.chars().count();
    if n > max {
        return Err(ApiError::invalid_parameter(format!(
            "{name} is {n} characters long; at most {max} are allowed"
        )));
    }
    Ok(())
}

/// The raw request body, with size and read failures in the API envelope.
pub struct RawBody(pub axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(RawBody(bytes)),
            Err(rejection) => {
                let status = rejection.status();
                if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    Err(ApiError::new(
                        status,
                        ErrorType::RequestTooLarge,
                        format!("request body is larger than {MAX_BODY_BYTES} bytes"),
                    ))
                } else {
                    Err(ApiError::bad_request(format!(
                        "could not read the request body: {}",
                        rejection.body_text()
                    )))
                }
            }
        }
    }
}

/// Largest request body the API reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
