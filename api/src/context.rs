use crate::clock::Clock;
use crate::store::keys::KeyRow;
use crate::store::work::WorkRow;
use crate::wake::WakeHub;
use chrono::Duration;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Tunables of the control plane (`MANGO_*` environment variables / flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lease TTL when a heartbeat does not ask for one, and the pre-heartbeat lease after Ack.
    pub default_ttl_seconds: i64,
    /// Poll's `reclaim_older_than_ms` when the caller does not send it.
    pub default_reclaim: Duration,
    /// How often the sweeper persists time-driven transitions.
    pub sweep_interval: std::time::Duration,
    /// Event streams send `event: ping` at least this often (the spec allows 15 s).
    pub stream_ping_interval: std::time::Duration,
    /// The Messages-API-compatible endpoint the agent loop calls (see
    /// [`Settings::agent_loop`] for what happens without one).
    pub model_base_url: Option<String>,
    /// Sent as `x-api-key` to the model endpoint only.
    pub model_api_key: Option<Secret>,
    /// First back-off after an overloaded or failed model call (doubles per
    /// retry) when the endpoint does not say how long to wait (`retry-after`).
    pub model_retry_backoff: std::time::Duration,
    /// How long one model call may take before it counts as failed (and is retried).
    pub model_request_timeout: std::time::Duration,
    /// Without a model endpoint: `false` (what `mango serve` does) answers
    /// input the model would answer with a `session.error` naming the
    /// settings, and starts no Work for it; `true` says the caller plays the
    /// model's part in-process (the testkit's `TestApp::start`,
    /// `mango-bench`): it appends the agent's events itself, so input is
    /// admitted and activated as with an endpoint, and no loop runs.
    pub caller_plays_model: bool,
    /// A Work item reclaimed more often than this is failed instead of
    /// handed out again (spec §3; `MANGO_MAX_RECLAIMS`).
    pub max_reclaims: u32,
    /// Where Skill archives are stored (`MANGO_OBJECT_STORE`).
    pub skill_archives: crate::skills::objects::Archives,
    /// Where Sessions mount their Memory Stores (`MANGO_MEMORY_MOUNT_ROOT`).
    pub memory_mount_root: String,
    /// What a Memory Store may hold and keep, and how fast a sessions
    /// token may write to one (`MANGO_MEMORY_STORE_MAX_BYTES` …).
    pub memory_limits: crate::memory_quota::MemoryLimits,
    /// What one peer and the process may hold of connections, and how long
    /// a quiet one lives (`MANGO_MAX_CONNECTIONS_PER_PEER` …).
    pub connections: crate::connection_limits::ConnectionLimits,
}

/// Who answers a Session's input, from [`Settings`].
#[derive(Debug, Clone, Copy)]
pub enum AgentLoop<'a> {
    /// The agent loop calls this endpoint.
    Model {
        base_url: &'a str,
        api_key: Option<&'a Secret>,
    },
    /// No endpoint: the loop answers what the model would answer with a
    /// terminal `session.error` ([`NO_MODEL_MESSAGE`]), and input starts no Work.
    NoModel,
    /// The caller appends the agent's events itself; no loop runs.
    CallerPlaysModel,
}

/// The `session.error` message of a Session whose input no model can answer.
pub const NO_MODEL_MESSAGE: &str =
    "no model endpoint is configured, so nothing can answer this Session: \
start the api with ANTHROPIC_API_KEY (the Anthropic API) or MANGO_MODEL_BASE_URL \
(a Messages-API-compatible endpoint, with MANGO_MODEL_API_KEY), then send the input again";

impl Settings {
    pub fn agent_loop(&self) -> AgentLoop<'_> {
        match (&self.model_base_url, self.caller_plays_model) {
            (Some(base_url), _) => AgentLoop::Model {
                base_url,
                api_key: self.model_api_key.as_ref(),
            },
            (None, false) => AgentLoop::NoModel,
            (None, true) => AgentLoop::CallerPlaysModel,
        }
    }

    /// Whether runnable input makes Work at admission: only when something
    /// will answer it (the worker's Work would otherwise wait for nothing).
    pub fn input_activates(&self) -> bool {
        !matches!(self.agent_loop(), AgentLoop::NoModel)
    }
}

/// A value that never appears in Debug output or logs.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_ttl_seconds: 120,
            default_reclaim: Duration::milliseconds(5000),
            sweep_interval: std::time::Duration::from_secs(1),
            stream_ping_interval: std::time::Duration::from_secs(10),
            model_base_url: None,
            model_api_key: None,
            model_retry_backoff: std::time::Duration::from_secs(1),
            model_request_timeout: std::time::Duration::from_secs(600),
            caller_plays_model: false,
            max_reclaims: 10,
            skill_archives: Default::default(),
            memory_mount_root: crate::memory_rules::DEFAULT_MOUNT_ROOT.to_string(),
            memory_limits: Default::default(),
            connections: Default::default(),
        }
    }
}

/// Environment keys by secret digest, with when they were looked up.
type KeyLookups = HashMap<Vec<u8>, (KeyRow, Instant)>;
/// Claims by sessions-token digest, with when they were looked up.
type ClaimLookups = HashMap<Vec<u8>, (WorkRow, Instant)>;

/// Everything a handler needs, cloned per request.
#[derive(Clone)]
pub struct ApiContext {
    pub db: PgPool,
    pub settings: Arc<Settings>,
    pub wake: Arc<WakeHub>,
    pub events: Arc<crate::feed::SessionFeeds>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Wakes the agent loop when an outbox row commits.
    pub agent_wake: Arc<tokio::sync::Notify>,
    /// This process's name in the `listeners` registry (see
    /// [`crate::db::as_api_process`]); `None` when the pool has none.
    pub process: Option<Arc<str>>,
    /// Whether the LISTEN connection is up (and registered): until it is,
    /// commits of other processes may go unnoticed for a second.
    pub listening: Arc<tokio::sync::watch::Sender<bool>>,
    /// What the Work lease paths take as now ([`crate::clock`]); the system clock
    /// unless a test replaces it.
    pub clock: Clock,
    sightings: Arc<Mutex<HashMap<(String, String), Instant>>>,
    recent_keys: Arc<Mutex<KeyLookups>>,
    recent_claims: Arc<Mutex<ClaimLookups>>,
}

/// A worker id is written to the store at most this often per process; stats
/// count ids seen in the last 30 s, so this staleness never changes the count.
const SIGHTING_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

impl ApiContext {
    pub fn new(db: PgPool, settings: Settings) -> Self {
        ApiContext {
            events: Arc::new(crate::feed::SessionFeeds::new(db.clone())),
            process: crate::db::api_process(&db).map(Arc::from),
            listening: Arc::new(tokio::sync::watch::channel(false).0),
            clock: Clock::System,
            db,
            settings: Arc::new(settings),
            wake: Arc::default(),
            metrics: Arc::default(),
            agent_wake: Arc::default(),
            sightings: Arc::default(),
            recent_keys: Arc::default(),
            recent_claims: Arc::default(),
        }
    }

    /// Now, as the Work lease paths see it.
    pub fn now(&self) -> mango_protocol::time::Timestamp {
        self.clock.now()
    }

    /// Resolves once the LISTEN connection is up: a server started for a
    /// test is ready for wake-ups and cross-process events from then on.
    pub async fn until_listening(&self) {
        let mut listening = self.listening.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = listening.wait_for(|up| *up).await;
    }

    /// Hands events this process committed to its own consumers: the
    /// Session's streams and, when the commit wrote an outbox row, the agent
    /// loop. Other processes learn of the commit by notification.
    pub fn committed(
        &self,
        session_id: &str,
        events: &[crate::store::events::LoggedEvent],
        outbox: bool,
    ) {
        self.events.publish(session_id, events);
        if outbox {
            self.agent_wake.notify_waiters();
        }
    }

    /// An Environment key looked up less than `max_age` ago (see `auth::environment_key_for_lease`).
    pub fn recent_key(&self, digest: &[u8], max_age: std::time::Duration) -> Option<KeyRow> {
        let cache = self.recent_keys.lock().expect("key cache lock");
        cache
            .get(digest)
            .filter(|(_, at)| at.elapsed() < max_age)
            .map(|(key, _)| key.clone())
    }

    /// A sessions token's claim looked up less than `max_age` ago (see `auth::recent_claim`).
    pub fn recent_claim(&self, digest: &[u8], max_age: std::time::Duration) -> Option<WorkRow> {
        let cache = self.recent_claims.lock().expect("claim cache lock");
        cache
            .get(digest)
            .filter(|(_, at)| at.elapsed() < max_age)
            .map(|(row, _)| row.clone())
    }

    pub fn remember_claim(&self, digest: Vec<u8>, row: WorkRow) {
        let mut cache = self.recent_claims.lock().expect("claim cache lock");
        if cache.len() > 1_000 {
            cache.clear();
        }
        cache.insert(digest, (row, Instant::now()));
    }

    pub fn remember_key(&self, digest: Vec<u8>, key: KeyRow) {
        let mut cache = self.recent_keys.lock().expect("key cache lock");
        if cache.len() > 1_000 {
            cache.clear();
        }
        cache.insert(digest, (key, Instant::now()));
    }

    /// Records that `worker_id` polled, off the request path and throttled.
    pub fn note_worker(&self, environment_id: &str, worker_id: &str) {
        let key = (environment_id.to_string(), worker_id.to_string());
        {
            let mut seen = self.sightings.lock().expect("sightings lock");
            let now = Instant::now();
            if seen
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < SIGHTING_REFRESH)
            {
                return;
            }
            if seen.len() > 10_000 {
                seen.retain(|_, t| now.duration_since(*t) < std::time::Duration::from_secs(60));
                if seen.len() > 10_000 {
                    // A flood of distinct worker ids: forget them all; stats stay
                    // right because the table, not this map, is what they read.
                    seen.clear();
                }
            }
            seen.insert(key.clone(), now);
        }
        let db = self.db.clone();
        tokio::spawn(async move {
            let (env, worker) = key;
            if let Err(err) =
                crate::store::workers::record(&db, &env, &worker, mango_protocol::time::now()).await
            {
                tracing::debug!(error = %err, "could not record worker sighting");
            }
        });
    }
}
