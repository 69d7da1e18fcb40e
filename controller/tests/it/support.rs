//! A supervisor in this test process, over a live api: started with a
//! launcher, stopped by its shutdown signal.

use mango_client::Client;
use mango_controller::core::config::Config;
use mango_controller::core::launcher::Launcher;
use mango_controller::core::metrics::Metrics;
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::{RunEnd, Supervisor};
use mango_protocol::{CheckStatus, Work, WorkState};
use mango_testkit::TestApp;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `mango-worker item`: the runner, from this package's own binary.
pub fn runner_command() -> mango_controller::local::RunnerCommand {
    mango_controller::local::RunnerCommand {
        program: env!("CARGO_BIN_EXE_mango-worker").into(),
        args: vec!["item".into()],
    }
}

/// Quick bounds for tests.
pub fn config(api: &TestApp, max_concurrency: usize) -> Config {
    let mut config = Config::new(&api.env_id, &api.base);
    config.max_concurrency = max_concurrency;
    config.claims_every = Duration::from_millis(300);
    config.shutdown_grace = Duration::from_secs(5);
    config.request_bound = Duration::from_secs(15);
    config
}

pub struct Running {
    #[allow(dead_code)]
    pub metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<RunEnd>,
}

impl Running {
    pub async fn start<L: Launcher>(api: &TestApp, config: Config, launcher: L) -> Running {
        let key = Secret::new(api.env_key.clone());
        let supervisor = Supervisor::new(config, launcher, &api.base, &key);
        supervisor
            .check_key(&key)
            .await
            .expect("the key is accepted");
        let metrics = supervisor.metrics();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(supervisor.run(async {
            let _ = stopped.await;
        }));
        Running {
            metrics,
            stop: Some(stop),
            done,
        }
    }

    /// SIGTERM's path: stop polling, drain, return how the run ended.
    pub async fn shutdown(mut self) -> RunEnd {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.done)
            .await
            .expect("the supervisor drains within a minute")
            .expect("no panic")
    }
}

/// Waits (at most `within`) until Work `id` is stopped; returns it.
pub async fn until_stopped(api: &TestApp, id: &str, within: Duration) -> Work {
    let operator = Client::new(&api.base, &api.ws_key);
    let deadline = Instant::now() + within;
    loop {
        let work = operator.work(&api.env_id, id).await.unwrap();
        if work.state == WorkState::Stopped {
            return work;
        }
        assert!(Instant::now() < deadline, "{id} still {:?}", work.state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a healthcheck and waits for its result.
pub async fn healthcheck(api: &TestApp, within: Duration) -> (String, CheckStatus, String) {
    let operator = Client::new(&api.base, &api.ws_key);
    let check = operator.create_healthcheck(&api.env_id).await.unwrap();
    let work = until_stopped(api, &check.id, within).await;
    let result = work.result.expect("a stopped check has a result");
    (check.id, result.status, result.message)
}
