//! A real api for other crates' tests: served in-process on 127.0.0.1 over a
//! database the test owns, with a Workspace key, an Environment and its key.

use crate::store::keys;
use crate::{server, ApiContext, Settings};
use mango_protocol::time;
use sqlx::PgPool;

pub struct LiveApi {
    pub base: String,
    pub db: PgPool,
    pub workspace_key: String,
    pub environment_id: String,
    pub environment_key: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl LiveApi {
    pub async fn start(db: PgPool) -> LiveApi {
        Self::start_with(db, Settings::default()).await
    }

    pub async fn start_with(db: PgPool, settings: Settings) -> LiveApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let ctx = ApiContext::new(db.clone(), settings);
        tokio::spawn(async move {
            let _ = server::serve(ctx, listener, async {
                let _ = rx.await;
            })
            .await;
        });
        let (_, workspace_key) =
            keys::create(&db, "wrkspc_default", None, "fixture operator", time::now())
                .await
                .expect("a workspace key");
        let env: serde_json::Value = reqwest::Client::new()
            .post(format!("{base}/v1/environments"))
            .bearer_auth(&workspace_key)
            .json(&serde_json::json!({"name": "fixture"}))
            .send()
            .await
            .expect("the api answers")
            .json()
            .await
            .expect("an Environment");
        let environment_id = env["id"].as_str().expect("an Environment id").to_string();
        let (_, environment_key) = keys::create(
            &db,
            "wrkspc_default",
            Some(&environment_id),
            "fixture supervisor",
            time::now(),
        )
        .await
        .expect("an Environment key");
        // Let the LISTEN connection come up before a test relies on wake-ups.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        LiveApi {
            base,
            db,
            workspace_key,
            environment_id,
            environment_key,
            _shutdown: tx,
        }
    }
}
