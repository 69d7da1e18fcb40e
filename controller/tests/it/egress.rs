//! The egress proxy over loopback: a local server stands for the outside,
//! and a fixed resolver makes `allowed.test` and `denied.test` resolve to
//! it, so what the proxy admits is its allowlist and address policy alone.

use base64::Engine as _;
use mango_controller::egress::address::AddressPolicy;
use mango_controller::egress::allow::Allowlist;
use mango_controller::egress::proxy::{EgressProxy, Limits, Policy, ProxyConfig, StaticResolver};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// "The outside": answers each connection's first bytes with `echo:` and
/// them, then closes; counts connections.
struct Outside {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

async fn outside() -> Outside {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let mut out = b"echo:".to_vec();
                out.extend_from_slice(&buf[..n]);
                let _ = stream.write_all(&out).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Outside { addr, connections }
}

async fn proxy(allow: &[String], allow_private: bool, limits: Limits) -> EgressProxy {
    let resolver = StaticResolver(
        ["allowed.test", "denied.test"]
            .into_iter()
            .map(|name| (name.to_string(), vec![LOOPBACK]))
            .collect(),
    );
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    EgressProxy::new(
        listener,
        ProxyConfig {
            pool: "egress-test".into(),
            policy: Policy {
                allowlist: Allowlist::parse(allow, false).unwrap(),
                addresses: AddressPolicy {
                    allow_private,
                    refused: vec![],
                },
            }
            .fixed(),
            limits,
            resolver: Arc::new(resolver),
        },
    )
    .unwrap()
}

fn proxy_auth(work_id: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{work_id}:"))
}

/// Sends `head`, then reads until the status line's blank line.
async fn ask(proxy: SocketAddr, head: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        // A connection closed unanswered may be reset rather than ended.
        if !matches!(stream.read(&mut byte).await, Ok(1)) {
            break;
        }
        got.push(byte[0]);
    }
    (stream, String::from_utf8_lossy(&got).into_owned())
}

async fn rest(mut stream: TcpStream) -> String {
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// A writer the test reads the proxy's log from.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn an_allowed_name_tunnels_and_forwards_a_denied_one_is_refused_and_every_decision_is_logged_and_counted(
) {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let outside = outside().await;
    let port = outside.addr.port();
    let proxy = proxy(&[format!("allowed.test:{port}")], true, Limits::default()).await;
    let at = proxy.local_addr();
    let metrics = proxy.metrics();
    tokio::spawn(proxy.serve());
    let auth = proxy_auth("work_egress1");
    let secret_header = "X-Secret: hunter2-do-not-log";

    // An allowed name through CONNECT: a tunnel to the outside.
    let (mut tunnel, status) = ask(
        at,
        &format!("CONNECT Allowed.Test.:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n{secret_header}\r\n\r\n"),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
    tunnel.write_all(b"ping through the tunnel").await.unwrap();
    assert_eq!(rest(tunnel).await, "echo:ping through the tunnel");

    // An allowed name as a plain http:// request: forwarded in origin
    // form, without the proxy's headers.
    let (forward, reply) = ask(
        at,
        &format!("GET http://allowed.test:{port}/a/path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Authorization: Basic {auth}\r\nProxy-Connection: keep-alive\r\n\r\n"),
    )
    .await;
    let seen = format!("{reply}{}", rest(forward).await);
    assert!(
        seen.starts_with("echo:GET /a/path?q=1 HTTP/1.1\r\n"),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("Host: allowed.test:{port}\r\n")),
        "{seen}"
    );
    assert!(seen.contains("Connection: close\r\n"), "{seen}");
    assert!(!seen.to_ascii_lowercase().contains("proxy-"), "{seen}");

    // A name not on the list, and an allowed name on another port.
    let (denied, status) = ask(
        at,
        &format!("CONNECT denied.test:{port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n{secret_header}\r\n\r\n"),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 403 "), "{status}");
    assert!(rest(denied).await.contains(&format!("denied.test:{port}")));
    let (_, status) = ask(
        at,
        &format!(
            "CONNECT allowed.test:{} HTTP/1.1\r\n\r\n",
            port.wrapping_add(1).max(1)
        ),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 403 "), "{status}");
    // An IP literal is never admitted, whatever it is.
    let (_, status) = ask(at, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(status.starts_with("HTTP/1.1 403 "), "{status}");
    // Not a proxy request at all.
    let (_, status) = ask(at, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(status.starts_with("HTTP/1.1 400 "), "{status}");

    assert_eq!(
        outside.connections.load(Ordering::SeqCst),
        2,
        "only the allowed requests reached the outside"
    );
    assert_eq!((metrics.allowed(), metrics.denied()), (2, 3));
    let rendered = metrics.render();
    assert!(
        rendered
            .contains("mango_egress_decisions_total{pool=\"egress-test\",decision=\"allowed\"} 2"),
        "{rendered}"
    );
    assert!(
        rendered
            .contains("mango_egress_decisions_total{pool=\"egress-test\",decision=\"denied\"} 3"),
        "{rendered}"
    );

    let text = log.text();
    let decisions: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "egress")
        .collect();
    assert_eq!(decisions.len(), 5, "{text}");
    let first = &decisions[0]["fields"];
    assert_eq!(first["decision"], "allowed");
    assert_eq!(first["pool"], "egress-test");
    assert_eq!(first["work_id"], "work_egress1");
    assert_eq!(first["host"], "Allowed.Test.");
    assert_eq!(first["port"], port);
    let denied = &decisions[2]["fields"];
    assert_eq!(denied["decision"], "denied");
    assert_eq!(denied["host"], "denied.test");
    assert_eq!(denied["work_id"], "work_egress1");
    assert_eq!(decisions[3]["fields"]["work_id"], "unknown");
    for never in [
        "hunter2",
        "X-Secret",
        auth.as_str(),
        "ping through",
        "/a/path",
    ] {
        assert!(!text.contains(never), "{never} is logged: {text}");
    }
}

#[tokio::test]
async fn an_allowed_name_that_resolves_to_loopback_is_refused_unless_private_is_allowed() {
    let outside = outside().await;
    let port = outside.addr.port();
    let proxy = proxy(&[format!("allowed.test:{port}")], false, Limits::default()).await;
    let at = proxy.local_addr();
    let metrics = proxy.metrics();
    tokio::spawn(proxy.serve());
    let (refused, status) = ask(at, &format!("CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(status.starts_with("HTTP/1.1 403 "), "{status}");
    assert!(rest(refused).await.contains("refused addresses"));
    assert_eq!(outside.connections.load(Ordering::SeqCst), 0);
    assert_eq!((metrics.allowed(), metrics.denied()), (0, 1));
}

#[tokio::test]
async fn an_unresolvable_allowed_name_is_a_bad_gateway() {
    let proxy = proxy(&["unknown.test:443".to_string()], true, Limits::default()).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let (_, status) = ask(at, "CONNECT unknown.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(status.starts_with("HTTP/1.1 502 "), "{status}");
}

/// A client that sends no head is answered 408 when the head bound ends
/// (the clock is the runtime's, paused: no real wait).
#[tokio::test(start_paused = true)]
async fn a_client_that_sends_no_head_is_cut_off_at_the_bound() {
    let proxy = proxy(&["allowed.test".to_string()], true, Limits::default()).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let (silent, status) = ask(at, "").await;
    assert!(status.starts_with("HTTP/1.1 408 "), "{status}");
    drop(silent);
    // Half a head, then nothing: the same.
    let (_, status) = ask(at, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: a").await;
    assert!(status.starts_with("HTTP/1.1 408 "), "{status}");
}

#[tokio::test]
async fn a_head_over_its_bound_is_refused() {
    let proxy = proxy(&["allowed.test".to_string()], true, Limits::default()).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let filler = "x".repeat(mango_controller::egress::request::MAX_HEAD);
    let (_, status) = ask(
        at,
        &format!("CONNECT allowed.test:443 HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n"),
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 431 "), "{status}");
}

/// At the connection limit a further client is closed unanswered; once one
/// goes, the next is served again.
#[tokio::test]
async fn connections_past_the_limit_are_closed_unanswered() {
    let limits = Limits {
        connections: 2,
        ..Limits::default()
    };
    let proxy = proxy(&["allowed.test".to_string()], true, limits).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let first = TcpStream::connect(at).await.unwrap();
    let _second = TcpStream::connect(at).await.unwrap();
    let (mut third, status) = ask(at, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status, "", "the third connection gets no answer");
    assert_eq!(third.read(&mut [0u8; 1]).await.unwrap_or(0), 0);
    drop(first);
    // The first's handler ends when it sees the close; until then the
    // limit holds, so ask until a slot is free.
    let mut answered = String::new();
    for _ in 0..200 {
        let (_, status) = ask(at, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n").await;
        if !status.is_empty() {
            answered = status;
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(answered.starts_with("HTTP/1.1 403 "), "{answered}");
}

fn worker_env() -> Vec<(&'static str, String)> {
    vec![
        ("MANGO_ENVIRONMENT_KEY", "mango_envk_unused".to_string()),
        ("MANGO_ENVIRONMENT_ID", "env_unused".to_string()),
        ("MANGO_BASE_URL", "http://127.0.0.1:9".to_string()),
        (
            "MANGO_DOCKER_BASE_URL",
            "http://host.docker.internal:9".to_string(),
        ),
        // Nothing answers here: a start that gets past the allowlist stops
        // at the engine.
        (
            "DOCKER_HOST",
            "unix:///nonexistent/egress-proxy.sock".to_string(),
        ),
    ]
}

/// `mango-worker docker` refuses a malformed or too broad entry at start,
/// naming it, before it touches the engine; from the flag and from
/// `MANGO_EGRESS_ALLOW` alike.
#[tokio::test]
async fn mango_worker_refuses_a_bad_entry_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], Option<&str>, &str); 4] = [
        (
            &["docker", "--egress-allow", "bad_name.example"],
            None,
            "\"bad_name.example\"",
        ),
        (
            &[
                "docker",
                "--egress-allow",
                "ok.example",
                "--egress-allow",
                "*.com",
            ],
            None,
            "\"*.com\"",
        ),
        (
            &["docker"],
            Some("ok.example,api.example:65536"),
            "\"api.example:65536\"",
        ),
        (&["docker"], Some("ok.example,,other.example"), "\"\""),
    ];
    for (i, (args, list, named)) in cases.into_iter().enumerate() {
        let mut env = worker_env();
        if let Some(list) = list {
            env.push(("MANGO_EGRESS_ALLOW", list.to_string()));
        }
        let log = dir.path().join(format!("worker-{i}.log"));
        let mut worker = crate::process::Worker::start(args, &env, &log);
        let status = worker.exit(std::time::Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {}", worker.log());
        let log = worker.log();
        assert!(log.contains("egress allowlist entry"), "{log}");
        assert!(log.contains(named), "{named} named: {log}");
        assert!(
            !log.contains("Docker engine"),
            "refused before the engine: {log}"
        );
    }
}

/// `--egress-allow-any` admits `*` and says so as a warning at start.
#[tokio::test]
async fn allow_any_is_warned_about_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut env = worker_env();
    env.push(("MANGO_EGRESS_ALLOW", "*".to_string()));
    let mut worker = crate::process::Worker::start(&["docker", "--egress-allow-any"], &env, &log);
    let status = worker.exit(std::time::Duration::from_secs(30)).await;
    assert_eq!(
        status.code(),
        Some(2),
        "the engine is not there: {}",
        worker.log()
    );
    let warned = worker
        .log()
        .lines()
        .find(|l| l.contains("--egress-allow-any"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no warning: {}", worker.log()));
    assert!(warned.contains("\"WARN\""), "{warned}");
    assert!(warned.contains("*:443"), "{warned}");
}

/// One address's connections are bounded apart from the total: a second
/// from the same sandbox is closed unanswered while another address is
/// served.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let limits = Limits {
        per_peer: 1,
        ..Limits::default()
    };
    let proxy = proxy(&["allowed.test".to_string()], true, limits).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let _held = TcpStream::connect(at).await.unwrap();
    let (_, status) = ask(at, "CONNECT denied.test:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(
        status, "",
        "a second connection from 127.0.0.1 gets no answer"
    );
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other
        .bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 0))
        .unwrap();
    let mut other = other.connect(at).await.unwrap();
    other
        .write_all(b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    other.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
}

/// A tunnel with no traffic either way ends at the idle bound (the
/// runtime's clock, paused: no real wait), closing the client's side.
#[tokio::test(start_paused = true)]
async fn an_idle_tunnel_is_closed_at_the_bound() {
    // An outside that accepts and holds every connection, silent.
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let limits = Limits::default();
    let idle = limits.idle;
    let proxy = proxy(&[format!("allowed.test:{port}")], true, limits).await;
    let at = proxy.local_addr();
    tokio::spawn(proxy.serve());
    let started = tokio::time::Instant::now();
    let (tunnel, status) = ask(at, &format!("CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
    assert_eq!(rest(tunnel).await, "", "closed with nothing sent");
    assert!(
        started.elapsed() >= idle,
        "not before the bound: {:?}",
        started.elapsed()
    );
}
