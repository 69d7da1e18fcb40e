use super::*;
use mango_protocol::time::parse;

const TTL: i64 = 120;

fn t0() -> Timestamp {
    parse("2026-05-01T12:00:00Z").unwrap()
}
fn at(secs: i64) -> Timestamp {
    t0() + Duration::seconds(secs)
}
fn ms(n: i64) -> Duration {
    Duration::milliseconds(n)
}

/// One item of `kind` walked through the real transitions into `state`,
/// created at t0, claimed at +1 s, acked at +2 s, first beat at +3 s.
fn lease_in(kind: WorkType, state: WorkState) -> Lease {
    let fresh = Lease::new(kind, t0(), TTL);
    if state == WorkState::Queued {
        return fresh;
    }
    let starting = fresh.claim(at(1)).ack(at(2), TTL).unwrap();
    match state {
        WorkState::Starting => starting,
        WorkState::Active => starting.heartbeat(None, None, at(3), TTL).unwrap().0,
        WorkState::Stopping => {
            let active = starting.heartbeat(None, None, at(3), TTL).unwrap().0;
            active.stop(false, Stopper::Operator, at(4)).unwrap()
        }
        WorkState::Stopped => starting.stop(true, Stopper::Operator, at(3)).unwrap(),
        WorkState::Queued => unreachable!(),
    }
}

fn pending(kind: WorkType) -> Lease {
    Lease::new(kind, t0(), TTL).claim(at(1))
}

// ---------------------------------------------------------------- reconcile

#[test]
fn overdue_healthcheck_times_out_from_every_live_state_at_its_deadline() {
    for state in [
        WorkState::Queued,
        WorkState::Starting,
        WorkState::Active,
        WorkState::Stopping,
    ] {
        let lease = lease_in(WorkType::Healthcheck, state);
        let deadline = lease.expires_at.unwrap();
        assert_eq!(deadline, at(120));
        // One microsecond before the deadline nothing changes (stopping's lease is still live too).
        let before = lease.reconcile(deadline - Duration::microseconds(1));
        assert_eq!(
            before, lease,
            "{state:?} must not change before the deadline"
        );
        let after = lease.reconcile(deadline);
        assert_eq!(after.state, WorkState::Stopped, "{state:?}");
        if state == WorkState::Stopping {
            // Stop was requested before the deadline: cancelled, not timed out.
            assert_eq!(
                after.result.as_ref().unwrap().status,
                CheckStatus::Cancelled
            );
        } else {
            assert_eq!(after.result.as_ref().unwrap().status, CheckStatus::TimedOut);
            assert_eq!(after.stopped_at, Some(deadline));
            assert_eq!(after.result.as_ref().unwrap().message, TIMED_OUT_MESSAGE);
        }
    }
}

#[test]
fn reconcile_leaves_stopped_and_session_work_alone() {
    let stopped = lease_in(WorkType::Healthcheck, WorkState::Stopped);
    assert_eq!(stopped.reconcile(at(10_000)), stopped);
    for state in [WorkState::Queued, WorkState::Starting, WorkState::Active] {
        let lease = lease_in(WorkType::Session, state);
        assert_eq!(lease.expires_at, None);
        assert_eq!(lease.reconcile(at(10_000)), lease, "{state:?}");
    }
}

#[test]
fn stopping_becomes_stopped_when_its_unrenewed_lease_runs_out() {
    let stopping = lease_in(WorkType::Session, WorkState::Stopping);
    let expiry = stopping.lease_expires_at.unwrap();
    assert_eq!(
        stopping.reconcile(expiry - Duration::microseconds(1)),
        stopping
    );
    let done = stopping.reconcile(expiry);
    assert_eq!(done.state, WorkState::Stopped);
    assert_eq!(done.stopped_at, Some(expiry));
    assert_eq!(done.result, None, "session work has no result");
}

#[test]
fn stopping_healthcheck_that_runs_out_is_cancelled() {
    // Short lease so it runs out before the healthcheck deadline.
    let active = lease_in(WorkType::Healthcheck, WorkState::Starting)
        .heartbeat(None, Some(5), at(3), TTL)
        .unwrap()
        .0;
    let stopping = active.stop(false, Stopper::Operator, at(4)).unwrap();
    let done = stopping.reconcile(at(8));
    assert_eq!(done.state, WorkState::Stopped);
    assert_eq!(done.result.unwrap().status, CheckStatus::Cancelled);
}

// ---------------------------------------------------------------- availability and claim

#[test]
fn availability_matrix() {
    let reclaim = ms(5000);
    let fresh = Lease::new(WorkType::Session, t0(), TTL);
    assert!(fresh.is_available(t0(), reclaim));

    let p = pending(WorkType::Session);
    assert!(
        !p.is_available(at(1) + ms(4999), reclaim),
        "pending claim younger than reclaim_older_than_ms"
    );
    assert!(
        p.is_available(at(1) + ms(5000), reclaim),
        "pending claim exactly at the reclaim age"
    );
    assert!(
        p.is_available(at(2), ms(1000)),
        "caller's shorter reclaim_older_than_ms applies"
    );

    let starting = lease_in(WorkType::Session, WorkState::Starting);
    assert!(!starting.is_available(at(2) + Duration::seconds(TTL) - ms(1), reclaim));
    assert!(
        starting.is_available(at(2) + Duration::seconds(TTL), reclaim),
        "lost before its first beat"
    );

    let active = lease_in(WorkType::Session, WorkState::Active);
    assert!(!active.is_available(at(100), reclaim));
    assert!(active.is_available(at(3 + TTL), reclaim), "lost worker");

    for state in [WorkState::Stopping, WorkState::Stopped] {
        assert!(
            !lease_in(WorkType::Session, state).is_available(at(100_000), reclaim),
            "{state:?}"
        );
    }

    let check = Lease::new(WorkType::Healthcheck, t0(), TTL);
    assert!(check.is_available(at(119), reclaim));
    assert!(
        !check.is_available(at(120), reclaim),
        "an overdue check is never handed out"
    );
}

#[test]
fn claim_bumps_epoch_and_clears_the_old_holders_lease() {
    let active = lease_in(WorkType::Healthcheck, WorkState::Active);
    let reclaimed = active.claim(at(200));
    assert_eq!(reclaimed.claim_epoch, active.claim_epoch + 1);
    assert_eq!(reclaimed.state, WorkState::Queued);
    assert_eq!(reclaimed.claimed_at, Some(at(200)));
    assert_eq!(reclaimed.latest_heartbeat_at, None);
    assert_eq!(reclaimed.previous_heartbeat_at, None);
    assert_eq!(reclaimed.lease_expires_at, None);
    assert_eq!(reclaimed.acknowledged_at, None);
    assert_eq!(reclaimed.started_at, None);
    assert_eq!(
        reclaimed.expires_at, active.expires_at,
        "the absolute deadline survives a reclaim"
    );
}

// ---------------------------------------------------------------- ack

#[test]
fn ack_matrix() {
    let p = pending(WorkType::Session);
    let acked = p.ack(at(2), TTL).unwrap();
    assert_eq!(acked.state, WorkState::Starting);
    assert_eq!(acked.acknowledged_at, Some(at(2)));
    assert_eq!(acked.lease_expires_at, Some(at(2 + TTL)));
    assert_eq!(acked.claimed_at, None, "no longer in the queue");

    assert_eq!(
        Lease::new(WorkType::Session, t0(), TTL).ack(at(2), TTL),
        Err(AckError::NotClaimed)
    );
    for state in [WorkState::Starting, WorkState::Active, WorkState::Stopping] {
        let lease = lease_in(WorkType::Session, state);
        assert_eq!(
            lease.ack(at(50), TTL),
            Ok(lease.clone()),
            "repeat Ack of {state:?} is idempotent"
        );
    }
    assert_eq!(
        lease_in(WorkType::Session, WorkState::Stopped).ack(at(50), TTL),
        Err(AckError::Stopped)
    );
}

// ---------------------------------------------------------------- token admission

#[test]
fn token_admission_matrix() {
    use TokenUse::*;
    let uses = [Heartbeat, Stop, Fail, Result, Session];

    for u in uses {
        assert_eq!(
            pending(WorkType::Session).admits_token(u, at(2)),
            Err(TokenRejection::NotAcknowledged)
        );
        for state in [WorkState::Starting, WorkState::Active, WorkState::Stopping] {
            let lease = lease_in(WorkType::Healthcheck, state);
            assert_eq!(lease.admits_token(u, at(10)), Ok(()), "{state:?} {u:?}");
        }
        let stopped = lease_in(WorkType::Session, WorkState::Stopped);
        assert_eq!(
            stopped.admits_token(u, at(10)),
            Err(TokenRejection::Stopped),
            "{u:?}"
        );
    }

    // An expired lease: heartbeat gets through to answer 412; everything else is 401.
    let active = lease_in(WorkType::Session, WorkState::Active);
    let late = active.lease_expires_at.unwrap();
    assert_eq!(active.admits_token(Heartbeat, late), Ok(()));
    for u in [Stop, Fail, Result, Session] {
        assert_eq!(
            active.admits_token(u, late),
            Err(TokenRejection::LeaseExpired),
            "{u:?}"
        );
    }
}

#[test]
fn result_window_admits_only_a_result_retry_for_thirty_seconds() {
    let active = lease_in(WorkType::Healthcheck, WorkState::Active);
    let ok = CheckResult {
        status: CheckStatus::Succeeded,
        message: "fine".into(),
    };
    let (done, _) = active.complete(&ok, at(10)).unwrap();
    let edge = at(10) + RESULT_RETRY_WINDOW;
    assert_eq!(
        done.admits_token(TokenUse::Result, edge - Duration::microseconds(1)),
        Ok(())
    );
    assert_eq!(
        done.admits_token(TokenUse::Result, edge),
        Err(TokenRejection::Stopped)
    );
    for u in [
        TokenUse::Heartbeat,
        TokenUse::Stop,
        TokenUse::Fail,
        TokenUse::Session,
    ] {
        assert_eq!(
            done.admits_token(u, at(11)),
            Err(TokenRejection::Stopped),
            "{u:?}"
        );
    }
}

// ---------------------------------------------------------------- heartbeat

#[test]
fn first_heartbeat_claims_the_lease_and_later_ones_echo() {
    let starting = lease_in(WorkType::Session, WorkState::Starting);
    let (active, beat) = starting.heartbeat(None, None, at(3), TTL).unwrap();
    assert!(beat.extended);
    assert_eq!(active.state, WorkState::Active);
    assert_eq!(active.started_at, Some(at(3)));
    assert_eq!(active.latest_heartbeat_at, Some(at(3)));
    assert_eq!(active.lease_expires_at, Some(at(3 + TTL)));

    let (next, _) = active
        .heartbeat(Some(at(3)), Some(300), at(60), TTL)
        .unwrap();
    assert_eq!(next.latest_heartbeat_at, Some(at(60)));
    assert_eq!(next.previous_heartbeat_at, Some(at(3)));
    assert_eq!(next.ttl_seconds, 300);
    assert_eq!(next.lease_expires_at, Some(at(360)));
    assert_eq!(
        next.started_at,
        Some(at(3)),
        "started_at is the first beat only"
    );
}

#[test]
fn stale_or_wrong_heartbeat_is_a_precondition_failure() {
    let starting = lease_in(WorkType::Session, WorkState::Starting);
    assert_eq!(
        starting.heartbeat(Some(at(3)), None, at(3), TTL),
        Err(HeartbeatError::Precondition),
        "the first beat must say NO_HEARTBEAT"
    );
    let active = lease_in(WorkType::Session, WorkState::Active);
    let (second, _) = active.heartbeat(Some(at(3)), None, at(10), TTL).unwrap();
    let (third, _) = second.heartbeat(Some(at(10)), None, at(20), TTL).unwrap();
    assert_eq!(
        third.heartbeat(Some(at(3)), None, at(21), TTL),
        Err(HeartbeatError::Precondition),
        "two steps back"
    );
    assert_eq!(
        third.heartbeat(None, None, at(21), TTL),
        Err(HeartbeatError::Precondition),
        "NO_HEARTBEAT on an active lease"
    );
    assert_eq!(
        third.heartbeat(Some(at(19)), None, at(21), TTL),
        Err(HeartbeatError::Precondition),
        "never issued"
    );
}

#[test]
fn replayed_heartbeat_is_a_success_and_keeps_the_chain() {
    let active = lease_in(WorkType::Session, WorkState::Active); // latest = +3, previous = NO_HEARTBEAT
                                                                 // The response to the first beat was lost; the client repeats NO_HEARTBEAT.
    let (replayed, beat) = active.heartbeat(None, None, at(5), TTL).unwrap();
    assert!(beat.extended);
    assert_eq!(replayed.latest_heartbeat_at, Some(at(5)));
    assert_eq!(replayed.previous_heartbeat_at, None);
    // The client now echoes the replay's answer.
    let (next, _) = replayed.heartbeat(Some(at(5)), None, at(9), TTL).unwrap();
    assert_eq!(next.previous_heartbeat_at, Some(at(5)));
    // And a retry of that beat is again tolerated, once removed only.
    assert!(next.heartbeat(Some(at(5)), None, at(10), TTL).is_ok());
    assert_eq!(
        next.heartbeat(None, None, at(10), TTL),
        Err(HeartbeatError::Precondition)
    );
}

#[test]
fn heartbeat_after_lease_expiry_fails_even_with_the_right_value() {
    let active = lease_in(WorkType::Session, WorkState::Active);
    let expiry = active.lease_expires_at.unwrap();
    assert!(active
        .heartbeat(Some(at(3)), None, expiry - Duration::microseconds(1), TTL)
        .is_ok());
    assert_eq!(
        active.heartbeat(Some(at(3)), None, expiry, TTL),
        Err(HeartbeatError::Precondition)
    );
    let starting = lease_in(WorkType::Session, WorkState::Starting);
    assert_eq!(
        starting.heartbeat(None, None, starting.lease_expires_at.unwrap(), TTL),
        Err(HeartbeatError::Precondition),
        "a worker that never beat within the pre-heartbeat lease lost it"
    );
}

#[test]
fn heartbeat_while_stopping_is_not_compared_and_does_not_extend() {
    let stopping = lease_in(WorkType::Session, WorkState::Stopping);
    for expected in [None, Some(at(3)), Some(at(999))] {
        let (same, beat) = stopping.heartbeat(expected, Some(300), at(6), TTL).unwrap();
        assert!(!beat.extended);
        assert_eq!(same, stopping, "the stopping deadline is never pushed out");
    }
}

#[test]
fn heartbeat_on_queued_or_stopped_is_refused() {
    assert_eq!(
        pending(WorkType::Session).heartbeat(None, None, at(2), TTL),
        Err(HeartbeatError::Precondition)
    );
    assert_eq!(
        lease_in(WorkType::Session, WorkState::Stopped).heartbeat(None, None, at(9), TTL),
        Err(HeartbeatError::Precondition)
    );
}

#[test]
fn heartbeat_stamps_strictly_increase_within_one_microsecond() {
    let active = lease_in(WorkType::Session, WorkState::Active);
    let (a, _) = active.heartbeat(Some(at(3)), None, at(3), TTL).unwrap();
    assert!(a.latest_heartbeat_at.unwrap() > at(3));
    assert_eq!(a.previous_heartbeat_at, Some(at(3)));
}

// ---------------------------------------------------------------- stop

#[test]
fn stop_matrix() {
    for kind in [WorkType::Session, WorkType::Healthcheck] {
        for force in [false, true] {
            // Never went active: stopped at once either way.
            for state in [WorkState::Queued, WorkState::Starting] {
                let stopped = lease_in(kind, state)
                    .stop(force, Stopper::Operator, at(50))
                    .unwrap();
                assert_eq!(
                    stopped.state,
                    WorkState::Stopped,
                    "{kind:?} {state:?} force={force}"
                );
                assert_eq!(stopped.stopped_at, Some(at(50)));
                assert_eq!(stopped.stop_requested_at, Some(at(50)));
                if kind == WorkType::Healthcheck {
                    assert_eq!(stopped.result.unwrap().status, CheckStatus::Cancelled);
                }
            }
            let pending_stop = pending(kind)
                .stop(force, Stopper::Operator, at(50))
                .unwrap();
            assert_eq!(pending_stop.state, WorkState::Stopped);
            assert_eq!(
                lease_in(kind, WorkState::Stopped).stop(force, Stopper::Operator, at(50)),
                Err(StopError::AlreadyStopped)
            );
        }
        let active = lease_in(kind, WorkState::Active);
        let graceful = active.stop(false, Stopper::Operator, at(50)).unwrap();
        assert_eq!(graceful.state, WorkState::Stopping);
        assert_eq!(
            graceful.lease_expires_at, active.lease_expires_at,
            "expires no later than its current TTL"
        );
        assert_eq!(graceful.stop_requested_at, Some(at(50)));
        assert_eq!(
            graceful.stop(false, Stopper::Operator, at(60)).unwrap(),
            graceful,
            "repeat graceful stop changes nothing"
        );
        let forced = graceful.stop(true, Stopper::Operator, at(60)).unwrap();
        assert_eq!(forced.state, WorkState::Stopped);
        assert_eq!(
            forced.stop_requested_at,
            Some(at(50)),
            "first request time is kept"
        );
        assert_eq!(
            active.stop(true, Stopper::Operator, at(50)).unwrap().state,
            WorkState::Stopped
        );
    }
}

// ---------------------------------------------------------------- result

#[test]
fn only_the_holders_idle_stop_of_an_active_session_is_keepable() {
    let active = lease_in(WorkType::Session, WorkState::Active);
    let idle = active.stop(true, Stopper::HolderIdle, at(50)).unwrap();
    assert_eq!(idle.state, WorkState::Stopped);
    assert_eq!(idle.end, Some(WorkEnd::Idle));
    assert!(idle.keepable());
    assert!(
        !active.keepable(),
        "a running item is not keepable before it ends"
    );

    let ends = |lease: &Lease| (lease.state, lease.end, lease.keepable());
    // Every other end of the same active item.
    assert_eq!(
        ends(&active.stop(true, Stopper::Holder, at(50)).unwrap()),
        (WorkState::Stopped, Some(WorkEnd::Holder), false)
    );
    assert_eq!(
        ends(&active.stop(true, Stopper::Operator, at(50)).unwrap()),
        (WorkState::Stopped, Some(WorkEnd::Operator), false)
    );
    assert_eq!(
        ends(&active.fail("bad input", at(50)).unwrap()),
        (WorkState::Stopped, Some(WorkEnd::Failed), false)
    );
    // A graceful idle Stop is no idle end: only a forced one is.
    assert_eq!(
        ends(&active.stop(false, Stopper::HolderIdle, at(50)).unwrap()),
        (WorkState::Stopping, Some(WorkEnd::Holder), false)
    );
    // Before its first beat the runner cannot have gone idle.
    let starting = lease_in(WorkType::Session, WorkState::Starting);
    assert_eq!(
        ends(&starting.stop(true, Stopper::HolderIdle, at(50)).unwrap()),
        (WorkState::Stopped, Some(WorkEnd::Holder), false)
    );
    // A healthcheck is never kept.
    let check = lease_in(WorkType::Healthcheck, WorkState::Active);
    assert!(!check
        .stop(true, Stopper::HolderIdle, at(50))
        .unwrap()
        .keepable());
}

#[test]
fn the_first_stop_asked_for_names_the_end() {
    let active = lease_in(WorkType::Session, WorkState::Active);
    let graceful = active.stop(false, Stopper::Operator, at(50)).unwrap();
    assert_eq!(graceful.end, Some(WorkEnd::Operator));
    // The runner's idle Stop after an operator's graceful one is the operator's end.
    let then_idle = graceful.stop(true, Stopper::HolderIdle, at(51)).unwrap();
    assert_eq!(then_idle.state, WorkState::Stopped);
    assert_eq!(then_idle.end, Some(WorkEnd::Operator));
    assert!(!then_idle.keepable());
    // A stopping lease that runs out keeps its cause; one with none is lapsed.
    let ran_out = graceful.reconcile(active.lease_expires_at.unwrap());
    assert_eq!(
        (ran_out.state, ran_out.end),
        (WorkState::Stopped, Some(WorkEnd::Operator))
    );
    let mut causeless = graceful.clone();
    causeless.end = None;
    assert_eq!(
        causeless.reconcile(active.lease_expires_at.unwrap()).end,
        Some(WorkEnd::Lapsed)
    );
    // A reclaim of a lost lease starts with no end.
    let lost = active.reconcile(active.lease_expires_at.unwrap());
    assert_eq!(lost.claim(active.lease_expires_at.unwrap()).end, None);
}

#[test]
fn a_result_and_a_deadline_are_their_own_ends() {
    let ok = CheckResult {
        status: CheckStatus::Succeeded,
        message: "passed".into(),
    };
    let active = lease_in(WorkType::Healthcheck, WorkState::Active);
    let (done, _) = active.complete(&ok, at(10)).unwrap();
    assert_eq!(done.end, Some(WorkEnd::Result));
    let overdue = lease_in(WorkType::Healthcheck, WorkState::Starting);
    let timed_out = overdue.reconcile(overdue.expires_at.unwrap());
    assert_eq!(timed_out.end, Some(WorkEnd::Lapsed));
    assert!(!timed_out.keepable());
}

#[test]
fn result_matrix() {
    let ok = CheckResult {
        status: CheckStatus::Succeeded,
        message: "Sandbox process and workspace check passed".into(),
    };
    let active = lease_in(WorkType::Healthcheck, WorkState::Active);
    let (done, how) = active.complete(&ok, at(10)).unwrap();
    assert_eq!(how, Completion::Stored);
    assert_eq!(done.state, WorkState::Stopped);
    assert_eq!(done.result.as_ref(), Some(&ok));
    assert_eq!(done.stopped_at, Some(at(10)));

    assert_eq!(
        done.complete(&ok, at(11)).unwrap(),
        (done.clone(), Completion::Replayed)
    );
    let other = CheckResult {
        status: CheckStatus::Failed,
        message: "no".into(),
    };
    assert_eq!(done.complete(&other, at(11)), Err(ResultError::Conflict));

    for state in [
        WorkState::Queued,
        WorkState::Starting,
        WorkState::Stopping,
        WorkState::Stopped,
    ] {
        assert_eq!(
            lease_in(WorkType::Healthcheck, state).complete(&ok, at(10)),
            Err(ResultError::NotActive),
            "{state:?}"
        );
    }
    assert_eq!(
        active.complete(&ok, active.lease_expires_at.unwrap()),
        Err(ResultError::NotActive),
        "an expired lease may not complete"
    );
    assert_eq!(
        lease_in(WorkType::Session, WorkState::Active).complete(&ok, at(10)),
        Err(ResultError::NotAHealthcheck)
    );
}

// ---------------------------------------------------------------- fail

#[test]
fn fail_matrix() {
    for state in [
        WorkState::Queued,
        WorkState::Starting,
        WorkState::Active,
        WorkState::Stopping,
    ] {
        let failed = lease_in(WorkType::Healthcheck, state)
            .fail("bad input", at(20))
            .unwrap();
        assert_eq!(failed.state, WorkState::Stopped, "{state:?}");
        let result = failed.result.unwrap();
        if state == WorkState::Stopping {
            assert_eq!(result.status, CheckStatus::Failed);
        } else {
            assert_eq!(
                result,
                CheckResult {
                    status: CheckStatus::Failed,
                    message: "bad input".into()
                }
            );
        }
        let session = lease_in(WorkType::Session, state)
            .fail("bad input", at(20))
            .unwrap();
        assert_eq!(session.state, WorkState::Stopped);
        assert_eq!(session.result, None);
    }
    assert_eq!(
        lease_in(WorkType::Session, WorkState::Stopped).fail("x", at(20)),
        Err(StopError::AlreadyStopped)
    );
}

#[test]
fn every_end_round_trips_through_its_stored_text() {
    for end in WorkEnd::ALL {
        assert_eq!(WorkEnd::parse(end.as_str()), Some(end));
    }
    assert_eq!(WorkEnd::parse("sleepy"), None);
}
