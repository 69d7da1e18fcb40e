//! The `network-cut` scenario: the container of a runner mid-call is
//! disconnected from the suite's network (`docker network disconnect`)
//! until its lease has expired, then connected again. The item must be
//! claimed again and finish in another sandbox; the cut runner, back on
//! the network, must find its claim over (its old token refused), so that
//! nothing it still had to say is taken: each call answered once.

use super::invariants::Promises;
use super::sandboxes;
use super::scenarios::{self, Outcome};
use super::system::System;
use super::watch::RECLAIM_DELAY;
use anyhow::Context;
use bollard::models::{NetworkConnectRequest, NetworkDisconnectRequest};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn run(system: &Arc<System>) -> anyhow::Result<Outcome> {
    let s = system.clone();
    let cut: Arc<std::sync::Mutex<Option<(String, f64)>>> = Arc::default();
    let cut_work = cut.clone();
    // Six Sessions on two supervisors of four slots each: the Docker one
    // runs at least two of them.
    let mut outcome = scenarios::frame(
        system,
        scenarios::spec(6, 2, "sleep 3; echo call {n}"),
        Promises::default(),
        Box::pin(async move {
            let (work, epoch, container) = until_docker_call(&s).await?;
            let reclaim = tokio::spawn({
                let (s, work) = (s.clone(), work.clone());
                async move { until_reclaimed(&s, &work, epoch).await }
            });
            let network = s.settings.names.network.clone();
            s.docker
                .disconnect_network(
                    &network,
                    NetworkDisconnectRequest {
                        container: Some(container.clone()),
                        force: Some(true),
                    },
                )
                .await
                .context("docker network disconnect")?;
            until_lease_lost(&s, &work, epoch).await?;
            // Healed: the runner is back, its claim over. Its supervisor
            // may have removed it already, having read the lease lost.
            let healed = s
                .docker
                .connect_network(
                    &network,
                    NetworkConnectRequest {
                        container: Some(container),
                        ..Default::default()
                    },
                )
                .await;
            if let Err(err) = healed {
                println!("faults: network-cut: the cut container was gone before it was reconnected ({err})");
            }
            let secs = reclaim.await??;
            *cut_work.lock().unwrap() = Some((work, secs));
            Ok(())
        }),
    )
    .await?;
    let cut = cut.lock().unwrap().clone();
    if let Some((work, secs)) = cut {
        let bound = system.settings.ttl_seconds as f64 + RECLAIM_DELAY.as_secs_f64();
        if secs > bound {
            outcome.verdict.failures.push(format!(
                "reclaim: the cut item {work} was claimed again {secs:.1} s after its last renewal (bound {bound} s)"
            ));
        }
        // An expired lease may go back to the queue before its next claim,
        // which the watch does not count as a reclaim.
        if !outcome.reclaims.iter().any(|(id, _)| *id == work) {
            outcome.reclaims.push((work, secs));
        }
    }
    Ok(outcome)
}

/// A Session's item that a Docker sandbox runs, mid-call: its Work, claim
/// and container.
async fn until_docker_call(system: &System) -> anyhow::Result<(String, i64, String)> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        scenarios::until_calls_run(system).await?;
        let names = &system.settings.names;
        for live in sandboxes::live(&system.docker, names, &system.local_root()).await {
            let docker = live.pool == names.docker_pool;
            let Some(container) = live.container.filter(|_| docker) else {
                continue;
            };
            // Its runner heartbeats (a sandbox slow to start may lose its
            // lease by itself), and its lease has a while to run.
            let (calling,): (bool,) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM work w JOIN session_events u ON u.session_id = w.session_id
                 WHERE w.id = $1 AND w.claim_epoch = $2 AND w.state = 'active'
                   AND w.latest_heartbeat_at IS NOT NULL
                   AND w.lease_expires_at > now() + interval '5 seconds'
                   AND u.type = 'agent.tool_use'
                   AND NOT EXISTS (SELECT 1 FROM session_events r WHERE r.session_id = u.session_id
                                   AND r.type = 'user.tool_result' AND r.body->>'tool_use_id' = u.id))",
            )
            .bind(&live.work_id)
            .bind(live.claim)
            .fetch_one(&system.db)
            .await?;
            if calling {
                return Ok((live.work_id, live.claim, container));
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no Docker sandbox ran a call within 90 s"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `work` is claimed again after its claim `epoch` (cut off)
/// lost its lease, within TTL plus the reclaim delay of its last renewal:
/// the seconds from that renewal to the new claim.
async fn until_reclaimed(system: &System, work: &str, epoch: i64) -> anyhow::Result<f64> {
    let bound = Duration::from_secs(system.settings.ttl_seconds) + RECLAIM_DELAY;
    // Past the bound, with room to say how late it came.
    let deadline = Instant::now() + bound * 2;
    let mut renewed: Option<DateTime<Utc>> = None;
    loop {
        let (now_epoch, claimed, last): (i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
            sqlx::query_as(
                // An Ack clears `claimed_at`: the new claim is dated by it then.
                "SELECT claim_epoch, COALESCE(claimed_at, acknowledged_at),
                        COALESCE(latest_heartbeat_at, acknowledged_at)
                 FROM work WHERE id = $1",
            )
            .bind(work)
            .fetch_one(&system.db)
            .await?;
        if now_epoch == epoch {
            renewed = last.or(renewed);
        } else {
            let (Some(claimed), Some(renewed)) = (claimed, renewed) else {
                anyhow::bail!(
                    "{work} was claimed again, but its cut claim's last renewal was never seen"
                );
            };
            return Ok((claimed - renewed).num_milliseconds() as f64 / 1000.0);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the cut item {work} was not claimed again within {:?}",
            bound * 2
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the lease of `work`'s claim `epoch` has expired (or the
/// item was already claimed again): the cut lasted past the TTL.
async fn until_lease_lost(system: &System, work: &str, epoch: i64) -> anyhow::Result<()> {
    let within = Duration::from_secs(system.settings.ttl_seconds) + RECLAIM_DELAY;
    let deadline = Instant::now() + within;
    loop {
        let (lost,): (bool,) = sqlx::query_as(
            "SELECT claim_epoch > $2 OR lease_expires_at < now() OR state = 'stopped'
             FROM work WHERE id = $1",
        )
        .bind(work)
        .bind(epoch)
        .fetch_one(&system.db)
        .await?;
        if lost {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the cut runner's lease of {work} still held {within:?} after the cut"
        );
        // Poll interval of this deadline loop.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
