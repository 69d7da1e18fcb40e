//! How a supervisor runs: its Environment, its pool, its bounds.

use std::time::Duration;

/// How long a signalled runner of a `stopping` item may take to exit: the
/// runner's own bound after a stop signal (`mango_runner::signal::EXIT_BOUND`,
/// 15 s: the running call cancelled, a Memory flush of at most 10 s, the
/// final Stop), plus 5 s for the engine to report the exit. A Stop still
/// ends in bounded time: the claims' period, then at most this.
pub const STOPPING_GRACE: Duration =
    Duration::from_secs(mango_runner::signal::EXIT_BOUND.as_secs() + 5);

/// The default keep of an idle Session's sandbox: 10 minutes. A runner
/// already waits 60 s after an end of turn before it ends an activation, so
/// a kept sandbox serves the user who answers within minutes (reading a
/// reply, running something, typing the next message); past that the
/// next turn pays one cold start, while every kept sandbox holds its
/// memory and pids all that time. docs/supervisor.md says the same.
pub const KEEP_IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct Config {
    pub environment_id: String,
    /// The `mango.dev/pool` label of its sandboxes: which ones it owns.
    pub pool: String,
    /// The API base URL sandboxes use (`MANGO_DOCKER_BASE_URL`, the
    /// in-cluster Service…), which may differ from the supervisor's own.
    pub sandbox_base_url: String,
    /// At most this many live sandboxes.
    pub max_concurrency: usize,
    /// Poll's long-poll wait (1..=999 ms).
    pub block_ms: u32,
    /// Sent as `Anthropic-Worker-ID`, for queue stats.
    pub worker_id: String,
    /// A healthcheck's sandbox is removed this long after its creation if
    /// its runner has not exited (spec §7: 30 s).
    pub healthcheck_attempt: Duration,
    /// Each request to the engine while reconciling or cleaning up (spec §7: 15 s).
    pub request_bound: Duration,
    /// From a created sandbox to its secret delivered: starting it and the
    /// hand-off (a Pod may first wait for its image and a node).
    pub hand_off_bound: Duration,
    /// After SIGTERM, running items get this long to finish before their
    /// sandboxes are removed.
    pub shutdown_grace: Duration,
    /// How often the claims of live items are read (a stopped or reclaimed
    /// item's sandbox is removed within this much).
    pub claims_every: Duration,
    /// A `stopping` item's runner is signalled to stop at once and gets this
    /// long to exit by itself before its sandbox is removed
    /// ([`STOPPING_GRACE`] by default).
    pub stopping_grace: Duration,
    /// A Work its own runner ended (a healthcheck's Result stops it with no
    /// Stop asked for) gets this long for the runner to exit by itself
    /// before its sandbox is removed. A Stop, a reclaim or a lost lease get
    /// no such grace.
    pub finish_grace: Duration,
    /// How often the workspaces of deleted Sessions are looked for and removed.
    pub workspace_sweep_every: Duration,
    /// Warm sandboxes kept started and identity-less, ready to be bound on
    /// Ack (spec §7.1); 0: every item starts cold. They do not count
    /// against `max_concurrency`, which counts bound sandboxes.
    pub warm: usize,
    /// How long a Session's sandbox waits, after an activation that ended
    /// at its runner's idle end, for that Session's next activation (spec
    /// §7.1); zero removes every sandbox after its activation. See
    /// [`KEEP_IDLE`] for the default.
    pub keep_idle: Duration,
    /// How often the warm pool checks its image (a changed one recycles
    /// the warm sandboxes of the old) and retries what it failed to make.
    pub warm_check_every: Duration,
    /// First pause after a failed Poll; doubles (with jitter) up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Config {
    pub fn new(environment_id: &str, sandbox_base_url: &str) -> Config {
        Config {
            environment_id: environment_id.to_string(),
            pool: "default".into(),
            sandbox_base_url: sandbox_base_url.to_string(),
            max_concurrency: 4,
            block_ms: 999,
            worker_id: default_worker_id(),
            healthcheck_attempt: Duration::from_secs(30),
            request_bound: Duration::from_secs(15),
            hand_off_bound: Duration::from_secs(15),
            shutdown_grace: Duration::from_secs(30),
            claims_every: Duration::from_secs(2),
            stopping_grace: STOPPING_GRACE,
            finish_grace: Duration::from_secs(5),
            workspace_sweep_every: Duration::from_secs(300),
            warm: 0,
            keep_idle: KEEP_IDLE,
            warm_check_every: Duration::from_secs(5),
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// `mango-worker-<host>-<pid>`.
pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("mango-worker-{host}-{}", std::process::id())
}
