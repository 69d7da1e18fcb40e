use super::*;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

fn observed(now: u64) -> Observed {
    Observed {
        generation: Some(3),
        problem: None,
        progress: Progress::Running,
        snapshot: Some(Snapshot {
            live: 2,
            last_poll_ok: Some(at(now - 1)),
            last_error: None,
            poll_errors: 0,
            removal_errors: 0,
        }),
        queue: Some(QueueStats {
            kind: "work_queue_stats".into(),
            depth: 5,
            pending: 1,
            oldest_queued_at: None,
            workers_polling: Some(1),
        }),
        hardening: None,
        now: at(now),
    }
}

fn get<'a>(status: &'a WorkerPoolStatus, kind: &str) -> &'a Condition {
    status.conditions.iter().find(|c| c.type_ == kind).unwrap()
}

/// Ready, Polling and Degraded (`Hardened` has a test of its own).
fn summary(status: &WorkerPoolStatus) -> Vec<(String, String, String)> {
    status
        .conditions
        .iter()
        .filter(|c| c.type_ != "Hardened")
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect()
}

fn triple(kind: &str, status: &str, reason: &str) -> (String, String, String) {
    (kind.into(), status.into(), reason.into())
}

#[test]
fn a_polling_pool_is_ready_and_polling_and_not_degraded() {
    let s = status(None, &observed(100));
    assert_eq!(
        summary(&s),
        [
            triple("Ready", "True", "Running"),
            triple("Polling", "True", "PollSucceeded"),
            triple("Degraded", "False", "AsExpected")
        ]
    );
    assert_eq!(s.live_items, 2);
    assert_eq!(s.queue.as_ref().map(|q| (q.depth, q.pending)), Some((5, 1)));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(get(&s, "Ready").observed_generation, Some(3));
    assert!(s
        .last_successful_poll
        .as_deref()
        .unwrap()
        .starts_with("2027-01-15T08:01:39"));
}

#[test]
fn each_problem_stops_readiness_and_polling_with_its_reason() {
    for (problem, reason) in [
        (
            Problem::InvalidSpec("spec.pod.runAsUser: must not be root (0)".into()),
            "InvalidSpec",
        ),
        (
            Problem::SecretMissing("secret pool-key not found".into()),
            "SecretMissing",
        ),
        (Problem::WorkspaceKey, "WorkspaceKey"),
        (Problem::NotAnEnvironmentKey, "NotAnEnvironmentKey"),
        (Problem::KeyRefused("401".into()), "KeyRefused"),
        (Problem::WrongEnvironment("403".into()), "WrongEnvironment"),
    ] {
        let mut o = observed(100);
        o.problem = Some(problem.clone());
        let s = status(None, &o);
        assert_eq!(
            summary(&s),
            [
                triple("Ready", "False", reason),
                triple("Polling", "False", "NotPolling"),
                triple("Degraded", "True", reason)
            ]
        );
        assert_eq!(get(&s, "Ready").message, problem.message());
        assert!(
            !problem.message().contains("mango_wsk_a"),
            "no key in a message"
        );
    }
}

#[test]
fn a_stale_poll_and_a_recent_error_show() {
    let mut o = observed(100);
    let snapshot = o.snapshot.as_mut().unwrap();
    snapshot.last_poll_ok = Some(at(100 - 31));
    snapshot.last_error = Some((at(95), "poll failed: connection refused".into()));
    let s = status(None, &o);
    assert_eq!(
        summary(&s),
        [
            triple("Ready", "True", "Running"),
            triple("Polling", "False", "PollFailing"),
            triple("Degraded", "True", "RecentErrors")
        ]
    );
    assert_eq!(
        get(&s, "Polling").message,
        "poll failed: connection refused"
    );
    // An error older than a minute no longer degrades the pool.
    o.snapshot.as_mut().unwrap().last_error = Some((at(100 - 61), "old".into()));
    o.snapshot.as_mut().unwrap().last_poll_ok = Some(at(99));
    assert_eq!(get(&status(None, &o), "Degraded").status, "False");
}

#[test]
fn a_starting_pool_is_neither_ready_nor_polling() {
    let mut o = observed(100);
    o.progress = Progress::CheckingKey;
    o.snapshot = None;
    let s = status(None, &o);
    assert_eq!(
        summary(&s),
        [
            triple("Ready", "False", "Starting"),
            triple("Polling", "False", "Starting"),
            triple("Degraded", "False", "AsExpected")
        ]
    );
    assert_eq!(s.live_items, 0);
    assert!(get(&s, "Ready")
        .message
        .contains("checking the Environment key"));

    // An edited pool's new supervisor first waits for the old one to detach.
    o.progress = Progress::WaitingForPrevious;
    let waiting = status(Some(&s), &o);
    let ready = get(&waiting, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Starting")
    );
    assert!(
        ready.message.contains("previous spec to detach"),
        "{}",
        ready.message
    );
}

#[test]
fn transition_times_move_only_when_a_status_changes() {
    let first = status(None, &observed(100));
    let later = status(Some(&first), &observed(200));
    assert_eq!(
        get(&later, "Ready").last_transition_time,
        get(&first, "Ready").last_transition_time
    );
    let mut broken = observed(300);
    broken.problem = Some(Problem::WorkspaceKey);
    let after = status(Some(&later), &broken);
    assert_ne!(
        get(&after, "Ready").last_transition_time,
        get(&later, "Ready").last_transition_time
    );
    // The last successful poll is kept while none happens.
    broken.snapshot = None;
    assert_eq!(
        status(Some(&later), &broken).last_successful_poll,
        later.last_successful_poll
    );
}

/// A status that dropped `queue` would not land on an API server that keeps
/// the map its apply emptied (`queue: {}` lacks the required `depth`), so
/// the queue as last read stays while none can be read.
#[test]
fn the_queue_as_last_read_stays_while_none_can_be_read() {
    let first = status(None, &observed(100));
    let mut stopped = observed(200);
    (stopped.queue, stopped.problem) = (None, Some(Problem::WorkspaceKey));
    let after = status(Some(&first), &stopped);
    assert_eq!(after.queue, first.queue);
    assert_eq!(get(&after, "Ready").reason, "WorkspaceKey");
    assert_eq!(status(None, &stopped).queue, None, "none read yet");
}

#[test]
fn hardened_says_whether_the_api_server_stored_the_pods_hardening() {
    let mut o = observed(100);
    let hardened = |o: &Observed| {
        let s = status(None, o);
        let c = get(&s, "Hardened").clone();
        (c.status, c.reason, c.message)
    };
    let (status_, reason, _) = hardened(&o);
    assert_eq!((status_.as_str(), reason.as_str()), ("Unknown", "NoPodYet"));
    o.hardening = Some(HardeningChecked {
        pod: "mango-work-a-1".into(),
        not_stored: vec![],
    });
    let (status_, reason, _) = hardened(&o);
    assert_eq!((status_.as_str(), reason.as_str()), ("True", "AsRequested"));
    o.hardening = Some(HardeningChecked {
        pod: "mango-work-b-1".into(),
        not_stored: vec!["spec.hostUsers".into()],
    });
    let (status_, reason, message) = hardened(&o);
    assert_eq!(
        (status_.as_str(), reason.as_str()),
        ("False", "FieldsNotStored")
    );
    assert!(
        message.contains("spec.hostUsers")
            && message.contains("mango-work-b-1")
            && message.contains("UserNamespacesSupport"),
        "{message}"
    );
    // Readiness is not its business: the pool still launches.
    assert_eq!(get(&status(None, &o), "Ready").status, "True");
}

#[test]
fn a_crd_older_than_the_controller_stops_the_pool_with_its_reason() {
    for (problem, reason) in [
        (Problem::CrdOutdated("revision 1 < 2".into()), "CrdOutdated"),
        (Problem::CrdUnreadable("403".into()), "CrdUnreadable"),
    ] {
        let mut o = observed(100);
        o.problem = Some(problem);
        let s = status(None, &o);
        assert_eq!(
            summary(&s),
            [
                triple("Ready", "False", reason),
                triple("Polling", "False", "NotPolling"),
                triple("Degraded", "True", reason)
            ]
        );
    }
}
