//! A loopback HTTP/1.1 proxy in front of the api that can lose answers: a
//! request it was told to drop still reaches the api (which acts on it),
//! and then the caller's connection is closed before any byte of the answer
//! comes back, as when a network fails after the server saved a write. It
//! can also refuse a request: the api never sees it, and the caller gets an
//! error envelope with the status it was told. Every other exchange, event
//! streams included, passes through untouched.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request to drop the answer of (or, with `refuse`, to answer with
/// that status itself): its method and a fragment of its path.
#[derive(Debug, Clone)]
struct Drop {
    method: String,
    path_contains: String,
    refuse: Option<u16>,
}

pub struct LossyProxy {
    /// `http://127.0.0.1:<port>`: point a client here instead of the api.
    pub base: String,
    drops: Arc<Mutex<Vec<Drop>>>,
    dropped: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::ops::Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LossyProxy {
    /// A proxy to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> LossyProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let drops: Arc<Mutex<Vec<Drop>>> = Arc::default();
        let dropped: Arc<Mutex<Vec<String>>> = Arc::default();
        let (d, seen) = (drops.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, d, seen) = (upstream.clone(), d.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = exchange(client, &upstream, &d, &seen).await;
                });
            }
        });
        LossyProxy {
            base,
            drops,
            dropped,
            task,
        }
    }

    /// The next request with `method` whose path contains `path_contains`
    /// goes through, and its answer is lost.
    pub fn drop_next(&self, method: &str, path_contains: &str) {
        self.drops.lock().unwrap().push(Drop {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            refuse: None,
        });
    }

    /// The next request with `method` whose path contains `path_contains`
    /// never reaches the api: the caller gets `status` and an error
    /// envelope (listed in [`LossyProxy::dropped`] as `METHOD path STATUS`).
    pub fn refuse_next(&self, method: &str, path_contains: &str, status: u16) {
        self.drops.lock().unwrap().push(Drop {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            refuse: Some(status),
        });
    }

    /// `METHOD path` of every request whose answer was lost, in order.
    pub fn dropped(&self) -> Vec<String> {
        self.dropped.lock().unwrap().clone()
    }
}

/// One request on its own upstream connection (`Connection: close` both ways).
async fn exchange(
    mut client: TcpStream,
    upstream: &str,
    drops: &Mutex<Vec<Drop>>,
    dropped: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_string();
    let mut parts = request_line.split(' ');
    let (method, path) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut length = 0usize;
    let mut kept = vec![request_line.clone()];
    for line in lines.filter(|l| !l.is_empty()) {
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            kept.push(line.to_string());
        }
    }
    kept.push("Connection: close".into());
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let (lose, refuse) = {
        let mut drops = drops.lock().unwrap();
        match drops
            .iter()
            .position(|d| d.method == method && path.contains(&d.path_contains))
        {
            Some(i) => {
                let rule = drops.remove(i);
                (rule.refuse.is_none(), rule.refuse)
            }
            None => (false, None),
        }
    };
    if let Some(status) = refuse {
        let body = format!(
            r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"refused by the test proxy with {status}"}},"request_id":"req_proxy"}}"#
        );
        let answer = format!(
            "HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        client.write_all(answer.as_bytes()).await?;
        dropped
            .lock()
            .unwrap()
            .push(format!("{method} {path} {status}"));
        return client.shutdown().await;
    }
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(format!("{}\r\n\r\n", kept.join("\r\n")).as_bytes())
        .await?;
    up.write_all(&body).await?;
    if lose {
        // The api answers in full; the caller gets nothing of it.
        let mut answer = Vec::new();
        up.read_to_end(&mut answer).await?;
        dropped.lock().unwrap().push(format!("{method} {path}"));
        drop(client);
        return Ok(());
    }
    let (mut up_read, _up_write) = up.split();
    tokio::io::copy(&mut up_read, &mut client).await?;
    client.shutdown().await
}
