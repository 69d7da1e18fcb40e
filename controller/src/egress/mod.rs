//! Per-pool egress: default deny, and an allowlist of names reached only
//! through the proxy the supervisor runs. [`allow`] is the allowlist's
//! syntax, [`address`] which resolved addresses may be reached,
//! [`request`] the one request head a connection starts with, and
//! [`proxy`] the proxy itself; [`pool`] runs it for a Kubernetes
//! WorkerPool, following the pool's `spec.egress`.

pub mod address;
pub mod allow;
pub mod pool;
pub mod proxy;
pub mod request;

use allow::{Allowlist, EntryError};

/// `--egress-allow…`: the flags every launcher with a proxy takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EgressArgs {
    /// A name this pool's sandboxes may reach through the egress proxy:
    /// `host[:port]` or `*.domain[:port]` (port 443 unless given).
    /// Repeatable; MANGO_EGRESS_ALLOW is a comma list. Empty (the
    /// default): no proxy, and sandboxes reach only the api.
    #[arg(
        long = "egress-allow",
        env = "MANGO_EGRESS_ALLOW",
        value_delimiter = ','
    )]
    pub allow: Vec<String>,
    /// Admit wildcards over a whole top-level domain or everything (`*.com`,
    /// `*`); warned about at every start.
    #[arg(long, env = "MANGO_EGRESS_ALLOW_ANY")]
    pub egress_allow_any: bool,
    /// Let allowed names resolve to loopback, private and link-local
    /// addresses too (names inside the operator's own network). The
    /// sandbox network's gateway, where the host and the api are, stays
    /// refused.
    #[arg(long, env = "MANGO_EGRESS_ALLOW_PRIVATE")]
    pub egress_allow_private: bool,
    /// The proxy's port, on the sandbox network's gateway address. Keep it
    /// fixed: sandboxes a restarted supervisor adopts still name it.
    #[arg(long, env = "MANGO_EGRESS_PROXY_PORT", default_value_t = 3128)]
    pub egress_proxy_port: u16,
}

impl EgressArgs {
    /// The allowlist, or the first refused entry; warns when
    /// `--egress-allow-any` is given, at every start.
    pub fn allowlist(&self) -> Result<Allowlist, EntryError> {
        // `MANGO_EGRESS_ALLOW=` (set, empty) is no list; a blank entry
        // inside a list (`a,,b`) is a typo and refused.
        let entries: &[String] = match self.allow.as_slice() {
            [only] if only.trim().is_empty() => &[],
            all => all,
        };
        let list = Allowlist::parse(entries, self.egress_allow_any)?;
        if self.egress_allow_any {
            tracing::warn!(broad = ?list.broad(), "--egress-allow-any: egress wildcards over whole top-level domains or everything are admitted");
        }
        Ok(list)
    }
}

/// What a sandbox's environment gets when its pool has a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// `host:port` of the proxy as sandboxes reach it.
    pub proxy: String,
    /// Reached directly, never through the proxy: the api's host.
    pub no_proxy: String,
}

impl Routing {
    /// `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`, in both cases, for the
    /// sandbox of `work_id`. The Work id is the proxy user: attribution in
    /// the proxy's log, not a credential (any tool of the pool can name
    /// any id, and gains nothing by it: the allowlist is the pool's).
    pub fn env(&self, work_id: &str) -> Vec<(String, String)> {
        // A warm sandbox is made before its Work is known, and Docker cannot
        // change a container's environment later: its requests are logged
        // with the pool alone.
        let url = if work_id.is_empty() {
            format!("http://{}", self.proxy)
        } else {
            format!("http://{work_id}@{}", self.proxy)
        };
        let mut env = Vec::new();
        for name in ["HTTPS_PROXY", "HTTP_PROXY"] {
            env.push((name.to_string(), url.clone()));
            env.push((name.to_ascii_lowercase(), url.clone()));
        }
        env.push(("NO_PROXY".to_string(), self.no_proxy.clone()));
        env.push(("no_proxy".to_string(), self.no_proxy.clone()));
        env
    }
}

/// A Docker pool's egress: its allowlist, and how its proxy runs.
pub struct DockerEgress {
    pub allowlist: Allowlist,
    pub allow_private: bool,
    /// On the sandbox network's gateway (0: any free port, for tests).
    pub port: u16,
    pub resolver: std::sync::Arc<dyn proxy::Resolve>,
}

/// Starts the pool's egress proxy on the sandbox network's gateway, the
/// host's address on that network, and points new sandboxes at it. The
/// gateway itself is a refused destination: the proxy is no way around
/// the fence to the host's other ports.
pub async fn serve_for_docker(
    launcher: crate::docker::DockerLauncher,
    egress: DockerEgress,
    pool: &str,
    sandbox_base_url: &str,
) -> Result<
    (
        crate::docker::DockerLauncher,
        std::sync::Arc<proxy::EgressMetrics>,
    ),
    crate::core::launcher::LaunchError,
> {
    use crate::core::launcher::LaunchError;
    let gateway = std::net::IpAddr::V4(launcher.network().gateway);
    let listen = std::net::SocketAddr::new(gateway, egress.port);
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|err| {
        LaunchError::Failed(format!(
            "cannot serve the egress proxy on {listen} (MANGO_EGRESS_PROXY_PORT, --egress-proxy-port): {err}"
        ))
    })?;
    let no_proxy = url_host(sandbox_base_url).ok_or_else(|| {
        LaunchError::Failed(format!(
            "the sandboxes' api URL {sandbox_base_url} has no host"
        ))
    })?;
    let entries: Vec<String> = egress
        .allowlist
        .entries()
        .iter()
        .map(ToString::to_string)
        .collect();
    let proxy = proxy::EgressProxy::new(
        listener,
        proxy::ProxyConfig {
            pool: pool.to_string(),
            policy: proxy::Policy {
                allowlist: egress.allowlist,
                addresses: address::AddressPolicy {
                    allow_private: egress.allow_private,
                    refused: vec![gateway],
                },
            }
            .fixed(),
            limits: proxy::Limits::default(),
            resolver: egress.resolver,
        },
    )
    .map_err(|err| LaunchError::Failed(format!("the egress proxy: {err}")))?;
    let listen = proxy.local_addr();
    let metrics = proxy.metrics();
    tracing::info!(addr = %listen, pool, allow = ?entries, "serving the egress proxy");
    tokio::spawn(proxy.serve());
    let routing = Routing {
        proxy: listen.to_string(),
        no_proxy,
    };
    Ok((launcher.with_egress(routing), metrics))
}

/// The host of a base URL (`http://host.docker.internal:8080/` →
/// `host.docker.internal`), for `NO_PROXY`.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cold_sandbox_names_its_work_and_a_warm_one_names_none() {
        let routing = Routing {
            proxy: "host.docker.internal:3128".into(),
            no_proxy: "host.docker.internal".into(),
        };
        let value = |env: Vec<(String, String)>, name: &str| {
            env.into_iter().find(|(k, _)| k == name).unwrap().1
        };
        assert_eq!(
            value(routing.env("work_abc"), "HTTPS_PROXY"),
            "http://work_abc@host.docker.internal:3128"
        );
        assert_eq!(
            value(routing.env(""), "https_proxy"),
            "http://host.docker.internal:3128",
            "no empty user in a warm sandbox's URL"
        );
        assert_eq!(value(routing.env(""), "NO_PROXY"), "host.docker.internal");
    }

    #[test]
    fn the_api_host_is_read_from_its_url() {
        for (url, host) in [
            ("http://host.docker.internal:8080", "host.docker.internal"),
            ("http://host.docker.internal:8080/", "host.docker.internal"),
            ("https://api.example.com/v1?x", "api.example.com"),
            ("http://u@10.0.0.1:1", "10.0.0.1"),
            ("http://[fd00::1]:8080/", "fd00::1"),
            ("mango-api:8080", "mango-api"),
        ] {
            assert_eq!(url_host(url).as_deref(), Some(host), "{url}");
        }
        assert_eq!(url_host("http://:8080"), None);
    }

    #[test]
    fn a_sandbox_names_its_work_as_the_proxy_user_and_skips_the_api() {
        let routing = Routing {
            proxy: "172.18.0.1:3128".into(),
            no_proxy: "host.docker.internal".into(),
        };
        let env = routing.env("work_01x");
        for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
            assert!(
                env.contains(&(
                    name.to_string(),
                    "http://work_01x@172.18.0.1:3128".to_string()
                )),
                "{env:?}"
            );
        }
        assert!(env.contains(&("NO_PROXY".into(), "host.docker.internal".into())));
        assert!(env.contains(&("no_proxy".into(), "host.docker.internal".into())));
    }

    #[test]
    fn the_allowlist_from_flags_refuses_a_bad_entry_naming_it() {
        let args = EgressArgs {
            allow: vec!["ok.example".into(), "*.com".into()],
            ..Default::default()
        };
        let err = args.allowlist().unwrap_err();
        assert!(err.to_string().contains("\"*.com\""), "{err}");
        let any = EgressArgs {
            egress_allow_any: true,
            ..args
        };
        assert_eq!(any.allowlist().unwrap().broad(), vec!["*.com:443"]);
        let unset = EgressArgs {
            allow: vec![String::new()],
            ..Default::default()
        };
        assert!(
            unset.allowlist().unwrap().is_empty(),
            "an empty MANGO_EGRESS_ALLOW is no list"
        );
        let blank = EgressArgs {
            allow: vec!["a.example".into(), " ".into()],
            ..Default::default()
        };
        assert_eq!(blank.allowlist().unwrap_err().entry, " ");
    }
}
