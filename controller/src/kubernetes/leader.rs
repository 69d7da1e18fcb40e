//! Leader election: only the replica holding the `coordination.k8s.io`
//! Lease runs the operator, so two replicas never both poll one pool. A
//! replica that loses the Lease detaches its supervisors at once (their
//! Pods keep running) and the next leader adopts them.

use crate::kubernetes::operator::{self, Context};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a Lease stays valid without renewal, and how early the holder renews it.
pub const LEASE_SECONDS: u64 = 15;
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// Where leadership comes from.
pub enum Leadership {
    /// This replica always leads (one replica, `--leader-election=false`).
    Always,
    /// This replica leads while it holds the named Lease.
    Lease { name: String, identity: String },
}

/// Runs the operator whenever this replica leads, until `shutdown`.
pub async fn run(ctx: Arc<Context>, leadership: Leadership, shutdown: CancellationToken) {
    match leadership {
        Leadership::Always => operator::run(ctx, shutdown).await,
        Leadership::Lease { name, identity } => loop {
            let ended = lead_while_held(&ctx, &name, &identity, &shutdown).await;
            if shutdown.is_cancelled() {
                return;
            }
            match ended {
                Ok(()) => tracing::error!(lease = %name, "leader election ended; restarting it"),
                Err(err) => {
                    tracing::error!(error = %err, lease = %name, "leader election failed; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = shutdown.cancelled() => return,
            }
        },
    }
}

async fn lead_while_held(
    ctx: &Arc<Context>,
    name: &str,
    identity: &str,
    shutdown: &CancellationToken,
) -> Result<(), LeaseManagerError> {
    let manager = LeaseManagerBuilder::new(ctx.client.clone(), name)
        .with_namespace(&ctx.settings.namespace)
        .with_identity(identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await?;
    let (mut leading, watcher) = manager.watch().await;
    tracing::info!(lease = %name, %identity, "waiting for leadership");
    loop {
        // Wait to lead.
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { return ended(watcher).await },
                _ = shutdown.cancelled() => { drop(leading); return ended(watcher).await },
            }
        }
        tracing::info!(lease = %name, %identity, "leading: the operator runs");
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
            // Releasing the Lease lets the next replica lead at once.
            drop(leading);
            return ended(watcher).await;
        }
    }
}

async fn ended(
    watcher: tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>,
) -> Result<(), LeaseManagerError> {
    match watcher.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(err),
        Err(join) => {
            tracing::error!(error = %join, "the leader election task failed");
            Ok(())
        }
    }
}
