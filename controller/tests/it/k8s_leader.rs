//! Leader election over HTTP against a fake API server whose Leases are
//! guarded by `resourceVersion` as a real API server guards them (a stale
//! replace is 409): standbys racing for an expired Lease and a leader that
//! releases on shutdown against the strict fake (testkit's `apiserver`);
//! a leader cut off from the API against the lenient one (`kube_api`),
//! the only fake that can cut one client off. At every instant (sampled
//! each 2 ms) at most one live replica believes it leads.

use k8s_openapi::api::coordination::v1::Lease;
use mango_controller::kubernetes::leader::{elect, Elector, Timing};
use mango_testkit::apiserver::ApiServer;
use mango_testkit::kube_api::FakeKubeApi;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "mango-controller";
/// A namespace the strict fake has from its start.
const NS: &str = "sandboxes";
const FAST: Timing = Timing {
    lease: Duration::from_millis(1200),
    renew_deadline: Duration::from_millis(800),
    retry: Duration::from_millis(100),
};

struct Replica {
    identity: String,
    leading: watch::Receiver<bool>,
    release: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    alive: bool,
}

fn replica(url: &str, identity: &str, timing: Timing) -> Replica {
    let mut config = kube::Config::new(url.parse().unwrap());
    config.default_namespace = NS.into();
    let client = kube::Client::try_from(config).unwrap();
    let elector = Elector::new(
        kube::Api::<Lease>::namespaced(client, NS),
        LEASE,
        identity,
        timing,
    );
    let (tx, leading) = watch::channel(false);
    let release = CancellationToken::new();
    let task = tokio::spawn(elect(elector, tx, release.clone()));
    Replica {
        identity: identity.to_string(),
        leading,
        release,
        task,
        alive: true,
    }
}

impl Replica {
    fn leads(&self) -> bool {
        self.alive && *self.leading.borrow()
    }

    /// Dies without a word: no release, no more renewals.
    fn crash(&mut self) {
        self.task.abort();
        self.alive = false;
    }
}

fn leaders(replicas: &[Replica]) -> Vec<String> {
    replicas
        .iter()
        .filter(|r| r.leads())
        .map(|r| r.identity.clone())
        .collect()
}

/// Samples every 2 ms until `done`, failing at once if two live replicas
/// lead together; the time it took.
async fn watch_until(
    replicas: &[Replica],
    within: Duration,
    what: &str,
    done: impl Fn(&[Replica]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = leaders(replicas);
        assert!(now.len() <= 1, "two leaders at once: {now:?}");
        if done(replicas) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what} not within {within:?}; leaders {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn holder(lease: Option<Value>) -> String {
    lease.unwrap()["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn strict_lease(fake: &ApiServer) -> Option<Value> {
    fake.object("leases", NS, LEASE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standbys_racing_for_an_expired_lease_never_both_lead() {
    let fake = ApiServer::start().await;
    let mut replicas = vec![replica(&fake.url, "r0", FAST)];
    watch_until(&replicas, Duration::from_secs(5), "a first leader", |r| {
        r[0].leads()
    })
    .await;
    replicas.push(replica(&fake.url, "r1", FAST));
    replicas.push(replica(&fake.url, "r2", FAST));
    // Standbys stay standbys while the leader renews.
    let steady = Instant::now();
    while steady.elapsed() < FAST.lease * 2 {
        assert_eq!(leaders(&replicas), ["r0"]);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (round, next) in (0..5).zip(3..) {
        let leader = replicas.iter().position(|r| r.leads()).unwrap();
        assert_eq!(
            holder(strict_lease(&fake)),
            replicas[leader].identity,
            "round {round}"
        );
        let transitions = strict_lease(&fake).unwrap()["spec"]["leaseTransitions"]
            .as_i64()
            .unwrap();
        replicas[leader].crash();
        let took = watch_until(&replicas, FAST.lease * 4, "a standby taking over", |r| {
            leaders(r).len() == 1
        })
        .await;
        // The Lease was held until the crash: it is taken once it
        // expired (counted from the last renewal each standby saw).
        assert!(
            took >= FAST.lease / 2,
            "round {round}: taken over after {took:?}, while the Lease ({:?}) was valid",
            FAST.lease
        );
        let now = leaders(&replicas).remove(0);
        assert_eq!(
            holder(strict_lease(&fake)),
            now,
            "round {round}: the Lease names the leader"
        );
        let after = strict_lease(&fake).unwrap()["spec"]["leaseTransitions"]
            .as_i64()
            .unwrap();
        assert_eq!(after, transitions + 1, "round {round}: one transition");
        // Keep two standbys racing.
        replicas.push(replica(&fake.url, &format!("r{next}"), FAST));
        // A while of the new leader's term, still one leader.
        let term = Instant::now();
        while term.elapsed() < FAST.renew_deadline {
            assert_eq!(
                leaders(&replicas),
                std::slice::from_ref(&now),
                "round {round}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for r in &mut replicas {
        r.crash();
    }
}

/// A leader whose renewals fail stops leading at its renew deadline, before
/// the Lease expires for the others; only then does a standby take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_the_api_stops_before_another_takes_over() {
    let fake = FakeKubeApi::start().await;
    let mut replicas = vec![replica(&fake.url, "a", FAST)];
    watch_until(&replicas, Duration::from_secs(5), "a leading", |r| {
        r[0].leads()
    })
    .await;
    replicas.push(replica(&fake.url, "b", FAST));
    replicas.push(replica(&fake.url, "c", FAST));
    tokio::time::sleep(FAST.lease).await;
    fake.cut_off(Some("a"));
    let stepped_down = watch_until(&replicas, FAST.lease * 2, "a stepping down", |r| {
        !r[0].leads()
    })
    .await;
    assert!(
        stepped_down <= FAST.renew_deadline + FAST.retry * 2,
        "a led {stepped_down:?} without renewing"
    );
    watch_until(&replicas, FAST.lease * 4, "b or c taking over", |r| {
        r[1].leads() || r[2].leads()
    })
    .await;
    // Reconnected, a stays a standby: the Lease is held.
    fake.cut_off(None);
    let quiet = Instant::now();
    while quiet.elapsed() < FAST.lease * 2 {
        let now = leaders(&replicas);
        assert_eq!(now.len(), 1, "{now:?}");
        assert_ne!(now[0], "a");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for r in &mut replicas {
        r.crash();
    }
}

/// On shutdown the leader releases the Lease (a guarded write with no
/// holder), so a standby leads at once instead of after the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_lease_is_taken_without_waiting_for_it_to_expire() {
    let slow = Timing {
        lease: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry: Duration::from_millis(100),
    };
    let fake = ApiServer::start().await;
    let mut replicas = vec![replica(&fake.url, "a", slow)];
    watch_until(&replicas, Duration::from_secs(5), "a leading", |r| {
        r[0].leads()
    })
    .await;
    replicas.push(replica(&fake.url, "b", slow));
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[0].release.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), &mut replicas[0].task).await;
    assert!(stopped.is_ok(), "a ends once released");
    replicas[0].alive = false;
    assert_eq!(holder(strict_lease(&fake)), "", "released: no holder");
    let took = watch_until(&replicas, slow.lease, "b taking the released Lease", |r| {
        r[1].leads()
    })
    .await;
    assert!(
        took < Duration::from_secs(3),
        "b waited {took:?}, as for an unreleased Lease of {:?}",
        slow.lease
    );
    replicas[1].crash();
}
