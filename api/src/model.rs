//! The model endpoint the agent loop calls: any Messages-API-compatible
//! server, the Anthropic API by default. Its key is a secret: it travels as
//! `x-api-key` only. A failed call becomes a [`ModelFailure`] whose message
//! says what happened in words a user can act on, and never holds the key.

use crate::context::Secret;
use mango_protocol::events::SessionErrorType;
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::time::Duration;

/// The Anthropic API: the endpoint when no `MANGO_MODEL_BASE_URL` is given.
pub const ANTHROPIC_API: &str = "https://api.anthropic.com";

/// The longest wait a `retry-after` gets honoured for; a longer one is cut
/// to this (a step holds its Session, and one of the loop's slots, meanwhile).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Where `mango serve`'s model endpoint and key come from.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// The variable the key came from, for the start log.
    pub key_from: Option<&'static str>,
}

impl ModelConfig {
    /// `MANGO_MODEL_BASE_URL` with `MANGO_MODEL_API_KEY`; without a base URL,
    /// the Anthropic API with `MANGO_MODEL_API_KEY` or else
    /// `ANTHROPIC_API_KEY`; `None` when there is neither base URL nor key.
    /// `ANTHROPIC_API_KEY` is never sent to another endpoint than
    /// Anthropic's. Empty values count as unset.
    pub fn resolve(
        base_url: Option<String>,
        model_api_key: Option<String>,
        anthropic_api_key: Option<String>,
    ) -> Option<ModelConfig> {
        let set = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let (base_url, model_api_key) = (set(base_url), set(model_api_key));
        let keyed = |key: String, from: &'static str| (Some(Secret(key)), Some(from));
        match base_url {
            Some(base_url) => {
                let (api_key, key_from) =
                    model_api_key.map_or((None, None), |k| keyed(k, "MANGO_MODEL_API_KEY"));
                Some(ModelConfig {
                    base_url,
                    api_key,
                    key_from,
                })
            }
            None => {
                let (api_key, key_from) = match (model_api_key, set(anthropic_api_key)) {
                    (Some(k), _) => keyed(k, "MANGO_MODEL_API_KEY"),
                    (None, Some(k)) => keyed(k, "ANTHROPIC_API_KEY"),
                    (None, None) => return None,
                };
                Some(ModelConfig {
                    base_url: ANTHROPIC_API.to_string(),
                    api_key,
                    key_from,
                })
            }
        }
    }

    /// What the start log says: the endpoint and where its key came from,
    /// never the key.
    pub fn describe(&self) -> String {
        let endpoint = if self.base_url == ANTHROPIC_API {
            format!("{ANTHROPIC_API} (the Anthropic API)")
        } else {
            self.base_url.clone()
        };
        match self.key_from {
            Some(var) => format!("{endpoint}, key from {var}"),
            None => format!("{endpoint}, no key"),
        }
    }
}

/// A Messages-API-compatible endpoint. The key is a secret: it is sent as
/// `x-api-key` and appears nowhere else (not in events, logs or Debug).
pub struct ModelEndpoint {
    http: reqwest::Client,
    base: String,
    /// `host:port` of the base URL, for messages (no path, no userinfo).
    host: String,
    key: Option<String>,
    timeout: Duration,
    pub max_tokens: u32,
    pub backoff: Duration,
}

impl std::fmt::Debug for ModelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEndpoint")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelFailure {
    /// The `session.error` type it becomes.
    pub kind: SessionErrorType,
    pub message: String,
    pub retryable: bool,
    /// How long the endpoint asked to be left alone (`retry-after-ms`,
    /// `retry-after`), at most [`MAX_RETRY_AFTER`].
    pub retry_after: Option<Duration>,
}

impl ModelEndpoint {
    /// An endpoint whose calls fail after `timeout` without an answer.
    pub fn new(base: &str, key: Option<String>, timeout: Duration) -> ModelEndpoint {
        let base = base.trim_end_matches('/').to_string();
        let host = reqwest::Url::parse(&base)
            .ok()
            .and_then(|u| {
                let host = u.host_str()?.to_string();
                Some(match u.port_or_known_default() {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                })
            })
            .unwrap_or_else(|| "an unparsable URL".to_string());
        ModelEndpoint {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5).min(timeout))
                .timeout(timeout)
                // The key travels in x-api-key, which a redirect would carry to another host.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a plain HTTP client builds"),
            base,
            host,
            key: key.filter(|k| !k.is_empty()),
            timeout,
            max_tokens: 4096,
            backoff: Duration::from_secs(1),
        }
    }

    pub async fn messages(&self, body: &Value) -> Result<Value, ModelFailure> {
        let mut req = self
            .http
            .post(format!("{}/v1/messages", self.base))
            .header("anthropic-version", "2023-06-01")
            .json(body);
        if let Some(key) = &self.key {
            req = req.header("x-api-key", key);
        }
        let resp = req.send().await.map_err(|e| self.unanswered(&e))?;
        let status = resp.status();
        let retry_after = retry_after(resp.headers(), chrono::Utc::now());
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no content type")
            .to_string();
        let text = resp.text().await.map_err(|e| self.unanswered(&e))?;
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|_| ModelFailure {
                kind: SessionErrorType::ModelRequestFailedError,
                message: format!(
                    "the model endpoint answered {} with a body that is not JSON ({content_type}, {} bytes): \
                     check that MANGO_MODEL_BASE_URL names a Messages-API-compatible endpoint",
                    status_words(status),
                    text.len()
                ),
                retryable: false,
                retry_after: None,
            });
        }
        let model = body["model"].as_str().unwrap_or_default();
        Err(self.refused(status, &text, model, retry_after))
    }

    /// A call that got no answer: no connection, or none in time.
    fn unanswered(&self, err: &reqwest::Error) -> ModelFailure {
        let message = if err.is_timeout() {
            format!(
                "the model endpoint at {} did not answer within {}",
                self.host,
                seconds(self.timeout)
            )
        } else if err.is_connect() {
            format!(
                "could not connect to the model endpoint at {}: {}",
                self.host,
                root_cause(err)
            )
        } else {
            format!(
                "the request to the model endpoint at {} failed: {}",
                self.host,
                root_cause(err)
            )
        };
        ModelFailure {
            kind: SessionErrorType::ModelRequestFailedError,
            message: self.redact(message),
            retryable: true,
            retry_after: None,
        }
    }

    /// A call the endpoint answered with an error status.
    fn refused(
        &self,
        status: reqwest::StatusCode,
        body: &str,
        model: &str,
        retry_after: Option<Duration>,
    ) -> ModelFailure {
        use SessionErrorType::*;
        let (kind, retryable, what, hint) = match status.as_u16() {
            401 => (
                ModelRequestFailedError,
                false,
                "the model endpoint refused the API key".to_string(),
                Some("check MANGO_MODEL_API_KEY or ANTHROPIC_API_KEY"),
            ),
            403 => (
                ModelRequestFailedError,
                false,
                "the model endpoint does not permit this request".to_string(),
                Some("check the key's permissions"),
            ),
            404 => (
                ModelRequestFailedError,
                false,
                format!("the model endpoint has no model {model:?}"),
                Some("check the Agent's model and MANGO_MODEL_BASE_URL"),
            ),
            408 => (
                ModelRequestFailedError,
                true,
                "the model endpoint timed the request out".to_string(),
                None,
            ),
            429 => (
                ModelRateLimitedError,
                true,
                "the model endpoint is rate limiting this api".to_string(),
                None,
            ),
            503 | 529 => (
                ModelOverloadedError,
                true,
                "the model endpoint is overloaded".to_string(),
                None,
            ),
            500..=599 => (
                ModelRequestFailedError,
                true,
                "the model endpoint failed".to_string(),
                None,
            ),
            _ => (
                ModelRequestFailedError,
                false,
                "the model endpoint refused the request".to_string(),
                None,
            ),
        };
        let mut message = format!("{what} ({}", status_words(status));
        if let Some(detail) = error_detail(body) {
            message.push_str(": ");
            message.push_str(&detail);
        }
        message.push(')');
        if let Some(hint) = hint {
            message.push_str(": ");
            message.push_str(hint);
        }
        ModelFailure {
            kind,
            message: self.redact(message),
            retryable,
            retry_after: retry_after.filter(|_| retryable),
        }
    }

    /// The message without the key, should the endpoint have echoed it.
    fn redact(&self, message: String) -> String {
        match &self.key {
            Some(key) if message.contains(key.as_str()) => {
                message.replace(key.as_str(), "[redacted]")
            }
            _ => message,
        }
    }
}

/// `429 Too Many Requests`, or `529` for a code without a standard reason.
fn status_words(status: reqwest::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 && s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.3} s")
    }
}

/// The innermost error of a chain: the one that names what went wrong
/// (`Connection refused (os error 111)`), not the URL.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// `type: message` of a Messages API error body, at most 300 characters.
fn error_detail(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let error = v.get("error")?;
    let message = error.get("message").and_then(Value::as_str);
    let kind = error.get("type").and_then(Value::as_str);
    let detail = match (kind, message) {
        (Some(k), Some(m)) => format!("{k}: {m}"),
        (Some(s), None) | (None, Some(s)) => s.to_string(),
        (None, None) => return None,
    };
    Some(detail.chars().take(300).collect())
}

/// The wait an answer asks for: `retry-after-ms` (milliseconds), else
/// `retry-after` (seconds, or an HTTP date), at most [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let from_secs =
        |s: f64| (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(1e6)));
    let wait = if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        from_secs(ms / 1000.0)
    } else {
        let value = header("retry-after")?;
        match value.parse::<f64>() {
            Ok(secs) => from_secs(secs),
            Err(_) => {
                let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
                let ms = (at.with_timezone(&chrono::Utc) - now)
                    .num_milliseconds()
                    .max(0);
                Some(Duration::from_millis(ms as u64))
            }
        }
    }?;
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates_within_the_cap() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let wait = |pairs: &[(&'static str, &str)]| retry_after(&headers(pairs), now);
        assert_eq!(wait(&[]), None);
        assert_eq!(wait(&[("retry-after", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(
            wait(&[("retry-after", "0.5")]),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            wait(&[("retry-after", "2"), ("retry-after-ms", "250")]),
            Some(Duration::from_millis(250)),
            "milliseconds win, as in the SDK"
        );
        assert_eq!(
            wait(&[("retry-after", "Thu, 01 Jan 2026 00:00:07 GMT")]),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            wait(&[("retry-after", "Wed, 31 Dec 2025 00:00:00 GMT")]),
            Some(Duration::ZERO),
            "a date gone by means now"
        );
        assert_eq!(wait(&[("retry-after", "3600")]), Some(MAX_RETRY_AFTER));
        assert_eq!(wait(&[("retry-after", "soon")]), None);
        assert_eq!(wait(&[("retry-after", "-1")]), None);
    }

    #[test]
    fn the_anthropic_api_is_the_default_and_its_key_goes_nowhere_else() {
        let s = |v: &str| Some(v.to_string());
        let none = ModelConfig::resolve(None, None, None);
        assert!(none.is_none(), "no base URL and no key: no model");
        let empty = ModelConfig::resolve(s(""), s(""), s(" "));
        assert!(empty.is_none(), "empty values are unset");

        let anthropic = ModelConfig::resolve(None, None, s("sk-ant-1")).unwrap();
        assert_eq!(anthropic.base_url, "https://api.anthropic.com");
        assert_eq!(anthropic.api_key.as_ref().unwrap().0, "sk-ant-1");
        assert_eq!(
            anthropic.describe(),
            "https://api.anthropic.com (the Anthropic API), key from ANTHROPIC_API_KEY"
        );
        assert!(!format!("{anthropic:?}").contains("sk-ant-1"));

        let own_key = ModelConfig::resolve(None, s("sk-mango"), s("sk-ant-1")).unwrap();
        assert_eq!(own_key.base_url, ANTHROPIC_API);
        assert_eq!(
            own_key.api_key.unwrap().0,
            "sk-mango",
            "MANGO_MODEL_API_KEY wins"
        );

        let custom = ModelConfig::resolve(s("http://gw:8080"), None, s("sk-ant-1")).unwrap();
        assert_eq!(custom.base_url, "http://gw:8080");
        assert!(
            custom.api_key.is_none(),
            "ANTHROPIC_API_KEY is not sent to another endpoint"
        );
        assert_eq!(custom.describe(), "http://gw:8080, no key");
        let keyed = ModelConfig::resolve(s("http://gw:8080"), s("k"), None).unwrap();
        assert_eq!(
            keyed.describe(),
            "http://gw:8080, key from MANGO_MODEL_API_KEY"
        );
    }

    #[test]
    fn an_echoed_key_is_redacted_from_a_failure() {
        let endpoint = ModelEndpoint::new(
            "http://user:pw@127.0.0.1:9/",
            Some("sk-secret".into()),
            Duration::from_secs(1),
        );
        let failure = endpoint.refused(
            reqwest::StatusCode::UNAUTHORIZED,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key sk-secret"}}"#,
            "m",
            None,
        );
        assert_eq!(
            failure.message,
            "the model endpoint refused the API key (401 Unauthorized: authentication_error: \
             invalid x-api-key [redacted]): check MANGO_MODEL_API_KEY or ANTHROPIC_API_KEY"
        );
        assert!(!failure.retryable);
        assert!(!format!("{endpoint:?}").contains("pw"), "{endpoint:?}");
    }
}
