//! Running the api: the HTTP server, the wake-up listener and the sweeper.

use crate::context::{AgentLoop, ApiContext};
use crate::service::work;
use crate::{listener, routes};
use axum::serve::ListenerExt;
use std::future::Future;
use tokio::net::TcpListener;

/// Serves until `shutdown` resolves, then finishes in-flight requests.
pub async fn serve(
    ctx: ApiContext,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_all(ctx, vec![listener], shutdown).await
}

/// [`serve`] on several listeners (e.g. loopback for operators and the
/// Docker bridge's address for sandboxes), one process and one router.
pub async fn serve_all(
    ctx: ApiContext,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let background = start_background(&ctx);
    let app = routes::router(ctx);
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut servers = tokio::task::JoinSet::new();
    for listener in listeners {
        // Event streams write each frame as it commits; with Nagle's algorithm a
        // frame that follows an unacknowledged one would wait for the reader's
        // delayed ACK (up to 40 ms).
        let listener = listener.tap_io(|tcp| {
            if let Err(err) = tcp.set_nodelay(true) {
                tracing::warn!(error = %err, "cannot set TCP_NODELAY on a connection");
            }
        });
        let mut stopped = stop.subscribe();
        let app = app.clone();
        servers.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.recv().await;
                })
                .await
        });
    }
    shutdown.await;
    let _ = stop.send(());
    let mut result = Ok(());
    while let Some(done) = servers.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(err)) => result = Err(err.into()),
            Err(err) => result = Err(err.into()),
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
