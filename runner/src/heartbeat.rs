//! The heartbeat keeper: the first heartbeat (NO_HEARTBEAT) claims the
//! Work's lease before any tool runs, then a beat at most every TTL/2 keeps
//! it, echoing the previous answer. Any sign the lease is gone cancels
//! `lost`, which cancels running tools. A stop signal makes it beat at once,
//! to learn whether a Stop was asked for. (The lease and its rules are the
//! api's; this only keeps it.)

use mango_client::{Client, ClientError};
use mango_protocol::{HeartbeatResponse, WorkState};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why the keeper stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeeperEnd {
    /// The runner finished and released the keeper.
    Released,
    /// The server asked the holder to stop (`stopping`, or not extended).
    StopRequested,
    /// A stop signal came and the server had no Stop for the item (an
    /// eviction, `docker stop`): the lease is still held, and the runner
    /// leaves it to expire if the signal ended the work, so Poll hands the
    /// item out again.
    Interrupted,
    /// 412: another holder owns the lease. Never Stop it.
    Lost,
    /// The token is no longer accepted (401/403/404…).
    Rejected(String),
    /// Transient failures outlasted the retries: leave the lease to expire so
    /// Poll can reclaim the item.
    Unreachable(String),
}

impl KeeperEnd {
    /// May the runner still force-Stop the item on its way out?
    pub fn may_stop(&self) -> bool {
        matches!(
            self,
            KeeperEnd::Released | KeeperEnd::StopRequested | KeeperEnd::Interrupted
        )
    }
}

pub struct HeartbeatKeeper {
    pub client: Client,
    pub environment_id: String,
    pub work_id: String,
}

fn classify(err: ClientError) -> KeeperEnd {
    if err.is_lease_lost() {
        KeeperEnd::Lost
    } else if err.is_transient() {
        KeeperEnd::Unreachable(err.to_string())
    } else {
        KeeperEnd::Rejected(err.to_string())
    }
}

/// Beat again after half the TTL (at least a second).
pub fn interval(ttl_seconds: i64) -> Duration {
    Duration::from_millis((ttl_seconds.max(1) as u64) * 500).max(Duration::from_secs(1))
}

impl HeartbeatKeeper {
    /// The first heartbeat: claims the lease (`starting → active`).
    pub async fn claim(&self) -> Result<HeartbeatResponse, KeeperEnd> {
        let beat = self
            .client
            .heartbeat(&self.environment_id, &self.work_id, None, None)
            .await
            .map_err(classify)?;
        if beat.state != WorkState::Active || !beat.lease_extended {
            return Err(KeeperEnd::StopRequested);
        }
        Ok(beat)
    }

    /// Renews until `done` is cancelled or the lease ends; cancels `lost` when
    /// the holder must stop working. Each beat is bounded by the time left on
    /// the lease, so a hung connection cannot outlive it; transient failures
    /// are retried soon after, until the lease would run out. Once `signalled`
    /// is cancelled it beats at once, once, within [`SIGNAL_BEAT_BOUND`], and
    /// ends: [`KeeperEnd::StopRequested`] when the Work is stopping,
    /// [`KeeperEnd::Interrupted`] when it is still active.
    pub async fn keep(
        &self,
        mut last: HeartbeatResponse,
        done: CancellationToken,
        lost: CancellationToken,
        signalled: CancellationToken,
    ) -> KeeperEnd {
        let mut last_ok = Instant::now();
        let mut pause = interval(last.ttl_seconds);
        let end = loop {
            tokio::select! {
                biased;
                _ = signalled.cancelled() => break self.beat_once(&last).await,
                _ = done.cancelled() => break KeeperEnd::Released,
                _ = tokio::time::sleep(pause) => {}
            }
            let ttl = Duration::from_secs(last.ttl_seconds.max(1) as u64);
            let left = ttl
                .saturating_sub(last_ok.elapsed())
                .saturating_sub(LEASE_MARGIN);
            if left.is_zero() {
                break KeeperEnd::Unreachable(
                    "no heartbeat was answered before the lease ran out".into(),
                );
            }
            let beat = self.client.heartbeat(
                &self.environment_id,
                &self.work_id,
                Some(&last.last_heartbeat),
                None,
            );
            // A stop signal does not wait for a beat in flight.
            let answered = tokio::select! {
                answered = tokio::time::timeout(left, beat) => answered,
                _ = signalled.cancelled() => break self.beat_once(&last).await,
            };
            match answered {
                Ok(Ok(beat)) if beat.state == WorkState::Active && beat.lease_extended => {
                    last = beat;
                    last_ok = Instant::now();
                    pause = interval(last.ttl_seconds);
                }
                Ok(Ok(_)) => break KeeperEnd::StopRequested,
                Ok(Err(err)) if err.is_transient() => {
                    tracing::warn!(work_id = %self.work_id, error = %err, "heartbeat failed; retrying");
                    pause = RETRY_PAUSE;
                }
                Ok(Err(err)) => break classify(err),
                Err(_) => pause = Duration::ZERO,
            }
        };
        if end != KeeperEnd::Released {
            if signalled.is_cancelled() {
                tracing::info!(work_id = %self.work_id, end = ?end, "heartbeat after the stop signal");
            } else {
                tracing::warn!(work_id = %self.work_id, end = ?end, "lease ended; cancelling work");
            }
            lost.cancel();
        }
        end
    }

    /// The beat after a stop signal: was a Stop asked for?
    async fn beat_once(&self, last: &HeartbeatResponse) -> KeeperEnd {
        let beat = self.client.heartbeat(
            &self.environment_id,
            &self.work_id,
            Some(&last.last_heartbeat),
            None,
        );
        match tokio::time::timeout(SIGNAL_BEAT_BOUND, beat).await {
            Ok(Ok(beat)) if beat.state == WorkState::Active && beat.lease_extended => {
                KeeperEnd::Interrupted
            }
            Ok(Ok(_)) => KeeperEnd::StopRequested,
            Ok(Err(err)) => classify(err),
            Err(_) => KeeperEnd::Unreachable(format!(
                "no heartbeat answer within {SIGNAL_BEAT_BOUND:?} of the stop signal"
            )),
        }
    }
}

/// How long the beat after a stop signal may take (it runs beside the
/// Memory flush, well inside [`crate::signal::EXIT_BOUND`]).
pub const SIGNAL_BEAT_BOUND: Duration = Duration::from_secs(3);

/// Stop working this long before the lease would run out: the server's clock decides.
const LEASE_MARGIN: Duration = Duration::from_secs(1);
/// After a failed beat, try again this soon (the regular pause is TTL/2).
const RETRY_PAUSE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_at_half_the_ttl_and_never_faster_than_once_a_second() {
        assert_eq!(interval(120), Duration::from_secs(60));
        assert_eq!(interval(3), Duration::from_millis(1500));
        assert_eq!(interval(1), Duration::from_secs(1));
        assert_eq!(interval(0), Duration::from_secs(1));
    }

    /// A server that accepts connections and never answers.
    async fn black_hole() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        base
    }

    #[tokio::test]
    async fn a_hung_heartbeat_never_outlives_the_lease() {
        let keeper = HeartbeatKeeper {
            client: Client::new(&black_hole().await, "mango_st_x"),
            environment_id: "env_x".into(),
            work_id: "work_x".into(),
        };
        let first = HeartbeatResponse {
            kind: "work_heartbeat".into(),
            last_heartbeat: "2026-01-01T00:00:00.000000Z".into(),
            lease_extended: true,
            state: WorkState::Active,
            ttl_seconds: 3,
        };
        let (done, lost) = (CancellationToken::new(), CancellationToken::new());
        let started = Instant::now();
        let end = tokio::time::timeout(
            Duration::from_secs(10),
            keeper.keep(first, done, lost.clone(), CancellationToken::new()),
        )
        .await
        .expect("the keeper gives up by itself");
        assert!(matches!(end, KeeperEnd::Unreachable(_)), "{end:?}");
        assert!(lost.is_cancelled(), "running tools are cancelled");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "gave up before the 3 s lease ran out: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn only_a_live_or_released_lease_may_be_stopped_by_its_holder() {
        assert!(KeeperEnd::Released.may_stop());
        assert!(KeeperEnd::StopRequested.may_stop());
        assert!(KeeperEnd::Interrupted.may_stop());
        assert!(!KeeperEnd::Lost.may_stop());
        assert!(!KeeperEnd::Rejected("401".into()).may_stop());
        assert!(!KeeperEnd::Unreachable("down".into()).may_stop());
    }
}
