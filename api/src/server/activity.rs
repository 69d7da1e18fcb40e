//! Whether a connection is doing anything: requests in flight (a response
//! counts until its body ends, so an event stream or a long poll is never
//! idle), and bytes read while none is. From these, the moment a quiet
//! connection is closed: a request head must complete within the
//! header-read timeout of its first byte (or of the connection opening),
//! and a kept-alive connection waits the idle timeout for its next request.

use crate::connection_limits::ConnectionLimits;
use axum::body::{Body, Bytes};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiet {
    /// A request head did not complete in time (or none began on a new connection).
    Header,
    /// No next request on a kept-alive connection.
    Idle,
}

#[derive(Debug, Clone, Copy)]
struct State {
    in_flight: usize,
    /// When the last request ended, or the connection opened.
    idle_since: Instant,
    /// Whether a request was ever served on this connection.
    served: bool,
    /// The first byte read since `idle_since`: a request head has begun.
    head_started: Option<Instant>,
}

impl State {
    /// When this connection is closed if nothing changes, and why.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, Quiet)> {
        if self.in_flight > 0 {
            return None;
        }
        Some(match self.head_started {
            Some(at) => (at + limits.header_read_timeout, Quiet::Header),
            None if !self.served => (self.idle_since + limits.header_read_timeout, Quiet::Header),
            None => (self.idle_since + limits.idle_timeout, Quiet::Idle),
        })
    }
}

/// One connection's activity, shared by its reader, its requests and its watchdog.
pub struct Activity {
    state: Mutex<State>,
    changed: Notify,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: Instant::now(),
                served: false,
                head_started: None,
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("connection activity lock")
    }

    /// A request began; it is in flight until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlightGuard {
        let mut state = self.state();
        state.in_flight += 1;
        state.served = true;
        state.head_started = None;
        drop(state);
        self.changed.notify_waiters();
        InFlightGuard {
            activity: self.clone(),
        }
    }

    fn end(&self) {
        let mut state = self.state();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
            state.head_started = None;
        }
        drop(state);
        self.changed.notify_waiters();
    }

    fn read_some(&self) {
        let mut state = self.state();
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_waiters();
        }
    }

    pub fn is_idle(&self) -> bool {
        self.state().in_flight == 0
    }

    /// Resolves when the connection has been quiet past its deadline.
    pub async fn quiet_past(&self, limits: &ConnectionLimits) -> Quiet {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so no change is missed.
            changed.as_mut().enable();
            let deadline = self.state().deadline(limits);
            match deadline {
                None => changed.await,
                Some((at, _)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {
                            if let Some((again, why)) = self.state().deadline(limits) {
                                if again <= Instant::now() {
                                    return why;
                                }
                            }
                        }
                        _ = changed => {}
                    }
                }
            }
        }
    }
}

/// Held while a request is in flight (moved into its response body).
pub struct InFlightGuard {
    activity: Arc<Activity>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.activity.end();
    }
}

/// A response body that keeps its request in flight until hyper has
/// written (or abandoned) it.
pub struct InFlightBody {
    pub body: Body,
    pub _guard: InFlightGuard,
}

impl http_body::Body for InFlightBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, telling [`Activity`] when bytes arrive.
pub struct Watched<T> {
    pub io: T,
    pub activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_some();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        }
    }

    #[test]
    fn deadlines_follow_what_the_connection_is_doing() {
        let opened = Instant::now();
        let secs = Duration::from_secs;
        let fresh = State {
            in_flight: 0,
            idle_since: opened,
            served: false,
            head_started: None,
        };
        // A new connection that sends nothing gets the header timeout.
        assert_eq!(
            fresh.deadline(&limits()),
            Some((opened + secs(10), Quiet::Header))
        );
        // A request in flight (an event stream, a long poll) has no deadline.
        let busy = State {
            in_flight: 1,
            served: true,
            ..fresh
        };
        assert_eq!(busy.deadline(&limits()), None);
        // Kept alive after a response: the idle timeout, from its end.
        let ended = opened + secs(100);
        let kept = State {
            in_flight: 0,
            idle_since: ended,
            served: true,
            head_started: None,
        };
        assert_eq!(
            kept.deadline(&limits()),
            Some((ended + secs(60), Quiet::Idle))
        );
        // A head begun on it must complete within the header timeout.
        let begun = State {
            head_started: Some(ended + secs(5)),
            ..kept
        };
        assert_eq!(
            begun.deadline(&limits()),
            Some((ended + secs(15), Quiet::Header))
        );
    }
}
