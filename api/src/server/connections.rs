//! The accept loop of one listener and the life of each connection it
//! accepts: the per-peer and process-wide caps (a connection past either is
//! closed as soon as it is accepted), the header-read and idle timeouts
//! ([`super::activity`]), each request's body read to its end before its
//! response ([`super::request_body`]), and backing off when `accept` fails (out of file
//! descriptors), so a flood can neither crash the loop nor make it spin.

use super::activity::{Activity, InFlightBody, Quiet, Watched};
use super::request_body;
use crate::connection_limits::{Audience, ConnectionLimits};
use crate::metrics::{Connections, Metrics};
use axum::Router;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

/// Open connections, counted against the caps, shared by every listener.
pub struct Gate {
    limits: ConnectionLimits,
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    total: usize,
    /// Per listener kind ([`Audience::index`]), per peer address.
    peers: [HashMap<IpAddr, usize>; 3],
}

/// Why a connection was closed at accept.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    PeerLimit,
    GlobalLimit,
}

impl Gate {
    pub fn new(limits: ConnectionLimits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            state: Mutex::default(),
        })
    }

    /// Counts a connection of `peer` on `audience`'s listener, or says which cap it meets.
    pub fn admit(self: &Arc<Self>, audience: Audience, peer: IpAddr) -> Result<Permit, Refusal> {
        // An IPv4 client of a dual-stack socket is the same peer as over IPv4.
        let peer = peer.to_canonical();
        let mut state = self.state.lock().expect("connection gate lock");
        if state.total >= self.limits.max_connections {
            return Err(Refusal::GlobalLimit);
        }
        let held = state.peers[audience.index()].entry(peer).or_insert(0);
        if *held >= self.limits.per_peer(audience) {
            return Err(Refusal::PeerLimit);
        }
        *held += 1;
        state.total += 1;
        Ok(Permit {
            gate: self.clone(),
            audience,
            peer,
        })
    }
}

/// One admitted connection; dropping it frees its place.
pub struct Permit {
    gate: Arc<Gate>,
    audience: Audience,
    peer: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock().expect("connection gate lock");
        state.total -= 1;
        let peers = &mut state.peers[self.audience.index()];
        if let Some(held) = peers.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// The pause after a failed `accept`: 10 ms, doubling to at most 1 s, back
/// to 10 ms after the next success.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    pub const FIRST: Duration = Duration::from_millis(10);
    pub const MAX: Duration = Duration::from_secs(1);

    pub fn failed(&mut self) -> Duration {
        let delay = Self::FIRST.saturating_mul(1 << self.failures.min(16));
        self.failures = self.failures.saturating_add(1);
        delay.min(Self::MAX)
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
    }
}

/// Errors of one connection that never reached us, not of the listener.
fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// At most one warning per interval for a kind of event a flood repeats.
struct Throttle {
    last: Option<tokio::time::Instant>,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    fn ready(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.last.is_some_and(|at| now - at < Self::EVERY) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// What every connection of one listener shares.
#[derive(Clone)]
pub struct Shared {
    pub audience: Audience,
    pub app: Router,
    pub gate: Arc<Gate>,
    pub metrics: Arc<Metrics>,
    pub limits: ConnectionLimits,
}

impl Shared {
    fn counters(&self) -> &Connections {
        &self.metrics.connections[self.audience.index()]
    }
}

/// Accepts until `stopping` turns true, then lets the connections finish:
/// idle ones are closed at once, busy ones once their requests end.
pub async fn accept_loop(
    listener: TcpListener,
    shared: Shared,
    mut stopping: watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::default();
    let mut refusals = Throttle { last: None };
    let mut failures = Throttle { last: None };
    let at = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stopping.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        match accepted {
            Ok((tcp, peer)) => {
                backoff.succeeded();
                match shared.gate.admit(shared.audience, peer.ip()) {
                    Ok(permit) => {
                        let shared = shared.clone();
                        let stopping = stopping.clone();
                        connections.spawn(serve_connection(tcp, permit, shared, stopping));
                    }
                    Err(refusal) => {
                        drop(tcp);
                        refused(&shared, refusal, peer, &mut refusals);
                    }
                }
            }
            Err(err) if is_connection_error(&err) => {}
            Err(err) => {
                Metrics::count(&shared.counters().accept_errors);
                let delay = backoff.failed();
                if failures.ready() {
                    tracing::error!(listener = shared.audience.label(), addr = ?at, error = %err, ?delay, "cannot accept connections (out of file descriptors?); backing off");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stopping.wait_for(|stop| *stop) => break,
                }
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

fn refused(shared: &Shared, refusal: Refusal, peer: SocketAddr, log: &mut Throttle) {
    let counters = shared.counters();
    let (counter, cap, what) = match refusal {
        Refusal::PeerLimit => (
            &counters.refused_peer_limit,
            shared.limits.per_peer(shared.audience),
            "this peer holds its cap of connections",
        ),
        Refusal::GlobalLimit => (
            &counters.refused_global_limit,
            shared.limits.max_connections,
            "the process holds MANGO_MAX_CONNECTIONS",
        ),
    };
    Metrics::count(counter);
    if log.ready() {
        tracing::warn!(listener = shared.audience.label(), peer = %peer.ip(), cap, "closed a new connection: {what} (further ones are counted in mango_http_connections_refused_total, logged at most every 10 s)");
    }
}

async fn serve_connection(
    tcp: TcpStream,
    permit: Permit,
    shared: Shared,
    mut stopping: watch::Receiver<bool>,
) {
    // Event streams write each frame as it commits; with Nagle's algorithm a
    // frame that follows an unacknowledged one would wait for the reader's
    // delayed ACK (up to 40 ms).
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::warn!(error = %err, "cannot set TCP_NODELAY on a connection");
    }
    let counters = shared.counters();
    counters.open.fetch_add(1, Relaxed);
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        let app = shared.app.clone();
        let drain_within = shared.limits.header_read_timeout;
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let guard = activity.begin();
            let app = app.clone();
            async move {
                let (request, leftover) = request_body::watch(request);
                let response = app.oneshot(request).await.unwrap_or_else(|e| match e {});
                let response = leftover.settle(response, drain_within).await;
                Ok::<_, Infallible>(response.map(|body| InFlightBody {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    let io = hyper_util::rt::TokioIo::new(Watched {
        io: tcp,
        activity: activity.clone(),
    });
    // The header-read timeout is Activity's, which starts at a head's first
    // byte rather than when the connection goes idle.
    let connection = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(err) = served {
                    tracing::trace!(error = %err, "connection ended with an error");
                }
                break;
            }
            quiet = activity.quiet_past(&shared.limits) => {
                Metrics::count(match quiet {
                    Quiet::Header => &counters.header_timeouts,
                    Quiet::Idle => &counters.idle_timeouts,
                });
                break;
            }
            _ = stopping.wait_for(|stop| *stop), if !shutting_down => {
                if activity.is_idle() {
                    break;
                }
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
    counters.open.fetch_sub(1, Relaxed);
    drop(permit);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(per_peer: usize, sandbox_per_peer: usize, total: usize) -> Arc<Gate> {
        Gate::new(ConnectionLimits {
            max_per_peer: per_peer,
            sandbox_max_per_peer: sandbox_per_peer,
            max_connections: total,
            ..ConnectionLimits::default()
        })
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_peer_gets_its_cap_and_not_one_more_and_a_closed_connection_frees_a_place() {
        let gate = gate(3, 1, 100);
        let held: Vec<_> = (0..3)
            .map(|_| gate.admit(Audience::Operators, A).unwrap())
            .collect();
        assert_eq!(
            gate.admit(Audience::Operators, A).err(),
            Some(Refusal::PeerLimit)
        );
        // Another peer, and the same peer on another listener, are counted apart.
        let other = gate.admit(Audience::Operators, B).unwrap();
        let sandbox = gate.admit(Audience::Sandboxes, A).unwrap();
        assert_eq!(
            gate.admit(Audience::Sandboxes, A).err(),
            Some(Refusal::PeerLimit)
        );
        drop(held);
        let again: Vec<_> = (0..3)
            .map(|_| gate.admit(Audience::Operators, A).unwrap())
            .collect();
        drop((other, sandbox, again));
        assert!(gate
            .state
            .lock()
            .unwrap()
            .peers
            .iter()
            .all(HashMap::is_empty));
        assert_eq!(gate.state.lock().unwrap().total, 0);
    }

    #[test]
    fn the_process_cap_holds_across_peers_and_listeners() {
        let gate = gate(10, 10, 4);
        let held = [
            gate.admit(Audience::Operators, A).unwrap(),
            gate.admit(Audience::Operators, B).unwrap(),
            gate.admit(Audience::Sandboxes, A).unwrap(),
            gate.admit(Audience::Metrics, B).unwrap(),
        ];
        assert_eq!(
            gate.admit(Audience::Operators, "10.0.0.3".parse().unwrap())
                .err(),
            Some(Refusal::GlobalLimit)
        );
        drop(held);
        assert!(gate.admit(Audience::Operators, A).is_ok());
    }

    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_is_one_peer() {
        let gate = gate(1, 1, 10);
        let _held = gate.admit(Audience::Operators, A).unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            gate.admit(Audience::Operators, mapped).err(),
            Some(Refusal::PeerLimit)
        );
    }

    #[test]
    fn accept_failures_back_off_doubling_to_a_second_and_reset_on_success() {
        let mut backoff = AcceptBackoff::default();
        let delays: Vec<_> = (0..9).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        for _ in 0..100 {
            assert_eq!(backoff.failed(), AcceptBackoff::MAX);
        }
        backoff.succeeded();
        assert_eq!(backoff.failed(), AcceptBackoff::FIRST);
    }
}
