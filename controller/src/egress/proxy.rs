//! The egress proxy: HTTP CONNECT tunnels and absolute-form `http://`
//! forwards to the names a pool allows, each resolved by the proxy and
//! checked against its [`AddressPolicy`]. One request head per connection,
//! read within [`Limits::head`]; at most [`Limits::connections`] at once
//! and [`Limits::per_peer`] from one address (one sandbox cannot take
//! every connection of its pool), each ended after [`Limits::idle`] with
//! no traffic either way.
//! Every decision is logged (pool, Work id, host, port, decision, reason)
//! and counted; no header or body is.
//!
//! The [`Policy`] is read through a `watch` channel at each decision, so a
//! new allowlist applies to the next connection without a restart; a
//! connection already admitted keeps running under the policy it got.

use super::address::AddressPolicy;
use super::allow::Allowlist;
use super::request::{self, HeadError, Kind, Request};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Resolves names to addresses: the system's resolver, or a fixed table
/// in tests.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// A fixed table of names (tests: `allowed.test` → a local server).
#[derive(Default)]
pub struct StaticResolver(pub HashMap<String, Vec<IpAddr>>);

impl Resolve for StaticResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        let found = self
            .0
            .get(host)
            .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        Box::pin(async move {
            found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name"))
        })
    }
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// For the whole request head to arrive.
    pub head: Duration,
    /// Resolution and connection to the destination, together.
    pub connect: Duration,
    /// Open client connections at once; more are closed unanswered.
    pub connections: usize,
    /// Open client connections from one address at once; more are closed
    /// unanswered.
    pub per_peer: usize,
    /// A tunnel or forward with no traffic either way for this long ends.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head: Duration::from_secs(10),
            connect: Duration::from_secs(10),
            connections: 512,
            per_peer: 64,
            idle: Duration::from_secs(300),
        }
    }
}

/// `mango_egress_decisions_total{pool,decision}`.
#[derive(Debug, Default)]
pub struct EgressMetrics {
    pool: String,
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl EgressMetrics {
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Relaxed)
    }

    pub fn denied(&self) -> u64 {
        self.denied.load(Relaxed)
    }

    pub fn render(&self) -> String {
        let pool = label_value(&self.pool);
        format!(
            "# HELP mango_egress_decisions_total Egress proxy requests, by the proxy's decision.\n\
             # TYPE mango_egress_decisions_total counter\n\
             mango_egress_decisions_total{{pool=\"{pool}\",decision=\"allowed\"}} {}\n\
             mango_egress_decisions_total{{pool=\"{pool}\",decision=\"denied\"}} {}\n",
            self.allowed(),
            self.denied()
        )
    }
}

/// A Prometheus label value, escaped.
pub fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What the proxy admits: names first, then the addresses they resolve
/// to. One value, so an edit swaps both at once. The default admits
/// nothing.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub allowlist: Allowlist,
    pub addresses: AddressPolicy,
}

impl Policy {
    /// A policy no one changes (the Docker supervisor's flags): the
    /// receiver keeps the last value once the sender is gone.
    pub fn fixed(self) -> watch::Receiver<Policy> {
        watch::channel(self).1
    }
}

pub struct ProxyConfig {
    pub pool: String,
    /// Read afresh for every connection.
    pub policy: watch::Receiver<Policy>,
    pub limits: Limits,
    pub resolver: Arc<dyn Resolve>,
}

struct Shared {
    config: ProxyConfig,
    metrics: Arc<EgressMetrics>,
    /// Where the proxy listens: never a destination (no loops).
    own: SocketAddr,
}

pub struct EgressProxy {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl EgressProxy {
    pub fn new(listener: TcpListener, config: ProxyConfig) -> std::io::Result<EgressProxy> {
        let own = listener.local_addr()?;
        let metrics = Arc::new(EgressMetrics {
            pool: config.pool.clone(),
            ..Default::default()
        });
        Ok(EgressProxy {
            listener,
            shared: Arc::new(Shared {
                config,
                metrics,
                own,
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.own
    }

    pub fn metrics(&self) -> Arc<EgressMetrics> {
        self.shared.metrics.clone()
    }

    /// Serves until the task is dropped.
    pub async fn serve(self) {
        let open = Arc::new(tokio::sync::Semaphore::new(
            self.shared.config.limits.connections,
        ));
        let peers = Arc::new(PeerSlots::default());
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, most likely: pause rather than spin.
                    tracing::warn!(error = %err, "egress proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = open.clone().try_acquire_owned() else {
                tracing::warn!(pool = %self.shared.config.pool, %peer, limit = self.shared.config.limits.connections,
                    "egress proxy: connection limit reached; closing a new connection unanswered");
                drop(stream);
                continue;
            };
            let Some(slot) = peers.take(peer.ip(), self.shared.config.limits.per_peer) else {
                tracing::warn!(pool = %self.shared.config.pool, %peer, limit = self.shared.config.limits.per_peer,
                    "egress proxy: this address's connection limit reached; closing a new connection unanswered");
                drop(stream);
                continue;
            };
            let shared = self.shared.clone();
            tokio::spawn(async move {
                shared.handle(stream, peer).await;
                drop(slot);
                drop(permit);
            });
        }
    }
}

/// Why a request was refused, for the log and the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Denial {
    NotAllowed,
    Unresolved,
    RefusedAddress,
}

impl Denial {
    fn as_str(self) -> &'static str {
        match self {
            Denial::NotAllowed => "not on the pool's allowlist",
            Denial::Unresolved => "the name does not resolve, or no admitted address of it answers",
            Denial::RefusedAddress => "the name resolves only to refused addresses",
        }
    }
}

impl Shared {
    async fn handle(&self, mut client: TcpStream, peer: SocketAddr) {
        let head =
            tokio::time::timeout(self.config.limits.head, request::read_head(&mut client)).await;
        let (head, early) = match head {
            Ok(Ok(read)) => read,
            Ok(Err(HeadError::TooLarge)) => {
                return answer(&mut client, 431, "the request head is too large").await
            }
            Ok(Err(HeadError::Closed | HeadError::Io(_))) => return,
            Err(_) => return answer(&mut client, 408, "no request head in time").await,
        };
        let request = match request::parse(&head) {
            Ok(request) => request,
            Err(why) => return answer(&mut client, 400, why).await,
        };
        drop(head);
        let destination = self.decide(&request).await;
        let work_id = request.work_id.as_deref().unwrap_or("unknown");
        let pool = self.config.pool.as_str();
        let (host, port) = (request.host.as_str(), request.port);
        let upstream = match destination {
            Err(denial) => {
                self.metrics.denied.fetch_add(1, Relaxed);
                tracing::info!(decision = "denied", reason = denial.as_str(), pool, work_id, host, port, %peer, "egress");
                let status = if denial == Denial::Unresolved {
                    502
                } else {
                    403
                };
                return answer(
                    &mut client,
                    status,
                    &format!(
                        "mango egress: {host}:{port} is refused for pool {pool}: {}",
                        denial.as_str()
                    ),
                )
                .await;
            }
            Ok(upstream) => upstream,
        };
        self.metrics.allowed.fetch_add(1, Relaxed);
        tracing::info!(decision = "allowed", pool, work_id, host, port, address = %upstream.peer_addr().map(|a| a.to_string()).unwrap_or_default(), %peer, "egress");
        let mut upstream = upstream;
        let opened = match &request.kind {
            Kind::Connect => {
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
            }
            Kind::Forward { head } => upstream.write_all(head).await,
        };
        if opened.is_err() {
            return;
        }
        if !early.is_empty() && upstream.write_all(&early).await.is_err() {
            return;
        }
        relay(client, upstream, self.config.limits.idle).await;
    }

    /// The allowlist first, then the proxy's own resolution, then each
    /// address against the policy; the first admitted address that
    /// answers is the destination.
    async fn decide(&self, request: &Request) -> Result<TcpStream, Denial> {
        // A snapshot: the borrow is a read lock, held no longer than a clone.
        let policy = self.config.policy.borrow().clone();
        if !policy.allowlist.admits(&request.host, request.port) {
            return Err(Denial::NotAllowed);
        }
        let name = super::allow::normalize(&request.host).map_err(|_| Denial::NotAllowed)?;
        let connect = async {
            let addresses = self
                .config
                .resolver
                .resolve(&name, request.port)
                .await
                .map_err(|_| Denial::Unresolved)?;
            if addresses.is_empty() {
                return Err(Denial::Unresolved);
            }
            let admitted: Vec<SocketAddr> = addresses
                .into_iter()
                .filter(|a| !self.is_self(*a) && policy.addresses.admits(a.ip()))
                .collect();
            if admitted.is_empty() {
                return Err(Denial::RefusedAddress);
            }
            for address in admitted {
                if let Ok(stream) = TcpStream::connect(address).await {
                    return Ok(stream);
                }
            }
            Err(Denial::Unresolved)
        };
        tokio::time::timeout(self.config.limits.connect, connect)
            .await
            .unwrap_or(Err(Denial::Unresolved))
    }
}

impl Shared {
    /// The proxy's own listener: its address, or, when it listens on every
    /// address, its port on loopback (its other addresses are the policy's
    /// `refused`).
    fn is_self(&self, destination: SocketAddr) -> bool {
        destination == self.own
            || (self.own.ip().is_unspecified()
                && destination.port() == self.own.port()
                && destination.ip().is_loopback())
    }
}

/// Open connections per client address.
#[derive(Default)]
struct PeerSlots(std::sync::Mutex<HashMap<IpAddr, usize>>);

/// One of a peer's connections; given back on drop.
struct PeerSlot {
    slots: Arc<PeerSlots>,
    ip: IpAddr,
}

impl PeerSlots {
    fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut open = self.0.lock().expect("peer slots");
        let count = open.entry(ip).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            slots: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().expect("peer slots");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Copies both ways until both sides are done, or until neither has sent
/// anything for `idle`.
async fn relay(client: TcpStream, upstream: TcpStream, idle: Duration) {
    let last = std::sync::Mutex::new(tokio::time::Instant::now());
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    tokio::join!(
        pipe(client_read, upstream_write, &last, idle),
        pipe(upstream_read, client_write, &last, idle),
    );
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    last: &std::sync::Mutex<tokio::time::Instant>,
    idle: Duration,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(idle, from.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                *last.lock().expect("activity") = tokio::time::Instant::now();
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            Err(_) => {
                let quiet = last.lock().expect("activity").elapsed();
                if quiet >= idle {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

async fn answer(client: &mut TcpStream, status: u16, message: &str) {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("{message}\n");
    let mut out = BufWriter::new(client);
    let _ = out
        .write_all(
            format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
    let _ = out.flush().await;
    let _ = out.into_inner().shutdown().await;
}

#[cfg(test)]
mod tests;
