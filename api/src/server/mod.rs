//! Running the api: its listeners (operators', sandboxes', metrics'), each
//! connection's limits, the wake-up listener and the sweeper.

mod activity;
mod connections;
mod request_body;

use crate::connection_limits::Audience;
use crate::context::{AgentLoop, ApiContext};
use crate::service::work;
use crate::{listener, routes};
use anyhow::Context;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use tokio::net::TcpListener;

/// Where the api listens.
#[derive(Default)]
pub struct Listeners {
    /// Every route (`MANGO_LISTEN_ADDR`).
    pub operators: Vec<TcpListener>,
    /// Only what a sandbox's runner uses, with its own per-peer cap
    /// (`MANGO_SANDBOX_LISTEN_ADDR`; [`routes::SANDBOX_ROUTES`]).
    pub sandboxes: Vec<TcpListener>,
    /// `/metrics` and `/healthz` (`MANGO_METRICS_ADDR`).
    pub metrics: Option<TcpListener>,
}

/// Where `/metrics` is served unless told otherwise: loopback, beside the
/// supervisor's 9464.
pub const DEFAULT_METRICS_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9465);

/// The metrics listener: at `given`, or else at [`DEFAULT_METRICS_ADDR`], or,
/// when another process holds that, at a free loopback port, logged (as the
/// supervisor does). An address that was asked for is never swapped.
pub async fn bind_metrics(given: Option<SocketAddr>) -> anyhow::Result<TcpListener> {
    let failed = |addr: SocketAddr| {
        format!("cannot serve metrics on {addr} (MANGO_METRICS_ADDR, --metrics-addr)")
    };
    if let Some(addr) = given {
        return TcpListener::bind(addr).await.with_context(|| failed(addr));
    }
    match TcpListener::bind(DEFAULT_METRICS_ADDR).await {
        Ok(listener) => Ok(listener),
        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = TcpListener::bind(SocketAddr::new(DEFAULT_METRICS_ADDR.ip(), 0))
                .await
                .with_context(|| failed(DEFAULT_METRICS_ADDR))?;
            let addr = listener.local_addr()?;
            tracing::warn!(default = %DEFAULT_METRICS_ADDR, %addr, "the default metrics address is taken (another api on this host?); serving /metrics on a free port instead (MANGO_METRICS_ADDR chooses one)");
            Ok(listener)
        }
        Err(err) => Err(err).with_context(|| failed(DEFAULT_METRICS_ADDR)),
    }
}

/// Serves until `shutdown` resolves, then finishes in-flight requests.
pub async fn serve(
    ctx: ApiContext,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_all(ctx, vec![listener], shutdown).await
}

/// [`serve`] on several operators' listeners, and no other.
pub async fn serve_all(
    ctx: ApiContext,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listeners = Listeners {
        operators: listeners,
        ..Listeners::default()
    };
    serve_listeners(ctx, listeners, shutdown).await
}

/// Serves every listener of `listeners` from one process: one gate counts
/// their connections against `Settings::connections`. On `shutdown`, idle
/// connections close at once and busy ones when their requests end.
pub async fn serve_listeners(
    ctx: ApiContext,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let background = start_background(&ctx);
    let limits = ctx.settings.connections.clone();
    let gate = connections::Gate::new(limits.clone());
    let shared = |audience: Audience, app: axum::Router| connections::Shared {
        audience,
        app,
        gate: gate.clone(),
        metrics: ctx.metrics.clone(),
        limits: limits.clone(),
    };
    let operators = shared(Audience::Operators, routes::router(ctx.clone()));
    let sandboxes = shared(Audience::Sandboxes, routes::sandbox_router(ctx.clone()));
    let metrics = shared(Audience::Metrics, routes::metrics_router(ctx.clone()));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    let all = (listeners.operators.into_iter().map(|l| (l, &operators)))
        .chain(listeners.sandboxes.into_iter().map(|l| (l, &sandboxes)))
        .chain(listeners.metrics.into_iter().map(|l| (l, &metrics)));
    for (listener, shared) in all {
        servers.spawn(connections::accept_loop(
            listener,
            shared.clone(),
            stopping.clone(),
        ));
    }
    shutdown.await;
    let _ = stop.send(true);
    let mut result = Ok(());
    while let Some(done) = servers.join_next().await {
        if let Err(err) = done {
            result = Err(err.into());
        }
    }
    for task in background {
        task.abort();
    }
    result
}

/// The LISTEN fan-out, the sweeper and the agent loop (unless the caller
/// plays the model's part); all are per process and safe to run on every replica.
pub fn start_background(ctx: &ApiContext) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(listener::listen(ctx.clone())),
        tokio::spawn(sweep_forever(ctx.clone())),
    ];
    let model = match ctx.settings.agent_loop() {
        AgentLoop::Model { base_url, api_key } => {
            let key = api_key.map(|k| k.0.clone());
            let mut endpoint =
                crate::model::ModelEndpoint::new(base_url, key, ctx.settings.model_request_timeout);
            endpoint.backoff = ctx.settings.model_retry_backoff;
            tracing::info!(model_base_url = %base_url, "agent loop running");
            Some(std::sync::Arc::new(endpoint))
        }
        AgentLoop::NoModel => {
            tracing::warn!(
                "agent loop without a model: no MANGO_MODEL_BASE_URL or ANTHROPIC_API_KEY is set, \
                 so every Session's input gets a session.error saying so"
            );
            None
        }
        AgentLoop::CallerPlaysModel => return tasks,
    };
    tasks.push(tokio::spawn(crate::agent_loop::run(ctx.clone(), model)));
    tasks
}

async fn sweep_forever(ctx: ApiContext) {
    let mut tick = tokio::time::interval(ctx.settings.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = work::reconcile_due(&ctx).await {
            tracing::warn!(error = %err, "sweep failed");
        }
    }
}
