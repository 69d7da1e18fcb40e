//! The Work lease state machine, pure: every rule of spec §3–§4 about what an
//! operation may do to a Work item, with no I/O. The store loads a [`Lease`],
//! asks this module for the next one, and writes it back fenced on the row
//! version and claim epoch it read; HTTP maps the errors to status codes.
//!
//! Time is always passed in (`now`), so every rule is testable at its edge.

use chrono::Duration;
use mango_protocol::time::Timestamp;
use mango_protocol::{CheckResult, CheckStatus, WorkState, WorkType};

/// How long after a Result commits its token may still repeat that Result.
pub const RESULT_RETRY_WINDOW: Duration = Duration::seconds(30);
/// Healthcheck deadline, counted from creation.
pub const HEALTHCHECK_DEADLINE: Duration = Duration::seconds(120);
pub const MIN_TTL_SECONDS: i64 = 1;
pub const MAX_TTL_SECONDS: i64 = 300;
pub const TIMED_OUT_MESSAGE: &str = "Healthcheck did not finish before its deadline";
pub const CANCELLED_MESSAGE: &str = "Healthcheck was stopped before it finished";

/// The lease-relevant part of a Work row.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub kind: WorkType,
    pub state: WorkState,
    pub claim_epoch: i64,
    /// When the pending (not yet acknowledged) claim was made.
    pub claimed_at: Option<Timestamp>,
    pub acknowledged_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub latest_heartbeat_at: Option<Timestamp>,
    /// The `expected_last_heartbeat` the latest beat matched (`None` = NO_HEARTBEAT);
    /// kept so a retried beat is a success, not a 412.
    pub previous_heartbeat_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    pub ttl_seconds: i64,
    pub stop_requested_at: Option<Timestamp>,
    pub stopped_at: Option<Timestamp>,
    /// Healthcheck deadline; `None` for Session Work.
    pub expires_at: Option<Timestamp>,
    pub result: Option<CheckResult>,
    pub result_committed_at: Option<Timestamp>,
    /// Who first asked the item to end, and how; `None` while nobody has.
    /// Set when it goes `stopping` or `stopped`, and never changed after.
    pub end: Option<WorkEnd>,
}

/// Why a Work item ends (stored as `work.end_reason`). A supervisor may
/// keep the sandbox of an item that ended [`WorkEnd::Idle`], and only of
/// such an item (spec §7.1): any other end removes it. Not on the wire:
/// the claims read shows only whether an end is keepable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkEnd {
    /// The holder's forced Stop at its Session's idle end (no operator's
    /// Stop, lost lease or failure before it).
    Idle,
    /// The holder's Stop for any other reason (the Session terminated, a
    /// graceful Stop of its own, a forced Stop before its first beat).
    Holder,
    /// A Workspace key's Stop, graceful or forced.
    Operator,
    /// Fail, by the holder or by Poll giving up on an item.
    Failed,
    /// A healthcheck's Result.
    Result,
    /// Time: a `stopping` lease ran out, or a healthcheck's deadline passed.
    Lapsed,
}

impl WorkEnd {
    const ALL: [WorkEnd; 6] = [
        WorkEnd::Idle,
        WorkEnd::Holder,
        WorkEnd::Operator,
        WorkEnd::Failed,
        WorkEnd::Result,
        WorkEnd::Lapsed,
    ];

    /// The stored text (the column's CHECK lists the same).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkEnd::Idle => "idle",
            WorkEnd::Holder => "holder",
            WorkEnd::Operator => "operator",
            WorkEnd::Failed => "failed",
            WorkEnd::Result => "result",
            WorkEnd::Lapsed => "lapsed",
        }
    }

    pub fn parse(text: &str) -> Option<WorkEnd> {
        WorkEnd::ALL.into_iter().find(|end| end.as_str() == text)
    }
}

/// Who asks for a Stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopper {
    /// A Workspace key.
    Operator,
    /// The claim's sessions token.
    Holder,
    /// The claim's sessions token, for its Session's idle end. It ends the
    /// item [`WorkEnd::Idle`] only when nothing else asked first and the
    /// item is an active Session's; otherwise it is an ordinary holder Stop.
    HolderIdle,
}

impl Lease {
    /// A new item as Create or Session admission inserts it.
    pub fn new(kind: WorkType, created_at: Timestamp, default_ttl: i64) -> Self {
        Lease {
            kind,
            state: WorkState::Queued,
            claim_epoch: 0,
            claimed_at: None,
            acknowledged_at: None,
            started_at: None,
            latest_heartbeat_at: None,
            previous_heartbeat_at: None,
            lease_expires_at: None,
            ttl_seconds: default_ttl,
            stop_requested_at: None,
            stopped_at: None,
            expires_at: match kind {
                WorkType::Healthcheck => Some(created_at + HEALTHCHECK_DEADLINE),
                WorkType::Session => None,
            },
            result: None,
            result_committed_at: None,
            end: None,
        }
    }

    /// Whether the item ended at its runner's idle end, so its sandbox may be
    /// kept for the Session's next activation (after reconcile).
    pub fn keepable(&self) -> bool {
        self.state == WorkState::Stopped && self.end == Some(WorkEnd::Idle)
    }

    fn lease_live(&self, now: Timestamp) -> bool {
        self.lease_expires_at.is_some_and(|t| t > now)
    }

    fn overdue(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Moves time-driven transitions forward: an overdue healthcheck is
    /// `timed_out`; a `stopping` item whose lease ran out is `stopped`.
    /// Every read applies this, so no reader depends on the sweeper.
    pub fn reconcile(&self, now: Timestamp) -> Lease {
        let mut next = self.clone();
        if next.state != WorkState::Stopped
            && next.kind == WorkType::Healthcheck
            && next.overdue(now)
        {
            let deadline = next.expires_at.expect("overdue implies a deadline");
            if next.state == WorkState::Stopping {
                // Stop was asked for before the deadline: the check was cancelled.
                let at = next.lease_expires_at.map_or(deadline, |l| l.min(deadline));
                next.finish(at, Some(CheckStatus::Cancelled), WorkEnd::Lapsed);
            } else {
                next.finish(deadline, Some(CheckStatus::TimedOut), WorkEnd::Lapsed);
            }
        } else if next.state == WorkState::Stopping && !next.lease_live(now) {
            let at = next.lease_expires_at.unwrap_or(now);
            next.finish(at, None, WorkEnd::Lapsed);
        }
        next
    }

    /// Records `stopped`; an unfinished healthcheck gets `status` (default
    /// cancelled). `end` counts only if nobody asked for the end before.
    fn finish(&mut self, at: Timestamp, status: Option<CheckStatus>, end: WorkEnd) {
        self.state = WorkState::Stopped;
        self.end = self.end.or(Some(end));
        self.stopped_at = Some(at);
        self.lease_expires_at = None;
        self.claimed_at = None;
        if self.kind == WorkType::Healthcheck && self.result.is_none() {
            let status = status.unwrap_or(CheckStatus::Cancelled);
            let message = match status {
                CheckStatus::TimedOut => TIMED_OUT_MESSAGE,
                _ => CANCELLED_MESSAGE,
            };
            self.result = Some(CheckResult {
                status,
                message: message.to_string(),
            });
        }
    }

    /// Whether Poll may claim this item now (the claim SQL mirrors this).
    pub fn is_available(&self, now: Timestamp, reclaim_after: Duration) -> bool {
        if self.overdue(now) {
            return false;
        }
        match self.state {
            WorkState::Queued => self.claimed_at.is_none_or(|c| c + reclaim_after <= now),
            WorkState::Starting | WorkState::Active => !self.lease_live(now),
            WorkState::Stopping | WorkState::Stopped => false,
        }
    }

    /// A (re)claim by Poll: a new epoch, back to a pending claim, heartbeat
    /// history cleared. The caller stores the new token's digest.
    pub fn claim(&self, now: Timestamp) -> Lease {
        Lease {
            state: WorkState::Queued,
            claim_epoch: self.claim_epoch + 1,
            claimed_at: Some(now),
            acknowledged_at: None,
            started_at: None,
            latest_heartbeat_at: None,
            previous_heartbeat_at: None,
            lease_expires_at: None,
            stop_requested_at: None,
            end: None,
            ..self.clone()
        }
    }

    /// Ack: the pending claim becomes `starting` with a pre-heartbeat lease.
    pub fn ack(&self, now: Timestamp, default_ttl: i64) -> Result<Lease, AckError> {
        match self.state {
            WorkState::Queued if self.claimed_at.is_some() => Ok(Lease {
                state: WorkState::Starting,
                acknowledged_at: Some(now),
                claimed_at: None,
                ttl_seconds: default_ttl,
                lease_expires_at: Some(now + Duration::seconds(default_ttl)),
                ..self.clone()
            }),
            WorkState::Queued => Err(AckError::NotClaimed),
            // Already acknowledged: a retried Ack whose response was lost.
            WorkState::Starting | WorkState::Active | WorkState::Stopping => Ok(self.clone()),
            WorkState::Stopped => Err(AckError::Stopped),
        }
    }

    /// May the claim's sessions token be used for `use_` now? (after reconcile)
    pub fn admits_token(&self, use_: TokenUse, now: Timestamp) -> Result<(), TokenRejection> {
        match self.state {
            WorkState::Queued => Err(TokenRejection::NotAcknowledged),
            WorkState::Starting | WorkState::Active if use_ == TokenUse::Heartbeat => Ok(()),
            WorkState::Starting | WorkState::Active | WorkState::Stopping => {
                if self.lease_live(now) {
                    Ok(())
                } else {
                    Err(TokenRejection::LeaseExpired)
                }
            }
            WorkState::Stopped => {
                let in_window = self
                    .result_committed_at
                    .is_some_and(|t| now < t + RESULT_RETRY_WINDOW);
                if use_ == TokenUse::Result && in_window {
                    Ok(())
                } else {
                    Err(TokenRejection::Stopped)
                }
            }
        }
    }

    /// Heartbeat: claim the lease with NO_HEARTBEAT, then echo the last value.
    pub fn heartbeat(
        &self,
        expected: Option<Timestamp>,
        desired_ttl: Option<i64>,
        now: Timestamp,
        default_ttl: i64,
    ) -> Result<(Lease, Beat), HeartbeatError> {
        match self.state {
            // Not compared while stopping: the reply itself tells the holder to cancel.
            WorkState::Stopping => return Ok((self.clone(), Beat { extended: false })),
            WorkState::Queued | WorkState::Stopped => return Err(HeartbeatError::Precondition),
            WorkState::Starting | WorkState::Active => {}
        }
        if !self.lease_live(now) {
            return Err(HeartbeatError::Precondition);
        }
        let fresh = self.state == WorkState::Starting && expected.is_none();
        let current = self.state == WorkState::Active
            && expected.is_some()
            && expected == self.latest_heartbeat_at;
        let replay = self.state == WorkState::Active && expected == self.previous_heartbeat_at;
        if !(fresh || current || replay) {
            return Err(HeartbeatError::Precondition);
        }
        let ttl = desired_ttl.unwrap_or(default_ttl);
        // Strictly increasing, so the value a client echoes names one beat.
        let stamp = match self.latest_heartbeat_at {
            Some(last) if last >= now => last + Duration::microseconds(1),
            _ => now,
        };
        let next = Lease {
            state: WorkState::Active,
            started_at: self.started_at.or(Some(now)),
            previous_heartbeat_at: if replay {
                self.previous_heartbeat_at
            } else {
                expected
            },
            latest_heartbeat_at: Some(stamp),
            ttl_seconds: ttl,
            lease_expires_at: Some(now + Duration::seconds(ttl)),
            ..self.clone()
        };
        Ok((next, Beat { extended: true }))
    }

    /// Stop: graceful turns `active` into `stopping`; forced, or on an item
    /// that never went active, records `stopped` at once. The first Stop
    /// asked for names the end; a holder's idle Stop is [`WorkEnd::Idle`]
    /// only on an active Session item nobody asked to stop before.
    pub fn stop(&self, force: bool, by: Stopper, now: Timestamp) -> Result<Lease, StopError> {
        let mut next = self.clone();
        let end = match by {
            Stopper::Operator => WorkEnd::Operator,
            Stopper::HolderIdle
                if force && self.state == WorkState::Active && self.kind == WorkType::Session =>
            {
                WorkEnd::Idle
            }
            Stopper::Holder | Stopper::HolderIdle => WorkEnd::Holder,
        };
        match self.state {
            WorkState::Stopped => return Err(StopError::AlreadyStopped),
            WorkState::Active | WorkState::Stopping if !force => {
                next.state = WorkState::Stopping;
                next.stop_requested_at = self.stop_requested_at.or(Some(now));
                next.end = self.end.or(Some(end));
            }
            _ => {
                next.stop_requested_at = self.stop_requested_at.or(Some(now));
                next.finish(now, None, end);
            }
        }
        Ok(next)
    }

    /// A healthcheck's worker reports its outcome; only the live active lease may.
    pub fn complete(
        &self,
        result: &CheckResult,
        now: Timestamp,
    ) -> Result<(Lease, Completion), ResultError> {
        if self.kind != WorkType::Healthcheck {
            return Err(ResultError::NotAHealthcheck);
        }
        match self.state {
            WorkState::Active if self.lease_live(now) => {
                let mut next = self.clone();
                next.result = Some(result.clone());
                next.result_committed_at = Some(now);
                next.finish(now, None, WorkEnd::Result);
                Ok((next, Completion::Stored))
            }
            WorkState::Stopped if self.result_committed_at.is_some() => {
                if self.result.as_ref() == Some(result) {
                    Ok((self.clone(), Completion::Replayed))
                } else {
                    Err(ResultError::Conflict)
                }
            }
            _ => Err(ResultError::NotActive),
        }
    }

    /// Fail: a permanent, immutable-input error ends the Work for good.
    pub fn fail(&self, message: &str, now: Timestamp) -> Result<Lease, StopError> {
        if self.state == WorkState::Stopped {
            return Err(StopError::AlreadyStopped);
        }
        let mut next = self.clone();
        if next.kind == WorkType::Healthcheck && next.result.is_none() {
            next.result = Some(CheckResult {
                status: CheckStatus::Failed,
                message: message.to_string(),
            });
        }
        next.stop_requested_at = self.stop_requested_at.or(Some(now));
        next.finish(now, None, WorkEnd::Failed);
        Ok(next)
    }

    /// `details.current_state` / heartbeat view of the lease.
    pub fn last_heartbeat(&self) -> Option<Timestamp> {
        self.latest_heartbeat_at
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenUse {
    Heartbeat,
    Stop,
    Fail,
    Result,
    /// Session reads, event stream and tool results.
    Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRejection {
    NotAcknowledged,
    LeaseExpired,
    Stopped,
}

impl TokenRejection {
    pub fn message(self) -> &'static str {
        match self {
            TokenRejection::NotAcknowledged => {
                "sessions token is not active yet: the Work has not been acknowledged"
            }
            TokenRejection::LeaseExpired => "sessions token expired with its lease",
            TokenRejection::Stopped => "sessions token expired: the Work is stopped",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    pub extended: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckError {
    NotClaimed,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatError {
    Precondition,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopError {
    AlreadyStopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    Stored,
    Replayed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultError {
    NotAHealthcheck,
    NotActive,
    Conflict,
}

#[cfg(test)]
mod tests;
