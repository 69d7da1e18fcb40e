//! Prometheus metrics for the api process, in the text exposition format.
//! Plain atomics: a handful of counters and one histogram do not need a
//! registry crate. The queue's gauges come from the database at each scrape
//! (`store::gauges`), so every api process reports the same values: sum the
//! counters across processes, take the max of the gauges.

use mango_protocol::events::SessionErrorType;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

macro_rules! counters {
    ($($field:ident => $name:literal, $help:literal;)*) => {
        #[derive(Default)]
        pub struct Metrics {
            $(pub $field: AtomicU64,)*
            /// Responses by status class: 2xx, 3xx, 4xx, 5xx.
            pub responses: [AtomicU64; 4],
            pub model: ModelCalls,
            sessions: Mutex<Option<(Instant, Vec<(String, i64)>)>>,
        }

        impl Metrics {
            pub fn render(&self) -> String {
                let mut out = String::new();
                $(
                    let _ = writeln!(out, "# HELP {} {}\n# TYPE {} counter\n{} {}", $name, $help, $name, $name, self.$field.load(Relaxed));
                )*
                let _ = writeln!(out, "# HELP mango_http_responses_total HTTP responses by status class.\n# TYPE mango_http_responses_total counter");
                for (i, class) in ["2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                    let _ = writeln!(out, "mango_http_responses_total{{class=\"{class}\"}} {}", self.responses[i].load(Relaxed));
                }
                self.model.render(&mut out);
                out
            }
        }
    };
}

counters! {
    claims => "mango_work_claims_total", "Work items claimed by Poll (first claims and reclaims).";
    reclaims => "mango_work_reclaims_total", "Claims that took an item from an earlier claim (stale pending claim or lost lease).";
    empty_polls => "mango_work_empty_polls_total", "Polls that returned null.";
    acks => "mango_work_acks_total", "Successful Acks.";
    heartbeats => "mango_work_heartbeats_total", "Successful heartbeats.";
    heartbeat_precondition_failures => "mango_work_heartbeat_precondition_failures_total", "Heartbeats answered 412.";
    stops => "mango_work_stops_total", "Successful Stop requests.";
    results => "mango_work_results_total", "Healthcheck results stored.";
    fails => "mango_work_fails_total", "Work items ended by Fail.";
    swept => "mango_work_swept_total", "Time-driven transitions persisted by the sweeper.";
    reclaim_limit_failures => "mango_work_reclaim_limit_failures_total", "Work items failed because they were reclaimed more often than the limit.";
    fenced_results => "mango_session_fenced_results_total", "Worker tool results admitted by the one-statement fenced path.";
    unlocked_admissions => "mango_session_unlocked_admissions_total", "Event sends admitted by one fenced append without a locking transaction (input that answers no call and needs no new activation).";
    locked_admissions => "mango_session_locked_admissions_total", "Event sends admitted under the Session row lock (everything else, and fenced sends that found the Session or claim moved on).";
}

/// How long a Sessions count is reused: counting every Session is the one
/// gauge whose cost grows with history.
const SESSIONS_REUSED_FOR: Duration = Duration::from_secs(15);

/// Upper bounds of the model-call latency buckets, in seconds.
const MODEL_BUCKETS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Model calls: latency of every call (answered or not) and failures by the
/// `session.error` type they become.
#[derive(Default)]
pub struct ModelCalls {
    buckets: [AtomicU64; MODEL_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
    errors: [AtomicU64; 4],
}

impl ModelCalls {
    pub fn observe(&self, elapsed: Duration, failure: Option<SessionErrorType>) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(MODEL_BUCKETS) {
            if seconds <= bound {
                bucket.fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(elapsed.as_micros().min(u64::MAX as u128) as u64, Relaxed);
        if let Some(kind) = failure {
            self.errors[error_index(kind)].fetch_add(1, Relaxed);
        }
    }

    fn render(&self, out: &mut String) {
        let name = "mango_model_request_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Model calls of the agent loop, answered or not.\n# TYPE {name} histogram");
        for (bucket, bound) in self.buckets.iter().zip(MODEL_BUCKETS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Relaxed)
            );
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
        let name = "mango_model_errors_total";
        let _ = writeln!(out, "# HELP {name} Failed model calls, by the session.error type they became.\n# TYPE {name} counter");
        for (i, kind) in ERROR_TYPES.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{type=\"{kind}\"}} {}",
                self.errors[i].load(Relaxed)
            );
        }
    }
}

const ERROR_TYPES: [&str; 4] = [
    "model_overloaded_error",
    "model_rate_limited_error",
    "model_request_failed_error",
    "unknown_error",
];

fn error_index(kind: SessionErrorType) -> usize {
    match kind {
        SessionErrorType::ModelOverloadedError => 0,
        SessionErrorType::ModelRateLimitedError => 1,
        SessionErrorType::ModelRequestFailedError => 2,
        SessionErrorType::SessionInputFailedError | SessionErrorType::UnknownError => 3,
    }
}

/// Everything `/metrics` shows: the process's counters, then the queue and
/// the Sessions as the database has them. A database that does not answer
/// leaves the gauges out (and says so in a comment), not the counters.
pub async fn render(metrics: &Metrics, db: &sqlx::PgPool) -> String {
    let mut out = metrics.render();
    let live = crate::store::gauges::live_work(db).await;
    let _ = writeln!(
        out,
        "# HELP mango_api_database_up Whether the database answered this scrape's queries (the api is ready).\n# TYPE mango_api_database_up gauge\nmango_api_database_up {}",
        u8::from(live.is_ok())
    );
    match live {
        Ok(rows) => render_work(&mut out, &rows),
        Err(err) => {
            tracing::warn!(error = %err, "metrics: reading the queue's gauges failed");
            let _ = writeln!(
                out,
                "# the queue's gauges are missing: the database did not answer"
            );
        }
    }
    match metrics.sessions_by_status(db).await {
        Ok(rows) => {
            let name = "mango_sessions";
            let _ = writeln!(out, "# HELP {name} Sessions by status (archived ones as status=\"archived\").\n# TYPE {name} gauge");
            for status in ["idle", "running", "rescheduling", "terminated", "archived"] {
                let count = rows
                    .iter()
                    .find(|(s, _)| s == status)
                    .map_or(0, |(_, c)| *c);
                let _ = writeln!(out, "{name}{{status=\"{status}\"}} {count}");
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "metrics: counting Sessions failed");
            let _ = writeln!(
                out,
                "# the Sessions gauge is missing: the database did not answer"
            );
        }
    }
    out
}

fn render_work(out: &mut String, rows: &[crate::store::gauges::WorkCount]) {
    let _ = writeln!(out, "# HELP mango_work_queue_depth Live Work items by Environment and state.\n# TYPE mango_work_queue_depth gauge");
    for row in rows {
        let _ = writeln!(
            out,
            "mango_work_queue_depth{{environment=\"{}\",state=\"{}\"}} {}",
            row.environment_id, row.state, row.count
        );
    }
    let _ = writeln!(out, "# HELP mango_work_oldest_queued_seconds Age of the oldest queued Work item, by Environment.\n# TYPE mango_work_oldest_queued_seconds gauge");
    for row in rows.iter().filter(|r| r.state == "queued") {
        let _ = writeln!(
            out,
            "mango_work_oldest_queued_seconds{{environment=\"{}\"}} {:.3}",
            row.environment_id, row.oldest_seconds
        );
    }
    let _ = writeln!(out, "# HELP mango_work_expired_leases Work items whose lease ran out and that no poller has reclaimed yet, by Environment.\n# TYPE mango_work_expired_leases gauge");
    let mut expired: std::collections::BTreeMap<&str, i64> = Default::default();
    for row in rows.iter().filter(|r| r.state != "stopping") {
        *expired.entry(&row.environment_id).or_default() += row.expired;
    }
    for (environment, count) in expired {
        let _ = writeln!(
            out,
            "mango_work_expired_leases{{environment=\"{environment}\"}} {count}"
        );
    }
}

impl Metrics {
    async fn sessions_by_status(&self, db: &sqlx::PgPool) -> sqlx::Result<Vec<(String, i64)>> {
        if let Some((at, rows)) = self.sessions.lock().unwrap().as_ref() {
            if at.elapsed() < SESSIONS_REUSED_FOR {
                return Ok(rows.clone());
            }
        }
        let rows = crate::store::gauges::sessions_by_status(db).await?;
        *self.sessions.lock().unwrap() = Some((Instant::now(), rows.clone()));
        Ok(rows)
    }

    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub fn response(&self, status: u16) {
        let class = match status {
            200..=299 => 0,
            300..=399 => 1,
            400..=499 => 2,
            _ => 3,
        };
        self.responses[class].fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_counter_with_help_and_type() {
        let m = Metrics::default();
        Metrics::count(&m.claims);
        Metrics::count(&m.claims);
        m.response(204);
        m.response(503);
        let text = m.render();
        assert!(
            text.contains("# TYPE mango_work_claims_total counter\nmango_work_claims_total 2\n")
        );
        assert!(text.contains("mango_http_responses_total{class=\"2xx\"} 1\n"));
        assert!(text.contains("mango_http_responses_total{class=\"5xx\"} 1\n"));
        assert!(text.contains("mango_work_swept_total 0\n"));
    }
}
