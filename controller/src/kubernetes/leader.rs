//! Leader election: only the replica holding the `coordination.k8s.io`
//! Lease runs the operator, so two replicas never both poll one pool. A
//! replica that loses the Lease detaches its supervisors at once (their
//! Pods keep running) and the next leader adopts them.
//!
//! The Lease is taken, renewed and released as client-go's leaderelection
//! does: every write is a replace guarded by the `resourceVersion` last
//! read, so of two replicas racing for it one wins and the other gets 409;
//! a Lease counts as expired only when its record has not changed for its
//! duration by this replica's own clock (never by the `renewTime` another
//! clock wrote); and a leader that cannot renew within the renew deadline,
//! shorter than the Lease, stops leading before anyone may take over.

use crate::kubernetes::operator::{self, Context};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a Lease stays valid unrenewed, how long a leader keeps trying
/// to renew before it stops leading, and how often everyone tries.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

/// client-go's defaults: 15 s, 10 s, 2 s.
pub const TIMING: Timing = Timing {
    lease: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry: Duration::from_secs(2),
};

/// Where leadership comes from.
pub enum Leadership {
    /// This replica always leads (one replica, `--leader-election=false`).
    Always,
    /// This replica leads while it holds the named Lease.
    Lease { name: String, identity: String },
}

fn conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// One replica's view of the Lease.
pub struct Elector {
    leases: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The Lease as last read or written: its `resourceVersion` guards the
    /// next write.
    lease: Option<Lease>,
    /// When its record last changed, by this replica's clock.
    observed_at: Instant,
    leading: bool,
}

impl Elector {
    pub fn new(leases: Api<Lease>, name: &str, identity: &str, timing: Timing) -> Elector {
        assert!(
            timing.lease > timing.renew_deadline && timing.renew_deadline > timing.retry,
            "a Lease must outlast the renew deadline, and that the retry period"
        );
        Elector {
            leases,
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            lease: None,
            observed_at: Instant::now(),
            leading: false,
        }
    }

    fn spec(&self) -> Option<&LeaseSpec> {
        self.lease.as_ref().and_then(|l| l.spec.as_ref())
    }

    fn holder(&self) -> &str {
        self.spec()
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or_default()
    }

    /// The record seen last is younger than its duration.
    fn record_valid(&self) -> bool {
        let seconds = self
            .spec()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or_default();
        self.observed_at + Duration::from_secs(seconds.max(0) as u64) > Instant::now()
    }

    /// Keeps `lease`, restarting the expiry clock when its record changed.
    fn saw(&mut self, lease: Lease) {
        if self.spec() != lease.spec.as_ref() {
            self.observed_at = Instant::now();
        }
        self.lease = Some(lease);
    }

    /// The record this replica writes as holder.
    fn record(&self, renewing: bool) -> LeaseSpec {
        let now = MicroTime(jiff::Timestamp::now());
        let old = self.spec();
        let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.lease.as_secs() as i32),
            acquire_time: if renewing {
                old.and_then(|s| s.acquire_time.clone())
                    .or(Some(now.clone()))
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if renewing {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// A replace of the Lease last seen, guarded by its `resourceVersion`.
    async fn write(&mut self, spec: LeaseSpec) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.lease.clone() else {
            return Ok(false);
        };
        lease.spec = Some(spec);
        match self
            .leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(stored) => {
                self.saw(stored);
                Ok(true)
            }
            Err(err) if conflict(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// One round: renew the Lease held, take one that is free or expired,
    /// or see it held by another. Whether this replica holds it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        // The leader's fast path: a write guarded by its own last write.
        if self.leading
            && self.holder() == self.identity
            && self.record_valid()
            && self.write(self.record(true)).await?
        {
            return Ok(true);
        }
        let Some(current) = self.leases.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.record(false)),
            };
            return match self.leases.create(&PostParams::default(), &lease).await {
                Ok(stored) => {
                    self.saw(stored);
                    self.leading = true;
                    Ok(true)
                }
                Err(err) if conflict(&err) => Ok(false),
                Err(err) => Err(err),
            };
        };
        self.saw(current);
        let mine = self.holder() == self.identity;
        if !self.holder().is_empty() && !mine && self.record_valid() {
            self.leading = false;
            return Ok(false);
        }
        self.leading = self.write(self.record(mine)).await?;
        Ok(self.leading)
    }

    /// Gives the Lease up so the next replica need not wait for it to
    /// expire: a guarded write with no holder and a one-second duration.
    pub async fn release(&mut self) {
        if !self.leading || self.holder() != self.identity {
            return;
        }
        self.leading = false;
        let now = MicroTime(jiff::Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: self.spec().and_then(|s| s.lease_transitions),
            ..Default::default()
        };
        match self.write(spec).await {
            Ok(true) => tracing::info!(lease = %self.name, "released the Lease"),
            Ok(false) => {
                tracing::info!(lease = %self.name, "the Lease changed hands before its release")
            }
            Err(err) => {
                tracing::warn!(lease = %self.name, error = %err, "could not release the Lease; it expires")
            }
        }
    }
}

/// Sleeps the retry period, up to a fifth longer, so replicas spread out.
async fn pause(retry: Duration) {
    let jitter = retry.mul_f64(rand::random::<f64>() * 0.2);
    tokio::time::sleep(retry + jitter).await;
}

/// Campaigns for the Lease until `release`, publishing on `leading`
/// whether this replica leads; then releases the Lease if it holds it.
/// `leading` turns false before anyone else may take the Lease: at the
/// renew deadline, or as soon as another holds it.
pub async fn elect(mut elector: Elector, leading: watch::Sender<bool>, release: CancellationToken) {
    let timing = elector.timing;
    loop {
        // Standing by.
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(lease = %elector.name, error = %err, "leader election: could not read or take the Lease")
                }
            }
            tokio::select! {
                _ = pause(timing.retry) => {}
                _ = release.cancelled() => return,
            }
        }
        tracing::info!(lease = %elector.name, identity = %elector.identity, "leading");
        leading.send_replace(true);
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(timing.retry) => {}
                _ = release.cancelled() => {
                    // The operator has stopped; the next replica may lead at once.
                    leading.send_replace(false);
                    elector.release().await;
                    return;
                }
            }
            let left = timing.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, elector.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::warn!(lease = %elector.name, holder = %elector.holder(), "leadership lost: another replica holds the Lease");
                    break;
                }
                Ok(Err(err)) => {
                    tracing::warn!(lease = %elector.name, error = %err, "could not renew the Lease; retrying")
                }
                Err(_) => {}
            }
            if renewed.elapsed() >= timing.renew_deadline {
                tracing::warn!(lease = %elector.name, "leadership lost: the Lease was not renewed within the renew deadline");
                break;
            }
        }
        elector.leading = false;
        leading.send_replace(false);
    }
}

/// Runs the operator whenever this replica leads, until `shutdown`.
pub async fn run(ctx: Arc<Context>, leadership: Leadership, shutdown: CancellationToken) {
    let (name, identity) = match leadership {
        Leadership::Always => return operator::run(ctx, shutdown).await,
        Leadership::Lease { name, identity } => (name, identity),
    };
    let elector = Elector::new(
        Api::namespaced(ctx.client.clone(), &ctx.settings.namespace),
        &name,
        &identity,
        TIMING,
    );
    let (tx, mut leading) = watch::channel(false);
    let release = CancellationToken::new();
    let electing = tokio::spawn(elect(elector, tx, release.clone()));
    tracing::info!(lease = %name, %identity, "waiting for leadership");
    'terms: loop {
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { break 'terms },
                _ = shutdown.cancelled() => break 'terms,
            }
        }
        let term = shutdown.child_token();
        let running = tokio::spawn(operator::run(ctx.clone(), term.clone()));
        let lost = loop {
            tokio::select! {
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() { break true }
                }
                _ = shutdown.cancelled() => break false,
            }
        };
        if lost {
            tracing::warn!(lease = %name, "leadership lost: supervisors detach, their Pods stay for the next leader");
        }
        term.cancel();
        let _ = running.await;
        if !lost {
            break;
        }
    }
    // Released only once the operator has stopped.
    release.cancel();
    let _ = electing.await;
}
