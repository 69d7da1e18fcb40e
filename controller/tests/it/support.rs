//! A supervisor in this test process, over a live api: started with a
//! launcher, stopped by its shutdown signal.

use mango_client::Client;
use mango_controller::core::config::Config;
use mango_controller::core::launcher::Launcher;
use mango_controller::core::metrics::Metrics;
use mango_controller::core::secret::Secret;
use mango_controller::core::supervisor::{RunEnd, Stop, Supervisor};
use mango_protocol::{CheckStatus, Work, WorkState};
use mango_testkit::{json_events, model_reply, TestApp};
use serde_json::{json, Value};
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
    stop: Option<tokio::sync::oneshot::Sender<Stop>>,
    done: tokio::task::JoinHandle<RunEnd>,
}

impl Running {
    pub async fn start<L: Launcher>(api: &TestApp, config: Config, launcher: L) -> Running {
        Self::start_via(api, &api.base, config, launcher).await
    }

    /// [`Running::start`] with the supervisor reaching the api at `base`.
    pub async fn start_via<L: Launcher>(
        api: &TestApp,
        base: &str,
        config: Config,
        launcher: L,
    ) -> Running {
        let key = Secret::new(api.env_key.clone());
        let supervisor = Supervisor::new(config, launcher, base, &key);
        supervisor
            .check_key(&key)
            .await
            .expect("the key is accepted");
        let metrics = supervisor.metrics();
        let (stop, stopped) = tokio::sync::oneshot::channel::<Stop>();
        let done =
            tokio::spawn(supervisor.run_until(async { stopped.await.unwrap_or(Stop::Drain) }));
        Running {
            metrics,
            stop: Some(stop),
            done,
        }
    }

    /// SIGTERM's path: stop polling, drain, return how the run ended.
    pub async fn shutdown(self) -> RunEnd {
        self.stop(Stop::Drain).await
    }

    /// Stops the run as `how` says; how it ended.
    pub async fn stop(mut self, how: Stop) -> RunEnd {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(how);
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

/// Replies of a scripted model for a Session of two turns: each runs one
/// `bash` command, then ends its turn.
pub fn two_bash_turns(first: &str, second: &str) -> Vec<(u16, Value)> {
    let turn = |id: &str, command: &str, end: &str| {
        [
            (
                200,
                model_reply(
                    json!([{"type": "tool_use", "id": id, "name": "bash",
                            "input": {"command": command}}]),
                    "tool_use",
                ),
            ),
            (
                200,
                model_reply(json!([{"type": "text", "text": end}]), "end_turn"),
            ),
        ]
    };
    turn("t1", first, "done")
        .into_iter()
        .chain(turn("t2", second, "again"))
        .collect()
}

/// The operator says `say`; waits (at most `within`) until the turn ended
/// and its last tool result contains `want`. Returns the events.
pub async fn turn(
    api: &TestApp,
    session: &str,
    say: &str,
    want: &str,
    within: Duration,
) -> Vec<Value> {
    mango_testkit::turns::say(api, session, say).await;
    let operator = Client::new(&api.base, &api.ws_key);
    let deadline = Instant::now() + within;
    loop {
        let events = json_events(operator.all_events(session).await.unwrap());
        let last_result = events
            .iter()
            .rev()
            .find(|e| e["type"] == "user.tool_result")
            .and_then(|r| r["content"][0]["text"].as_str())
            .unwrap_or("");
        let idle = events.last().is_some_and(|e| {
            e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn"
        });
        if idle && last_result.contains(want) {
            return events;
        }
        assert!(Instant::now() < deadline, "{say}: {events:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator ends the Session's live activation (a forced Stop), so the
/// next message makes another.
pub async fn end_activation(api: &TestApp, session: &str) {
    for (id, state) in api.session_work(session).await {
        if state != "stopped" {
            api.stop_work(&id, true).await;
            until_stopped(api, &id, Duration::from_secs(15)).await;
        }
    }
}

/// The Session's one live Work item.
pub async fn live_work(api: &TestApp, session: &str) -> String {
    let live: Vec<String> = api
        .session_work(session)
        .await
        .into_iter()
        .filter(|(_, state)| state != "stopped")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(live.len(), 1, "one live activation: {live:?}");
    live[0].clone()
}

/// The results the Session's log holds for tool call `id`.
pub fn results_for<'a>(events: &'a [Value], id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == "user.tool_result" && e["tool_use_id"] == id)
        .collect()
}

/// A Session with one message, so its Work is queued for a supervisor.
pub async fn queued_session(api: &TestApp) -> (String, String) {
    let session = api.create_session().await;
    mango_testkit::turns::say(api, &session, "go").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((id, _)) = api.session_work(&session).await.into_iter().next() {
            return (session, id);
        }
        assert!(Instant::now() < deadline, "the Session's Work is created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most `within`) until `done` says so.
pub async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The text of the Session's last tool result.
pub fn last_output(events: &[Value]) -> String {
    events
        .iter()
        .rev()
        .find(|e| e["type"] == "user.tool_result")
        .and_then(|r| r["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_string()
}
