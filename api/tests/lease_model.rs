//! The Work lease store, model-checked (issue 27 item 3; docs/reliability.md).
//!
//! proptest generates histories of pollers, holders (heartbeat, result,
//! release, fail), operators (graceful and forced stop), the sweeper and the
//! clock, and runs them against the real service and store on PostgreSQL,
//! with a [`ManualClock`] so every lease edge is reached exactly. The pure
//! lease state machine ([`mango_api::lease`]) is the model. Some steps run
//! two actors at once; the model accepts a step when some order of its two
//! actions explains both answers and the rows the store holds afterwards.
//!
//! After every step: each row equals the model's lease; every token but the
//! item's current claim's is refused; no two claims hold one item; no item is
//! claimed past the reclaim limit; the claim and reclaim counters agree. A
//! divergence is shrunk to a minimal history and printed.
//!
//! `MANGO_PROPTEST_CASES` sets the number of histories (default
//! [`DEFAULT_CASES`]).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::Duration;
use mango_api::auth;
use mango_api::clock::ManualClock;
use mango_api::error::ApiError;
use mango_api::lease::{Lease, StopError, Stopper, TokenUse};
use mango_api::service::fail as fail_service;
use mango_api::service::poll::{self, PollRequest};
use mango_api::service::work::{self as work_service, Beat, Fence};
use mango_api::store::environments::{self, EnvironmentRow};
use mango_api::store::{keys, work};
use mango_api::{ids, ApiContext, Settings};
use mango_protocol::time::{self, Timestamp};
use mango_protocol::{
    CheckResult, CheckStatus, ErrorCode, HeartbeatResponse, WorkSecret, WorkState, WorkType,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;

/// Histories per run when `MANGO_PROPTEST_CASES` is unset: bounded for `make test`.
const DEFAULT_CASES: u32 = 64;
const MAX_STEPS: usize = 40;
const MAX_ITEMS: usize = 5;
/// Short enough that clock steps cross it often.
const TTL_SECONDS: i64 = 4;
const RECLAIM_MS: i64 = 2_000;
/// Small, so histories reach the cap.
const MAX_RECLAIMS: u32 = 2;
const HOLDER_FAIL_MESSAGE: &str = "the holder gave up";

fn reclaim_after() -> Duration {
    Duration::milliseconds(RECLAIM_MS)
}

fn base_time() -> Timestamp {
    time::parse("2030-01-01T00:00:00Z").expect("a valid timestamp")
}

// ------------------------------------------------------------------ histories

/// Which of an item's tokens a holder presents.
#[derive(Debug, Clone, Copy)]
enum TokenPick {
    Latest,
    /// The claim before the latest (the latest when there is none).
    Previous,
}

/// What a heartbeat sends as `expected_last_heartbeat`.
#[derive(Debug, Clone, Copy)]
enum Expected {
    NoHeartbeat,
    /// The last value this token's holder was answered.
    Last,
    /// The one before it (a retry whose answer was lost).
    BeforeLast,
    /// A value no beat ever had.
    Bogus,
}

#[derive(Debug, Clone)]
enum Op {
    Create,
    Poll,
    Ack {
        item: usize,
    },
    Heartbeat {
        item: usize,
        token: TokenPick,
        expected: Expected,
        ttl: Option<i64>,
    },
    Result {
        item: usize,
        token: TokenPick,
        succeeded: bool,
    },
    /// The holder's own Stop.
    Release {
        item: usize,
        token: TokenPick,
        force: bool,
    },
    Fail {
        item: usize,
        token: TokenPick,
    },
    /// An operator's Stop (Workspace key).
    Stop {
        item: usize,
        force: bool,
    },
    Sweep,
}

#[derive(Debug, Clone)]
enum Step {
    One(Op),
    Two(Op, Op),
    Advance { ms: i64 },
}

#[derive(Debug, Clone)]
struct History {
    initial_items: usize,
    steps: Vec<Step>,
}

fn item() -> impl Strategy<Value = usize> {
    0..MAX_ITEMS
}

fn token() -> impl Strategy<Value = TokenPick> {
    prop_oneof![4 => Just(TokenPick::Latest), 1 => Just(TokenPick::Previous)]
}

fn expected() -> impl Strategy<Value = Expected> {
    prop_oneof![
        2 => Just(Expected::NoHeartbeat),
        5 => Just(Expected::Last),
        1 => Just(Expected::BeforeLast),
        1 => Just(Expected::Bogus),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Create),
        5 => Just(Op::Poll),
        4 => item().prop_map(|item| Op::Ack { item }),
        6 => (item(), token(), expected(), prop_oneof![Just(None), Just(Some(1)), Just(Some(6))])
            .prop_map(|(item, token, expected, ttl)| Op::Heartbeat { item, token, expected, ttl }),
        2 => (item(), token(), any::<bool>())
            .prop_map(|(item, token, succeeded)| Op::Result { item, token, succeeded }),
        1 => (item(), token(), any::<bool>())
            .prop_map(|(item, token, force)| Op::Release { item, token, force }),
        1 => (item(), token()).prop_map(|(item, token)| Op::Fail { item, token }),
        2 => (item(), any::<bool>()).prop_map(|(item, force)| Op::Stop { item, force }),
        2 => Just(Op::Sweep),
    ]
}

/// Clock steps cluster at the edges: just before and at the TTL, the
/// reclaim delay and the healthcheck deadline.
fn advance() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(1),
        Just(999),
        Just(1_000),
        Just(RECLAIM_MS - 1),
        Just(RECLAIM_MS),
        Just(TTL_SECONDS * 1_000 - 1),
        Just(TTL_SECONDS * 1_000),
        Just(6_000),
        Just(30_000),
        Just(121_000),
    ]
    .prop_map(|ms| Step::Advance { ms })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => op().prop_map(Step::One),
        3 => (op(), op()).prop_map(|(a, b)| Step::Two(a, b)),
        3 => advance(),
    ]
}

fn history() -> impl Strategy<Value = History> {
    (1..=3usize, prop::collection::vec(step(), 1..=MAX_STEPS)).prop_map(|(initial_items, steps)| {
        History {
            initial_items,
            steps,
        }
    })
}

// ------------------------------------------------------------------ what the actors know

/// A claim a poller handed out.
#[derive(Debug, Clone)]
struct Claim {
    token: String,
    epoch: i64,
    /// Every `last_heartbeat` this holder was answered, oldest first.
    answered: Vec<Timestamp>,
}

#[derive(Debug, Clone)]
struct Item {
    id: String,
    created_at: Timestamp,
    claims: Vec<Claim>,
}

/// An [`Op`] resolved against what the actors know before the step.
#[derive(Debug, Clone)]
enum Call {
    Create,
    Poll,
    Ack {
        item: usize,
    },
    Heartbeat {
        item: usize,
        claim: usize,
        expected: Option<Timestamp>,
        ttl: Option<i64>,
    },
    Result {
        item: usize,
        claim: usize,
        result: CheckResult,
    },
    Release {
        item: usize,
        claim: usize,
        force: bool,
    },
    Fail {
        item: usize,
        claim: usize,
    },
    Stop {
        item: usize,
        force: bool,
    },
    Sweep,
    /// Nothing to act on yet (no item, or no claim of it).
    Skip,
}

fn pick_claim(item: &Item, pick: TokenPick) -> Option<usize> {
    let latest = item.claims.len().checked_sub(1)?;
    Some(match pick {
        TokenPick::Latest => latest,
        TokenPick::Previous => latest.saturating_sub(1),
    })
}

fn resolve(op: &Op, items: &[Item]) -> Call {
    let index = |i: usize| (!items.is_empty()).then(|| i % items.len());
    let held = |i: usize, pick: TokenPick| {
        let i = index(i)?;
        Some((i, pick_claim(&items[i], pick)?))
    };
    match *op {
        Op::Create if items.len() >= MAX_ITEMS => Call::Skip,
        Op::Create => Call::Create,
        Op::Poll => Call::Poll,
        Op::Sweep => Call::Sweep,
        Op::Ack { item } => index(item).map_or(Call::Skip, |item| Call::Ack { item }),
        Op::Stop { item, force } => {
            index(item).map_or(Call::Skip, |item| Call::Stop { item, force })
        }
        Op::Heartbeat {
            item,
            token,
            expected,
            ttl,
        } => match held(item, token) {
            None => Call::Skip,
            Some((item, claim)) => {
                let answered = &items[item].claims[claim].answered;
                let expected = match expected {
                    Expected::NoHeartbeat => None,
                    Expected::Last => answered.last().copied(),
                    Expected::BeforeLast => answered.iter().rev().nth(1).copied(),
                    Expected::Bogus => Some(base_time() - Duration::seconds(1)),
                };
                Call::Heartbeat {
                    item,
                    claim,
                    expected,
                    ttl,
                }
            }
        },
        Op::Result {
            item,
            token,
            succeeded,
        } => match held(item, token) {
            None => Call::Skip,
            Some((item, claim)) => Call::Result {
                item,
                claim,
                result: if succeeded {
                    CheckResult {
                        status: CheckStatus::Succeeded,
                        message: "all good".into(),
                    }
                } else {
                    CheckResult {
                        status: CheckStatus::Failed,
                        message: "broken".into(),
                    }
                },
            },
        },
        Op::Release { item, token, force } => match held(item, token) {
            None => Call::Skip,
            Some((item, claim)) => Call::Release { item, claim, force },
        },
        Op::Fail { item, token } => match held(item, token) {
            None => Call::Skip,
            Some((item, claim)) => Call::Fail { item, claim },
        },
    }
}

/// What one action was answered, compared between the store and the model.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Created,
    /// The item index, and the claim's epoch.
    Polled(Option<(usize, i64)>),
    Acked(WorkState),
    Beat(HeartbeatResponse),
    Stopped,
    Completed,
    Failed,
    Swept(usize),
    Refused {
        status: u16,
        code: Option<String>,
    },
    Skipped,
}

fn refused(status: u16, code: Option<ErrorCode>) -> Outcome {
    Outcome::Refused {
        status,
        code: code.map(|c| c.as_str().to_string()),
    }
}

fn observed_refusal(err: &ApiError) -> Outcome {
    Outcome::Refused {
        status: err.status.as_u16(),
        code: err
            .details
            .get("error_code")
            .and_then(|c| c.as_str())
            .map(str::to_string),
    }
}

// ------------------------------------------------------------------ the real system

struct Real {
    ctx: ApiContext,
    clock: ManualClock,
    environment_id: String,
    key_id: String,
}

fn bearer(token: &str) -> axum::http::HeaderMap {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {token}").parse().expect("a header value"),
    );
    headers
}

fn sessions_token(secret: &str) -> String {
    let json = URL_SAFE_NO_PAD
        .decode(secret)
        .expect("a base64 Work secret");
    let secret: WorkSecret = serde_json::from_slice(&json).expect("a Work secret");
    secret.sessions_token
}

/// What a call produced beyond its outcome: a new item or a new claim.
enum Learned {
    Nothing,
    Item(Item),
    Claim { item_id: String, claim: Claim },
}

impl Real {
    async fn start(pool: PgPool) -> Real {
        let settings = Settings {
            default_ttl_seconds: TTL_SECONDS,
            default_reclaim: reclaim_after(),
            max_reclaims: MAX_RECLAIMS,
            ..Settings::default()
        };
        let clock = ManualClock::starting_at(base_time() + Duration::days(3650));
        let mut ctx = ApiContext::new(pool, settings);
        ctx.clock = clock.clone().into();
        // Rows an earlier (failed) history left unfinished stop here, far in
        // the future, so this history's sweeps count only its own rows.
        while work_service::reconcile_due(&ctx).await.expect("sweep") > 0 {}
        clock.set(base_time());
        let now = clock.now();
        let environment = EnvironmentRow {
            id: ids::new_id("env"),
            workspace_id: "wrkspc_default".into(),
            name: "lease model".into(),
            description: None,
            config: serde_json::json!({"type": "self_hosted"}),
            metadata: serde_json::json!({}),
            scope: None,
            created_at: now,
            updated_at: now,
            archived_at: None,
        };
        let environment = environments::insert(&ctx.db, &environment)
            .await
            .expect("insert an environment");
        let (key, _secret) = keys::create(
            &ctx.db,
            "wrkspc_default",
            Some(&environment.id),
            "lease model",
            now,
        )
        .await
        .map_err(|e| format!("{e:?}"))
        .expect("create an Environment key");
        Real {
            ctx,
            clock,
            environment_id: environment.id,
            key_id: key.id,
        }
    }

    async fn row(&self, id: &str) -> work::WorkRow {
        work::find(&self.ctx.db, &self.environment_id, id)
            .await
            .expect("read a Work row")
            .expect("the row exists")
    }

    /// The route's authentication of a sessions token, then its Work row.
    async fn holder_row(
        &self,
        conn: &mut sqlx::PgConnection,
        item: &Item,
        token: &str,
    ) -> Result<work::WorkRow, ApiError> {
        auth::authenticate(&self.ctx, conn, &bearer(token))
            .await?
            .token_for(&self.environment_id, &item.id, "the lease model")
    }

    async fn run(&self, call: &Call, items: &[Item]) -> (Outcome, Learned) {
        let ctx = &self.ctx;
        let env = self.environment_id.as_str();
        let mut conn = ctx.db.acquire().await.expect("a connection");
        let conn = &mut *conn;
        let answer = |r: Result<Outcome, ApiError>| match r {
            Ok(outcome) => outcome,
            Err(err) => observed_refusal(&err),
        };
        match call {
            Call::Skip => (Outcome::Skipped, Learned::Nothing),
            Call::Create => {
                let row = work_service::create_healthcheck(ctx, conn, env, &BTreeMap::new())
                    .await
                    .expect("create a healthcheck");
                let item = Item {
                    id: row.id,
                    created_at: row.created_at,
                    claims: Vec::new(),
                };
                (Outcome::Created, Learned::Item(item))
            }
            Call::Poll => {
                let request = PollRequest {
                    environment_id: env,
                    key_id: &self.key_id,
                    block: None,
                    reclaim_after: reclaim_after(),
                    worker_id: None,
                };
                match poll::poll(ctx, request, None).await {
                    Ok(None) => (Outcome::Polled(None), Learned::Nothing),
                    Ok(Some((row, secret))) => {
                        let index = items.iter().position(|i| i.id == row.id);
                        let claim = Claim {
                            token: sessions_token(&secret),
                            epoch: row.claim_epoch,
                            answered: Vec::new(),
                        };
                        // A new item of a concurrent Create has no index yet:
                        // the step resolves it (`usize::MAX` until then).
                        let index = index.unwrap_or(usize::MAX);
                        (
                            Outcome::Polled(Some((index, row.claim_epoch))),
                            Learned::Claim {
                                item_id: row.id,
                                claim,
                            },
                        )
                    }
                    Err(err) => (observed_refusal(&err), Learned::Nothing),
                }
            }
            Call::Sweep => {
                let moved = work_service::reconcile_due(ctx).await.expect("sweep");
                (Outcome::Swept(moved), Learned::Nothing)
            }
            Call::Ack { item } => {
                let row = self.row(&items[*item].id).await;
                let r = work_service::ack(ctx, conn, row, &self.key_id).await;
                (
                    answer(r.map(|(_, l)| Outcome::Acked(l.state))),
                    Learned::Nothing,
                )
            }
            Call::Stop { item, force } => {
                let row = self.row(&items[*item].id).await;
                let r = work_service::stop(ctx, conn, row, Fence::Operator, *force, false).await;
                (answer(r.map(|()| Outcome::Stopped)), Learned::Nothing)
            }
            Call::Heartbeat {
                item,
                claim,
                expected,
                ttl,
            } => {
                let item = &items[*item];
                let r = match self
                    .holder_row(conn, item, &item.claims[*claim].token)
                    .await
                {
                    Ok(row) => {
                        let beat = Beat {
                            expected: *expected,
                            desired_ttl: *ttl,
                        };
                        work_service::heartbeat(ctx, conn, row, beat)
                            .await
                            .map(Outcome::Beat)
                    }
                    Err(err) => Err(err),
                };
                (answer(r), Learned::Nothing)
            }
            Call::Result {
                item,
                claim,
                result,
            } => {
                let item = &items[*item];
                let r = match self
                    .holder_row(conn, item, &item.claims[*claim].token)
                    .await
                {
                    Ok(row) => work_service::complete(ctx, conn, row, result.clone())
                        .await
                        .map(|_| Outcome::Completed),
                    Err(err) => Err(err),
                };
                (answer(r), Learned::Nothing)
            }
            Call::Release { item, claim, force } => {
                let item = &items[*item];
                let r = match self
                    .holder_row(conn, item, &item.claims[*claim].token)
                    .await
                {
                    Ok(row) => {
                        let digest = row.token_sha256.clone().unwrap_or_default();
                        work_service::stop(ctx, conn, row, Fence::Token(&digest), *force, false)
                            .await
                            .map(|()| Outcome::Stopped)
                    }
                    Err(err) => Err(err),
                };
                (answer(r), Learned::Nothing)
            }
            Call::Fail { item, claim } => {
                let item = &items[*item];
                let r = match self
                    .holder_row(conn, item, &item.claims[*claim].token)
                    .await
                {
                    Ok(row) => {
                        let digest = row.token_sha256.clone().unwrap_or_default();
                        fail_service::fail(ctx, row, Fence::Token(&digest), HOLDER_FAIL_MESSAGE)
                            .await
                            .map(|_| Outcome::Failed)
                    }
                    Err(err) => Err(err),
                };
                (answer(r), Learned::Nothing)
            }
        }
    }
}

// ------------------------------------------------------------------ the model

#[derive(Debug, Clone, PartialEq)]
struct ModelItem {
    id: String,
    created_at: Timestamp,
    lease: Lease,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct Model {
    items: Vec<ModelItem>,
    claims: u64,
    reclaims: u64,
    give_ups: u64,
}

type Refusal = Outcome;

fn token_refusal(use_: TokenUse, lease: &Lease, now: Timestamp) -> Result<(), Refusal> {
    lease
        .admits_token(use_, now)
        .map_err(|_| refused(401, None))
}

fn already_stopped(_: StopError) -> Refusal {
    refused(409, Some(ErrorCode::WorkAlreadyStopped))
}

impl Model {
    /// The service's `transition`: the rule sees the reconciled lease; a
    /// refusal still keeps what reconciling moved.
    fn transition(
        &mut self,
        item: usize,
        now: Timestamp,
        rule: impl FnOnce(&Lease) -> Result<(Lease, Outcome), Refusal>,
    ) -> Outcome {
        let lease = &mut self.items[item].lease;
        let current = lease.reconcile(now);
        match rule(&current) {
            Ok((next, outcome)) => {
                *lease = next;
                outcome
            }
            Err(refusal) => {
                *lease = current;
                refusal
            }
        }
    }

    /// Whether claim `epoch` is still the item's claim (its token authenticates).
    fn holds(&self, item: usize, epoch: i64) -> bool {
        self.items[item].lease.claim_epoch == epoch
    }

    fn poll(&mut self, now: Timestamp) -> Outcome {
        self.poll_around(now, usize::MAX, &mut |_| {})
    }

    /// A Poll is a sequence of statements: a claim, and for an item past
    /// the reclaim limit its Fail, then the next claim. `other` (another
    /// actor's whole action) runs once, after the first `at` of them (or last).
    fn poll_around(
        &mut self,
        now: Timestamp,
        at: usize,
        other: &mut dyn FnMut(&mut Model),
    ) -> Outcome {
        let mut done = 0;
        let mut other = Some(other);
        let mut statement = |model: &mut Model, done: &mut usize| {
            if *done == at {
                if let Some(other) = other.take() {
                    other(model);
                }
            }
            *done += 1;
        };
        let outcome = loop {
            statement(self, &mut done);
            let candidate = self
                .items
                .iter()
                .enumerate()
                .filter(|(_, i)| i.lease.is_available(now, reclaim_after()))
                .min_by(|(_, a), (_, b)| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)))
                .map(|(index, _)| index);
            let Some(index) = candidate else {
                break Outcome::Polled(None);
            };
            let lease = self.items[index].lease.claim(now);
            let epoch = lease.claim_epoch;
            self.items[index].lease = lease;
            self.claims += 1;
            if epoch > 1 {
                self.reclaims += 1;
            }
            let reclaims = epoch - 1;
            if reclaims > i64::from(MAX_RECLAIMS) {
                statement(self, &mut done);
                self.give_ups += 1;
                let message =
                    poll::reclaim_limit_message(&self.items[index].id, reclaims, MAX_RECLAIMS);
                self.transition(index, now, |current| {
                    current
                        .fail(&message, now)
                        .map(|next| (next, Outcome::Failed))
                        .map_err(already_stopped)
                });
                continue;
            }
            break Outcome::Polled(Some((index, epoch)));
        };
        if let Some(other) = other.take() {
            other(self);
        }
        outcome
    }

    fn sweep(&mut self, now: Timestamp) -> Outcome {
        let mut moved = 0;
        for item in &mut self.items {
            let lease = &item.lease;
            let due = (lease.kind == WorkType::Healthcheck
                && lease.state != WorkState::Stopped
                && lease.expires_at.is_some_and(|t| t <= now))
                || (lease.state == WorkState::Stopping
                    && lease.lease_expires_at.is_some_and(|t| t <= now));
            let next = lease.reconcile(now);
            if due && next != *lease {
                item.lease = next;
                moved += 1;
            }
        }
        Outcome::Swept(moved)
    }

    /// Applies `call`; `created` is the item a Create made (its id is the store's).
    fn apply(
        &mut self,
        call: &Call,
        items: &[Item],
        created: Option<&Item>,
        now: Timestamp,
    ) -> Outcome {
        match call {
            Call::Skip => Outcome::Skipped,
            Call::Create => {
                let item = created.expect("a Create learns its item");
                self.items.push(ModelItem {
                    id: item.id.clone(),
                    created_at: item.created_at,
                    lease: Lease::new(WorkType::Healthcheck, now, TTL_SECONDS),
                });
                Outcome::Created
            }
            Call::Poll => self.poll(now),
            Call::Sweep => self.sweep(now),
            Call::Ack { item } => {
                self.transition(*item, now, |current| match current.ack(now, TTL_SECONDS) {
                    Ok(next) => Ok((next.clone(), Outcome::Acked(next.state))),
                    Err(mango_api::lease::AckError::NotClaimed) => {
                        Err(refused(409, Some(ErrorCode::WorkNotClaimed)))
                    }
                    Err(mango_api::lease::AckError::Stopped) => {
                        Err(refused(409, Some(ErrorCode::WorkAlreadyStopped)))
                    }
                })
            }
            Call::Stop { item, force } => self.transition(*item, now, |current| {
                current
                    .stop(*force, Stopper::Operator, now)
                    .map(|next| (next, Outcome::Stopped))
                    .map_err(already_stopped)
            }),
            Call::Heartbeat {
                item,
                claim,
                expected,
                ttl,
            } => {
                if !self.holds(*item, items[*item].claims[*claim].epoch) {
                    return refused(401, None);
                }
                self.transition(*item, now, |current| {
                    token_refusal(TokenUse::Heartbeat, current, now)?;
                    let (next, beat) = current
                        .heartbeat(*expected, *ttl, now, TTL_SECONDS)
                        .map_err(|_| refused(412, Some(ErrorCode::HeartbeatPreconditionFailed)))?;
                    let answer = HeartbeatResponse {
                        kind: "work_heartbeat".into(),
                        last_heartbeat: next
                            .last_heartbeat()
                            .map(|t| time::format(&t))
                            .unwrap_or_default(),
                        lease_extended: beat.extended,
                        state: next.state,
                        ttl_seconds: next.ttl_seconds,
                    };
                    Ok((next, Outcome::Beat(answer)))
                })
            }
            Call::Result {
                item,
                claim,
                result,
            } => {
                if !self.holds(*item, items[*item].claims[*claim].epoch) {
                    return refused(401, None);
                }
                self.transition(*item, now, |current| {
                    token_refusal(TokenUse::Result, current, now)?;
                    let (next, _) = current.complete(result, now).map_err(|e| match e {
                        mango_api::lease::ResultError::NotAHealthcheck => {
                            refused(400, Some(ErrorCode::NotAHealthcheck))
                        }
                        mango_api::lease::ResultError::NotActive => {
                            refused(409, Some(ErrorCode::WorkNotActive))
                        }
                        mango_api::lease::ResultError::Conflict => {
                            refused(409, Some(ErrorCode::ResultConflict))
                        }
                    })?;
                    Ok((next, Outcome::Completed))
                })
            }
            Call::Release { item, claim, force } => {
                if !self.holds(*item, items[*item].claims[*claim].epoch) {
                    return refused(401, None);
                }
                self.transition(*item, now, |current| {
                    token_refusal(TokenUse::Stop, current, now)?;
                    let next = current
                        .stop(*force, Stopper::Holder, now)
                        .map_err(already_stopped)?;
                    Ok((next, Outcome::Stopped))
                })
            }
            Call::Fail { item, claim } => {
                if !self.holds(*item, items[*item].claims[*claim].epoch) {
                    return refused(401, None);
                }
                self.transition(*item, now, |current| {
                    token_refusal(TokenUse::Fail, current, now)?;
                    let next = current
                        .fail(HOLDER_FAIL_MESSAGE, now)
                        .map_err(already_stopped)?;
                    Ok((next, Outcome::Failed))
                })
            }
        }
    }
}

// ------------------------------------------------------------------ one history

/// The store's rows and counters, as the model holds them.
async fn observe(real: &Real, items: &[Item]) -> Model {
    let mut observed = Model::default();
    for item in items {
        let row = real.row(&item.id).await;
        observed.items.push(ModelItem {
            id: row.id.clone(),
            created_at: row.created_at,
            lease: row.lease(),
        });
    }
    let metrics = &real.ctx.metrics;
    observed.claims = metrics.claims.load(Relaxed);
    observed.reclaims = metrics.reclaims.load(Relaxed);
    observed.give_ups = metrics.reclaim_limit_failures.load(Relaxed);
    observed
}

/// The promises that hold whatever the model says: one live claim per
/// item, old tokens refused, nothing claimed past the cap.
async fn check_invariants(real: &Real, items: &[Item]) -> Result<(), TestCaseError> {
    let mut digests = HashMap::new();
    for item in items {
        let row = real.row(&item.id).await;
        if row.claim_epoch - 1 > i64::from(MAX_RECLAIMS) {
            prop_assert_eq!(
                row.state,
                WorkState::Stopped,
                "{} is claimed past the reclaim limit and not stopped",
                item.id
            );
        }
        if let Some(digest) = &row.token_sha256 {
            let other = digests.insert(digest.clone(), item.id.clone());
            prop_assert!(other.is_none(), "two items share one claim: {:?}", other);
        }
        for claim in &item.claims {
            let found = work::find_by_token(&real.ctx.db, &ids::sha256(&claim.token))
                .await
                .expect("find by token");
            let current = claim.epoch == row.claim_epoch;
            match found {
                Some(found) => {
                    prop_assert!(
                        current && found.id == item.id,
                        "the token of claim {} of {} still authenticates (current claim {})",
                        claim.epoch,
                        item.id,
                        row.claim_epoch
                    );
                }
                None => prop_assert!(
                    !current,
                    "the current claim {} of {} does not authenticate",
                    claim.epoch,
                    item.id
                ),
            }
        }
    }
    Ok(())
}

/// Folds what the calls taught the actors into what they know.
fn learn(items: &mut Vec<Item>, mut learned: Vec<Learned>) {
    // New items first: a concurrent Poll may have claimed one already.
    learned.sort_by_key(|fact| !matches!(fact, Learned::Item(_)));
    for fact in learned {
        match fact {
            Learned::Nothing => {}
            Learned::Item(item) => items.push(item),
            Learned::Claim { item_id, claim } => {
                let item = items
                    .iter_mut()
                    .find(|i| i.id == item_id)
                    .expect("a claimed item is known");
                item.claims.push(claim);
            }
        }
    }
}

fn remember_beats(items: &mut [Item], calls: &[Call], outcomes: &[Outcome]) {
    for (call, outcome) in calls.iter().zip(outcomes) {
        if let (Call::Heartbeat { item, claim, .. }, Outcome::Beat(answer)) = (call, outcome) {
            if let Some(at) = time::parse(&answer.last_heartbeat) {
                let answered = &mut items[*item].claims[*claim].answered;
                if answered.last() != Some(&at) {
                    answered.push(at);
                }
            }
        }
    }
}

/// A poll's item index for an item a concurrent Create made: its position
/// once the step's new items are known.
fn settle_poll_indexes(outcomes: &mut [Outcome], learned: &[Learned], items: &[Item]) {
    for (outcome, fact) in outcomes.iter_mut().zip(learned) {
        if let (Outcome::Polled(Some((index, _))), Learned::Claim { item_id, .. }) = (outcome, fact)
        {
            *index = items
                .iter()
                .position(|i| &i.id == item_id)
                .expect("a claimed item is known");
        }
    }
}

async fn run_history(pool: PgPool, history: History) -> Result<(), TestCaseError> {
    let real = Real::start(pool).await;
    let mut model = Model::default();
    let mut items: Vec<Item> = Vec::new();
    for _ in 0..history.initial_items {
        let (_, learned) = real.run(&Call::Create, &items).await;
        let Learned::Item(item) = learned else {
            unreachable!("a Create learns its item")
        };
        model.apply(&Call::Create, &items, Some(&item), real.clock.now());
        items.push(item);
        real.clock.advance(Duration::milliseconds(1));
    }
    let mut steps = history.steps.clone();
    // The sweeper a day later: every lease has run out, every check is over.
    steps.push(Step::Advance { ms: 86_400_000 });
    steps.push(Step::One(Op::Sweep));
    for (n, step) in steps.iter().enumerate() {
        let now = real.clock.now();
        let ops: Vec<&Op> = match step {
            Step::Advance { ms } => {
                real.clock.advance(Duration::milliseconds(*ms));
                continue;
            }
            Step::One(op) => vec![op],
            Step::Two(a, b) => vec![a, b],
        };
        let calls: Vec<Call> = ops.iter().map(|op| resolve(op, &items)).collect();
        let answers = match calls.as_slice() {
            [one] => vec![real.run(one, &items).await],
            [a, b] => {
                let (a, b) = tokio::join!(real.run(a, &items), real.run(b, &items));
                vec![a, b]
            }
            _ => unreachable!("a step has one or two actions"),
        };
        let (mut outcomes, learned): (Vec<Outcome>, Vec<Learned>) = answers.into_iter().unzip();
        let created: Vec<Option<Item>> = learned
            .iter()
            .map(|l| match l {
                Learned::Item(item) => Some(item.clone()),
                _ => None,
            })
            .collect();
        learn(&mut items, learned.iter().map(clone_learned).collect());
        settle_poll_indexes(&mut outcomes, &learned, &items);

        for (outcome, call) in outcomes.iter().zip(&calls) {
            if let Outcome::Polled(Some((_, epoch))) = outcome {
                prop_assert!(
                    *epoch - 1 <= i64::from(MAX_RECLAIMS),
                    "step {n}: {call:?} handed out claim {epoch}, past the reclaim limit"
                );
            }
        }
        if let [Outcome::Polled(Some(a)), Outcome::Polled(Some(b))] = outcomes.as_slice() {
            prop_assert_ne!(a, b, "step {}: two pollers got one claim", n);
        }

        let observed = observe(&real, &items).await;
        let mut orders: Vec<Order> = if calls.len() == 1 {
            vec![Order::Sequence(vec![0])]
        } else {
            vec![Order::Sequence(vec![0, 1]), Order::Sequence(vec![1, 0])]
        };
        if calls.len() == 2 {
            for poll in (0..2).filter(|&i| matches!(calls[i], Call::Poll)) {
                // Between a Poll's statements: after a claim past the limit, after its Fail.
                orders.extend((1..=4).map(|at| Order::InsidePoll { poll, at }));
            }
        }
        let mut tried = Vec::new();
        let mut accepted = None;
        for order in orders {
            let mut candidate = model.clone();
            let mut expected = vec![Outcome::Skipped; calls.len()];
            let apply = |model: &mut Model, i: usize, expected: &mut Vec<Outcome>| {
                let outcome = model.apply(&calls[i], &items, created[i].as_ref(), now);
                expected[i] = harness_indexed(outcome, model, &items);
            };
            match &order {
                Order::Sequence(sequence) => {
                    for &i in sequence {
                        apply(&mut candidate, i, &mut expected);
                    }
                }
                Order::InsidePoll { poll, at } => {
                    let other = 1 - poll;
                    let mut other_expected = vec![Outcome::Skipped; calls.len()];
                    let outcome = candidate.poll_around(now, *at, &mut |model| {
                        apply(model, other, &mut other_expected)
                    });
                    expected[*poll] = harness_indexed(outcome, &candidate, &items);
                    expected[other] = other_expected[other].clone();
                }
            }
            // Items two concurrent Creates made are indexed as the actors learned them.
            let mut ordered = candidate;
            ordered
                .items
                .sort_by_key(|m| items.iter().position(|i| i.id == m.id));
            if expected == outcomes && ordered == observed {
                accepted = Some(ordered);
                break;
            }
            tried.push((order, expected, ordered));
        }
        if accepted.is_none() {
            accepted = concurrent_sweeps(&model, &calls, &outcomes, &observed, now);
        }
        let Some(next) = accepted else {
            return Err(TestCaseError::fail(format!(
                "step {n} ({step:?}, at {}) diverged from the model:\n  calls: {calls:?}\n  store answered: {outcomes:?}\n  store holds: {observed:#?}\n  the model, in each order: {tried:#?}",
                time::format(&now)
            )));
        };
        model = next;
        remember_beats(&mut items, &calls, &outcomes);
        check_invariants(&real, &items).await?;
    }
    for item in &model.items {
        prop_assert_eq!(
            item.lease.state,
            WorkState::Stopped,
            "{} never stopped",
            &item.id
        );
    }
    Ok(())
}

/// An order of a step's actions the model tries.
#[derive(Debug)]
enum Order {
    Sequence(Vec<usize>),
    /// The other action between the Poll's statements `at - 1` and `at`.
    InsidePoll {
        poll: usize,
        at: usize,
    },
}

/// A model Poll's answer with the item as the actors index it.
fn harness_indexed(outcome: Outcome, model: &Model, items: &[Item]) -> Outcome {
    match outcome {
        Outcome::Polled(Some((index, epoch))) => {
            let id = &model.items[index].id;
            let index = items.iter().position(|i| &i.id == id).expect("known");
            Outcome::Polled(Some((index, epoch)))
        }
        other => other,
    }
}

/// A sweep pass is atomic per row, not as a whole: two passes at once may
/// split the rows between them. They are the model's one pass when their
/// counts add up to its count and the rows end as it leaves them.
fn concurrent_sweeps(
    model: &Model,
    calls: &[Call],
    outcomes: &[Outcome],
    observed: &Model,
    now: Timestamp,
) -> Option<Model> {
    let ([Call::Sweep, Call::Sweep], [Outcome::Swept(a), Outcome::Swept(b)]) = (calls, outcomes)
    else {
        return None;
    };
    let mut candidate = model.clone();
    let Outcome::Swept(moved) = candidate.sweep(now) else {
        unreachable!("a sweep answers its count")
    };
    (a + b == moved && candidate == *observed).then_some(candidate)
}

fn clone_learned(fact: &Learned) -> Learned {
    match fact {
        Learned::Nothing => Learned::Nothing,
        Learned::Item(item) => Learned::Item(item.clone()),
        Learned::Claim { item_id, claim } => Learned::Claim {
            item_id: item_id.clone(),
            claim: claim.clone(),
        },
    }
}

fn cases() -> u32 {
    match std::env::var("MANGO_PROPTEST_CASES") {
        Err(_) => DEFAULT_CASES,
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                panic!("MANGO_PROPTEST_CASES must be a positive integer, got {text:?}")
            }),
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn the_lease_store_follows_the_lease_model(pool: PgPool) {
    let options = pool.connect_options().as_ref().clone();
    let cases = cases();
    // proptest drives synchronously: the histories run on a runtime of their
    // own, on a thread of their own, with a pool made there.
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let pool = runtime
            .block_on(
                PgPoolOptions::new()
                    .max_connections(8)
                    .connect_with(options),
            )
            .expect("connect to the test database");
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 2_000,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        let result = runner.run(&history(), |history| {
            runtime.block_on(run_history(pool.clone(), history))
        });
        runtime.block_on(pool.close());
        result
    })
    .join()
    .expect("the model thread");
    match outcome {
        Ok(()) => {}
        Err(TestError::Fail(reason, minimal)) => {
            panic!("the lease store left the model: {reason}\nminimal history: {minimal:#?}")
        }
        Err(TestError::Abort(reason)) => panic!("the lease model aborted: {reason}"),
    }
}

/// Found by the model: Fail runs in a transaction, and a refused Fail rolled
/// back the timed-out state its reconciling had written, unlike every other
/// refused transition.
#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_refused_fail_keeps_the_timeout_it_reconciled(pool: PgPool) {
    let real = Real::start(pool).await;
    let (_, Learned::Item(item)) = real.run(&Call::Create, &[]).await else {
        unreachable!("a Create learns its item")
    };
    let mut items = vec![item];
    let (polled, learned) = real.run(&Call::Poll, &items).await;
    assert_eq!(polled, Outcome::Polled(Some((0, 1))));
    learn(&mut items, vec![learned]);
    real.clock.advance(Duration::seconds(121));

    let (answer, _) = real.run(&Call::Fail { item: 0, claim: 0 }, &items).await;

    assert_eq!(
        answer,
        refused(401, None),
        "an overdue check's token is refused"
    );
    let row = real.row(&items[0].id).await;
    assert_eq!(row.state, WorkState::Stopped);
    assert_eq!(
        row.result.map(|r| r.status),
        Some(CheckStatus::TimedOut),
        "the refusal kept the timeout it reconciled"
    );
}
