//! The supervisor (spec §7): polls with the Environment key, acks, asks a
//! launcher for one sandbox per item, hands the secret over once, watches
//! the sandbox and removes it when the activation ends. It never
//! heartbeats: the runner does, and the runner's exit ends the activation.
//!
//! Whether an item's Work was stopped or reclaimed meanwhile it learns from
//! the claims of its key (`GET …/work/claims`, Mango's narrow extension),
//! read every `claims_every` for all live items at once.

use crate::core::config::Config;
use crate::core::kept::KeptSandboxes;
use crate::core::launcher::{
    Found, ItemIdentity, LaunchError, Launcher, Sandbox, SandboxExit, SandboxSpec, Warm,
};
use crate::core::metrics::{Metrics, Outcome};
use crate::core::observer::{Happening, Observer, Quiet};
use crate::core::secret::Secret;
use crate::core::stages::{Stage, Stamps};
use crate::core::warm::WarmPool;
use mango_client::{Client, ClientError, RetryPolicy};
use mango_protocol::envelope::Envelope;
use mango_protocol::{ClaimState, Work, WorkData, WorkState, WorkType};
use rand::Rng;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why the supervisor would not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("MANGO_ENVIRONMENT_KEY is a Workspace key: a Workspace key must never reach a supervisor or a sandbox; create an Environment key with `mango api-key create -workspace W -environment {0} -label L`")]
    WorkspaceKey(String),
    #[error("MANGO_ENVIRONMENT_KEY is not an Environment key (keys of this kind start with mango_envk_)")]
    NotAnEnvironmentKey,
    #[error("the api refused MANGO_ENVIRONMENT_KEY ({0}): it is unknown or revoked; create a new one with `mango api-key create … -environment …`")]
    Refused(ClientError),
    #[error("MANGO_ENVIRONMENT_KEY does not serve Environment {environment} ({error})")]
    WrongEnvironment {
        environment: String,
        error: ClientError,
    },
}

/// How to stop a run. Either way polling stops first: a Poll in flight
/// is answered (an item it claims is launched, not left to its lease), and
/// no other is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Let running items finish within the shutdown grace, then remove
    /// what is left (`mango-worker docker|local --drain`).
    Drain,
    /// Leave every running sandbox as it is, holding its lease, for the
    /// next supervisor of the pool to adopt: launches in progress finish
    /// their hand-off (within the request bound), nothing is removed. What
    /// SIGTERM does by default, and a Kubernetes controller that is
    /// replaced, loses its leadership, or sees its pool change.
    Detach,
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Asked to drain; every sandbox was finished or removed.
    Shutdown,
    /// Asked to detach: sandboxes were left running for a successor.
    Detached,
    /// The api stopped accepting the key (revoked meanwhile).
    KeyRefused(String),
}

/// What the claims say of a live item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Still this claim's, and running (or about to).
    Live,
    /// Asked to stop: its runner should exit soon.
    Stopping,
    /// Stopped by its own runner, with no Stop asked for (a healthcheck's
    /// Result): the runner is on its way out, and its sandbox goes when it
    /// exits, or after the finish grace.
    Finished,
    /// Stopped by a Stop (a cancellation), or another claim took it, or its
    /// lease was lost: its sandbox goes now.
    Over,
    /// Stopped at its runner's idle end (spec §7.1): a runner that waits
    /// for its Session's next envelope stays, and its sandbox may be kept.
    Kept,
}

/// Where an item's sandbox came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Cold,
    Warm,
    /// Its Session's kept sandbox.
    Kept,
}

struct LiveItem {
    claim: i64,
    session_id: Option<String>,
    verdict: watch::Sender<Verdict>,
}

impl LiveItem {
    /// Tells the item's watch what its claim says now; an unchanged verdict
    /// wakes nothing.
    fn tell(&self, verdict: Verdict) {
        self.verdict.send_if_modified(|v| {
            let changed = *v != verdict;
            *v = verdict;
            changed
        });
    }
}

struct Shared<L> {
    config: Config,
    launcher: L,
    /// Polls, without the client's own retries: the loop backs off itself.
    poller: Client,
    /// Ack and claims, with retries.
    ops: Client,
    metrics: Arc<Metrics>,
    observer: Arc<dyn Observer>,
    live: Mutex<HashMap<String, LiveItem>>,
    slots: Arc<Semaphore>,
    /// Warm sandboxes ready to be bound; their own bound, not `slots`.
    warm: WarmPool,
    /// Sandboxes waiting for their Session's next activation, bound to no
    /// item; at most `max_concurrency` of them, the oldest evicted.
    kept: KeptSandboxes,
    /// Set on shutdown once the grace is over: every sandbox goes now.
    force: CancellationToken,
    /// Set when the shutdown's bound is over too: removals stop retrying.
    abandon: CancellationToken,
    /// Set on detach: watching stops, and sandboxes are left as they are.
    detach: CancellationToken,
    /// Set when the claims watch finds the key refused, with why: polling
    /// ends even while every slot is taken and no Poll would ask.
    key_refused: CancellationToken,
    refusal: Mutex<Option<String>>,
}

pub struct Supervisor<L: Launcher> {
    shared: Arc<Shared<L>>,
}

impl<L: Launcher> Supervisor<L> {
    pub fn new(config: Config, launcher: L, api_base: &str, key: &Secret) -> Supervisor<L> {
        let poller = Client::new(api_base, key.expose()).with_retry(RetryPolicy::none());
        let ops = Client::new(api_base, key.expose());
        let slots = Arc::new(Semaphore::new(config.max_concurrency));
        let warm = WarmPool::new(config.warm);
        let kept = KeptSandboxes::new(if config.keep_idle.is_zero() {
            0
        } else {
            config.max_concurrency
        });
        Supervisor {
            shared: Arc::new(Shared {
                warm,
                kept,
                config,
                launcher,
                poller,
                ops,
                metrics: Arc::default(),
                observer: Arc::new(Quiet),
                live: Mutex::default(),
                slots,
                force: CancellationToken::new(),
                abandon: CancellationToken::new(),
                detach: CancellationToken::new(),
                key_refused: CancellationToken::new(),
                refusal: Mutex::default(),
            }),
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Tells `observer` of launches, failures and removals (before `run`).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Supervisor<L> {
        Arc::get_mut(&mut self.shared)
            .expect("an observer is set before the supervisor runs")
            .observer = observer;
        self
    }

    /// Refuses a Workspace key, a key the api does not accept, and a key of
    /// another Environment, with the reason; waits (backing off) while the
    /// api cannot be reached.
    pub async fn check_key(&self, key: &Secret) -> Result<(), StartError> {
        let env = &self.shared.config.environment_id;
        if key.expose().starts_with("mango_wsk_") {
            return Err(StartError::WorkspaceKey(env.clone()));
        }
        if !key.expose().starts_with("mango_envk_") {
            return Err(StartError::NotAnEnvironmentKey);
        }
        let mut backoff = Backoff::new(&self.shared.config);
        loop {
            match self.shared.poller.stats(env).await {
                Ok(_) => return Ok(()),
                Err(err) if err.status().map(|s| s.as_u16()) == Some(401) => {
                    return Err(StartError::Refused(err))
                }
                Err(err) if matches!(err.status().map(|s| s.as_u16()), Some(403 | 404)) => {
                    return Err(StartError::WrongEnvironment {
                        environment: env.clone(),
                        error: err,
                    })
                }
                Err(err) => {
                    self.shared
                        .metrics
                        .note_error(format!("the api is unavailable: {err}"));
                    let pause = backoff.next();
                    tracing::warn!(error = %err, ?pause, "the api is unavailable; retrying");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Runs until `stop` resolves, then drains or detaches as it says, or
    /// until the api refuses the key (then drains).
    pub async fn run_until(self, stop: impl Future<Output = Stop> + Send) -> RunEnd {
        let shared = self.shared.clone();
        let mut items = JoinSet::new();
        shared.reconcile(&mut items).await;
        shared.reconcile_warm().await;
        let watcher = tokio::spawn(shared.clone().watch_claims());
        let sweeper = tokio::spawn(shared.clone().sweep_workspaces());
        let filler = tokio::spawn(shared.clone().keep_warm());
        let stopping = CancellationToken::new();
        let (end, how) = {
            let polling = shared.clone().poll_loop(&mut items, stopping.clone());
            tokio::pin!(polling, stop);
            tokio::select! {
                end = &mut polling => (end, Stop::Drain),
                how = &mut stop => {
                    stopping.cancel();
                    (polling.await, how)
                }
            }
        };
        watcher.abort();
        sweeper.abort();
        filler.abort();
        let _ = filler.await;
        if how == Stop::Detach {
            // Warm sandboxes stay too: their owner (this worker id) adopts
            // them when it starts again. Only the watching stops.
            drop(shared.warm.drain(|_| false));
            shared.note_warm();
            // Kept ones too: the next supervisor adopts each as the item it
            // last served, whose ended claim gets it removed.
            drop(shared.kept.drain());
            shared.note_kept();
            shared.detach(&mut items).await;
            return match end {
                RunEnd::KeyRefused(why) => RunEnd::KeyRefused(why),
                _ => RunEnd::Detached,
            };
        }
        tracing::info!(
            live = shared.live_count(),
            "no longer polling; letting running items finish"
        );
        shared.clear_warm().await;
        shared.clear_kept().await;
        let watcher = tokio::spawn(shared.clone().watch_claims());
        shared.drain(&mut items).await;
        watcher.abort();
        end
    }
}

impl<L: Launcher> Shared<L> {
    fn live_count(&self) -> usize {
        self.live.lock().expect("live lock").len()
    }

    /// Polls while slots are free, until `stopping`; each item runs in
    /// `items`. A Poll in flight when `stopping` is set gets its answer
    /// (within the request bound): cutting it off could lose an item the
    /// api has just claimed for this key until its lease ran out.
    async fn poll_loop(
        self: Arc<Self>,
        items: &mut JoinSet<()>,
        stopping: CancellationToken,
    ) -> RunEnd {
        let env = self.config.environment_id.clone();
        let mut backoff = Backoff::new(&self.config);
        let answer_bound = async {
            stopping.cancelled().await;
            tokio::time::sleep(self.config.request_bound).await;
        };
        tokio::pin!(answer_bound);
        loop {
            // Reap finished items so the set does not grow.
            while items.try_join_next().is_some() {}
            let permit = tokio::select! {
                biased;
                _ = stopping.cancelled() => return RunEnd::Shutdown,
                _ = self.key_refused.cancelled() => {
                    let why = self.refusal.lock().expect("refusal lock").clone().unwrap_or_default();
                    tracing::error!(error = %why, "the api refused the Environment key; no longer polling");
                    return RunEnd::KeyRefused(why);
                }
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return RunEnd::Shutdown,
                },
            };
            let polled = tokio::select! {
                polled = self.poller.poll(
                    &env,
                    Some(self.config.block_ms),
                    Some(&self.config.worker_id),
                ) => polled,
                _ = &mut answer_bound => {
                    tracing::warn!("stopping with a Poll unanswered after the request bound");
                    return RunEnd::Shutdown;
                }
            };
            let at = Instant::now();
            match polled {
                Ok(Some(work)) => {
                    backoff.reset();
                    self.metrics.note_poll_ok();
                    self.metrics.polls.fetch_add(1, Relaxed);
                    items.spawn(self.clone().run_item(work, at, permit));
                }
                Ok(None) => {
                    backoff.reset();
                    self.metrics.note_poll_ok();
                    self.metrics.polls.fetch_add(1, Relaxed);
                    self.metrics.empty_polls.fetch_add(1, Relaxed);
                }
                Err(err) if matches!(err.status().map(|s| s.as_u16()), Some(401 | 403)) => {
                    self.metrics
                        .note_error(format!("the api refused the Environment key: {err}"));
                    tracing::error!(error = %err, "the api refused the Environment key; no longer polling");
                    return RunEnd::KeyRefused(err.to_string());
                }
                Err(err) => {
                    self.metrics.poll_errors.fetch_add(1, Relaxed);
                    self.metrics.note_error(format!("poll failed: {err}"));
                    drop(permit);
                    let pause = backoff.next();
                    tracing::warn!(error = %err, ?pause, "poll failed; backing off");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stopping.cancelled() => return RunEnd::Shutdown,
                    }
                }
            }
        }
    }

    /// Sandboxes an earlier run left: exited ones are removed, running ones
    /// adopted and watched like the items this run starts.
    async fn reconcile(self: &Arc<Self>, items: &mut JoinSet<()>) {
        let found =
            match tokio::time::timeout(self.config.request_bound, self.launcher.existing()).await {
                Ok(Ok(found)) => found,
                Ok(Err(err)) => {
                    tracing::error!(error = %err, "could not list the sandboxes of an earlier run");
                    return;
                }
                Err(_) => {
                    tracing::error!("listing the sandboxes of an earlier run timed out");
                    return;
                }
            };
        for Found { sandbox, running } in found {
            if !running {
                tracing::info!(sandbox = %sandbox.name, work_id = %sandbox.item.work_id, "removing an exited sandbox of an earlier run");
                self.remove(&sandbox).await;
                continue;
            }
            tracing::info!(sandbox = %sandbox.name, work_id = %sandbox.item.work_id, "adopting a running sandbox of an earlier run");
            // It counts against the concurrency limit like any other.
            let permit = self.slots.clone().try_acquire_owned().ok();
            let verdict = self.register(&sandbox.item);
            self.metrics.outcome(Outcome::Adopted);
            self.observer.observe(Happening::Adopted(&sandbox));
            let shared = self.clone();
            items.spawn(async move {
                let mut stamps = Stamps::default();
                // Adopted, it is never kept: which Session's next envelope
                // its runner would take, this run cannot tell.
                shared.watch(&sandbox, verdict, &mut stamps, false).await;
                shared.finish(&sandbox.item, &stamps);
                drop(permit);
            });
        }
    }

    fn register(&self, item: &ItemIdentity) -> watch::Receiver<Verdict> {
        let (tx, rx) = watch::channel(Verdict::Live);
        self.live.lock().expect("live lock").insert(
            item.work_id.clone(),
            LiveItem {
                claim: item.claim,
                session_id: item.session_id.clone(),
                verdict: tx,
            },
        );
        self.metrics.live.fetch_add(1, Relaxed);
        rx
    }

    fn finish(&self, item: &ItemIdentity, stamps: &Stamps) {
        let removed = {
            let mut live = self.live.lock().expect("live lock");
            match live.get(&item.work_id) {
                Some(entry) if entry.claim == item.claim => live.remove(&item.work_id).is_some(),
                _ => false,
            }
        };
        if removed {
            self.metrics.live.fetch_sub(1, Relaxed);
        }
        self.metrics.observe(stamps);
        let stages: Vec<String> = stamps
            .offsets_ms()
            .into_iter()
            .map(|(s, ms)| format!("{}={ms}ms", s.as_str()))
            .collect();
        tracing::debug!(work_id = %item.work_id, claim = item.claim, stages = %stages.join(" "), "item done");
        #[cfg(feature = "bench-hooks")]
        self.observer.observe(Happening::Done { item, stamps });
    }

    /// One polled item, from Ack to its sandbox's removal.
    async fn run_item(
        self: Arc<Self>,
        mut work: Work,
        polled: Instant,
        permit: OwnedSemaphorePermit,
    ) {
        let mut stamps = Stamps::default();
        stamps.mark_at(Stage::Polled, polled);
        let secret = work.secret.take().map(Secret::new);
        let item = ItemIdentity {
            work_id: work.id.clone(),
            claim: work.claim.unwrap_or(0),
            environment_id: work.environment_id.clone(),
            work_type: work.data.work_type(),
            session_id: match &work.data {
                WorkData::Session { id } => Some(id.clone()),
                WorkData::Healthcheck => None,
            },
        };
        let verdict = self.register(&item);
        let outcome = match self.launch(&item, secret, verdict, &mut stamps).await {
            Ok(outcome) => outcome,
            Err(failure) => {
                self.metrics
                    .note_error(format!("{}: {failure}", item.work_id));
                self.observer.observe(Happening::LaunchFailed {
                    item: &item,
                    error: &failure,
                });
                Some(Outcome::LaunchFailed)
            }
        };
        if let Some(outcome) = outcome {
            self.metrics.outcome(outcome);
        }
        self.finish(&item, &stamps);
        drop(permit);
    }

    /// Ack, create, hand-off, then watch; `Err` says why the launch failed
    /// (the item is then left to its lease), `None` that the sandbox was
    /// left running on detach.
    async fn launch(
        self: &Arc<Self>,
        item: &ItemIdentity,
        secret: Option<Secret>,
        mut verdict: watch::Receiver<Verdict>,
        stamps: &mut Stamps,
    ) -> Result<Option<Outcome>, String> {
        let work_id = &item.work_id;
        let Some(secret) = secret else {
            tracing::error!(%work_id, "Poll answered an item without a secret");
            return Err("Poll answered an item without a secret".into());
        };
        if item.claim == 0 {
            tracing::error!(%work_id, "Poll did not name its claim: this api is older than the supervisor");
            return Err("Poll did not name its claim (an api older than the supervisor)".into());
        }
        if let Err(err) = self.ops.ack(&item.environment_id, work_id).await {
            // A stopped item (409) is nobody's now; anything else: the claim expires.
            tracing::warn!(%work_id, error = %err, "ack failed; the item is left to its lease");
            return Err(format!("ack failed: {err}"));
        }
        stamps.mark(Stage::Acked);
        let spec = SandboxSpec::for_item(item, &self.config.pool, &self.config.sandbox_base_url);
        self.settle_earlier_items_of(item).await;
        let (mut sandbox, mut via) = match self.take_kept(&spec).await {
            Some(sandbox) => {
                stamps.mark(Stage::Bound);
                (sandbox, Via::Kept)
            }
            None => self.make_sandbox(item, &spec, stamps).await?,
        };
        // After a cancellation, no secret is delivered.
        if *verdict.borrow() != Verdict::Live || self.force.is_cancelled() {
            tracing::info!(%work_id, "stopped before its hand-off; removing the sandbox unstarted");
            drop(secret);
            self.remove(&sandbox).await;
            stamps.mark(Stage::Gone);
            self.observer.observe(Happening::Removed {
                sandbox: &sandbox,
                outcome: Outcome::Cancelled,
            });
            return Ok(Some(Outcome::Cancelled));
        }
        let mut failed = self.start(&sandbox, via, &secret, stamps).await;
        if let (Some(failure), Via::Kept) = (&failed, via) {
            // The claim is still ours: the item starts as if none was kept.
            tracing::warn!(%work_id, sandbox = %sandbox.name, error = %failure, "the kept sandbox took no envelope; removing it and starting the item cold");
            self.remove(&sandbox).await;
            (sandbox, via) = self.make_sandbox(item, &spec, stamps).await?;
            failed = self.start(&sandbox, via, &secret, stamps).await;
        }
        drop(secret);
        if let Some(failure) = failed {
            tracing::error!(%work_id, sandbox = %sandbox.name, error = %failure, "removing the sandbox; the item is left to its lease");
            self.remove(&sandbox).await;
            stamps.mark(Stage::Gone);
            return Err(failure);
        }
        if via == Via::Kept {
            self.metrics.kept_reused.fetch_add(1, Relaxed);
        }
        self.observer.observe(Happening::Launched(&sandbox));
        let _ = verdict.borrow_and_update();
        let keepable = self.keeps(&sandbox);
        Ok(self.watch(&sandbox, verdict, stamps, keepable).await)
    }

    /// A warm sandbox bound to the item, or a cold one created for it.
    async fn make_sandbox(
        &self,
        item: &ItemIdentity,
        spec: &SandboxSpec,
        stamps: &mut Stamps,
    ) -> Result<(Sandbox, Via), String> {
        let bound = match self.take_warm(item).await {
            Some(warm) => self.bind(warm, spec).await,
            None => None,
        };
        Ok(match bound {
            Some(sandbox) => {
                stamps.mark(Stage::Bound);
                (sandbox, Via::Warm)
            }
            None => {
                let sandbox = self.create_cold(spec).await?;
                stamps.mark(Stage::Created);
                (sandbox, Via::Cold)
            }
        })
    }

    /// Gets the item's runner going with its secret: the envelope for one
    /// that waits (warm, kept, or cold with keeping on), the bare secret
    /// otherwise. `Some` says why it failed.
    async fn start(
        &self,
        sandbox: &Sandbox,
        via: Via,
        secret: &Secret,
        stamps: &mut Stamps,
    ) -> Option<String> {
        let item = &sandbox.item;
        let bound = self.hand_off_bound(item, stamps);
        let waiting_cold = via == Via::Cold && self.launcher.waits(sandbox);
        if via == Via::Cold && !waiting_cold {
            let secret = Secret::new(secret.expose().to_string());
            let handed = tokio::time::timeout(bound, self.launcher.hand_off(sandbox, secret)).await;
            return match handed {
                Ok(Ok(handed)) => {
                    stamps.mark_at(Stage::Started, handed.started);
                    stamps.mark_at(Stage::Delivered, handed.delivered);
                    None
                }
                Ok(Err(err)) => Some(format!("the hand-off failed: {err}")),
                Err(_) => Some("the hand-off timed out".to_string()),
            };
        }
        let delivered = tokio::time::timeout(bound, async {
            if waiting_cold {
                let started = self.launcher.start_waiting(sandbox).await?;
                stamps.mark_at(Stage::Started, started);
            }
            self.launcher
                .deliver(sandbox, envelope_of(item, secret))
                .await
        })
        .await;
        match delivered {
            Ok(Ok(at)) => {
                stamps.mark_at(Stage::Delivered, at);
                None
            }
            Ok(Err(err)) => Some(format!("delivering the envelope failed: {err}")),
            Err(_) => Some("delivering the envelope timed out".to_string()),
        }
    }

    /// Whether `sandbox` may be kept after its item's idle end.
    fn keeps(&self, sandbox: &Sandbox) -> bool {
        !self.config.keep_idle.is_zero()
            && sandbox.item.work_type == WorkType::Session
            && self.launcher.waits(sandbox)
    }

    /// Before an item of a Session with another live item here takes a
    /// sandbox: that item may have ended idle since the claims watch last
    /// read it, and would then be kept only after this item started cold,
    /// to wait out its keep unused. Its claim is read now instead, and its
    /// sandbox, if kept, is waited for (within the request bound).
    async fn settle_earlier_items_of(&self, item: &ItemIdentity) {
        if self.config.keep_idle.is_zero() {
            return;
        }
        let Some(session_id) = item.session_id.as_deref() else {
            return;
        };
        let earlier = |live: &HashMap<String, LiveItem>| -> Vec<(String, i64)> {
            live.iter()
                .filter(|(id, e)| {
                    **id != item.work_id && e.session_id.as_deref() == Some(session_id)
                })
                .map(|(id, e)| (id.clone(), e.claim))
                .collect()
        };
        let earlier_items = earlier(&self.live.lock().expect("live lock"));
        if earlier_items.is_empty() {
            return;
        }
        let ids: Vec<String> = earlier_items.iter().map(|(id, _)| id.clone()).collect();
        let bound = self.config.request_bound;
        let env = &self.config.environment_id;
        let Ok(Ok(answer)) = tokio::time::timeout(bound, self.ops.claims(env, &ids)).await else {
            return;
        };
        let mut ended_idle = false;
        {
            let live = self.live.lock().expect("live lock");
            for (id, claim) in &earlier_items {
                let Some(entry) = live.get(id) else { continue };
                let verdict = verdict_of(answer.data.iter().find(|c| c.id == *id), *claim);
                ended_idle |= verdict == Verdict::Kept;
                entry.tell(verdict);
            }
        }
        if !ended_idle {
            return;
        }
        let deadline = Instant::now() + bound;
        while !self.kept.holds(session_id)
            && !earlier(&self.live.lock().expect("live lock")).is_empty()
            && Instant::now() < deadline
        {
            // A poll inside the bound: its watch keeps the sandbox at once.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The item's Session's kept sandbox, rebound to it; `None` when there
    /// is none, or it would not rebind (then it is removed).
    async fn take_kept(&self, spec: &SandboxSpec) -> Option<Sandbox> {
        let session_id = spec.item.session_id.as_deref()?;
        let kept = self.kept.take(session_id)?;
        self.note_kept();
        let work_id = &spec.item.work_id;
        if self.image_changed(&kept).await {
            tracing::info!(%work_id, sandbox = %kept.name, "the pool's image changed since the Session's sandbox was kept; removing it and starting the item cold");
            self.remove(&kept).await;
            return None;
        }
        let rebound =
            tokio::time::timeout(self.config.request_bound, self.launcher.rebind(&kept, spec))
                .await;
        let why = match rebound {
            Ok(Ok(sandbox)) => {
                tracing::info!(%work_id, sandbox = %sandbox.name, was = %kept.name, "bound its Session's kept sandbox");
                return Some(sandbox);
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {:?}", self.config.request_bound),
        };
        tracing::warn!(%work_id, sandbox = %kept.name, error = %why, "could not rebind the Session's kept sandbox; removing it and starting the item cold");
        self.remove(&kept).await;
        None
    }

    /// Whether `sandbox` runs another image than new sandboxes would now;
    /// not when either is unknown.
    async fn image_changed(&self, sandbox: &Sandbox) -> bool {
        let bound = self.config.request_bound;
        let now = tokio::time::timeout(bound, self.launcher.warm_image()).await;
        let its = tokio::time::timeout(bound, self.launcher.image_of(sandbox)).await;
        match (now, its) {
            (Ok(Ok(Some(now))), Ok(Ok(Some(its)))) => now != its,
            _ => false,
        }
    }

    /// Keeps the sandbox of an activation that ended at its runner's idle
    /// end for its Session's next, until `keep_idle` runs out or its runner
    /// exits; what the bound evicts is removed.
    async fn keep(self: &Arc<Self>, sandbox: &Sandbox) {
        let Some(session_id) = sandbox.item.session_id.clone() else {
            self.remove(sandbox).await;
            return;
        };
        let evicted = self
            .kept
            .admit(&session_id, sandbox.clone(), Instant::now());
        let shared = self.clone();
        let watched = sandbox.clone();
        let task = tokio::spawn(async move {
            let keep = tokio::time::sleep(shared.config.keep_idle);
            tokio::pin!(keep);
            let mut backoff = Backoff::new(&shared.config);
            let why = loop {
                tokio::select! {
                    ended = shared.launcher.wait(&watched) => match ended {
                        // While the engine is unavailable it may well wait still.
                        Err(LaunchError::Unavailable { .. }) => tokio::time::sleep(backoff.next()).await,
                        _ => break "its runner exited",
                    },
                    _ = &mut keep => break "its keep ran out",
                }
            };
            if let Some(sandbox) = shared.kept.forget(&watched.handle) {
                tracing::info!(sandbox = %sandbox.name, session_id = %session_id, why, "removing a kept sandbox");
                shared.note_kept();
                shared.remove(&sandbox).await;
            }
        });
        self.kept.watch(&sandbox.handle, task.abort_handle());
        self.note_kept();
        for old in evicted {
            tracing::info!(sandbox = %old.name, "evicting a kept sandbox past the bound");
            self.remove(&old).await;
        }
    }

    fn note_kept(&self) {
        self.metrics.kept.store(self.kept.count() as i64, Relaxed);
    }

    /// On drain: every kept sandbox goes.
    async fn clear_kept(&self) {
        for sandbox in self.kept.drain() {
            self.remove(&sandbox).await;
        }
        self.note_kept();
    }

    /// Creates the item's sandbox, not yet started; `Err` says why not
    /// (the item is then left to its lease).
    async fn create_cold(&self, spec: &SandboxSpec) -> Result<Sandbox, String> {
        let work_id = &spec.item.work_id;
        let created =
            tokio::time::timeout(self.config.request_bound, self.launcher.create(spec)).await;
        match created {
            Ok(Ok(sandbox)) => Ok(sandbox),
            Ok(Err(LaunchError::AlreadyExists(name))) => {
                // Only this claim could have made it: never a second sandbox.
                tracing::error!(%work_id, sandbox = %name, "a sandbox for this claim exists already; not starting another");
                Err(format!("a sandbox for this claim exists already ({name})"))
            }
            Ok(Err(err)) => {
                tracing::error!(%work_id, sandbox = %spec.name, error = %err, "could not create the sandbox; the item is left to its lease");
                Err(format!("could not create the sandbox: {err}"))
            }
            Err(_) => {
                tracing::error!(%work_id, sandbox = %spec.name, "creating the sandbox timed out; the item is left to its lease");
                // It may exist by now.
                self.remove_named(spec).await;
                Err("creating the sandbox timed out".into())
            }
        }
    }

    /// A ready warm sandbox for `item`, if it may go warm: a healthcheck,
    /// or a Session's first activation (a Session with a workspace keeps
    /// it, so goes cold). `None` starts it cold at once: a claim never
    /// waits for the pool.
    async fn take_warm(&self, item: &ItemIdentity) -> Option<Warm> {
        if self.warm.target() == 0 {
            return None;
        }
        if self.warm.ready() == 0 {
            self.metrics.warm_missed.fetch_add(1, Relaxed);
            return None;
        }
        if let Some(session_id) = &item.session_id {
            let has = tokio::time::timeout(
                self.config.request_bound,
                self.launcher.has_workspace(session_id),
            )
            .await;
            match has {
                Ok(Ok(false)) => {}
                Ok(Ok(true)) => return None,
                Ok(Err(err)) => {
                    tracing::warn!(work_id = %item.work_id, error = %err, "could not tell whether the Session has a workspace; starting it cold");
                    return None;
                }
                Err(_) => {
                    tracing::warn!(work_id = %item.work_id, "asking whether the Session has a workspace timed out; starting it cold");
                    return None;
                }
            }
        }
        let taken = self.warm.take();
        if taken.is_none() {
            self.metrics.warm_missed.fetch_add(1, Relaxed);
        }
        self.note_warm();
        taken
    }

    /// Binds a warm sandbox taken from the pool to `spec`'s item; one that
    /// will not bind is removed, and the item starts cold.
    async fn bind(&self, warm: Warm, spec: &SandboxSpec) -> Option<Sandbox> {
        let work_id = &spec.item.work_id;
        let bound =
            tokio::time::timeout(self.config.request_bound, self.launcher.bind(&warm, spec)).await;
        let why = match bound {
            Ok(Ok(sandbox)) => {
                self.metrics.warm_bound.fetch_add(1, Relaxed);
                tracing::info!(%work_id, sandbox = %sandbox.name, warm = %warm.name, "bound a warm sandbox");
                return Some(sandbox);
            }
            Ok(Err(LaunchError::Taken(name))) => {
                // Never bound twice, and never removed under its item.
                tracing::error!(%work_id, warm = %name, "a warm sandbox of the pool is bound to another item already; leaving it and starting the item cold");
                self.metrics.warm_missed.fetch_add(1, Relaxed);
                return None;
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {:?}", self.config.request_bound),
        };
        tracing::warn!(%work_id, warm = %warm.name, error = %why, "could not bind the warm sandbox; removing it and starting the item cold");
        self.metrics.warm_missed.fetch_add(1, Relaxed);
        self.remove_warm(&warm).await;
        None
    }

    fn note_warm(&self) {
        self.metrics
            .warm_ready
            .store(self.warm.ready() as i64, Relaxed);
    }

    /// Removes an unbound warm sandbox, within the request bound; one whose
    /// removal fails is listed again by the next start of its owner.
    async fn remove_warm(&self, warm: &Warm) {
        match tokio::time::timeout(self.config.request_bound, self.launcher.remove_warm(warm)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                self.metrics.removal_errors.fetch_add(1, Relaxed);
                tracing::error!(warm = %warm.name, error = %err, "could not remove a warm sandbox");
            }
            Err(_) => {
                self.metrics.removal_errors.fetch_add(1, Relaxed);
                tracing::error!(warm = %warm.name, "removing a warm sandbox timed out");
            }
        }
    }

    /// Watches a ready warm sandbox: one that dies while it waits leaves the
    /// pool, is removed, and the filler replaces it.
    fn watch_warm(self: &Arc<Self>, handle: String) {
        let shared = self.clone();
        let id = handle.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Backoff::new(&shared.config);
            // While the engine is unavailable it may well be waiting still.
            while let Err(LaunchError::Unavailable { .. }) = shared.launcher.wait_warm(&id).await {
                tokio::time::sleep(backoff.next()).await;
            }
            if let Some(warm) = shared.warm.forget(&id) {
                tracing::warn!(warm = %warm.name, "a warm sandbox ended while it waited; replacing it");
                shared.remove_warm(&warm).await;
                shared.note_warm();
            }
        });
        self.warm.watch(&handle, task.abort_handle());
    }

    /// The warm sandboxes this worker id left: those of the current image
    /// fill the pool again, the others are removed. Another supervisor's
    /// are never touched.
    async fn reconcile_warm(self: &Arc<Self>) {
        let owner = &self.config.worker_id;
        let found = tokio::time::timeout(
            self.config.request_bound,
            self.launcher.existing_warm(owner),
        )
        .await;
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(err)) => {
                tracing::error!(error = %err, "could not list the warm sandboxes of an earlier run");
                return;
            }
            Err(_) => {
                tracing::error!("listing the warm sandboxes of an earlier run timed out");
                return;
            }
        };
        if found.is_empty() {
            return;
        }
        let image =
            match tokio::time::timeout(self.config.request_bound, self.launcher.warm_image()).await
            {
                Ok(Ok(image)) => image,
                _ => None,
            };
        for warm in found {
            if image.as_deref() != Some(warm.image.as_str()) {
                tracing::info!(warm = %warm.name, "removing a warm sandbox of an earlier run (another image)");
                self.remove_warm(&warm).await;
                continue;
            }
            let handle = warm.handle.clone();
            match self.warm.admit(warm) {
                Ok(()) => {
                    tracing::info!(warm = %handle, "adopted a warm sandbox of an earlier run");
                    self.watch_warm(handle);
                }
                Err(warm) => {
                    tracing::info!(warm = %warm.name, "removing a warm sandbox of an earlier run (the pool is full)");
                    self.remove_warm(&warm).await;
                }
            }
        }
        self.note_warm();
    }

    /// Keeps the pool at its size: replaces what was taken or died,
    /// recycles the warm sandboxes of an image that changed, and retries
    /// (backing off) what it failed to make.
    async fn keep_warm(self: Arc<Self>) {
        if self.warm.target() == 0 {
            return;
        }
        let mut image: Option<String> = None;
        let mut backoff = Backoff::new(&self.config);
        loop {
            let now =
                tokio::time::timeout(self.config.request_bound, self.launcher.warm_image()).await;
            match now {
                Ok(Ok(Some(now))) => {
                    if image.as_deref() != Some(now.as_str()) {
                        for old in self.warm.drain(|w| w.image == now) {
                            tracing::info!(warm = %old.name, "the pool's image changed; recycling a warm sandbox of the old one");
                            self.remove_warm(&old).await;
                        }
                        image = Some(now);
                    }
                }
                Ok(Ok(None)) => {
                    tracing::warn!(
                        launcher = self.launcher.kind(),
                        "this launcher makes no warm sandboxes; every item starts cold"
                    );
                    return;
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "could not read the pool's image"),
                Err(_) => tracing::warn!("reading the pool's image timed out"),
            }
            let mut failed = image.is_none();
            let missing = if failed { 0 } else { self.warm.start_making() };
            let owner = self.config.worker_id.clone();
            // Making one includes starting it: a Pod may first wait for a
            // node and its image, as a cold one may before its hand-off.
            let making_bound = self.config.request_bound + self.config.hand_off_bound;
            let made =
                futures::future::join_all((0..missing).map(|_| {
                    tokio::time::timeout(making_bound, self.launcher.create_warm(&owner))
                }))
                .await;
            for result in made {
                self.warm.made();
                match result {
                    Ok(Ok(warm)) if image.as_deref() != Some(warm.image.as_str()) => {
                        self.remove_warm(&warm).await;
                    }
                    Ok(Ok(warm)) => {
                        let handle = warm.handle.clone();
                        match self.warm.admit(warm) {
                            Ok(()) => self.watch_warm(handle),
                            Err(warm) => self.remove_warm(&warm).await,
                        }
                    }
                    Ok(Err(err)) => {
                        failed = true;
                        self.metrics
                            .note_error(format!("making a warm sandbox: {err}"));
                        tracing::warn!(error = %err, "could not make a warm sandbox");
                    }
                    Err(_) => {
                        // One made late is listed at this owner's next start.
                        failed = true;
                        tracing::warn!("making a warm sandbox timed out");
                    }
                }
            }
            self.note_warm();
            if failed {
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
            backoff.reset();
            tokio::select! {
                _ = self.warm.wake.notified() => {}
                _ = tokio::time::sleep(self.config.warm_check_every) => {}
            }
        }
    }

    /// On drain: every warm sandbox of this owner goes, the pool's and any
    /// whose making was cut short.
    async fn clear_warm(&self) {
        if self.warm.target() == 0 {
            return;
        }
        for warm in self.warm.drain(|_| false) {
            self.remove_warm(&warm).await;
        }
        self.note_warm();
        if let Ok(Ok(left)) = tokio::time::timeout(
            self.config.request_bound,
            self.launcher.existing_warm(&self.config.worker_id),
        )
        .await
        {
            for warm in left {
                self.remove_warm(&warm).await;
            }
        }
    }

    /// How long a hand-off may take: the launcher's start bound, and for a
    /// healthcheck no longer than what is left of its attempt.
    fn hand_off_bound(&self, item: &ItemIdentity, stamps: &Stamps) -> Duration {
        let bound = self.config.hand_off_bound;
        let made = stamps.get(Stage::Created).or(stamps.get(Stage::Bound));
        match (item.work_type, made) {
            (WorkType::Healthcheck, Some(created)) => bound.min(
                (created + self.config.healthcheck_attempt)
                    .saturating_duration_since(Instant::now()),
            ),
            _ => bound,
        }
    }

    /// Until the runner exits, its Work is stopped or reclaimed, a
    /// healthcheck's attempt runs out, or shutdown forces it; then the
    /// sandbox goes. On detach it is left as it is (`None`). A `keepable`
    /// one whose Work ends at its runner's idle end is kept instead.
    async fn watch(
        self: &Arc<Self>,
        sandbox: &Sandbox,
        mut verdict: watch::Receiver<Verdict>,
        stamps: &mut Stamps,
        keepable: bool,
    ) -> Option<Outcome> {
        let work_id = &sandbox.item.work_id;
        let attempt_ends = match sandbox.item.work_type {
            WorkType::Healthcheck => {
                let from = stamps
                    .get(Stage::Created)
                    .or(stamps.get(Stage::Bound))
                    .unwrap_or_else(Instant::now);
                Some(tokio::time::Instant::from_std(
                    from + self.config.healthcheck_attempt,
                ))
            }
            WorkType::Session => None,
        };
        let mut stopping_ends: Option<tokio::time::Instant> = None;
        let mut finish_ends: Option<tokio::time::Instant> = None;
        // While the engine is unavailable the sandbox may well be running:
        // it is watched again once the engine answers, never forgotten.
        let wait_after = |pause: Duration| async move {
            tokio::time::sleep(pause).await;
            self.launcher.wait(sandbox).await
        };
        let mut backoff = Backoff::new(&self.config);
        let exited = wait_after(Duration::ZERO);
        tokio::pin!(exited);
        let outcome = loop {
            tokio::select! {
                ended = &mut exited => {
                    match ended {
                        Ok(SandboxExit::Exited(code)) => {
                            tracing::info!(%work_id, sandbox = %sandbox.name, code, exit = exit_meaning(code), "the runner exited");
                        }
                        Ok(SandboxExit::Gone) => tracing::warn!(%work_id, sandbox = %sandbox.name, "the sandbox disappeared"),
                        Err(err @ LaunchError::Unavailable { .. }) => {
                            let pause = backoff.next();
                            tracing::error!(%work_id, sandbox = %sandbox.name, error = %err, ?pause, "cannot watch the sandbox while its engine is unavailable; retrying");
                            exited.set(wait_after(pause));
                            continue;
                        }
                        Err(err) => tracing::error!(%work_id, sandbox = %sandbox.name, error = %err, "could not watch the sandbox; removing it"),
                    }
                    stamps.mark(Stage::Exited);
                    break Outcome::Finished;
                }
                changed = verdict.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let now = *verdict.borrow_and_update();
                    match now {
                        Verdict::Over => {
                            tracing::info!(%work_id, sandbox = %sandbox.name, "its Work stopped or was reclaimed; removing the sandbox");
                            break Outcome::Cancelled;
                        }
                        // Its runner is asked now, not at its next heartbeat,
                        // and gets the grace to end the item and exit.
                        Verdict::Stopping if stopping_ends.is_none() => {
                            stopping_ends = Some(tokio::time::Instant::now() + self.config.stopping_grace);
                            self.signal_stop(sandbox).await;
                        }
                        // Its runner reported and is exiting: removing the
                        // sandbox now would cut its last steps short.
                        Verdict::Finished if finish_ends.is_none() => {
                            finish_ends = Some(tokio::time::Instant::now() + self.config.finish_grace);
                        }
                        // Its runner now waits for the Session's next envelope.
                        Verdict::Kept if keepable && !self.force.is_cancelled() => {
                            tracing::info!(%work_id, sandbox = %sandbox.name, keep = ?self.config.keep_idle, "its activation ended idle; keeping the sandbox for its Session's next");
                            self.keep(sandbox).await;
                            return Some(Outcome::Kept);
                        }
                        // One that waits, not to be kept, would wait on
                        // with nothing to deliver: it goes now.
                        Verdict::Kept if self.launcher.waits(sandbox) => {
                            tracing::info!(%work_id, sandbox = %sandbox.name, "its activation ended idle; its sandbox is not kept, removing it");
                            break Outcome::Finished;
                        }
                        // Its runner exits by itself, as after a Result.
                        Verdict::Kept if finish_ends.is_none() => {
                            finish_ends = Some(tokio::time::Instant::now() + self.config.finish_grace);
                        }
                        _ => {}
                    }
                }
                _ = sleep_until(stopping_ends) => {
                    tracing::warn!(%work_id, sandbox = %sandbox.name, grace = ?self.config.stopping_grace, "its Work is stopping and the signalled runner did not exit; removing the sandbox");
                    break Outcome::Cancelled;
                }
                _ = sleep_until(finish_ends) => {
                    tracing::warn!(%work_id, sandbox = %sandbox.name, grace = ?self.config.finish_grace, "its runner ended its Work but did not exit; removing the sandbox");
                    break Outcome::Cancelled;
                }
                _ = sleep_until(attempt_ends) => {
                    tracing::warn!(%work_id, sandbox = %sandbox.name, "the healthcheck's attempt ran out; removing the sandbox");
                    break Outcome::TimedOut;
                }
                _ = self.force.cancelled() => {
                    tracing::warn!(%work_id, sandbox = %sandbox.name, "shutting down: removing the sandbox of a running item");
                    break Outcome::Cancelled;
                }
                _ = self.detach.cancelled() => {
                    tracing::info!(%work_id, sandbox = %sandbox.name, "detaching: the sandbox keeps running for the next supervisor");
                    return None;
                }
            }
        };
        self.remove(sandbox).await;
        stamps.mark(Stage::Gone);
        self.observer
            .observe(Happening::Removed { sandbox, outcome });
        Some(outcome)
    }

    /// Asks the runner of a `stopping` item to stop, within the request
    /// bound. A request that fails is logged; the grace runs all the same,
    /// and the sandbox is removed after it.
    async fn signal_stop(&self, sandbox: &Sandbox) {
        let grace = self.config.stopping_grace;
        let asked = tokio::time::timeout(
            self.config.request_bound.min(grace),
            self.launcher.signal_stop(sandbox, grace),
        )
        .await;
        let work_id = &sandbox.item.work_id;
        match asked {
            Ok(Ok(())) => {
                tracing::info!(%work_id, sandbox = %sandbox.name, ?grace, "its Work is stopping; asked its runner to stop")
            }
            Ok(Err(err)) => {
                tracing::warn!(%work_id, sandbox = %sandbox.name, error = %err, "could not ask the runner to stop; removing the sandbox after the grace")
            }
            Err(_) => {
                tracing::warn!(%work_id, sandbox = %sandbox.name, "asking the runner to stop timed out; removing the sandbox after the grace")
            }
        }
    }

    /// Removes a sandbox, each request within the request bound, retrying
    /// (backing off) until the engine confirms it: a removal the engine does
    /// not confirm is reported, never hidden, and the item keeps its slot
    /// meanwhile. Only the end of the shutdown's bound gives up.
    async fn remove(&self, sandbox: &Sandbox) {
        let mut backoff = Backoff::new(&self.config);
        loop {
            let attempt =
                tokio::time::timeout(self.config.request_bound, self.launcher.remove(sandbox));
            let error = match attempt.await {
                Ok(Ok(())) => return,
                Ok(Err(err)) => err.to_string(),
                Err(_) => format!("no answer within {:?}", self.config.request_bound),
            };
            self.metrics.removal_errors.fetch_add(1, Relaxed);
            self.metrics
                .note_error(format!("removing sandbox {}: {error}", sandbox.name));
            self.observer.observe(Happening::RemovalUnconfirmed {
                sandbox,
                error: &error,
            });
            let pause = backoff.next();
            tracing::error!(sandbox = %sandbox.name, work_id = %sandbox.item.work_id, %error, ?pause, "could not confirm the removal of the sandbox; retrying");
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.abandon.cancelled() => {
                    tracing::error!(sandbox = %sandbox.name, work_id = %sandbox.item.work_id, "shutting down with the removal of this sandbox unconfirmed: remove it by hand");
                    return;
                }
            }
        }
    }

    async fn remove_named(&self, spec: &SandboxSpec) {
        let sandbox = Sandbox {
            name: spec.name.clone(),
            handle: spec.name.clone(),
            item: spec.item.clone(),
        };
        self.remove(&sandbox).await;
    }

    /// Reads the claims of every live item and tells each what they say.
    /// While the api cannot answer, verdicts stay as they were: a sandbox
    /// is never removed for want of an answer.
    async fn watch_claims(self: Arc<Self>) {
        let env = self.config.environment_id.clone();
        let mut tick = tokio::time::interval(self.config.claims_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ids: Vec<String> = self
                .live
                .lock()
                .expect("live lock")
                .keys()
                .cloned()
                .collect();
            for chunk in ids.chunks(100) {
                let answer = match self.ops.claims(&env, chunk).await {
                    Ok(answer) => answer,
                    Err(err) if matches!(err.status().map(|s| s.as_u16()), Some(401 | 403)) => {
                        // Revoked meanwhile: the items run on with their own
                        // tokens, but nothing new is taken on this key.
                        self.metrics
                            .note_error(format!("the api refused the Environment key: {err}"));
                        *self.refusal.lock().expect("refusal lock") = Some(err.to_string());
                        self.key_refused.cancel();
                        continue;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "could not read the claims of live items");
                        continue;
                    }
                };
                let states: HashMap<&str, &ClaimState> =
                    answer.data.iter().map(|c| (c.id.as_str(), c)).collect();
                let live = self.live.lock().expect("live lock");
                for id in chunk {
                    let Some(entry) = live.get(id) else { continue };
                    let verdict = verdict_of(states.get(id.as_str()).copied(), entry.claim);
                    entry.tell(verdict);
                }
            }
        }
    }

    /// Every `workspace_sweep_every`: the workspaces of Sessions the api
    /// says are deleted are removed (never one a live item uses). A sweep
    /// that cannot ask the api or reach the engine is retried next time.
    async fn sweep_workspaces(self: Arc<Self>) {
        let env = self.config.environment_id.clone();
        let every = self.config.workspace_sweep_every;
        // The first sweep waits a period: a starting supervisor has items first.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let kept = match tokio::time::timeout(
                self.config.request_bound,
                self.launcher.workspaces(&env),
            )
            .await
            {
                Ok(Ok(kept)) => kept,
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "could not list Session workspaces");
                    continue;
                }
                Err(_) => {
                    tracing::warn!("listing Session workspaces timed out");
                    continue;
                }
            };
            let in_use: Vec<String> = self
                .live
                .lock()
                .expect("live lock")
                .values()
                .filter_map(|l| l.session_id.clone())
                .collect();
            let candidates: Vec<String> =
                kept.into_iter().filter(|s| !in_use.contains(s)).collect();
            for chunk in candidates.chunks(100) {
                let deleted = match self.ops.deleted_sessions(&env, chunk).await {
                    Ok(answer) => answer.data,
                    Err(err) => {
                        tracing::warn!(error = %err, "could not ask which Sessions are deleted");
                        break;
                    }
                };
                for session_id in deleted.iter().filter(|s| chunk.contains(s)) {
                    if self.live_session(session_id) {
                        continue;
                    }
                    // Its kept sandbox goes first: it holds the workspace.
                    if let Some(kept) = self.kept.take(session_id) {
                        tracing::info!(sandbox = %kept.name, %session_id, "removing the kept sandbox of a deleted Session");
                        self.note_kept();
                        self.remove(&kept).await;
                    }
                    match tokio::time::timeout(
                        self.config.request_bound,
                        self.launcher.remove_workspace(session_id),
                    )
                    .await
                    {
                        Ok(Ok(())) => {
                            tracing::info!(%session_id, "removed the workspace of a deleted Session");
                            self.observer
                                .observe(Happening::WorkspaceRemoved { session_id });
                        }
                        Ok(Err(err)) => {
                            tracing::warn!(%session_id, error = %err, "could not remove the workspace of a deleted Session; retrying next sweep");
                        }
                        Err(_) => {
                            tracing::warn!(%session_id, "removing the workspace of a deleted Session timed out; retrying next sweep");
                        }
                    }
                }
            }
        }
    }

    fn live_session(&self, session_id: &str) -> bool {
        self.live
            .lock()
            .expect("live lock")
            .values()
            .any(|l| l.session_id.as_deref() == Some(session_id))
    }

    /// Leaves every running sandbox to the next supervisor: watching
    /// stops, launches in progress finish their hand-off, and removals
    /// already decided (a stopped Work's) finish, all within the request
    /// bound; whatever is still going then is abandoned (a sandbox left
    /// unstarted is removed by the next supervisor, its item reclaimed once
    /// its lease runs out).
    async fn detach(&self, items: &mut JoinSet<()>) {
        tracing::info!(
            live = self.live_count(),
            "no longer polling; leaving running sandboxes to the next supervisor"
        );
        self.detach.cancel();
        let bound = tokio::time::sleep(self.config.request_bound);
        tokio::pin!(bound);
        loop {
            tokio::select! {
                next = items.join_next() => if next.is_none() { return },
                _ = &mut bound => break,
            }
        }
        tracing::warn!(
            unfinished = items.len(),
            bound = ?self.config.request_bound,
            "launches or removals still in progress after the bound are abandoned"
        );
        items.abort_all();
        while items.join_next().await.is_some() {}
    }

    /// Lets running items finish for the shutdown grace, then removes what
    /// is left.
    async fn drain(&self, items: &mut JoinSet<()>) {
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                next = items.join_next() => if next.is_none() { return },
                _ = &mut grace => break,
            }
        }
        tracing::warn!(
            live = self.live_count(),
            "the shutdown grace is over; removing the sandboxes of running items"
        );
        self.force.cancel();
        let bound = tokio::time::sleep(self.config.request_bound * 2);
        tokio::pin!(bound);
        loop {
            tokio::select! {
                next = items.join_next() => if next.is_none() { return },
                _ = &mut bound => {
                    tracing::error!(live = self.live_count(), "sandboxes whose removal is not confirmed remain");
                    self.abandon.cancel();
                    // Each removal reports its sandbox by name as it gives up.
                    while items.join_next().await.is_some() {}
                    return;
                }
            }
        }
    }
}

/// The envelope line of `item`, carrying its secret: zeroed when dropped,
/// as the secret is.
fn envelope_of(item: &ItemIdentity, secret: &Secret) -> Secret {
    let mut envelope = Envelope {
        work_id: item.work_id.clone(),
        environment_id: item.environment_id.clone(),
        work_type: item.work_type,
        session_id: item.session_id.clone(),
        claim: item.claim,
        secret: secret.expose().to_string(),
    };
    let line = Secret::new(envelope.to_line());
    zeroize::Zeroize::zeroize(&mut envelope.secret);
    line
}

/// What a sandbox's exit status says, for its log line.
fn exit_meaning(code: i64) -> &'static str {
    match (mango_runner::exit::Exit::from_code(code as i32), code) {
        (Some(exit), _) => exit.as_str(),
        (None, 137) => "killed (SIGKILL: out of memory, or removed)",
        (None, 126 | 127) => "the runner could not be started",
        (None, _) => "not a runner's exit status",
    }
}

/// What a claim's state says of the live item of claim `ours`.
fn verdict_of(claim: Option<&ClaimState>, ours: i64) -> Verdict {
    match claim {
        // Another key's claim now (or no claim): not ours.
        None => Verdict::Over,
        Some(c) if c.claim != ours => Verdict::Over,
        // Its runner lost the lease (a runner that never heartbeats, say):
        // any Poll may take the item, so this activation is over.
        Some(c) if c.lease_lost => Verdict::Over,
        Some(c) if c.keepable => Verdict::Kept,
        Some(c) => match c.state {
            // Only the runner's own Result stops a Work with no Stop asked
            // for (or the api's deadline of a check long past its attempt).
            WorkState::Stopped if c.stop_requested_at.is_none() => Verdict::Finished,
            // A Stop: a cancellation has zero grace (spec §7).
            WorkState::Stopped => Verdict::Over,
            WorkState::Stopping => Verdict::Stopping,
            WorkState::Queued | WorkState::Starting | WorkState::Active => Verdict::Live,
        },
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Jittered exponential back-off between failed polls.
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &Config) -> Backoff {
        Backoff {
            first: config.first_backoff,
            max: config.max_backoff,
            next: config.first_backoff,
        }
    }

    fn reset(&mut self) {
        self.next = self.first;
    }

    /// The pause to take now: up to the current ceiling, at least half of it.
    fn next(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let ms = ceiling.as_millis().max(2) as u64;
        Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(state: WorkState, claim: i64, lease_lost: bool) -> ClaimState {
        ClaimState {
            id: "work_1".into(),
            state,
            claim,
            stop_requested_at: None,
            lease_lost,
            keepable: false,
        }
    }

    #[test]
    fn a_claim_is_live_only_while_it_is_ours_and_holds_its_lease() {
        use WorkState::*;
        assert_eq!(verdict_of(None, 1), Verdict::Over);
        for state in [Queued, Starting, Active] {
            assert_eq!(verdict_of(Some(&claim(state, 1, false)), 1), Verdict::Live);
            assert_eq!(verdict_of(Some(&claim(state, 1, true)), 1), Verdict::Over);
            assert_eq!(verdict_of(Some(&claim(state, 2, false)), 1), Verdict::Over);
        }
        assert_eq!(
            verdict_of(Some(&claim(Stopping, 1, false)), 1),
            Verdict::Stopping
        );
        // Stopped by its runner's own Result: the runner exits by itself.
        assert_eq!(
            verdict_of(Some(&claim(Stopped, 1, false)), 1),
            Verdict::Finished
        );
        // Stopped by a Stop (a cancellation): zero grace.
        let stopped = ClaimState {
            stop_requested_at: Some(mango_protocol::time::now()),
            ..claim(Stopped, 1, false)
        };
        assert_eq!(verdict_of(Some(&stopped), 1), Verdict::Over);
        let stopped_elsewhere = ClaimState {
            claim: 2,
            ..claim(Stopped, 1, false)
        };
        assert_eq!(verdict_of(Some(&stopped_elsewhere), 1), Verdict::Over);
    }

    #[test]
    fn only_an_idle_end_of_our_own_claim_keeps() {
        use WorkState::*;
        let idle = ClaimState {
            keepable: true,
            ..claim(Stopped, 1, false)
        };
        assert_eq!(verdict_of(Some(&idle), 1), Verdict::Kept);
        assert_eq!(
            verdict_of(Some(&idle), 2),
            Verdict::Over,
            "another claim's idle end is not this sandbox's"
        );
        let lost = ClaimState {
            keepable: true,
            ..claim(Stopped, 1, true)
        };
        assert_eq!(
            verdict_of(Some(&lost), 1),
            Verdict::Over,
            "a lost lease never keeps"
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps_and_resets() {
        let mut config = Config::new("env", "http://x");
        config.first_backoff = Duration::from_millis(100);
        config.max_backoff = Duration::from_millis(400);
        let mut b = Backoff::new(&config);
        let first = b.next();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        let second = b.next();
        assert!(second >= Duration::from_millis(100) && second <= Duration::from_millis(200));
        for _ in 0..10 {
            assert!(b.next() <= Duration::from_millis(400));
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(100));
    }
}
