//! The model endpoint the agent loop calls: any Messages-API-compatible
//! server. Its key is a secret: it travels as `x-api-key` only.

use mango_protocol::events::SessionErrorType;
use serde_json::Value;
use std::time::Duration;

/// A Messages-API-compatible endpoint. The key is a secret: it is sent as
/// `x-api-key` and appears nowhere else (not in events, logs or Debug).
pub struct ModelEndpoint {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
    pub max_tokens: u32,
    pub backoff: Duration,
}

impl std::fmt::Debug for ModelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEndpoint")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelFailure {
    /// The `session.error` type it becomes.
    pub kind: SessionErrorType,
    pub message: String,
    pub retryable: bool,
}

impl ModelEndpoint {
    pub fn new(base: &str, key: Option<String>) -> ModelEndpoint {
        ModelEndpoint {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(600))
                // The key travels in x-api-key, which a redirect would carry to another host.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a plain HTTP client builds"),
            base: base.trim_end_matches('/').to_string(),
            key,
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
        let resp = req.send().await.map_err(|e| ModelFailure {
            kind: SessionErrorType::ModelRequestFailedError,
            message: format!(
                "the model endpoint is unreachable ({})",
                if e.is_timeout() {
                    "timed out"
                } else {
                    "connection failed"
                }
            ),
            retryable: true,
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|_| ModelFailure {
                kind: SessionErrorType::ModelRequestFailedError,
                message: "the model endpoint answered with something that is not JSON".into(),
                retryable: false,
            });
        }
        let detail: String = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        let (kind, retryable) = match status.as_u16() {
            429 => (SessionErrorType::ModelRateLimitedError, true),
            529 | 503 => (SessionErrorType::ModelOverloadedError, true),
            500..=599 => (SessionErrorType::ModelRequestFailedError, true),
            _ => (SessionErrorType::ModelRequestFailedError, false),
        };
        Err(ModelFailure {
            kind,
            message: format!("the model endpoint answered {status}: {detail}"),
            retryable,
        })
    }
}
