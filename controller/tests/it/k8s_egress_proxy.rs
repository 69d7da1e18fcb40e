//! `mango-worker egress-proxy` against the strict fake API server: the
//! pool's `spec.egress` read through it, edited and deleted there, and a
//! local HTTP server on loopback standing for the outside (`allowPrivate`,
//! since it is on loopback). The module's entry point runs with a fixed
//! resolver (`ok.test`, `other.test` → loopback); the real binary with the
//! system's, where `localhost` is the name it admits.

use crate::k8s_strict::{self, NS};
use base64::Engine as _;
use http::Method;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use mango_controller::egress::pool::{self, PoolProxy};
use mango_controller::egress::proxy::{Limits, StaticResolver};
use mango_controller::kubernetes::crd::WorkerPool;
use mango_testkit::apiserver::{ApiServer, Options, Overload};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const POOL: &str = "builders";

/// "The outside": answers every request with `200 hello`.
async fn outside() -> u16 {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    port
}

fn make_pool(fake: &ApiServer, allow: &[String]) {
    fake.create(
        json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"environmentId": "env_1", "environmentKeySecret": {"name": "pool-key"},
                 "egress": {"allow": allow, "allowPrivate": true,
                            "proxy": "mango-egress.sandboxes.svc:3128"}}}),
    )
    .expect("the WorkerPool is admitted");
}

/// Sends `request` and reads the whole answer.
async fn exchange(to: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(to).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// An absolute-form GET through the proxy as Work `work_id`: the answer's status line.
async fn get_through(proxy: SocketAddr, authority: &str, work_id: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{work_id}:"));
    let answer = exchange(
        proxy,
        &format!("GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Basic {auth}\r\nX-Secret: hunter2-never-logged\r\nConnection: close\r\n\r\n"),
    )
    .await;
    answer.lines().next().unwrap_or("").to_string()
}

/// A CONNECT tunnel through the proxy and a GET inside it: the inner status line.
async fn connect_through(proxy: SocketAddr, authority: &str) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte).await, Ok(1)) {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 200 ") {
        return head.lines().next().unwrap_or("").to_string();
    }
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut inner = String::new();
    let _ = stream.read_to_string(&mut inner).await;
    inner.lines().next().unwrap_or("").to_string()
}

/// `GET path` on the metrics listener: (status code, body).
async fn health(metrics: SocketAddr, path: &str) -> (u16, String) {
    let answer = exchange(
        metrics,
        &format!("GET {path} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

async fn patch_allow(fake: &ApiServer, allow: &[String]) {
    let pools: Api<WorkerPool> = Api::namespaced(k8s_strict::client(fake).await, NS);
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"egress": {"allow": allow}}})),
        )
        .await
        .expect("the edit is admitted");
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

#[tokio::test]
async fn the_pools_allowlist_is_followed_live_and_a_deleted_pool_denies_all() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .finish();
    // A current-thread test runtime: the proxy's tasks log here too.
    let _logging = tracing::subscriber::set_default(subscriber);
    let port = outside().await;
    let (ok, other) = (format!("ok.test:{port}"), format!("other.test:{port}"));
    let fake = k8s_strict::fake_with(Options::default()).await;
    make_pool(&fake, std::slice::from_ref(&ok));
    // The first lists fail, as an overloaded apiserver's do: not ready meanwhile.
    fake.fail_next(Method::GET, "/workerpools", Overload::Throttled, 2);
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let at = listener.local_addr().unwrap();
    let metrics = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let metrics_at = metrics.local_addr().unwrap();
    let setup = PoolProxy {
        client: k8s_strict::client(&fake).await,
        namespace: NS.into(),
        pool: POOL.into(),
        own_addresses: vec![],
        resolver: Arc::new(StaticResolver(
            ["ok.test", "other.test"]
                .map(|n| (n.to_string(), vec![LOOPBACK]))
                .into(),
        )),
        limits: Limits::default(),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn(pool::serve(
        setup,
        listener,
        metrics,
        stop.clone().cancelled_owned(),
    ));

    let (code, why) = health(metrics_at, "/readyz").await;
    assert_eq!(code, 503, "not ready before the pool is read: {why}");
    assert_eq!(health(metrics_at, "/healthz").await.0, 200);
    crate::support::until("ready", Duration::from_secs(30), async || {
        health(metrics_at, "/readyz").await.0 == 200
    })
    .await;

    assert_eq!(get_through(at, &ok, "work_ep1").await, "HTTP/1.1 200 OK");
    assert_eq!(connect_through(at, &ok).await, "HTTP/1.1 200 OK");
    let denied = get_through(at, &other, "work_ep2").await;
    assert!(denied.starts_with("HTTP/1.1 403 "), "{denied}");
    let text = health(metrics_at, "/metrics").await.1;
    assert!(
        text.contains(&format!(
            "mango_egress_decisions_total{{pool=\"{POOL}\",decision=\"allowed\"}} 2"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "mango_egress_decisions_total{{pool=\"{POOL}\",decision=\"denied\"}} 1"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("mango_egress_policy_valid{{pool=\"{POOL}\"}} 1")),
        "{text}"
    );

    // The edit applies to the next request, with no restart.
    patch_allow(&fake, std::slice::from_ref(&other)).await;
    crate::support::until(
        "the edited allowlist",
        Duration::from_secs(30),
        async || get_through(at, &other, "work_ep3").await == "HTTP/1.1 200 OK",
    )
    .await;
    assert!(get_through(at, &ok, "work_ep3")
        .await
        .starts_with("HTTP/1.1 403 "));

    // An invalid edit denies everything.
    patch_allow(&fake, &["*.test".to_string()]).await;
    crate::support::until(
        "the invalid allowlist",
        Duration::from_secs(30),
        async || {
            get_through(at, &other, "work_ep4")
                .await
                .starts_with("HTTP/1.1 403 ")
        },
    )
    .await;
    assert!(health(metrics_at, "/metrics")
        .await
        .1
        .contains("mango_egress_policy_valid{pool=\"builders\"} 0"));

    // A deleted pool: everything denied.
    patch_allow(&fake, std::slice::from_ref(&other)).await;
    crate::support::until(
        "the valid allowlist again",
        Duration::from_secs(30),
        async || get_through(at, &other, "work_ep5").await == "HTTP/1.1 200 OK",
    )
    .await;
    let pools: Api<WorkerPool> = Api::namespaced(k8s_strict::client(&fake).await, NS);
    pools.delete(POOL, &DeleteParams::default()).await.unwrap();
    crate::support::until("the deleted pool", Duration::from_secs(30), async || {
        get_through(at, &other, "work_ep6")
            .await
            .starts_with("HTTP/1.1 403 ")
    })
    .await;
    let text = health(metrics_at, "/metrics").await.1;
    assert!(
        text.contains(&format!("mango_egress_policy_valid{{pool=\"{POOL}\"}} 0")),
        "{text}"
    );
    stop.cancel();
    served.await.unwrap().unwrap();

    let log = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    let decision = log
        .lines()
        .find(|l| l.contains("\"work_id\":\"work_ep2\""))
        .expect("the denial is logged with its Work id");
    for field in [
        "\"decision\":\"denied\"",
        "\"pool\":\"builders\"",
        "\"host\":\"other.test\"",
        &format!("\"port\":{port}"),
    ] {
        assert!(decision.contains(field), "{field} in {decision}");
    }
    assert!(
        log.contains("the WorkerPool does not exist"),
        "the deny-all names why"
    );
    assert!(log.contains("\\\"*.test\\\""), "the invalid entry is named");
    assert!(!log.contains("hunter2"), "no header is logged");
}

/// A free loopback port (bound, then let go, for the binary to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind((LOOPBACK, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn the_binary_reads_its_pool_through_a_kubeconfig_and_follows_an_edit() {
    let port = outside().await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    make_pool(&fake, &[format!("localhost:{port}")]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: fake, user: {{}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NS}}}}}]\n\
             current-context: fake\n",
            fake.url
        ),
    )
    .unwrap();
    let (listen, metrics) = (free_port(), free_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mango-worker"))
        .args(["egress-proxy", "--pool", POOL, "--namespace", NS])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_IPS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mango-worker starts");
    let (at, metrics_at) = (
        SocketAddr::new(LOOPBACK, listen),
        SocketAddr::new(LOOPBACK, metrics),
    );
    crate::support::until("the binary ready", Duration::from_secs(30), async || {
        TcpStream::connect(metrics_at).await.is_ok() && health(metrics_at, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(
        get_through(at, &format!("localhost:{port}"), "work_bin1").await,
        "HTTP/1.1 200 OK"
    );
    assert!(get_through(at, &format!("other.test:{port}"), "work_bin1")
        .await
        .starts_with("HTTP/1.1 403 "));

    patch_allow(&fake, &[format!("elsewhere.test:{port}")]).await;
    // Until the watch delivers the edit, requests are still allowed, and
    // counted: the counter must agree with every answer seen, however late.
    let mut allowed = 1;
    crate::support::until(
        "the edit in the binary",
        Duration::from_secs(30),
        async || {
            let answer = get_through(at, &format!("localhost:{port}"), "work_bin2").await;
            allowed += usize::from(answer == "HTTP/1.1 200 OK");
            answer.starts_with("HTTP/1.1 403 ")
        },
    )
    .await;
    let text = health(metrics_at, "/metrics").await.1;
    assert!(
        text.contains(&format!(
            "mango_egress_decisions_total{{pool=\"{POOL}\",decision=\"allowed\"}} {allowed}\n"
        )),
        "{allowed} allowed: {text}"
    );
    assert!(
        fake.requests().iter().any(|(m, u)| m == "GET"
            && u.contains("/namespaces/sandboxes/workerpools")
            && u.contains("watch=true")),
        "it watches the pool"
    );
    child.kill().await.unwrap();
}
