//! What one client may hold of the api's connections, and the process's
//! open-file budget they come out of (docs/operations.md, "Connections").
//! A sandbox is a hostile client: without these, idle connections that send
//! nothing exhaust the file descriptors and operators are locked out.

use std::time::Duration;

/// Which listener a connection arrived on: each has its own per-peer cap,
/// and the metrics label their connections apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Audience {
    /// `MANGO_LISTEN_ADDR`: every route.
    Operators,
    /// `MANGO_SANDBOX_LISTEN_ADDR`: the routes a sandbox's runner uses.
    Sandboxes,
    /// `MANGO_METRICS_ADDR`: `/metrics` and `/healthz`.
    Metrics,
}

impl Audience {
    pub const ALL: [Audience; 3] = [Audience::Operators, Audience::Sandboxes, Audience::Metrics];

    pub fn label(self) -> &'static str {
        match self {
            Audience::Operators => "operators",
            Audience::Sandboxes => "sandboxes",
            Audience::Metrics => "metrics",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The bounds every accepted connection lives under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// An HTTP/1 connection must send a complete request head within this
    /// long of opening or of its previous response ending
    /// (`MANGO_HEADER_READ_TIMEOUT_SECONDS`).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed,
    /// HTTP/2 ones included; an open event stream or long poll is a request
    /// in flight (`MANGO_IDLE_TIMEOUT_SECONDS`).
    pub idle_timeout: Duration,
    /// Open connections of one peer address on an operators' or the
    /// metrics listener (`MANGO_MAX_CONNECTIONS_PER_PEER`).
    pub max_per_peer: usize,
    /// Open connections of one peer address on the sandbox listener
    /// (`MANGO_SANDBOX_MAX_CONNECTIONS_PER_PEER`).
    pub sandbox_max_per_peer: usize,
    /// Open connections of the process on all listeners together
    /// (`MANGO_MAX_CONNECTIONS`); kept under the open-file limit.
    pub max_connections: usize,
}

pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_PER_PEER: usize = 256;
pub const DEFAULT_SANDBOX_MAX_PER_PEER: usize = 64;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_per_peer: DEFAULT_MAX_PER_PEER,
            sandbox_max_per_peer: DEFAULT_SANDBOX_MAX_PER_PEER,
            max_connections: connection_budget(open_file_limit()),
        }
    }
}

impl ConnectionLimits {
    /// The per-peer cap of `audience`'s listeners.
    pub fn per_peer(&self, audience: Audience) -> usize {
        match audience {
            Audience::Sandboxes => self.sandbox_max_per_peer,
            Audience::Operators | Audience::Metrics => self.max_per_peer,
        }
    }
}

/// File descriptors kept out of the connection budget for everything else
/// the process opens (database pool, LISTEN connection, Skill archives,
/// logs): 1,024, or half the limit when that is 2,048 or less.
pub fn reserved_descriptors(open_files: u64) -> u64 {
    1024.min(open_files / 2)
}

/// How many connections fit under `open_files` descriptors.
pub fn connection_budget(open_files: u64) -> usize {
    usize::try_from(open_files - reserved_descriptors(open_files)).unwrap_or(usize::MAX)
}

/// `MANGO_MAX_CONNECTIONS` checked against the budget: more would let
/// accepted connections exhaust the descriptors the process needs.
pub fn check_max_connections(asked: usize, open_files: u64) -> Result<usize, String> {
    let budget = connection_budget(open_files);
    if asked == 0 {
        return Err("MANGO_MAX_CONNECTIONS must be at least 1".into());
    }
    if asked > budget {
        return Err(format!(
            "MANGO_MAX_CONNECTIONS={asked} does not fit the open-file limit of {open_files}: \
             at most {budget} (the limit less {} kept for the database and files); \
             raise the limit (ulimit -n, LimitNOFILE=) or ask for fewer",
            reserved_descriptors(open_files)
        ));
    }
    Ok(asked)
}

/// The soft open-file limit (`RLIMIT_NOFILE`), 1,024 when it cannot be read.
pub fn open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// Raises the soft open-file limit to the hard one (what a process may do
/// without privilege) and returns the limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_descriptors_for_the_rest_of_the_process() {
        assert_eq!(connection_budget(1_048_576), 1_047_552);
        assert_eq!(connection_budget(20_000), 18_976);
        assert_eq!(connection_budget(2_048), 1_024);
        assert_eq!(connection_budget(1_024), 512);
    }

    #[test]
    fn max_connections_is_refused_one_past_the_budget() {
        assert_eq!(check_max_connections(18_976, 20_000), Ok(18_976));
        let refused = check_max_connections(18_977, 20_000).unwrap_err();
        assert!(refused.contains("MANGO_MAX_CONNECTIONS=18977"), "{refused}");
        assert!(refused.contains("at most 18976"), "{refused}");
        assert!(check_max_connections(0, 20_000).is_err());
    }

    #[test]
    fn each_listener_has_its_own_per_peer_cap() {
        let limits = ConnectionLimits {
            max_per_peer: 7,
            sandbox_max_per_peer: 3,
            ..ConnectionLimits::default()
        };
        assert_eq!(limits.per_peer(Audience::Operators), 7);
        assert_eq!(limits.per_peer(Audience::Metrics), 7);
        assert_eq!(limits.per_peer(Audience::Sandboxes), 3);
    }
}
