//! `mango-worker kubernetes`: the operator's process. It checks that it can
//! reach the cluster and that the `WorkerPool` CRD is installed, serves
//! `/metrics`, `/healthz` and `/readyz`, and runs the operator while it
//! holds the leader Lease.

use crate::kubernetes::crd::WorkerPool;
use crate::kubernetes::leader::{self, Leadership};
use crate::kubernetes::operator::{Context, Settings};
use kube::api::ListParams;
use kube::{Api, Client};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The operator's flags (each also an environment variable, as the chart sets them).
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct KubernetesArgs {
    /// Without one: run the operator.
    #[command(subcommand)]
    pub command: Option<KubernetesCommand>,
    /// The namespace whose WorkerPools this controller serves (default: its
    /// own ServiceAccount's namespace, else the kubeconfig's).
    #[arg(long, env = "MANGO_NAMESPACE")]
    pub namespace: Option<String>,
    /// The api URL for pools whose `spec.apiUrl` is empty (the chart sets
    /// its in-cluster Service).
    #[arg(long, env = "MANGO_DEFAULT_API_URL")]
    pub default_api_url: Option<String>,
    /// The api as sandboxes reach it, for pools that name neither
    /// `spec.sandboxApiUrl` nor `spec.apiUrl` (the chart sets its Service's
    /// sandbox port; without it, the api URL).
    #[arg(long, env = "MANGO_DEFAULT_SANDBOX_API_URL")]
    pub default_sandbox_api_url: Option<String>,
    /// The sandbox image for pools whose `spec.image` is empty.
    #[arg(long, env = "MANGO_DEFAULT_SANDBOX_IMAGE", default_value = concat!("mango-sandbox:", env!("CARGO_PKG_VERSION")))]
    pub default_sandbox_image: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "MANGO_METRICS_ADDR", default_value = "0.0.0.0:9464")]
    pub metrics_addr: SocketAddr,
    /// Run the operator only while holding the Lease (off: this replica
    /// always runs it; never run two replicas so).
    #[arg(long, env = "MANGO_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// The `coordination.k8s.io` Lease the replicas elect a leader with.
    #[arg(long, env = "MANGO_LEASE_NAME", default_value = "mango-controller")]
    pub lease_name: String,
    /// This replica's name in the Lease and in Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Run no pool while the cluster serves an older WorkerPool CRD than
    /// this controller's (needs `get` on the CRD: the chart's ClusterRole).
    #[arg(long, env = "MANGO_CHECK_CRD", default_value_t = true, action = clap::ArgAction::Set)]
    pub check_crd: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum KubernetesCommand {
    /// Print, as YAML, the PVC, Pod and Event the controller would create
    /// for a sample item of a WorkerPool file, after checking the pool as
    /// the cluster and the operator do. No cluster needed.
    Render(crate::kubernetes::render::RenderArgs),
}

/// Runs the operator until `shutdown`; errors are printed for people.
pub async fn run(
    args: KubernetesArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> ExitCode {
    match serve(args, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mango-worker kubernetes: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn serve(
    args: KubernetesArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let client = Client::try_default().await.map_err(|err| {
        anyhow::anyhow!(
            "no Kubernetes API to talk to (neither an in-cluster ServiceAccount nor a kubeconfig works): {err}"
        )
    })?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_string());
    check_crd(&client, &namespace).await?;
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("mango-controller-{}", std::process::id()));
    let ctx = Context::new(
        client,
        Settings {
            namespace: namespace.clone(),
            default_api_url: args.default_api_url.clone(),
            default_sandbox_api_url: args.default_sandbox_api_url.clone(),
            default_sandbox_image: args.default_sandbox_image.clone(),
            instance: identity.clone(),
            check_crd: args.check_crd,
        },
    );
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|err| anyhow::anyhow!("cannot serve metrics on {}: {err}", args.metrics_addr))?;
    tokio::spawn(serve_metrics(listener, ctx.clone()));
    let leadership = if args.leader_election {
        Leadership::Lease {
            name: args.lease_name.clone(),
            identity: identity.clone(),
        }
    } else {
        Leadership::Always
    };
    tracing::info!(%namespace, %identity, leader_election = args.leader_election, metrics = %args.metrics_addr, "the operator starts");
    let stop = CancellationToken::new();
    let operator = tokio::spawn(leader::run(ctx, leadership, stop.clone()));
    shutdown.await;
    tracing::info!("shutting down: supervisors detach, their Pods stay for the next leader");
    stop.cancel();
    let _ = operator.await;
    Ok(())
}

/// Fails with what to do when the CRD is missing or the ServiceAccount may not read pools.
async fn check_crd(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let pools: Api<WorkerPool> = Api::namespaced(client.clone(), namespace);
    match pools.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(anyhow::anyhow!(
            "the WorkerPool CRD (workerpools.mango.dev) is not installed: `kubectl apply -f crds/workerpool.yaml` (the Helm chart installs it)"
        )),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(anyhow::anyhow!(
            "this ServiceAccount may not list workerpools in namespace {namespace}: grant the chart's Role ({})",
            status.message
        )),
        Err(err) => Err(anyhow::anyhow!("cannot list WorkerPools in namespace {namespace}: {err}")),
    }
}

async fn serve_metrics(listener: tokio::net::TcpListener, ctx: Arc<Context>) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let ctx = ctx.clone();
                async move { ctx.render_metrics() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        // Ready once the CRD check passed, which precedes serving.
        .route("/readyz", get(|| async { "ok" }));
    if let Err(err) = axum::serve(listener, app).await {
        tracing::error!(error = %err, "the metrics server stopped");
    }
}
