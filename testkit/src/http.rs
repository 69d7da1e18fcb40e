//! Raw calls to the api and what they return.

use crate::TestApp;
use reqwest::{Method, StatusCode};
use serde_json::Value;

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    /// `details.error_code` of an error envelope.
    pub fn code(&self) -> Option<&str> {
        self.body["error"]["details"]["error_code"].as_str()
    }
    pub fn error_type(&self) -> Option<&str> {
        self.body["error"]["type"].as_str()
    }
    /// Asserts the status and that an error reply is a complete envelope.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.body
        );
        if status >= 400 {
            assert_eq!(self.body["type"], "error", "error envelope: {}", self.body);
            assert!(
                self.body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{}",
                self.body
            );
            assert!(
                self.body["request_id"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("req_")),
                "{}",
                self.body
            );
            assert_eq!(
                self.headers.get("request-id").and_then(|v| v.to_str().ok()),
                self.body["request_id"].as_str(),
                "request-id header matches the body"
            );
        }
        self
    }
}

impl TestApp {
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        credential: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = credential {
            req = req.bearer_auth(c);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        reply(req.send().await.unwrap()).await
    }

    /// Sends `raw` bytes as the body with a JSON content type.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        credential: Option<&str>,
        raw: &str,
    ) -> Reply {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(raw.to_string());
        if let Some(c) = credential {
            req = req.bearer_auth(c);
        }
        reply(req.send().await.unwrap()).await
    }
}

pub(crate) async fn reply(resp: reqwest::Response) -> Reply {
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Reply {
        status,
        headers,
        body,
    }
}

/// `s` as a query-string value.
pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
