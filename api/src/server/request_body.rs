//! A request's body read to its end before its response goes out. A
//! handler that answers without reading the body (Ack takes none; a
//! refusal can come before the read) leaves the rest to hyper, which, when
//! the body has not all arrived yet, stops reading and closes the
//! connection after a response that promised keep-alive: a client that sent
//! its next request on it meanwhile (httpx, reqwest) gets no answer at all.
//! So what the app left is drained here, bounded in bytes and time; a body
//! too large or too slow for that, or one the client waits on a
//! `100 Continue` to send, gets `Connection: close` on its response, and
//! the client knows to open a new connection.

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Request, Response};
use http_body::Body as _;
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// At most this much of a body the app left unread is drained (the api's
/// own body limit): a larger rest closes the connection instead.
pub const MAX_DRAINED_BYTES: usize = crate::extract::MAX_BODY_BYTES;

/// The body as the app sees it; dropped unread, it hands what is left back.
pub struct Returned {
    inner: Option<Incoming>,
    left: Arc<Mutex<Option<Incoming>>>,
}

impl Drop for Returned {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take() {
            if !body.is_end_stream() {
                *self.left.lock().expect("unread body lock") = Some(body);
            }
        }
    }
}

impl http_body::Body for Returned {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        match self.get_mut().inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map(|b| b.size_hint())
            .unwrap_or_else(|| http_body::SizeHint::with_exact(0))
    }
}

/// What of a request's body the app may leave unread.
pub struct Leftover {
    left: Arc<Mutex<Option<Incoming>>>,
    /// The client sends the body only once told `100 Continue`: draining it
    /// would ask for an upload nobody wants.
    awaits_continue: bool,
}

/// `request` with a body that hands back what the app leaves of it.
pub fn watch(request: Request<Incoming>) -> (Request<Returned>, Leftover) {
    let awaits_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let left = Arc::new(Mutex::new(None));
    let request = request.map(|body| Returned {
        inner: Some(body),
        left: left.clone(),
    });
    (
        request,
        Leftover {
            left,
            awaits_continue,
        },
    )
}

impl Leftover {
    /// Drains what the app left of the body, within `within`; when that
    /// cannot be done, `response` says the connection closes after it.
    pub async fn settle<B>(self, mut response: Response<B>, within: Duration) -> Response<B> {
        let left = self.left.lock().expect("unread body lock").take();
        let Some(body) = left else {
            return response;
        };
        // A rest declared larger than the bound is not waited for at all.
        let drained = !self.awaits_continue
            && body.size_hint().lower() <= MAX_DRAINED_BYTES as u64
            && tokio::time::timeout(within, drain(body, MAX_DRAINED_BYTES))
                .await
                .unwrap_or(false);
        if !drained {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Reads `body` to its end, unless it holds more than `max` bytes or fails.
async fn drain(mut body: Incoming, max: usize) -> bool {
    let mut read = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(frame) = frame else { return false };
        if let Some(data) = frame.data_ref() {
            read += data.len();
            if read > max {
                return false;
            }
        }
    }
    true
}
