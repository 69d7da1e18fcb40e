//! A pool's egress allowlist: which names and ports its sandboxes may reach
//! through the egress proxy. Pure: parsing and matching, no I/O.
//!
//! The syntax, one entry each:
//! * `host[:port]`: exactly that name. Names are compared in their ASCII
//!   (IDNA) form, lower case, without a trailing dot, so `Bücher.Example.`
//!   and `xn--bcher-kva.example` are one entry.
//! * `*.domain[:port]`: any name *below* `domain`, at any depth
//!   (`a.domain`, `a.b.domain`), never `domain` itself. `*` is allowed
//!   only as the whole leftmost label.
//! * The port defaults to 443; 1..=65535.
//! * IP literals are refused: the proxy admits names and resolves them
//!   itself, so an address in the allowlist would skip the check of what a
//!   name resolves to.
//! * A wildcard with fewer than two fixed labels (`*`, `*.com`) would open
//!   a whole top-level domain or everything: refused unless the operator
//!   spells `--egress-allow-any` (`allowAny`), which is logged as a warning
//!   at every start. Without a public-suffix list, `*.co.uk` counts as
//!   narrow enough; say so in the docs rather than pretend otherwise.

use std::fmt;

pub const DEFAULT_PORT: u16 = 443;
/// Longest name DNS carries (RFC 1035), in its ASCII form.
const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pattern: Pattern,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this name (ASCII, lower case, no trailing dot).
    Exact(String),
    /// Any name strictly below this suffix; `""` is the bare `*`.
    Below(String),
}

/// Why an entry was refused; the message names the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryError {
    pub entry: String,
    pub why: String,
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "egress allowlist entry {:?}: {}", self.entry, self.why)
    }
}

impl std::error::Error for EntryError {}

impl Entry {
    /// Parses one entry; `allow_any` admits wildcards wider than one label
    /// under two fixed ones.
    pub fn parse(entry: &str, allow_any: bool) -> Result<Entry, EntryError> {
        let refuse = |why: &str| EntryError {
            entry: entry.to_string(),
            why: why.to_string(),
        };
        let text = entry.trim();
        if text.is_empty() {
            return Err(refuse("is empty"));
        }
        if text.contains("://") || text.contains('/') {
            return Err(refuse(
                "takes a name and an optional port (host[:port]), not a URL",
            ));
        }
        if text.starts_with('[') || text.parse::<std::net::IpAddr>().is_ok() {
            return Err(refuse(
                "is an IP address; the allowlist takes names, which the proxy resolves itself",
            ));
        }
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => (host, parse_port(port).map_err(|why| refuse(&why))?),
            None => (text, DEFAULT_PORT),
        };
        let (wildcard, rest) = match host.strip_prefix('*') {
            Some("") => (true, ""),
            Some(rest) => match rest.strip_prefix('.') {
                Some(rest) => (true, rest),
                None => return Err(refuse("a wildcard is `*.` followed by a domain")),
            },
            None => (false, host),
        };
        if rest.contains('*') {
            return Err(refuse("`*` is allowed only as the whole leftmost label"));
        }
        let name = if rest.is_empty() {
            String::new()
        } else {
            let name = normalize(rest).map_err(|why| refuse(&why))?;
            if name.parse::<std::net::Ipv4Addr>().is_ok() {
                return Err(refuse(
                    "is an IP address; the allowlist takes names, which the proxy resolves itself",
                ));
            }
            name
        };
        if !wildcard {
            return Ok(Entry {
                pattern: Pattern::Exact(name),
                port,
            });
        }
        let fixed = if name.is_empty() {
            0
        } else {
            name.split('.').count()
        };
        if fixed < 2 && !allow_any {
            return Err(refuse(
                "is a wildcard over a whole top-level domain or everything; \
                 name a domain with at least two labels (`*.example.com`), \
                 or give --egress-allow-any (allowAny) to mean it",
            ));
        }
        Ok(Entry {
            pattern: Pattern::Below(name),
            port,
        })
    }

    /// Whether `host` (already normalized) on `port` is admitted.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        match &self.pattern {
            Pattern::Exact(name) => host == name,
            Pattern::Below(suffix) if suffix.is_empty() => !host.is_empty(),
            Pattern::Below(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
        }
    }

    /// Wider than one label under two fixed ones: what `allow_any` admits.
    pub fn is_broad(&self) -> bool {
        match &self.pattern {
            Pattern::Exact(_) => false,
            Pattern::Below(suffix) => suffix.is_empty() || !suffix.contains('.'),
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Exact(name) => write!(f, "{name}:{}", self.port),
            Pattern::Below(suffix) if suffix.is_empty() => write!(f, "*:{}", self.port),
            Pattern::Below(suffix) => write!(f, "*.{suffix}:{}", self.port),
        }
    }
}

fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {port:?} is not a number 1..=65535"));
    }
    match port.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(format!("port {port} is outside 1..=65535")),
    }
}

/// A host name in the form entries and requests are compared in: IDNA to
/// ASCII, lower case, one trailing dot dropped; refused when it is not a
/// valid DNS name (labels of 1..=63 letters, digits and inner hyphens, at
/// most 253 in all).
pub fn normalize(host: &str) -> Result<String, String> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return Err("the name is empty".into());
    }
    let ascii = if host.is_ascii() {
        host.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii(host)
            .map_err(|_| "is not a valid internationalized name".to_string())?
    };
    if ascii.len() > MAX_NAME {
        return Err(format!("the name is longer than {MAX_NAME} characters"));
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err("the name has an empty label".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!("a label is longer than {MAX_LABEL} characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(format!(
                "the label {label:?} has a character other than a-z, 0-9 and -"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("the label {label:?} starts or ends with -"));
        }
    }
    Ok(ascii)
}

/// A pool's allowlist. Empty (the default): nothing is admitted, and no
/// proxy runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
    allow_any: bool,
}

impl Allowlist {
    /// Parses every entry; the first bad one is the error. Blank entries
    /// (from `a,,b` or a trailing comma) are refused too: a typo must not
    /// pass silently.
    pub fn parse<S: AsRef<str>>(entries: &[S], allow_any: bool) -> Result<Allowlist, EntryError> {
        let entries = entries
            .iter()
            .map(|e| Entry::parse(e.as_ref(), allow_any))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Allowlist { entries, allow_any })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The broad entries `allow_any` let in, for the start-up warning.
    pub fn broad(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| e.is_broad())
            .map(Entry::to_string)
            .collect()
    }

    pub fn allow_any(&self) -> bool {
        self.allow_any
    }

    /// Whether a request for `host` (as the client spelled it) on `port` is
    /// admitted. IP literals and names that do not normalize never are.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
            return false;
        }
        match normalize(host) {
            Ok(name) => self.entries.iter().any(|e| e.admits(&name, port)),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests;
