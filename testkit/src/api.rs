//! The live api: `mango` served in-process on 127.0.0.1:0 over a database
//! the caller owns, with a Workspace key, an Environment and its key.

use mango_api::store::keys;
use mango_api::{server, ApiContext, Settings};
use mango_protocol::time;
use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestApp {
    /// `http://127.0.0.1:<port>`
    pub base: String,
    /// Its sandbox listeners ([`TestApp::start_also_on`]): only the routes
    /// a runner uses, as `MANGO_SANDBOX_LISTEN_ADDR` serves them.
    pub also: Vec<std::net::SocketAddr>,
    /// `http://127.0.0.1:<port>` of its metrics listener (`/metrics`).
    pub metrics_base: String,
    /// The client [`TestApp::call`] sends with.
    pub http: reqwest::Client,
    /// The caller's pool on the api's database: a test's direct SQL writes
    /// through it as another process would.
    pub db: PgPool,
    /// The served api's context (its pool is [`ApiContext::db`]).
    pub ctx: ApiContext,
    /// A Workspace key of `wrkspc_default`.
    pub ws_key: String,
    pub env_id: String,
    /// An Environment key bound to `env_id`.
    pub env_key: String,
    pub env_key_id: String,
    /// Dropping the sender shuts the server down gracefully.
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl TestApp {
    /// The api with default settings, and the test playing the model's
    /// part: it appends the agent's events itself
    /// ([`crate::append_agent_events`]), so Sessions' input is admitted and
    /// activated as with a model endpoint, and no agent loop runs. A test of
    /// the agent loop starts the api with a [`crate::ScriptedModel`]'s
    /// `model_base_url`, and one of an api without a model with
    /// `Settings::default()`, through [`TestApp::start_with`].
    pub async fn start(db: PgPool) -> TestApp {
        Self::start_with(
            db,
            Settings {
                caller_plays_model: true,
                ..Settings::default()
            },
        )
        .await
    }

    /// [`TestApp::start`] on `clock`, a clock the test moves (the Work
    /// lease paths read it: spec §3–§4 edges, and times left as the api counts them).
    pub async fn start_on_clock(db: PgPool, clock: mango_api::clock::ManualClock) -> TestApp {
        let pool = mango_api::db::api_pool(&db, 16).await.unwrap();
        let mut ctx = ApiContext::new(
            pool,
            Settings {
                caller_plays_model: true,
                ..Settings::default()
            },
        );
        ctx.clock = clock.into();
        Self::serve(db, ctx).await
    }

    /// The api with `settings` over the database `db` points at.
    pub async fn start_with(db: PgPool, settings: Settings) -> TestApp {
        // The server runs as `mango serve` does, as a named api process; the
        // test's own pool (`db`) writes as another process would.
        let pool = mango_api::db::api_pool(&db, 16).await.unwrap();
        Self::serve(db, ApiContext::new(pool, settings)).await
    }

    /// Serves `ctx` (the sweeper, the LISTEN connection and, with a model
    /// endpoint, the agent loop included) on a loopback port; creates the
    /// keys through `db` and the Environment over HTTP. Returns once the
    /// LISTEN connection is up, so wake-ups and other processes' events
    /// reach the api from then on.
    pub async fn serve(db: PgPool, ctx: ApiContext) -> TestApp {
        Self::serve_on(db, ctx, &[]).await
    }

    /// [`TestApp::serve`], with a sandbox listener on a port of each of
    /// `ips` too (e.g. the Docker bridge's gateway: `mango-bench supervisor`).
    pub async fn serve_also_on(db: PgPool, ctx: ApiContext, ips: &[std::net::IpAddr]) -> TestApp {
        Self::serve_on(db, ctx, ips).await
    }

    /// [`TestApp::start_with`], with a sandbox listener on a port of each of
    /// `ips` too (e.g. the Docker bridge's gateway, where sandboxes reach
    /// the host): sandboxes reach only the routes a runner uses.
    pub async fn start_also_on(
        db: PgPool,
        settings: Settings,
        ips: &[std::net::IpAddr],
    ) -> TestApp {
        let pool = mango_api::db::api_pool(&db, 16).await.unwrap();
        Self::serve_on(db, ApiContext::new(pool, settings), ips).await
    }

    /// A second api process on this one's database, as another replica of
    /// `mango serve` is: its own named pool (so its own LISTEN connection and
    /// registry row), the same settings, on its own loopback port. It shares
    /// this app's Workspace key, Environment and Environment key (nothing new
    /// is created) and returns once it listens. Stop it with
    /// [`TestApp::stop`]; dropping it stops it too.
    pub async fn second_process(&self) -> TestApp {
        let pool = mango_api::db::api_pool(&self.db, 8).await.unwrap();
        let ctx = ApiContext::new(pool, (*self.ctx.settings).clone());
        let (base, also, metrics_base, shutdown, server) = Self::listen(ctx.clone(), &[]).await;
        let app = TestApp {
            base,
            also,
            metrics_base,
            http: self.http.clone(),
            db: self.db.clone(),
            ctx,
            ws_key: self.ws_key.clone(),
            env_id: self.env_id.clone(),
            env_key: self.env_key.clone(),
            env_key_id: self.env_key_id.clone(),
            shutdown: Mutex::new(Some(shutdown)),
            server: Mutex::new(Some(server)),
        };
        app.ctx.until_listening().await;
        app
    }

    /// Serves `ctx` on a loopback port, a sandbox listener on one port of
    /// each of `ips`, and a loopback metrics port: the base URL, the further addresses, the
    /// metrics URL, the shutdown sender and the server task.
    async fn listen(
        ctx: ApiContext,
        ips: &[std::net::IpAddr],
    ) -> (
        String,
        Vec<std::net::SocketAddr>,
        String,
        oneshot::Sender<()>,
        JoinHandle<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let listeners = vec![listener];
        let mut also = Vec::new();
        let mut sandboxes = Vec::new();
        for ip in ips {
            let extra = tokio::net::TcpListener::bind((*ip, 0)).await.unwrap();
            also.push(extra.local_addr().unwrap());
            sandboxes.push(extra);
        }
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_base = format!("http://{}", metrics.local_addr().unwrap());
        let listeners = server::Listeners {
            operators: listeners,
            sandboxes,
            metrics: Some(metrics),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            server::serve_listeners(ctx, listeners, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        (base, also, metrics_base, tx, server)
    }

    async fn serve_on(db: PgPool, ctx: ApiContext, ips: &[std::net::IpAddr]) -> TestApp {
        let (base, also, metrics_base, tx, server) = Self::listen(ctx.clone(), ips).await;
        let (_, ws_key) = keys::create(&db, "wrkspc_default", None, "test operator", time::now())
            .await
            .unwrap();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let mut app = TestApp {
            base,
            also,
            metrics_base,
            http,
            db,
            ctx,
            ws_key,
            env_id: String::new(),
            env_key: String::new(),
            env_key_id: String::new(),
            shutdown: Mutex::new(Some(tx)),
            server: Mutex::new(Some(server)),
        };
        app.env_id = app.create_environment("test env").await;
        let (key, secret) = app.environment_key(&app.env_id.clone()).await;
        app.env_key = secret;
        app.env_key_id = key;
        app.ctx.until_listening().await;
        app
    }

    /// Shuts the server down gracefully (in-flight requests finish) and
    /// waits for it, at most `within`. Dropping the app shuts it down too,
    /// without waiting.
    pub async fn stop(&self, within: Duration) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.lock().expect("shutdown lock").take() {
            let _ = tx.send(());
        }
        let Some(server) = self.server.lock().expect("server lock").take() else {
            return Ok(());
        };
        match tokio::time::timeout(within, server).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => anyhow::bail!("the api server failed: {err}"),
            Err(_) => anyhow::bail!("the api server did not shut down within {within:?}"),
        }
    }

    pub async fn create_environment(&self, name: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/environments",
                Some(&self.ws_key),
                Some(json!({"name": name})),
            )
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }

    /// (key id, secret) of a new Environment key bound to `env`.
    pub async fn environment_key(&self, env: &str) -> (String, String) {
        let (row, secret) = keys::create(
            &self.db,
            "wrkspc_default",
            Some(env),
            "test supervisor",
            time::now(),
        )
        .await
        .unwrap();
        (row.id, secret)
    }
}
