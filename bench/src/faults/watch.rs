//! What the suite watches while a scenario runs, four times a second: every
//! Work row of the Environment (claims, leases, reclaims) and every live
//! sandbox (which item, which claim).

use super::sandboxes;
use super::system::System;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after a lease's expiry a poller must have reclaimed it: the
/// supervisors' long poll (≤ 1 s) and their back-off after failed polls.
pub const RECLAIM_DELAY: Duration = Duration::from_secs(10);
/// How long two sandboxes of one item may both live: the stale one's
/// supervisor learns of the new claim from its claims watch and removes it.
pub const OVERLAP_BOUND: Duration = Duration::from_secs(15);

#[derive(Clone, Debug)]
struct Seen {
    epoch: i64,
    state: String,
    renewed: Option<DateTime<Utc>>,
}

#[derive(Default)]
pub struct Observed {
    /// Per reclaim: the Work, and seconds from its last renewal to the new claim.
    pub reclaims: Vec<(String, f64)>,
    /// Leases left expired past the reclaim delay, and overlapping sandboxes.
    pub failures: Vec<String>,
    pub samples: usize,
}

type Row = (
    String,
    i64,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

pub struct Watch {
    observed: Arc<Mutex<Observed>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    pub fn start(system: Arc<System>) -> Watch {
        let observed: Arc<Mutex<Observed>> = Arc::default();
        let out = observed.clone();
        let task = tokio::spawn(async move {
            let mut seen: HashMap<String, Seen> = HashMap::new();
            let mut overlapping: HashMap<String, Instant> = HashMap::new();
            let mut reported: std::collections::HashSet<String> = Default::default();
            loop {
                sample(&system, &mut seen, &mut overlapping, &mut reported, &out).await;
                // Poll interval: four samples a second.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Watch { observed, task }
    }

    pub fn finish(self) -> Observed {
        self.task.abort();
        std::mem::take(&mut *self.observed.lock().unwrap())
    }
}

async fn sample(
    system: &System,
    seen: &mut HashMap<String, Seen>,
    overlapping: &mut HashMap<String, Instant>,
    reported: &mut std::collections::HashSet<String>,
    out: &Mutex<Observed>,
) {
    let rows: Result<Vec<Row>, _> = sqlx::query_as(
        "SELECT id, claim_epoch, state, claimed_at, COALESCE(latest_heartbeat_at, acknowledged_at),
                lease_expires_at, stopped_at, now()
         FROM work WHERE environment_id = $1",
    )
    .bind(&system.env_id)
    .fetch_all(&system.db)
    .await;
    // The database restarting under the watch: nothing to see this time.
    let Ok(rows) = rows else { return };
    let ttl = system.settings.ttl_seconds as f64;
    let mut failures = Vec::new();
    let mut reclaims = Vec::new();
    for (id, epoch, state, claimed, renewed, expires, _stopped, now) in rows {
        if let Some(before) = seen.get(&id) {
            let leased = before.state == "starting" || before.state == "active";
            if epoch > before.epoch && leased {
                if let (Some(claimed), Some(renewed)) = (claimed, before.renewed) {
                    let secs = (claimed - renewed).num_milliseconds() as f64 / 1000.0;
                    reclaims.push((id.clone(), secs));
                    if secs > ttl + RECLAIM_DELAY.as_secs_f64() {
                        failures.push(format!(
                            "{id} was reclaimed {secs:.1} s after its last renewal (TTL {ttl} s + {} s)",
                            RECLAIM_DELAY.as_secs()
                        ));
                    }
                }
            }
        }
        let leased = state == "starting" || state == "active";
        if let (true, Some(expires)) = (leased, expires) {
            let late = (now - expires).num_milliseconds() as f64 / 1000.0;
            if late > RECLAIM_DELAY.as_secs_f64() && reported.insert(format!("lease {id} {epoch}"))
            {
                failures.push(format!(
                    "the lease of {id} (claim {epoch}) expired {late:.1} s ago and nobody reclaimed it"
                ));
            }
        }
        seen.insert(
            id,
            Seen {
                epoch,
                state,
                renewed,
            },
        );
    }
    let live = sandboxes::live(&system.docker, &system.local_root()).await;
    let mut claims: HashMap<&str, std::collections::HashSet<i64>> = HashMap::new();
    for l in &live {
        claims.entry(&l.work_id).or_default().insert(l.claim);
    }
    overlapping.retain(|id, _| claims.get(id.as_str()).is_some_and(|c| c.len() > 1));
    for (id, c) in claims {
        if c.len() > 1 {
            let since = *overlapping
                .entry(id.to_string())
                .or_insert_with(Instant::now);
            if since.elapsed() > OVERLAP_BOUND && reported.insert(format!("overlap {id}")) {
                failures.push(format!(
                    "{id} has had live sandboxes of claims {c:?} at once for over {} s",
                    OVERLAP_BOUND.as_secs()
                ));
            }
        }
    }
    let mut out = out.lock().unwrap();
    out.samples += 1;
    out.reclaims.extend(reclaims);
    out.failures.extend(failures);
}
