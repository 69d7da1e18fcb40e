//! A pool's status from what the operator observed: a pure function, so
//! every condition and reason is tested without a cluster.

use crate::core::metrics::Snapshot;
use crate::kubernetes::crd::{QueueStatus, WorkerPoolStatus};
use crate::kubernetes::launcher::HardeningChecked;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use mango_protocol::QueueStats;
use std::time::{Duration, SystemTime};

/// A Poll within this long counts as polling now.
pub const POLL_FRESH: Duration = Duration::from_secs(30);
/// An error within this long makes the pool degraded.
pub const ERROR_FRESH: Duration = Duration::from_secs(60);

/// Why a pool's supervisor does not run (or no longer polls).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The spec would weaken the sandbox or cannot be used.
    InvalidSpec(String),
    /// The Secret, or its key, is missing.
    SecretMissing(String),
    /// The Secret could not be read now (the API shed the request, failed
    /// inside, or could not be reached): a retry may succeed.
    SecretUnreadable(String),
    /// The Secret holds a Workspace key, which must never reach a pool.
    WorkspaceKey,
    /// The Secret holds something that is not an Environment key.
    NotAnEnvironmentKey,
    /// The api refused the key (unknown or revoked).
    KeyRefused(String),
    /// The key serves another Environment.
    WrongEnvironment(String),
    /// The cluster serves an older WorkerPool CRD than this controller's.
    CrdOutdated(String),
    /// The WorkerPool CRD cannot be read, so its revision is unknown.
    CrdUnreadable(String),
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::InvalidSpec(_) => "InvalidSpec",
            Problem::SecretMissing(_) => "SecretMissing",
            Problem::SecretUnreadable(_) => "SecretUnreadable",
            Problem::WorkspaceKey => "WorkspaceKey",
            Problem::NotAnEnvironmentKey => "NotAnEnvironmentKey",
            Problem::KeyRefused(_) => "KeyRefused",
            Problem::WrongEnvironment(_) => "WrongEnvironment",
            Problem::CrdOutdated(_) => "CrdOutdated",
            Problem::CrdUnreadable(_) => "CrdUnreadable",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Problem::InvalidSpec(m)
            | Problem::SecretMissing(m)
            | Problem::SecretUnreadable(m)
            | Problem::CrdOutdated(m)
            | Problem::CrdUnreadable(m) => m.clone(),
            Problem::WorkspaceKey => "the Secret holds a Workspace key (mango_wsk_…); a pool takes an Environment key: `mango api-key create -workspace W -environment E -label L`".into(),
            Problem::NotAnEnvironmentKey => "the Secret does not hold an Environment key (mango_envk_…)".into(),
            Problem::KeyRefused(m) => format!("the api refused the Environment key (unknown or revoked): {m}"),
            Problem::WrongEnvironment(m) => format!("the Environment key does not serve spec.environmentId: {m}"),
        }
    }
}

/// How far the pool's supervisor has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The supervisors of the pool's earlier spec are still detaching.
    WaitingForPrevious,
    /// Checking its Environment key with the api.
    CheckingKey,
    /// It checked its key and runs.
    Running,
}

/// What the operator saw of one pool.
#[derive(Debug, Clone)]
pub struct Observed {
    pub generation: Option<i64>,
    pub problem: Option<Problem>,
    pub progress: Progress,
    pub snapshot: Option<Snapshot>,
    pub queue: Option<QueueStats>,
    /// How the API server stored the latest sandbox Pod's hardening.
    pub hardening: Option<HardeningChecked>,
    pub now: SystemTime,
}

fn rfc3339(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// One condition, keeping its transition time when its status is unchanged.
fn condition(
    previous: &[Condition],
    kind: &str,
    status: bool,
    reason: &str,
    message: String,
    observed: &Observed,
) -> Condition {
    let status = if status { "True" } else { "False" };
    condition_of(previous, kind, status, reason, message, observed)
}

fn condition_of(
    previous: &[Condition],
    kind: &str,
    status: &str,
    reason: &str,
    message: String,
    observed: &Observed,
) -> Condition {
    let since = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| {
            Time(jiff::Timestamp::try_from(observed.now).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
        });
    Condition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: since,
        observed_generation: observed.generation,
    }
}

/// The status to write.
pub fn status(previous: Option<&WorkerPoolStatus>, observed: &Observed) -> WorkerPoolStatus {
    let before: &[Condition] = previous.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let snapshot = observed.snapshot.as_ref();
    let polled_at = snapshot.and_then(|s| s.last_poll_ok);
    let polled_lately = polled_at
        .is_some_and(|at| observed.now.duration_since(at).unwrap_or_default() <= POLL_FRESH);
    let recent_error = snapshot
        .and_then(|s| s.last_error.clone())
        .filter(|(at, _)| observed.now.duration_since(*at).unwrap_or_default() <= ERROR_FRESH);

    let (ready, polling, degraded) = match &observed.problem {
        Some(problem) => (
            condition(
                before,
                "Ready",
                false,
                problem.reason(),
                problem.message(),
                observed,
            ),
            condition(
                before,
                "Polling",
                false,
                "NotPolling",
                "the supervisor does not poll until the problem is fixed".into(),
                observed,
            ),
            condition(
                before,
                "Degraded",
                true,
                problem.reason(),
                problem.message(),
                observed,
            ),
        ),
        None if observed.progress != Progress::Running => (
            condition(
                before,
                "Ready",
                false,
                "Starting",
                match observed.progress {
                    Progress::WaitingForPrevious => {
                        "waiting for the supervisor of the pool's previous spec to detach"
                    }
                    _ => "checking the Environment key with the api",
                }
                .into(),
                observed,
            ),
            condition(
                before,
                "Polling",
                false,
                "Starting",
                "not polling yet".into(),
                observed,
            ),
            match &recent_error {
                Some((_, error)) => condition(
                    before,
                    "Degraded",
                    true,
                    "ApiUnavailable",
                    error.clone(),
                    observed,
                ),
                None => condition(
                    before,
                    "Degraded",
                    false,
                    "AsExpected",
                    "no recent errors".into(),
                    observed,
                ),
            },
        ),
        None => (
            condition(
                before,
                "Ready",
                true,
                "Running",
                "the supervisor polls with an accepted Environment key".into(),
                observed,
            ),
            if polled_lately {
                condition(
                    before,
                    "Polling",
                    true,
                    "PollSucceeded",
                    "a Poll succeeded within 30 s".into(),
                    observed,
                )
            } else {
                condition(
                    before,
                    "Polling",
                    false,
                    "PollFailing",
                    recent_error
                        .as_ref()
                        .map(|(_, e)| e.clone())
                        .unwrap_or_else(|| "no Poll succeeded within 30 s".into()),
                    observed,
                )
            },
            match &recent_error {
                Some((_, error)) => condition(
                    before,
                    "Degraded",
                    true,
                    "RecentErrors",
                    error.clone(),
                    observed,
                ),
                None => condition(
                    before,
                    "Degraded",
                    false,
                    "AsExpected",
                    "no recent errors".into(),
                    observed,
                ),
            },
        ),
    };
    WorkerPoolStatus {
        conditions: vec![ready, polling, degraded, hardened(before, observed)],
        live_items: snapshot.map_or(0, |s| s.live as u32),
        // The queue as last read while none can be read now (the supervisor
        // is not running, or the api did not answer): an apply that dropped
        // it would leave `queue: {}` on API servers whose server-side apply
        // keeps a map it emptied (structured-merge-diff #306), and the
        // schema refuses that, so no status, not even a problem, would land.
        queue: observed
            .queue
            .as_ref()
            .map(|q| QueueStatus {
                depth: q.depth,
                pending: q.pending,
                oldest_queued_at: q
                    .oldest_queued_at
                    .as_ref()
                    .map(mango_protocol::time::format),
            })
            .or_else(|| previous.and_then(|p| p.queue.clone())),
        last_successful_poll: polled_at
            .map(rfc3339)
            .or_else(|| previous.and_then(|p| p.last_successful_poll.clone())),
        observed_generation: observed.generation,
    }
}

/// `Hardened`: whether the API server stored the latest sandbox Pod's
/// hardening as the controller sent it.
fn hardened(before: &[Condition], observed: &Observed) -> Condition {
    match &observed.hardening {
        None => condition_of(
            before,
            "Hardened",
            "Unknown",
            "NoPodYet",
            "no sandbox Pod was created since the supervisor started".into(),
            observed,
        ),
        Some(checked) if checked.not_stored.is_empty() => condition_of(
            before,
            "Hardened",
            "True",
            "AsRequested",
            format!(
                "the Kubernetes API stored the hardening of Pod {} as sent",
                checked.pod
            ),
            observed,
        ),
        Some(checked) => condition_of(
            before,
            "Hardened",
            "False",
            "FieldsNotStored",
            format!(
                "the Kubernetes API did not store {} of Pod {} as sent (a feature gate that is off, such as UserNamespacesSupport for spec.hostUsers, or a mutating webhook): sandboxes run without it",
                checked.not_stored.join(", "),
                checked.pod
            ),
            observed,
        ),
    }
}

#[cfg(test)]
mod tests;
