//! A lean HTTP/1.1 path for the item runner's per-call request: sending a
//! tool result. reqwest does work per request that this one request does not
//! need: its redirect layer formats and re-parses the whole URL (host
//! included) even with redirects off, it consults proxy rules, clones its
//! default headers and checks a connection out of a keyed pool. All of that
//! sits between a command's end and its result leaving: in the runner, that
//! stretch went from 54 to 40 µs (p50) on this path.
//!
//! The lane keeps a few idle kept-alive connections of its own (hyper's
//! `http1` client), writes the request with headers built once, and reads
//! the answer whole. A connection goes back to the lane only after a whole
//! answer was read on it; any failure drops it, so the next request opens a
//! fresh one. Failures are transport errors: transient, as reqwest's are.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Mutex;

/// Idle connections kept; more concurrent senders open and then close their own.
const IDLE_KEPT: usize = 2;

pub(crate) struct Lane {
    /// `host:port` to connect to.
    address: String,
    host: HeaderValue,
    authorization: HeaderValue,
    /// The base URL's path, without a trailing `/`.
    path_prefix: String,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

/// A whole answer: status, headers and body.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LaneError(String);

impl Lane {
    /// A lane to `base` (an `http://` URL), or `None` for any other base.
    pub(crate) fn new(base: &reqwest::Url, authorization: &HeaderValue) -> Option<Lane> {
        if base.scheme() != "http" {
            return None;
        }
        // An IPv6 host comes bracketed, as both the address and `Host` want it.
        let host = base.host_str()?;
        let port = base.port_or_known_default()?;
        let address = format!("{host}:{port}");
        let host_header = match base.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        Some(Lane {
            address,
            host: HeaderValue::from_str(&host_header).ok()?,
            authorization: authorization.clone(),
            path_prefix: base.path().trim_end_matches('/').to_string(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Whether `path` goes on the wire as it is: only unreserved characters
    /// and `/` (anything else takes reqwest's path, which encodes it).
    pub(crate) fn carries(path: &str) -> bool {
        path.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~'))
    }

    /// POSTs `body` (JSON) to `path` (see [`Lane::carries`]) with the
    /// client's credential and beta header.
    pub(crate) async fn post_json(&self, path: &str, body: Bytes) -> Result<Answer, LaneError> {
        let (mut sender, mut reused) = match self.take_idle() {
            Some(sender) => (sender, true),
            None => (self.connect().await?, false),
        };
        let response = loop {
            match sender.send_request(self.request(path, body.clone())?).await {
                Ok(response) => break response,
                // A kept connection the server closed before the request went
                // out: nothing was sent, so a fresh connection may send it now.
                Err(e) if reused && e.is_canceled() => {
                    sender = self.connect().await?;
                    reused = false;
                }
                Err(e) => return Err(LaneError(format!("sending to {}: {e}", self.address))),
            }
        };
        let (head, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            // An error answer stays what its status says (as reqwest's path
            // reads it); a success must arrive whole.
            Err(_) if !head.status.is_success() => {
                return Ok(Answer {
                    status: head.status,
                    headers: head.headers,
                    body: Bytes::new(),
                })
            }
            Err(e) => {
                return Err(LaneError(format!(
                    "reading the answer from {}: {e}",
                    self.address
                )))
            }
        };
        self.put_back(sender);
        Ok(Answer {
            status: head.status,
            headers: head.headers,
            body,
        })
    }

    fn request(&self, path: &str, body: Bytes) -> Result<Request<Full<Bytes>>, LaneError> {
        let length = HeaderValue::from(body.len());
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.path_prefix))
            .body(Full::new(body))
            .map_err(|e| LaneError(format!("building the request: {e}")))?;
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(AUTHORIZATION, self.authorization.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CONTENT_LENGTH, length);
        headers.insert(
            "anthropic-beta",
            HeaderValue::from_static(crate::BETA_HEADER),
        );
        Ok(request)
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().expect("lane lock");
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn put_back(&self, sender: SendRequest<Full<Bytes>>) {
        let mut idle = self.idle.lock().expect("lane lock");
        if idle.len() < IDLE_KEPT && !sender.is_closed() {
            idle.push(sender);
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, LaneError> {
        let connecting = tokio::net::TcpStream::connect(&self.address);
        let stream = tokio::time::timeout(crate::CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| LaneError(format!("connecting to {}: timed out", self.address)))?
            .map_err(|e| LaneError(format!("connecting to {}: {e}", self.address)))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| LaneError(format!("connecting to {}: {e}", self.address)))?;
        tokio::spawn(async move {
            // Ends when the server closes the connection or the lane drops it.
            let _ = connection.await;
        });
        Ok(sender)
    }
}
