//! What the suite watches while a scenario runs, four times a second: every
//! Work row of the Environment (claims, leases, reclaims) and every live
//! sandbox (which item, which claim).

use super::sandboxes;
use super::system::System;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};
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

/// One Work row as the watch reads it.
#[derive(Clone, Debug)]
pub struct WorkRow {
    pub id: String,
    pub epoch: i64,
    pub state: String,
    /// When its claim was made, or acked once it was.
    pub claimed: Option<DateTime<Utc>>,
    /// Its last heartbeat, or its ack before the first.
    pub renewed: Option<DateTime<Utc>>,
    pub expires: Option<DateTime<Utc>>,
    /// The database's clock at the read.
    pub now: DateTime<Utc>,
}

type Row = (
    String,
    i64,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

/// What the watch remembers between samples, and judges each one by: a
/// pure function of the rows and sandboxes it is shown.
pub struct Judge {
    ttl: f64,
    seen: HashMap<String, Seen>,
    overlapping: HashMap<String, Instant>,
    reported: HashSet<String>,
}

impl Judge {
    pub fn new(ttl_seconds: u64) -> Judge {
        Judge {
            ttl: ttl_seconds as f64,
            seen: HashMap::new(),
            overlapping: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    /// Each lease reclaimed within TTL plus the reclaim delay, and none
    /// left expired longer: the reclaims seen and the failures.
    pub fn rows(&mut self, rows: Vec<WorkRow>, out: &mut Observed) {
        let delay = RECLAIM_DELAY.as_secs_f64();
        for row in rows {
            let id = row.id;
            if let Some(before) = self.seen.get(&id) {
                let leased = before.state == "starting" || before.state == "active";
                if row.epoch > before.epoch && leased {
                    if let (Some(claimed), Some(renewed)) = (row.claimed, before.renewed) {
                        let secs = (claimed - renewed).num_milliseconds() as f64 / 1000.0;
                        out.reclaims.push((id.clone(), secs));
                        if secs > self.ttl + delay {
                            out.failures.push(format!(
                                "{id} was reclaimed {secs:.1} s after its last renewal (TTL {} s + {delay} s)",
                                self.ttl
                            ));
                        }
                    }
                }
            }
            let leased = row.state == "starting" || row.state == "active";
            if let (true, Some(expires)) = (leased, row.expires) {
                let late = (row.now - expires).num_milliseconds() as f64 / 1000.0;
                if late > delay && self.reported.insert(format!("lease {id} {}", row.epoch)) {
                    out.failures.push(format!(
                        "the lease of {id} (claim {}) expired {late:.1} s ago and nobody reclaimed it",
                        row.epoch
                    ));
                }
            }
            self.seen.insert(
                id,
                Seen {
                    epoch: row.epoch,
                    state: row.state,
                    renewed: row.renewed,
                },
            );
        }
    }

    /// No item held by two claims at once for longer than the overlap
    /// bound, judged at `now`.
    pub fn live(&mut self, live: &[sandboxes::Live], now: Instant, out: &mut Observed) {
        let mut claims: HashMap<&str, HashSet<i64>> = HashMap::new();
        for l in live {
            claims.entry(&l.work_id).or_default().insert(l.claim);
        }
        self.overlapping
            .retain(|id, _| claims.get(id.as_str()).is_some_and(|c| c.len() > 1));
        for (id, c) in claims {
            if c.len() > 1 {
                let since = *self.overlapping.entry(id.to_string()).or_insert(now);
                if now.duration_since(since) > OVERLAP_BOUND
                    && self.reported.insert(format!("overlap {id}"))
                {
                    out.failures.push(format!(
                        "{id} has had live sandboxes of claims {c:?} at once for over {} s",
                        OVERLAP_BOUND.as_secs()
                    ));
                }
            }
        }
    }
}

pub struct Watch {
    observed: Arc<Mutex<Observed>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    pub fn start(system: Arc<System>) -> Watch {
        let observed: Arc<Mutex<Observed>> = Arc::default();
        let out = observed.clone();
        let task = tokio::spawn(async move {
            let mut judge = Judge::new(system.settings.ttl_seconds);
            loop {
                sample(&system, &mut judge, &out).await;
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

async fn sample(system: &System, judge: &mut Judge, out: &Mutex<Observed>) {
    let rows: Result<Vec<Row>, _> = sqlx::query_as(
        // An Ack clears `claimed_at`: a claim acked between two samples is
        // dated by its Ack (a few ms later), or it would go uncounted.
        "SELECT id, claim_epoch, state, COALESCE(claimed_at, acknowledged_at),
                COALESCE(latest_heartbeat_at, acknowledged_at),
                lease_expires_at, now()
         FROM work WHERE environment_id = $1",
    )
    .bind(&system.env_id)
    .fetch_all(&system.db)
    .await;
    // The database restarting under the watch: nothing to see this time.
    let Ok(rows) = rows else { return };
    let rows = rows
        .into_iter()
        .map(
            |(id, epoch, state, claimed, renewed, expires, now)| WorkRow {
                id,
                epoch,
                state,
                claimed,
                renewed,
                expires,
                now,
            },
        )
        .collect();
    let live = sandboxes::live(&system.docker, &system.local_root()).await;
    let mut seen = Observed::default();
    judge.rows(rows, &mut seen);
    judge.live(&live, Instant::now(), &mut seen);
    let mut out = out.lock().unwrap();
    out.samples += 1;
    out.reclaims.extend(seen.reclaims);
    out.failures.extend(seen.failures);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn row(epoch: i64, state: &str, claimed: i64, renewed: i64, now: i64) -> WorkRow {
        WorkRow {
            id: "work_a".into(),
            epoch,
            state: state.into(),
            claimed: Some(at(claimed)),
            renewed: Some(at(renewed)),
            expires: Some(at(renewed + 15)),
            now: at(now),
        }
    }

    #[test]
    fn a_reclaim_within_ttl_and_delay_passes_and_a_later_one_fails() {
        let mut judge = Judge::new(15);
        let mut out = Observed::default();
        judge.rows(vec![row(1, "active", 0, 10, 11)], &mut out);
        judge.rows(vec![row(2, "starting", 30, 30, 30)], &mut out);
        assert_eq!(out.reclaims.len(), 1);
        assert!(out.failures.is_empty(), "{:?}", out.failures);

        let mut judge = Judge::new(15);
        let mut out = Observed::default();
        judge.rows(vec![row(1, "active", 0, 10, 11)], &mut out);
        // 26 s after its last renewal: past 15 s + 10 s.
        judge.rows(vec![row(2, "starting", 36, 36, 36)], &mut out);
        assert_eq!(out.failures.len(), 1, "{:?}", out.failures);
    }

    #[test]
    fn a_lease_left_expired_past_the_delay_fails_once() {
        let mut judge = Judge::new(15);
        let mut out = Observed::default();
        // Expired at 25, seen at 34: within the delay.
        judge.rows(vec![row(1, "active", 0, 10, 34)], &mut out);
        assert!(out.failures.is_empty(), "{:?}", out.failures);
        judge.rows(vec![row(1, "active", 0, 10, 36)], &mut out);
        judge.rows(vec![row(1, "active", 0, 10, 40)], &mut out);
        assert_eq!(out.failures.len(), 1, "{:?}", out.failures);
        // A stopped item's old lease is nobody's to reclaim.
        let mut out = Observed::default();
        Judge::new(15).rows(vec![row(1, "stopped", 0, 10, 100)], &mut out);
        assert!(out.failures.is_empty(), "{:?}", out.failures);
    }

    fn live(claim: i64) -> sandboxes::Live {
        sandboxes::Live {
            pool: "faults-docker".into(),
            work_id: "work_a".into(),
            claim,
            container: None,
        }
    }

    #[test]
    fn an_item_held_by_two_claims_past_the_bound_fails() {
        let start = Instant::now();
        let mut judge = Judge::new(15);
        let mut out = Observed::default();
        judge.live(&[live(1), live(2)], start, &mut out);
        judge.live(&[live(1), live(2)], start + OVERLAP_BOUND, &mut out);
        assert!(out.failures.is_empty(), "{:?}", out.failures);
        judge.live(
            &[live(1), live(2)],
            start + OVERLAP_BOUND + Duration::from_secs(1),
            &mut out,
        );
        assert_eq!(out.failures.len(), 1, "{:?}", out.failures);
    }

    #[test]
    fn an_overlap_that_ends_starts_its_count_again() {
        let start = Instant::now();
        let mut judge = Judge::new(15);
        let mut out = Observed::default();
        judge.live(&[live(1), live(2)], start, &mut out);
        judge.live(&[live(2)], start + Duration::from_secs(10), &mut out);
        judge.live(
            &[live(2), live(3)],
            start + Duration::from_secs(11),
            &mut out,
        );
        judge.live(
            &[live(2), live(3)],
            start + Duration::from_secs(20),
            &mut out,
        );
        assert!(out.failures.is_empty(), "{:?}", out.failures);
    }
}
