//! Request parsing with precise errors in the API envelope: query parameters
//! and JSON bodies are checked field by field, unknown fields are refused.

use crate::error::{ApiError, ApiResult};
use mango_protocol::{ErrorCode, ErrorType};
use serde_json::{Map, Value};

/// Query parameters, in order, repeated keys kept (for `types[]=a&types[]=b`).
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(raw: Option<&str>) -> Params {
        Params(
            form_urlencoded::parse(raw.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
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

/// A JSON object body whose fields are read one by one.
pub struct Body(pub Map<String, Value>);

impl Body {
    /// Parses a required JSON object, refusing fields outside `allowed`.
    pub fn parse(bytes: &[u8], allowed: &[&str]) -> ApiResult<Body> {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(
                ApiError::bad_request("request body is required: send a JSON object")
                    .code(ErrorCode::InvalidJson),
            );
        }
        Self::object(bytes, allowed)
    }

    /// An optional body: empty means `{}` (SDK body-less POSTs send Content-Length: 0).
    pub fn parse_optional(bytes: &[u8], allowed: &[&str]) -> ApiResult<Body> {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(Body(Map::new()));
        }
        Self::object(bytes, allowed)
    }

    fn object(bytes: &[u8], allowed: &[&str]) -> ApiResult<Body> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("request body is not valid JSON: {e}"))
                .code(ErrorCode::InvalidJson)
        })?;
        let Value::Object(map) = value else {
            return Err(ApiError::bad_request("request body must be a JSON object")
                .code(ErrorCode::InvalidJson));
        };
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::invalid_parameter(format!(
                "unknown field {unknown:?}; expected one of: {}",
                allowed.join(", ")
            )));
        }
        Ok(Body(map))
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    pub fn required(&self, name: &str) -> ApiResult<&Value> {
        match self.0.get(name) {
            None | Some(Value::Null) => {
                Err(ApiError::invalid_parameter(format!("{name} is required")))
            }
            Some(v) => Ok(v),
        }
    }

    pub fn required_str(&self, name: &str) -> ApiResult<&str> {
        self.required(name)?
            .as_str()
            .ok_or_else(|| ApiError::invalid_parameter(format!("{name} must be a string")))
    }

    /// Absent → `None`; null → `Some(None)`; string → `Some(Some(s))`.
    pub fn nullable_str(&self, name: &str) -> ApiResult<Option<Option<&str>>> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(Value::String(s)) => Ok(Some(Some(s))),
            Some(_) => Err(ApiError::invalid_parameter(format!(
                "{name} must be a string or null"
            ))),
        }
    }

    pub fn optional_bool(&self, name: &str) -> ApiResult<Option<bool>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid_parameter(format!(
                "{name} must be a boolean"
            ))),
        }
    }

    pub fn optional_int(&self, name: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(ApiError::invalid_parameter(format!(
                    "{name} must be an integer from {min} through {max}"
                ))),
            },
            Some(_) => Err(ApiError::invalid_parameter(format!(
                "{name} must be an integer"
            ))),
        }
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
