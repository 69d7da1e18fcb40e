//! `mango-worker egress-proxy`: the egress proxy of one Kubernetes
//! WorkerPool. It follows the pool's `spec.egress` (`allow`, `allowAny`,
//! `allowPrivate`) with a watch and hands each change to the proxy, so an
//! edit applies to the next connection without a restart. A missing pool
//! or an invalid allowlist denies everything, logged as an error (the
//! operator shows the pool `InvalidSpec`). The proxy's own Pod addresses
//! are refused destinations whatever `allowPrivate` says.

use super::address::AddressPolicy;
use super::proxy::{self, EgressMetrics, EgressProxy, Limits, Policy, ProxyConfig, Resolve};
use crate::kubernetes::crd::WorkerPool;
use anyhow::Context as _;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// `mango-worker egress-proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct EgressProxyArgs {
    /// The WorkerPool whose `spec.egress` this proxy applies.
    #[arg(long)]
    pub pool: String,
    /// The pool's namespace [default: POD_NAMESPACE, else this Pod's
    /// service account namespace].
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Where sandboxes reach the proxy.
    #[arg(
        long,
        env = "MANGO_EGRESS_PROXY_LISTEN",
        default_value = "0.0.0.0:3128"
    )]
    pub listen: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(
        long,
        env = "MANGO_EGRESS_METRICS_LISTEN",
        default_value = "0.0.0.0:9465"
    )]
    pub metrics_listen: SocketAddr,
    /// This Pod's own addresses, never a destination (the downward API's
    /// `status.podIPs`, a comma list) [default: what this host's name
    /// resolves to, which the kubelet writes into the Pod's /etc/hosts].
    #[arg(long, env = "POD_IPS", value_delimiter = ',')]
    pub pod_ip: Vec<IpAddr>,
}

/// How the proxy of one pool runs, for [`serve`].
pub struct PoolProxy {
    pub client: kube::Client,
    pub namespace: String,
    pub pool: String,
    /// Refused destinations whatever the pool says: the proxy's own Pod.
    pub own_addresses: Vec<IpAddr>,
    pub resolver: Arc<dyn Resolve>,
    pub limits: Limits,
}

/// What the metrics listener reports.
struct Health {
    pool: String,
    /// The pool was read (found or not) at least once.
    ready: AtomicBool,
    /// The pool exists and its allowlist parses.
    valid: AtomicBool,
    decisions: Arc<EgressMetrics>,
}

impl Health {
    fn render(&self) -> String {
        format!(
            "{}# HELP mango_egress_policy_valid Whether the proxy holds its pool's allowlist (0: the pool is missing or its allowlist is invalid, and everything is denied).\n\
             # TYPE mango_egress_policy_valid gauge\n\
             mango_egress_policy_valid{{pool=\"{}\"}} {}\n",
            self.decisions.render(),
            proxy::label_value(&self.pool),
            u8::from(self.valid.load(Relaxed))
        )
    }
}

/// The flags' entry point: a client from the kubeconfig or the Pod's
/// service account, the system's resolver, until `stop`.
pub async fn run(
    args: EgressProxyArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let namespace = match args.namespace.filter(|ns| !ns.trim().is_empty()) {
        Some(ns) => ns,
        None => std::fs::read_to_string(NAMESPACE_FILE)
            .map(|ns| ns.trim().to_string())
            .with_context(|| {
                format!("no --namespace, no POD_NAMESPACE, and {NAMESPACE_FILE} cannot be read")
            })?,
    };
    let own_addresses = if args.pod_ip.is_empty() {
        own_host_addresses().await
    } else {
        args.pod_ip
    };
    let listener = TcpListener::bind(args.listen).await.with_context(|| {
        format!(
            "cannot serve the egress proxy on {} (--listen, MANGO_EGRESS_PROXY_LISTEN)",
            args.listen
        )
    })?;
    let metrics = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| {
            format!(
                "cannot serve metrics on {} (--metrics-listen, MANGO_EGRESS_METRICS_LISTEN)",
                args.metrics_listen
            )
        })?;
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client (neither a kubeconfig nor the Pod's service account)")?;
    let setup = PoolProxy {
        client,
        namespace,
        pool: args.pool,
        own_addresses,
        resolver: Arc::new(proxy::SystemResolver),
        limits: Limits::default(),
    };
    serve(setup, listener, metrics, stop).await
}

/// Serves the proxy on `listener` and its health on `metrics`, following
/// the pool, until `stop`.
pub async fn serve(
    setup: PoolProxy,
    listener: TcpListener,
    metrics: TcpListener,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (edit, policy) = watch::channel(denied(&setup.own_addresses));
    let proxy = EgressProxy::new(
        listener,
        ProxyConfig {
            pool: setup.pool.clone(),
            policy,
            limits: setup.limits,
            resolver: setup.resolver,
        },
    )?;
    let health = Arc::new(Health {
        pool: setup.pool.clone(),
        ready: AtomicBool::new(false),
        valid: AtomicBool::new(false),
        decisions: proxy.metrics(),
    });
    tracing::info!(pool = %setup.pool, namespace = %setup.namespace, addr = %proxy.local_addr(),
        metrics = %metrics.local_addr()?, refused = ?setup.own_addresses, "serving the egress proxy");
    let api: Api<WorkerPool> = Api::namespaced(setup.client, &setup.namespace);
    let follower = Follower {
        pool: setup.pool,
        namespace: setup.namespace,
        own: setup.own_addresses,
        edit,
        health: health.clone(),
    };
    tokio::select! {
        () = proxy.serve() => {}
        () = follower.follow(api) => {}
        served = serve_health(metrics, health) => served?,
        () = stop => tracing::info!("shutting down the egress proxy"),
    }
    Ok(())
}

/// Deny everything, refusing the own addresses too.
fn denied(own: &[IpAddr]) -> Policy {
    Policy {
        allowlist: Default::default(),
        addresses: AddressPolicy {
            allow_private: false,
            refused: own.to_vec(),
        },
    }
}

/// The policy a pool's spec makes, or why everything is denied.
pub fn policy_of(pool: Option<&WorkerPool>, own: &[IpAddr]) -> Result<Policy, String> {
    let pool = pool.ok_or("the WorkerPool does not exist")?;
    let egress = pool.spec.egress.clone().unwrap_or_default();
    let allowlist = egress
        .allowlist()
        .map_err(|err| format!("spec.egress.allow is invalid: {err}"))?;
    Ok(Policy {
        allowlist,
        addresses: AddressPolicy {
            allow_private: egress.allow_private,
            refused: own.to_vec(),
        },
    })
}

struct Follower {
    pool: String,
    namespace: String,
    own: Vec<IpAddr>,
    edit: watch::Sender<Policy>,
    health: Arc<Health>,
}

impl Follower {
    /// Applies every change of the pool until the watch ends (it does not:
    /// the watcher retries with backoff, keeping the last policy).
    async fn follow(self, api: Api<WorkerPool>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.pool));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        // Whether the list in progress named the pool.
        let mut listed = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => listed = false,
                Ok(Event::InitApply(pool)) => {
                    listed = true;
                    self.apply(Some(&pool));
                }
                Ok(Event::InitDone) => {
                    if !listed {
                        self.apply(None);
                    }
                    self.health.ready.store(true, Relaxed);
                }
                Ok(Event::Apply(pool)) => self.apply(Some(&pool)),
                Ok(Event::Delete(_)) => self.apply(None),
                Err(err) => {
                    tracing::warn!(pool = %self.pool, error = %err, "cannot watch the WorkerPool; keeping the last policy while retrying");
                }
            }
        }
    }

    fn apply(&self, pool: Option<&WorkerPool>) {
        let (pool_name, namespace) = (self.pool.as_str(), self.namespace.as_str());
        match policy_of(pool, &self.own) {
            Ok(policy) => {
                let allow: Vec<String> = policy
                    .allowlist
                    .entries()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let broad = policy.allowlist.broad();
                if !broad.is_empty() {
                    tracing::warn!(pool = pool_name, ?broad, "allowAny: egress wildcards over whole top-level domains or everything are admitted");
                }
                tracing::info!(
                    pool = pool_name,
                    namespace,
                    ?allow,
                    allow_private = policy.addresses.allow_private,
                    "egress policy applied"
                );
                self.edit.send_replace(policy);
                self.health.valid.store(true, Relaxed);
            }
            Err(why) => {
                tracing::error!(pool = pool_name, namespace, reason = %why, "denying all egress");
                self.edit.send_replace(denied(&self.own));
                self.health.valid.store(false, Relaxed);
            }
        }
    }
}

async fn serve_health(listener: TcpListener, health: Arc<Health>) -> anyhow::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let metrics = health.clone();
    let app = axum::Router::new()
        .route("/metrics", get(move || async move { metrics.render() }))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || async move {
                if health.ready.load(Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the WorkerPool has not been read yet",
                    )
                }
            }),
        );
    axum::serve(listener, app)
        .await
        .context("the metrics server stopped")
}

/// What this host's name resolves to, loopback aside: in a Pod, its IPs
/// (the kubelet writes them into /etc/hosts under the Pod's name).
async fn own_host_addresses() -> Vec<IpAddr> {
    let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") else {
        tracing::warn!("cannot read this host's name; its own addresses are refused only when POD_IPS names them");
        return Vec::new();
    };
    let name = name.trim().to_string();
    let found = tokio::net::lookup_host((name.as_str(), 0)).await;
    match found {
        Ok(found) => {
            let mut ips: Vec<IpAddr> = found
                .map(|a| a.ip())
                .filter(|ip| !ip.is_loopback())
                .collect();
            ips.sort();
            ips.dedup();
            ips
        }
        Err(err) => {
            tracing::warn!(host = %name, error = %err, "this host's name does not resolve; its own addresses are refused only when POD_IPS names them");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::crd::EgressSpec;

    fn pool(egress: Option<EgressSpec>) -> WorkerPool {
        let mut pool: WorkerPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"environmentId": "env_1", "environmentKeySecret": {"name": "k"}}
        }))
        .unwrap();
        pool.spec.egress = egress;
        pool
    }

    #[test]
    fn a_pools_policy_is_its_allowlist_with_the_own_addresses_refused() {
        let own: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap()];
        let policy = policy_of(
            Some(&pool(Some(EgressSpec {
                allow: vec!["api.example.com".into()],
                allow_private: true,
                ..Default::default()
            }))),
            &own,
        )
        .unwrap();
        assert!(policy.allowlist.admits("api.example.com", 443));
        assert!(
            policy.addresses.admits("10.9.9.9".parse().unwrap()),
            "allowPrivate"
        );
        assert!(
            !policy.addresses.admits(own[0]),
            "never the proxy's own Pod"
        );
        let none = policy_of(Some(&pool(None)), &own).unwrap();
        assert!(none.allowlist.is_empty(), "no egress: nothing admitted");
    }

    #[test]
    fn a_missing_pool_or_a_bad_entry_denies_all_naming_why() {
        assert_eq!(
            policy_of(None, &[]).unwrap_err(),
            "the WorkerPool does not exist"
        );
        let broad = pool(Some(EgressSpec {
            allow: vec!["ok.example".into(), "*.com".into()],
            ..Default::default()
        }));
        let why = policy_of(Some(&broad), &[]).unwrap_err();
        assert!(why.contains("\"*.com\""), "{why}");
    }
}
