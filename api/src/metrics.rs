//! Prometheus metrics for the api process, in the text exposition format.
//! Plain atomics: a handful of counters does not need a registry crate.

use crate::connection_limits::Audience;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($field:ident => $name:literal, $help:literal;)*) => {
        #[derive(Default)]
        pub struct Metrics {
            $(pub $field: AtomicU64,)*
            /// Responses by status class: 2xx, 3xx, 4xx, 5xx.
            pub responses: [AtomicU64; 4],
            /// Connections by listener ([`Audience::index`]).
            pub connections: [Connections; 3],
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
                render_connections(&mut out, &self.connections);
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

impl Metrics {
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

/// One listener's connections: how many are open, and why others ended.
#[derive(Default)]
pub struct Connections {
    pub open: AtomicU64,
    /// Closed at accept: the peer already held its per-peer cap.
    pub refused_peer_limit: AtomicU64,
    /// Closed at accept: the process held `MANGO_MAX_CONNECTIONS`.
    pub refused_global_limit: AtomicU64,
    /// Closed: no complete request head within the header-read timeout.
    pub header_timeouts: AtomicU64,
    /// Closed: no request in flight for the idle timeout.
    pub idle_timeouts: AtomicU64,
    /// `accept` failed (e.g. EMFILE); the listener backed off.
    pub accept_errors: AtomicU64,
}

fn render_connections(out: &mut String, connections: &[Connections; 3]) {
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let each = |out: &mut String, name: &str, field: fn(&Connections) -> &AtomicU64| {
        for audience in Audience::ALL {
            let value = field(&connections[audience.index()]).load(Relaxed);
            let _ = writeln!(out, "{name}{{listener=\"{}\"}} {value}", audience.label());
        }
    };
    family(
        out,
        "mango_http_connections_open",
        "gauge",
        "Open connections by listener.",
    );
    each(out, "mango_http_connections_open", |c| &c.open);
    family(
        out,
        "mango_http_connections_refused_total",
        "counter",
        "Connections closed as soon as accepted, by listener and the cap they met.",
    );
    for audience in Audience::ALL {
        let c = &connections[audience.index()];
        for (reason, value) in [
            ("peer_limit", &c.refused_peer_limit),
            ("global_limit", &c.refused_global_limit),
        ] {
            let _ = writeln!(
                out,
                "mango_http_connections_refused_total{{listener=\"{}\",reason=\"{reason}\"}} {}",
                audience.label(),
                value.load(Relaxed)
            );
        }
    }
    family(
        out,
        "mango_http_connections_timed_out_total",
        "counter",
        "Connections closed by the header-read or the idle timeout, by listener.",
    );
    for audience in Audience::ALL {
        let c = &connections[audience.index()];
        for (reason, value) in [("header", &c.header_timeouts), ("idle", &c.idle_timeouts)] {
            let _ = writeln!(
                out,
                "mango_http_connections_timed_out_total{{listener=\"{}\",reason=\"{reason}\"}} {}",
                audience.label(),
                value.load(Relaxed)
            );
        }
    }
    family(
        out,
        "mango_http_accept_errors_total",
        "counter",
        "Failed accepts (e.g. out of file descriptors), after each of which the listener backs off.",
    );
    each(out, "mango_http_accept_errors_total", |c| &c.accept_errors);
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
        Metrics::count(&m.connections[Audience::Sandboxes.index()].refused_peer_limit);
        let text = m.render();
        assert!(text.contains(
            "mango_http_connections_refused_total{listener=\"sandboxes\",reason=\"peer_limit\"} 1\n"
        ));
        assert!(text.contains(
            "mango_http_connections_refused_total{listener=\"operators\",reason=\"peer_limit\"} 0\n"
        ));
        assert!(text.contains("# TYPE mango_http_connections_open gauge\n"));
    }
}
