//! The api under a hostile client: a peer's connection cap, the process's,
//! the header-read and idle timeouts, and the sandbox and metrics
//! listeners, over real sockets. The flooding peer is another loopback
//! address (127.0.0.3), so the caps are counted for it alone.

use mango_api::connection_limits::{Audience, ConnectionLimits};
use mango_api::server::{self, Listeners};
use mango_api::store::keys;
use mango_api::{ApiContext, Settings};
use mango_protocol::time;
use mango_testkit::TestApp;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const OPERATOR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const OTHER_PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// The api on its three kinds of listener, nothing else connecting to it.
struct Served {
    operators: SocketAddr,
    sandboxes: SocketAddr,
    metrics: SocketAddr,
    ctx: ApiContext,
    ws_key: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Served {
    async fn start(db: sqlx::PgPool, connections: ConnectionLimits) -> Served {
        let (_, ws_key) = keys::create(&db, "wrkspc_default", None, "operator", time::now())
            .await
            .unwrap();
        let pool = mango_api::db::api_pool(&db, 8).await.unwrap();
        let settings = Settings {
            caller_plays_model: true,
            connections,
            ..Settings::default()
        };
        let ctx = ApiContext::new(pool, settings);
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let (operators, sandboxes, metrics) = (
            bind().await.unwrap(),
            bind().await.unwrap(),
            bind().await.unwrap(),
        );
        let served = Served {
            operators: operators.local_addr().unwrap(),
            sandboxes: sandboxes.local_addr().unwrap(),
            metrics: metrics.local_addr().unwrap(),
            ctx: ctx.clone(),
            ws_key,
            _stop: {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let listeners = Listeners {
                    operators: vec![operators],
                    sandboxes: vec![sandboxes],
                    metrics: Some(metrics),
                };
                tokio::spawn(server::serve_listeners(ctx, listeners, async {
                    let _ = rx.await;
                }));
                tx
            },
        };
        served.ctx.until_listening().await;
        served
    }

    fn counter(
        &self,
        audience: Audience,
        which: fn(&mango_api::metrics::Connections) -> &std::sync::atomic::AtomicU64,
    ) -> u64 {
        which(&self.ctx.metrics.connections[audience.index()]).load(Relaxed)
    }

    /// Waits until `audience`'s listeners hold `n` open connections.
    async fn until_open(&self, audience: Audience, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.counter(audience, |c| &c.open) < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} connections open",
                self.counter(audience, |c| &c.open)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn limits(per_peer: usize, sandbox_per_peer: usize, total: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        max_per_peer: per_peer,
        sandbox_max_per_peer: sandbox_per_peer,
        max_connections: total,
    }
}

async fn connect(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// One keep-alive request on `stream`: the status line and the body.
async fn request(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> (String, String) {
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head =
        format!("{method} {path} HTTP/1.1\r\nHost: mango\r\n{auth}Content-Length: 0\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let (head, body) = answer(stream, &format!("{method} {path}")).await;
    (head.lines().next().unwrap().to_string(), body)
}

/// The next response on `stream`: its head and its body.
async fn answer(stream: &mut TcpStream, what: &str) -> (String, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let n = stream.read(&mut buf).await.expect("the answer is read");
            assert!(n > 0, "closed before answering {what}");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            let Some(end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                return (
                    text[..end].to_string(),
                    text[end + 4..end + 4 + length].to_string(),
                );
            }
        }
    });
    answer
        .await
        .unwrap_or_else(|_| panic!("no answer to {what}"))
}

async fn fresh_request(
    from: Ipv4Addr,
    to: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> (String, String) {
    let mut stream = connect(from, to).await;
    request(&mut stream, method, path, key).await
}

/// Whether the server closes `stream` (end of file or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!(
            "the server wrote {:?} instead of closing",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(_) => false,
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn one_peer_holds_thousands_of_idle_connections_and_not_one_more_while_others_are_served(
    db: sqlx::PgPool,
) {
    const CAP: usize = 2_000;
    let api = Served::start(db, limits(CAP, 8, 10_000)).await;
    // Connections that never send a byte, as the flood of issue 25 did.
    let mut held = Vec::with_capacity(CAP);
    for _ in 0..CAP {
        held.push(connect(FLOODER, api.operators).await);
    }
    api.until_open(Audience::Operators, CAP as u64).await;

    let mut one_more = connect(FLOODER, api.operators).await;
    assert!(
        closed_within(&mut one_more, Duration::from_secs(10)).await,
        "connection {} of one peer was kept",
        CAP + 1
    );
    assert_eq!(
        api.counter(Audience::Operators, |c| &c.refused_peer_limit),
        1
    );

    // Meanwhile operators, and another peer, are served.
    let (status, body) = fresh_request(OPERATOR, api.operators, "GET", "/healthz", None).await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("HTTP/1.1 200 OK", r#"{"status":"ok"}"#)
    );
    let (status, body) = fresh_request(
        OPERATOR,
        api.operators,
        "GET",
        "/v1/environments",
        Some(&api.ws_key),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let (status, _) = fresh_request(OTHER_PEER, api.operators, "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");

    // The held connections were kept, not dropped: the first and the last still answer.
    let (status, _) = request(&mut held[0], "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (status, _) = request(held.last_mut().unwrap(), "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");

    // A closed one frees its place for the same peer.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut again = connect(FLOODER, api.operators).await;
        if !closed_within(&mut again, Duration::from_millis(200)).await {
            let (status, _) = request(&mut again, "GET", "/healthz", None).await;
            assert_eq!(status, "HTTP/1.1 200 OK");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed place was never given back"
        );
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_process_cap_holds_across_peers(db: sqlx::PgPool) {
    let api = Served::start(db, limits(15, 15, 20)).await;
    let mut held = Vec::new();
    for (from, n) in [(FLOODER, 15), (OTHER_PEER, 5)] {
        for _ in 0..n {
            let mut stream = connect(from, api.operators).await;
            let (status, _) = request(&mut stream, "GET", "/healthz", None).await;
            assert_eq!(status, "HTTP/1.1 200 OK");
            held.push(stream);
        }
    }
    let mut over = connect(OPERATOR, api.sandboxes).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(10)).await,
        "connection 21 was kept"
    );
    assert_eq!(
        api.counter(Audience::Sandboxes, |c| &c.refused_global_limit),
        1
    );
    assert_eq!(
        api.counter(Audience::Operators, |c| &c.refused_peer_limit),
        0
    );
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut again = connect(OPERATOR, api.operators).await;
        if !closed_within(&mut again, Duration::from_millis(200)).await {
            let (status, _) = request(&mut again, "GET", "/healthz", None).await;
            assert_eq!(status, "HTTP/1.1 200 OK");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed place was never given back"
        );
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_head_never_finished_and_a_connection_that_sends_nothing_are_closed_at_the_header_timeout(
    db: sqlx::PgPool,
) {
    let api = Served::start(
        db,
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(1),
            ..limits(100, 100, 1_000)
        },
    )
    .await;
    let opened = Instant::now();
    let mut slowloris = connect(FLOODER, api.operators).await;
    slowloris
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: mango\r\n")
        .await
        .unwrap();
    let mut silent = connect(FLOODER, api.operators).await;
    assert!(closed_within(&mut slowloris, Duration::from_secs(30)).await);
    assert!(closed_within(&mut silent, Duration::from_secs(30)).await);
    assert!(
        opened.elapsed() >= Duration::from_secs(1),
        "closed before the timeout"
    );
    assert_eq!(api.counter(Audience::Operators, |c| &c.header_timeouts), 2);
    // A complete request within the timeout is answered.
    let (status, _) = fresh_request(FLOODER, api.operators, "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_kept_alive_connection_is_closed_when_idle_but_an_open_event_stream_is_not(
    db: sqlx::PgPool,
) {
    let settings = Settings {
        caller_plays_model: true,
        connections: ConnectionLimits {
            idle_timeout: Duration::from_secs(1),
            ..limits(100, 100, 1_000)
        },
        ..Settings::default()
    };
    let app = TestApp::start_with(db, settings).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut kept = connect(FLOODER, addr).await;
    let (status, _) = request(&mut kept, "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        closed_within(&mut kept, Duration::from_secs(30)).await,
        "an idle connection was kept"
    );
    assert!(
        app.ctx.metrics.connections[Audience::Operators.index()]
            .idle_timeouts
            .load(Relaxed)
            >= 1
    );

    let session = app.create_session().await;
    let mut stream = mango_testkit::SseReader::new(app.open_stream(&session, &app.ws_key).await);
    // Three idle timeouts with no frame on the wire (pings come every 10 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    app.send(
        &session,
        serde_json::json!([mango_testkit::user_message("still there?")]),
    )
    .await
    .expect(200);
    let frame = tokio::time::timeout(Duration::from_secs(20), stream.next_event())
        .await
        .expect("the stream delivers")
        .expect("the stream is open");
    assert_eq!(frame.json()["type"], "user.message", "{frame:?}");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_sandbox_listener_serves_the_runners_routes_with_its_own_cap_and_metrics_have_their_own(
    db: sqlx::PgPool,
) {
    let api = Served::start(db, limits(100, 5, 1_000)).await;
    let (status, _) = fresh_request(FLOODER, api.sandboxes, "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (status, body) = fresh_request(
        FLOODER,
        api.sandboxes,
        "GET",
        "/v1/environments",
        Some(&api.ws_key),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(body.contains("sandbox listener"), "{body}");
    // A runner's route is served (and refuses the wrong credential as usual).
    let (status, body) = fresh_request(
        FLOODER,
        api.sandboxes,
        "POST",
        "/v1/environments/env_x/work/work_x/heartbeat",
        Some("mango_st_nope"),
    )
    .await;
    assert!(!body.contains("sandbox listener"), "{status} {body}");
    assert!(status.starts_with("HTTP/1.1 4"), "{status} {body}");
    for at in [api.operators, api.sandboxes] {
        let (status, _) = fresh_request(OPERATOR, at, "GET", "/metrics", None).await;
        assert_eq!(status, "HTTP/1.1 404 Not Found", "/metrics on {at}");
    }

    // A flood on the sandbox listener meets its cap; operators from the same address are still served.
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut stream = connect(FLOODER, api.sandboxes).await;
        let (status, _) = request(&mut stream, "GET", "/healthz", None).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        held.push(stream);
    }
    let mut sixth = connect(FLOODER, api.sandboxes).await;
    assert!(
        closed_within(&mut sixth, Duration::from_secs(10)).await,
        "connection 6 of one sandbox was kept"
    );
    let (status, _) = fresh_request(
        FLOODER,
        api.operators,
        "GET",
        "/v1/environments",
        Some(&api.ws_key),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");

    let (status, text) = fresh_request(OPERATOR, api.metrics, "GET", "/metrics", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        text.contains("mango_http_connections_refused_total{listener=\"sandboxes\",reason=\"peer_limit\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("mango_http_connections_open{listener=\"sandboxes\"} 5\n"),
        "{text}"
    );
}

#[test]
fn every_sandbox_route_is_a_documented_operation() {
    let doc: serde_json::Value =
        serde_json::from_str(&mango_api::openapi::to_json(&mango_api::routes::openapi())).unwrap();
    for (method, path) in mango_api::routes::SANDBOX_ROUTES {
        assert!(
            doc["paths"][path].get(method.to_lowercase()).is_some(),
            "{method} {path} is not an operation"
        );
    }
    assert!(
        doc["paths"].get("/metrics").is_none(),
        "/metrics is documented on the api's router"
    );
}

#[test]
fn serve_refuses_more_connections_than_its_open_file_limit_allows() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mango"))
        .args(["serve"])
        .env("MANGO_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("MANGO_MAX_CONNECTIONS", "100000000")
        .output()
        .expect("mango runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("MANGO_MAX_CONNECTIONS=100000000 does not fit the open-file limit"),
        "{stderr}"
    );
}

/// The head of a POST to Ack (which reads no body) announcing `body_len`
/// bytes of body, with `extra` headers.
fn ack_head(body_len: usize, extra: &str) -> String {
    format!(
        "POST /v1/environments/env_x/work/work_x/ack HTTP/1.1\r\nHost: mango\r\n\
         Authorization: Bearer nope\r\nContent-Type: application/json\r\n\
         Content-Length: {body_len}\r\n{extra}\r\n"
    )
}

fn says_close(head: &str) -> bool {
    head.lines()
        .any(|l| l.eq_ignore_ascii_case("connection: close"))
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_body_the_handler_never_reads_is_drained_and_the_connection_kept(db: sqlx::PgPool) {
    let api = Served::start(db, limits(100, 100, 1_000)).await;
    let mut stream = connect(OPERATOR, api.operators).await;
    stream.set_nodelay(true).unwrap();
    // The body after its head, later than the handler answers without it
    // (as httpx writes them: two sends, the body at times a moment late).
    stream.write_all(ack_head(2, "").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream.write_all(b"{}").await.unwrap();
    let (head, body) = answer(&mut stream, "the Ack").await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}\n{body}");
    assert!(!says_close(&head), "{head}");
    // Kept alive as promised: the next request on it is answered.
    let (status, _) = request(&mut stream, "GET", "/healthz", None).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_body_too_slow_too_large_or_awaiting_continue_closes_the_connection_and_says_so(
    db: sqlx::PgPool,
) {
    let api = Served::start(
        db,
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(1),
            ..limits(100, 100, 1_000)
        },
    )
    .await;
    let max = mango_api::extract::MAX_BODY_BYTES;
    let too_large = vec![b' '; max + 2];
    let cases: [(&str, String, &[u8]); 3] = [
        ("never sent", ack_head(10, ""), b""),
        (
            "larger than what is drained",
            ack_head(too_large.len(), ""),
            &too_large,
        ),
        (
            "awaiting 100 Continue",
            ack_head(10, "Expect: 100-continue\r\n"),
            b"",
        ),
    ];
    for (case, head, body) in cases {
        let mut stream = connect(OPERATOR, api.operators).await;
        let (mut reader, mut writer) = stream.split();
        let sent = async {
            writer.write_all(head.as_bytes()).await.unwrap();
            // The server may stop reading (and reset) once it has answered.
            let _ = writer.write_all(body).await;
        };
        let mut got = Vec::new();
        let read = async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
                let n = reader.read(&mut buf).await.expect("the answer is read");
                assert!(n > 0, "{case}: closed before answering");
                got.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(30), futures::future::join(sent, read))
            .await
            .unwrap_or_else(|_| panic!("{case}: no answer"));
        let text = String::from_utf8_lossy(&got).into_owned();
        let head = &text[..text.find("\r\n\r\n").unwrap()];
        assert!(head.starts_with("HTTP/1.1 401"), "{case}: {head}");
        assert!(says_close(head), "{case}: kept alive: {head}");
        assert!(!text.contains("100 Continue"), "{case}: {text}");
    }
}
