use super::*;
use std::net::Ipv4Addr;
use tokio::io::AsyncReadExt;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn policy(allow: &[String]) -> Policy {
    Policy {
        allowlist: Allowlist::parse(allow, false).unwrap(),
        addresses: AddressPolicy {
            allow_private: true,
            refused: vec![],
        },
    }
}

/// The status line the proxy answers a CONNECT with, and the stream.
async fn connect(proxy: SocketAddr, target: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte).await, Ok(1)) {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    (head.lines().next().unwrap_or("").to_string(), stream)
}

#[tokio::test]
async fn an_edit_of_the_policy_flips_a_name_for_new_connections_only() {
    // The destination: holds every connection open, answering `pong`.
    let outside = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = outside.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = outside.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4];
                while stream.read_exact(&mut buf).await.is_ok() {
                    if stream.write_all(b"pong").await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let (edit, live) = watch::channel(Policy::default());
    let proxy = EgressProxy::new(
        TcpListener::bind((LOOPBACK, 0)).await.unwrap(),
        ProxyConfig {
            pool: "flip".into(),
            policy: live,
            limits: Limits::default(),
            resolver: Arc::new(StaticResolver(
                [("ok.test".to_string(), vec![LOOPBACK])].into(),
            )),
        },
    )
    .unwrap();
    let at = proxy.local_addr();
    let metrics = proxy.metrics();
    tokio::spawn(proxy.serve());
    let target = format!("ok.test:{port}");

    let (status, _) = connect(at, &target).await;
    assert!(status.contains(" 403 "), "denied before the edit: {status}");

    edit.send_replace(policy(std::slice::from_ref(&target)));
    let (status, mut tunnel) = connect(at, &target).await;
    assert!(status.contains(" 200 "), "allowed after the edit: {status}");

    edit.send_replace(policy(&["elsewhere.test".to_string()]));
    let (status, _) = connect(at, &target).await;
    assert!(
        status.contains(" 403 "),
        "denied after the edit back: {status}"
    );
    // The tunnel admitted before keeps the decision it got.
    tunnel.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"pong");
    assert_eq!((metrics.allowed(), metrics.denied()), (1, 2));
}

#[tokio::test]
async fn a_proxy_on_every_address_refuses_its_own_port_on_loopback() {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = format!("self.test:{port}");
    let proxy = EgressProxy::new(
        listener,
        ProxyConfig {
            pool: "loop".into(),
            policy: policy(std::slice::from_ref(&target)).fixed(),
            limits: Limits::default(),
            resolver: Arc::new(StaticResolver(
                [("self.test".to_string(), vec![LOOPBACK])].into(),
            )),
        },
    )
    .unwrap();
    tokio::spawn(proxy.serve());
    let (status, _) = connect(SocketAddr::new(LOOPBACK, port), &target).await;
    assert!(status.contains(" 403 "), "no loop through itself: {status}");
}
