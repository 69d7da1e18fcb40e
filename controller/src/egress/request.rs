//! The one request head a proxy connection starts with, read within a
//! bound and parsed: a `CONNECT host:port` or an absolute-form `http://`
//! request. Pure parsing apart from [`read_head`].

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest request head (request line and headers) the proxy reads.
pub const MAX_HEAD: usize = 16 * 1024;

#[derive(Debug)]
pub enum HeadError {
    /// Closed before a whole head arrived.
    Closed,
    TooLarge,
    Io(std::io::Error),
}

/// Reads until the blank line ending the head: the head and whatever the
/// client sent after it (the start of a body or of a tunnel's traffic).
pub async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = reader.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let searched_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = find_end(&buf[searched_from..]) {
            let end = searched_from + at + 4;
            if end > MAX_HEAD {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
}

fn find_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n")
}

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    /// As the client spelled it (not yet normalized); IPv6 without brackets.
    pub host: String,
    pub port: u16,
    /// The Work id a sandbox names as its proxy user (attribution only).
    pub work_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Connect,
    /// An `http://` request, re-written to origin form with hop-by-hop and
    /// proxy headers dropped and `Connection: close`.
    Forward {
        head: Vec<u8>,
    },
}

/// Parses a head; the error is a short reason for a 400.
pub fn parse(head: &[u8]) -> Result<Request, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a malformed request line");
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err("only HTTP/1.0 and HTTP/1.1 are spoken");
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("a malformed method");
    }
    let mut headers: Vec<(&str, &str)> = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or("a malformed header line")?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err("a malformed header name");
        }
        headers.push((name, value.trim()));
    }
    let work_id = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("proxy-authorization"))
        .and_then(|(_, v)| proxy_user(v));
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Request {
            kind: Kind::Connect,
            host,
            port,
            work_id,
        });
    }
    let rest = match target.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &target[7..],
        _ => return Err("only CONNECT and absolute http:// requests are proxied"),
    };
    let (authority_part, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let (host, port) = authority(authority_part, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    for (name, value) in &headers {
        let hop = [
            "proxy-authorization",
            "proxy-connection",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
        if !hop {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Request {
        kind: Kind::Forward {
            head: out.into_bytes(),
        },
        host,
        port,
        work_id,
    })
}

/// `host:port` (`[v6]:port`); the port is required unless `default` is given.
fn authority(text: &str, default: Option<u16>) -> Result<(String, u16), &'static str> {
    if text.contains('@') {
        return Err("credentials in the target are refused");
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("a malformed IPv6 literal")?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(after.strip_prefix(':').ok_or("a malformed authority")?),
            ),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err("the target has no host");
    }
    let port = match (port, default) {
        (Some(p), _) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err("the target's port is not 1..=65535"),
            }
        }
        (Some(_), _) => return Err("the target's port is not 1..=65535"),
        (None, Some(d)) => d,
        (None, None) => return Err("CONNECT needs host:port"),
    };
    Ok((host.to_string(), port))
}

/// The user of `Basic base64(user:…)`, when it looks like an id: the
/// sandbox's Work id. Anything else is ignored, so a tool cannot have the
/// proxy log what it likes.
fn proxy_user(value: &str) -> Option<String> {
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let user = decoded.split(':').next()?;
    let plausible = (1..=64).contains(&user.len())
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    plausible.then(|| user.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    }

    #[test]
    fn a_connect_names_its_host_port_and_work() {
        let head = format!(
            "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic("work_01abc")
        );
        let req = parse(head.as_bytes()).unwrap();
        assert_eq!(req.kind, Kind::Connect);
        assert_eq!((req.host.as_str(), req.port), ("api.example.com", 443));
        assert_eq!(req.work_id.as_deref(), Some("work_01abc"));
        let v6 = parse(b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("2001:db8::1", 8443));
    }

    #[test]
    fn malformed_heads_are_refused() {
        for head in [
            &b"CONNECT api.example.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT api.example.com:0 HTTP/1.1\r\n\r\n",
            b"CONNECT api.example.com:65536 HTTP/1.1\r\n\r\n",
            b"CONNECT :443 HTTP/1.1\r\n\r\n",
            b"CONNECT user@api.example.com:443 HTTP/1.1\r\n\r\n",
            b"GET /path HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET https://api.example.com/ HTTP/1.1\r\n\r\n",
            b"GET http://user:pw@api.example.com/ HTTP/1.1\r\n\r\n",
            b"GET http://api.example.com/ HTTP/2\r\n\r\n",
            b"GET  http://api.example.com/ HTTP/1.1\r\n\r\n",
            b"get http://api.example.com/ HTTP/1.1\r\n\r\n",
            b"GET http://api.example.com/ HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET http://api.example.com/ HTTP/1.1\r\nBad Name: v\r\n\r\n",
            b"\xff\xfe HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse(head).is_err(), "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn a_forwarded_request_loses_proxy_and_hop_headers() {
        let head = format!(
            "POST http://plain.example:8080/a/b?c=d HTTP/1.1\r\nHost: plain.example:8080\r\nProxy-Authorization: Basic {}\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nX-Kept: yes\r\nContent-Length: 3\r\n\r\n",
            basic("work_x")
        );
        let req = parse(head.as_bytes()).unwrap();
        assert_eq!((req.host.as_str(), req.port), ("plain.example", 8080));
        let Kind::Forward { head } = req.kind else {
            panic!("a forward")
        };
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /a/b?c=d HTTP/1.1\r\nHost: plain.example:8080\r\nX-Kept: yes\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
        );
        let bare = parse(b"GET http://plain.example HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(bare.port, 80);
        let Kind::Forward { head } = bare.kind else {
            panic!("a forward")
        };
        assert!(head.starts_with(b"GET / HTTP/1.0\r\n"));
        let query = parse(b"GET http://plain.example?q=1 HTTP/1.1\r\n\r\n").unwrap();
        let Kind::Forward { head } = query.kind else {
            panic!("a forward")
        };
        assert!(head.starts_with(b"GET /?q=1 HTTP/1.1\r\n"));
    }

    #[test]
    fn only_id_shaped_proxy_users_are_taken() {
        assert_eq!(
            proxy_user(&format!("Basic {}", basic("work_1"))).as_deref(),
            Some("work_1")
        );
        assert_eq!(
            proxy_user(&format!("Basic {}", basic(&"a".repeat(64)))).map(|u| u.len()),
            Some(64)
        );
        for value in [
            format!("Basic {}", basic(&"a".repeat(65))),
            format!("Basic {}", basic("a b")),
            format!("Basic {}", basic("")),
            format!("Bearer {}", basic("work_1")),
            "Basic !!!".to_string(),
        ] {
            assert_eq!(proxy_user(&value), None, "{value}");
        }
    }

    #[tokio::test]
    async fn a_head_is_read_up_to_its_bound() {
        let mut ok = Vec::from(&b"CONNECT a.example:443 HTTP/1.1\r\n"[..]);
        ok.extend(std::iter::repeat_n(b'x', MAX_HEAD - ok.len() - 4));
        ok.extend_from_slice(b"\r\n\r\n");
        let (head, _) = read_head(&mut &ok[..]).await.unwrap();
        assert_eq!(head.len(), MAX_HEAD);
        let early = b"CONNECT a.example:443 HTTP/1.1\r\n\r\nEARLY";
        let (head, rest) = read_head(&mut &early[..]).await.unwrap();
        assert!(head.ends_with(b"\r\n\r\n"));
        assert_eq!(
            rest, b"EARLY",
            "what follows the head is kept for the destination"
        );
        let mut big = Vec::from(&b"CONNECT a.example:443 HTTP/1.1\r\n"[..]);
        big.extend(std::iter::repeat_n(b'x', MAX_HEAD - big.len() - 3));
        big.extend_from_slice(b"\r\n\r\n");
        assert!(matches!(
            read_head(&mut &big[..]).await,
            Err(HeadError::TooLarge)
        ));
        assert!(matches!(
            read_head(&mut &b"CONNECT a:1 HTTP/1.1\r\n"[..]).await,
            Err(HeadError::Closed)
        ));
    }
}
