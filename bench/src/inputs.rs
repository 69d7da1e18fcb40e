//! `inputs`: a Session's inputs (spec §9) made ready by the item runner
//! and by the official Python SDK's worker code, on the same server in the
//! same run, each stage timed by the worker itself around that stage only:
//!
//! * **Skills**: a Session pinning `--input-skills` (500) small custom Skills
//!   (a `SKILL.md` and a script each): the runner's `skills::materialize`
//!   (download, check length and digest, expand into a staged tree, swap it
//!   in) vs the SDK's `download_session_skills`;
//! * **store download**: a Session attaching a Memory Store of
//!   `--input-memories` (10,000) memories: `memory::Mounted::download` vs
//!   `SessionMemoryStores.download`;
//! * **idle sync**: that store's final sync at a clean end, nothing having
//!   changed: the runner's last `sync_all` vs the SDK's `finish()`.
//!
//! The runner side is the real `mango-runner` process serving the Session's
//! Work; its figures are the `elapsed_ms` of its own log lines. The SDK side
//! is `sdk_inputs.py` calling the stages as `EnvironmentWorker` does, on the
//! sub-client the worker builds from the Work secret, after the one snapshot
//! fetch both stages share. Skills and store are on separate Sessions, so
//! each figure is one stage's own.
//!
//! An Agent pins at most 64 Skills; a Session reaches its 500 scope-pins
//! (spec §9) through a coordinator's roster, whose Skills the SDK's worker
//! does not download. So the bench freezes 500 primary pins into the
//! Session's snapshot in SQL, as Session creation freezes pins (the
//! snapshot's pins with their names, lengths and digests, and the
//! `session_skill_pins` rows its token may download), and both sides read
//! the same snapshot.
//!
//! The runner's peak RSS (`VmHWM`) is read once its Skills are in place (a
//! tool call answered after them proves it) and before its Session ends.
//! Rounds alternate which side goes first; medians over rounds are compared.
//! Workspaces and store mounts live in the bench's scratch
//! ([`crate::harness::scratch_root`], a tmpfs where there is one), so that
//! what is compared is the workers' work, not the disk's.

use crate::chart::Chart;
use crate::harness::Bench;
use crate::http::{Api, Claim};
use crate::measure::percentile;
use crate::runner::{
    append_bash_call, claim, clean_command, hand_secret, locate_python, locate_worker,
    print_log_tail, proc_status_kib, result_text, runner_command, verdict, Launch, Scratch,
};
use anyhow::{bail, ensure, Context};
use futures::StreamExt;
use mango_api::service::admission::emit;
use mango_protocol::events::{types, EventBody};
use mango_testkit::work::try_sessions_token;
use reqwest::Method;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::RecvError;

/// Ours must take at most this fraction of the SDK's time, per stage.
pub const TARGET_RATIO: f64 = 0.5;
/// The runner's peak RSS while it materializes the Skills.
pub const TARGET_RSS_MIB: f64 = 32.0;
const SDK_DRIVER: &str = include_str!("sdk_inputs.py");
/// Inputs ready and the first tool call answered (either side).
const READY_TIMEOUT: Duration = Duration::from_secs(300);
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);
/// Setup requests in flight at once.
const SEED_CONCURRENCY: usize = 8;
/// Each bench Skill's files: `SKILL.md` and `scripts/run.sh`.
const FILES_PER_SKILL: usize = 2;

pub struct Options {
    pub skills: usize,
    pub memories: usize,
    pub rounds: usize,
}

/// One side's figures over the rounds (ms, MiB).
#[derive(Default)]
pub struct Figures {
    skills_ms: Vec<f64>,
    download_ms: Vec<f64>,
    idle_sync_ms: Vec<f64>,
    /// Peak RSS by the time the Skills were in place.
    skills_rss_mib: Vec<f64>,
    /// Peak RSS by the time the store was downloaded.
    store_rss_mib: Vec<f64>,
}

fn median(samples: &[f64]) -> f64 {
    percentile(&mut samples.to_vec(), 50.0)
}

fn peak(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(0.0, f64::max)
}

impl Figures {
    fn skills(&self) -> f64 {
        median(&self.skills_ms)
    }
    fn download(&self) -> f64 {
        median(&self.download_ms)
    }
    fn idle_sync(&self) -> f64 {
        median(&self.idle_sync_ms)
    }
}

pub struct InputsResult {
    runner: Figures,
    sdk: Option<Figures>,
}

impl InputsResult {
    /// Ours / the SDK's median, per stage: Skills, store download, idle sync.
    fn ratios(&self) -> Option<[f64; 3]> {
        let sdk = self.sdk.as_ref()?;
        let r = &self.runner;
        Some([
            r.skills() / sdk.skills(),
            r.download() / sdk.download(),
            r.idle_sync() / sdk.idle_sync(),
        ])
    }

    /// The runner's peak RSS while materializing, over every round.
    fn runner_rss_mib(&self) -> f64 {
        peak(&self.runner.skills_rss_mib)
    }

    /// Each stage's times over the rounds, ours beside the SDK's.
    pub fn chart(&self, opts: &Options) -> Chart {
        let mut chart = Chart::new(
            "inputs",
            format!(
                "inputs: {} Skills, a {}-memory store, one idle sync; {} rounds",
                opts.skills, opts.memories, opts.rounds
            ),
        );
        type Stage = fn(&Figures) -> &[f64];
        let stages: [(&str, Stage); 3] = [
            ("Skills materialized", |f| &f.skills_ms),
            ("store downloaded", |f| &f.download_ms),
            ("idle sync", |f| &f.idle_sync_ms),
        ];
        for (stage, samples) in stages {
            chart.case(format!("{stage}: mango-runner"), samples(&self.runner));
            match &self.sdk {
                Some(sdk) => chart.case(format!("{stage}: SDK"), samples(sdk)),
                None => chart.case(format!("{stage}: SDK (skipped)"), &[]),
            }
        }
        chart
    }

    pub fn line(&self) -> String {
        let ratio = |i: usize| {
            self.ratios()
                .map_or("n/a".to_string(), |r| format!("{:.3}", r[i]))
        };
        format!(
            "skills_ratio={} store_download_ratio={} idle_sync_ratio={} runner_inputs_rss_mib={:.2}",
            ratio(0),
            ratio(1),
            ratio(2),
            self.runner_rss_mib()
        )
    }
}

/// What every round uses: an Agent, the Skill versions to pin, a full store.
struct Fixture {
    agent: String,
    versions: Vec<String>,
    store: String,
    memories: usize,
}

pub async fn run(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<InputsResult> {
    let worker = locate_worker()?;
    let driver_dir = Scratch::new(&format!("{}_sdk_inputs", bench.db_name))?;
    let driver = driver_dir.0.join("sdk_inputs.py");
    std::fs::write(&driver, SDK_DRIVER).context("writing the SDK driver")?;
    let python = locate_python(&driver, "inputs").await;
    bench.clear_live().await?;
    println!(
        "inputs: workspaces and store mounts under {} (MANGO_BENCH_SCRATCH)",
        bench.scratch.display()
    );
    let fixture = seed(bench, opts).await?;
    // The setup's writes are flushed now, not by the checkpointer while a
    // pass measures.
    if let Some(why) = bench.settle().await {
        println!("inputs: could not settle the database after the setup ({why}); its flushing may weigh on the first passes");
    }
    let api = bench.api.with_new_client()?;

    let mut sides = vec![Launch::Runner(&worker)];
    if let Some(python) = &python {
        sides.push(Launch::Sdk {
            python,
            driver: &driver,
        });
    }
    let mut runner = Figures::default();
    let mut sdk = Figures::default();
    for round in 0..opts.rounds {
        println!("inputs: round {} of {}", round + 1, opts.rounds);
        // Alternate who goes first: the machine drifts.
        let order: Vec<Launch> = if round % 2 == 0 {
            sides.clone()
        } else {
            sides.iter().rev().copied().collect()
        };
        for side in order {
            let figures = match side {
                Launch::Runner(_) => &mut runner,
                Launch::Sdk { .. } => &mut sdk,
            };
            skills_pass(bench, &api, &fixture, side, figures).await?;
            store_pass(bench, &api, &fixture, side, figures).await?;
        }
    }
    let result = InputsResult {
        runner,
        sdk: python.is_some().then_some(sdk),
    };
    report(opts, &result);
    Ok(result)
}

// ---------------------------------------------------------------- setup (not measured)

async fn seed(bench: &Arc<Bench>, opts: &Options) -> anyhow::Result<Fixture> {
    let started = Instant::now();
    println!(
        "inputs: creating {} Skills ({FILES_PER_SKILL} files each) and a Memory Store of {} memories",
        opts.skills, opts.memories
    );
    let versions = in_parallel(opts.skills, "Skills", |i| {
        let bench = bench.clone();
        async move {
            let (_, version) = bench
                .app
                .create_skill(
                    &format!("bench-skill-{i:04}"),
                    "A small Skill of the bench.",
                )
                .await;
            version["id"].as_str().map(str::to_string)
        }
    })
    .await?;
    let store = bench.app.create_store("bench inputs").await;
    in_parallel(opts.memories, "memories", |i| {
        let (bench, store) = (bench.clone(), store.clone());
        async move {
            let note = format!(
                "# Note {i}\n\n{}\n",
                "Something the agent learned and keeps. ".repeat(3)
            );
            let path = format!("/notes/d{:03}/note-{i:05}.md", i / 100);
            let created = bench.app.create_memory(&store, &path, &note).await;
            created["id"].as_str().map(str::to_string)
        }
    })
    .await?;
    let agent = bench.api.create_agent("bench-inputs").await?;
    println!("inputs: set up in {:.1} s", started.elapsed().as_secs_f64());
    Ok(Fixture {
        agent,
        versions,
        store,
        memories: opts.memories,
    })
}

/// `make(i)` for every `i < count`, [`SEED_CONCURRENCY`] at a time, each in
/// its own task (the testkit's calls assert, so a failure is a panic of
/// that task); prints progress at every quarter.
async fn in_parallel<F, Fut>(count: usize, what: &str, make: F) -> anyhow::Result<Vec<String>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Option<String>> + Send + 'static,
{
    let mut made = Vec::with_capacity(count);
    let mut tasks = futures::stream::iter((0..count).map(|i| tokio::spawn(make(i))))
        .buffer_unordered(SEED_CONCURRENCY);
    while let Some(task) = tasks.next().await {
        let id = task
            .with_context(|| format!("creating {what}"))?
            .with_context(|| format!("created {what} without an id"))?;
        made.push(id);
        if made.len() % (count / 4).max(1) == 0 && made.len() < count {
            println!("inputs:   {} of {count} {what}", made.len());
        }
    }
    Ok(made)
}

/// A Session of the fixture's Agent pinning every Skill version: its
/// snapshot rewritten in SQL as creation would have frozen it, and checked
/// through the API.
async fn session_pinning(bench: &Bench, api: &Api, fx: &Fixture) -> anyhow::Result<String> {
    let session = api.create_session(&fx.agent, &bench.app.env_id).await?;
    let mut tx = bench.app.db.begin().await?;
    sqlx::query(
        "UPDATE sessions SET agent = jsonb_set(agent, '{skills}', (
             SELECT jsonb_agg(jsonb_build_object(
                 'type', 'custom', 'skill_id', v.skill_id, 'version', v.id, 'name', v.name,
                 'description', v.description, 'content_size_bytes', v.size_bytes,
                 'content_sha256', v.sha256) ORDER BY v.name)
             FROM skill_versions v WHERE v.id = ANY($2)))
         WHERE id = $1",
    )
    .bind(&session)
    .bind(&fx.versions)
    .execute(&mut *tx)
    .await
    .context("freezing the pins into the snapshot")?;
    sqlx::query(
        "INSERT INTO session_skill_pins (session_id, version_id, skill_id)
         SELECT $1, v.id, v.skill_id FROM skill_versions v WHERE v.id = ANY($2)",
    )
    .bind(&session)
    .bind(&fx.versions)
    .execute(&mut *tx)
    .await
    .context("recording the pins")?;
    tx.commit().await?;
    let read = bench
        .app
        .call(
            Method::GET,
            &format!("/v1/sessions/{session}"),
            Some(&bench.app.ws_key),
            None,
        )
        .await;
    let pinned = read.body["agent"]["skills"].as_array().map_or(0, Vec::len);
    ensure!(
        pinned == fx.versions.len(),
        "the Session's snapshot pins {pinned} Skills, not {}",
        fx.versions.len()
    );
    Ok(session)
}

/// A Session's Work, polled and acked as a supervisor would, after its first message.
async fn activate(api: &Api, session: &str) -> anyhow::Result<mango_protocol::Work> {
    api.send_message(session, "go").await?;
    claim(api, session).await
}

// ---------------------------------------------------------------- the passes

async fn skills_pass(
    bench: &Bench,
    api: &Api,
    fx: &Fixture,
    side: Launch<'_>,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let session = session_pinning(bench, api, fx).await?;
    let work = activate(api, &session).await?;
    let label = side.label();
    let files = fx.versions.len() * FILES_PER_SKILL;
    let scratch = Scratch::new_in(&bench.scratch, &format!("inputs_{label}"))?;
    let (ms, rss) = match side {
        Launch::Runner(worker) => {
            let mut served = Served::start(worker, bench, &work, &session, &scratch).await?;
            let counted = served.ask(bench, "find skills -type f | wc -l").await;
            let rss = served.peak_rss_mib();
            let log = served.end(bench, counted.is_err()).await?;
            let counted = counted?;
            ensure!(
                counted.trim() == files.to_string(),
                "runner: {} files under skills/, not {files}",
                counted.trim()
            );
            ensure!(
                !scratch.workspace().join("skills").exists(),
                "runner: the Skills were left in the workspace"
            );
            let ms = logged_ms(&log, "materialized the Session's Skills")?;
            (ms, rss?)
        }
        Launch::Sdk { python, driver } => {
            let out = sdk_stage(python, driver, bench, &work, &session, &scratch, "skills").await;
            stop_and_end(bench, api, &work, &session).await?;
            let out = out?;
            ensure!(
                out["files"].as_u64() == Some(files as u64),
                "sdk: {} files under skills/, not {files}",
                out["files"]
            );
            (number(&out, "skills_ms")?, number(&out, "rss_mib")?)
        }
    };
    println!(
        "  {label}: {} Skills ({files} files) materialized in {ms:.1} ms; peak RSS {rss:.2} MiB",
        fx.versions.len()
    );
    figures.skills_ms.push(ms);
    figures.skills_rss_mib.push(rss);
    Ok(())
}

async fn store_pass(
    bench: &Bench,
    api: &Api,
    fx: &Fixture,
    side: Launch<'_>,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let (session, mount) = api
        .create_session_attaching(&fx.agent, &bench.app.env_id, &fx.store)
        .await?;
    ensure!(
        !Path::new(&mount).exists(),
        "{mount} exists before the pass (an earlier worker left it)"
    );
    let work = activate(api, &session).await?;
    let label = side.label();
    let scratch = Scratch::new_in(&bench.scratch, &format!("inputs_{label}"))?;
    let (download, idle, rss) = match side {
        Launch::Runner(worker) => {
            let mut served = Served::start(worker, bench, &work, &session, &scratch).await?;
            let counted = served
                .ask(bench, &format!("find {mount}/notes -type f | wc -l"))
                .await;
            let rss = served.peak_rss_mib();
            let log = served.end(bench, counted.is_err()).await?;
            let counted = counted?;
            ensure!(
                counted.trim() == fx.memories.to_string(),
                "runner: {} files in the store's folder, not {}",
                counted.trim(),
                fx.memories
            );
            let last_sync = logged(&log, "memory store synced for the last time")?;
            let outcome = last_sync["outcome"].as_str().unwrap_or_default();
            ensure!(
                outcome.contains("pulled: 0, pushed: 0, removed_locally: 0, deleted_remotely: 0"),
                "runner: the final sync was not idle: {outcome}"
            );
            (
                logged_ms(&log, "memory store downloaded")?,
                number(&last_sync, "elapsed_ms")?,
                rss?,
            )
        }
        Launch::Sdk { python, driver } => {
            let out = sdk_stage(python, driver, bench, &work, &session, &scratch, "store").await;
            stop_and_end(bench, api, &work, &session).await?;
            let out = out?;
            ensure!(
                out["files"].as_u64() == Some(fx.memories as u64),
                "sdk: {} files in the store's folder, not {}",
                out["files"],
                fx.memories
            );
            ensure!(
                out["left_on_disk"] == false,
                "sdk: the store's folder was left on disk"
            );
            (
                number(&out, "download_ms")?,
                number(&out, "idle_sync_ms")?,
                number(&out, "rss_mib")?,
            )
        }
    };
    ensure!(
        !Path::new(&mount).exists(),
        "{label}: the store's folder {mount} was left on disk"
    );
    println!(
        "  {label}: store of {} memories downloaded in {download:.1} ms, idle sync {idle:.1} ms; peak RSS {rss:.2} MiB",
        fx.memories
    );
    figures.download_ms.push(download);
    figures.idle_sync_ms.push(idle);
    figures.store_rss_mib.push(rss);
    Ok(())
}

/// A `mango-runner` process serving one Session's Work.
struct Served<'a> {
    child: tokio::process::Child,
    pid: u32,
    session: String,
    scratch: &'a Scratch,
}

impl<'a> Served<'a> {
    async fn start(
        worker: &Path,
        bench: &Bench,
        work: &mango_protocol::Work,
        session: &str,
        scratch: &'a Scratch,
    ) -> anyhow::Result<Served<'a>> {
        let secret = work.secret.as_deref().context("Poll returned no secret")?;
        let mut child = runner_command(worker, bench, &work.id, session, &scratch.workspace())
            // No sync after the tool call: only the final one is measured.
            .env("MANGO_MEMORY_SYNC_INTERVAL_SECONDS", "3600")
            .current_dir(scratch.workspace())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.log())?)
            .kill_on_drop(true)
            .spawn()
            .context("starting mango-runner")?;
        hand_secret(&mut child, secret).await?;
        let pid = child.id().context("the runner has no pid")?;
        Ok(Served {
            child,
            pid,
            session: session.to_string(),
            scratch,
        })
    }

    /// Appends an `agent.tool_use` running `command` in bash and returns
    /// the result's text; the runner answers only once its inputs are ready.
    async fn ask(&mut self, bench: &Bench, command: &str) -> anyhow::Result<String> {
        let mut feed = bench.app.ctx.events.subscribe(&self.session);
        let call = append_bash_call(bench, &self.session, command).await?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            tokio::select! {
                got = tokio::time::timeout_at(deadline, feed.recv()) => match got {
                    Ok(Ok(event)) if event.body["type"] == types::USER_TOOL_RESULT
                        && event.body["tool_use_id"] == call.as_str() =>
                    {
                        ensure!(event.body["is_error"] != true, "runner: the tool call failed: {}", event.body);
                        return Ok(result_text(&event.body));
                    }
                    Ok(Ok(_)) | Ok(Err(RecvError::Lagged(_))) => {}
                    Ok(Err(RecvError::Closed)) => bail!("runner: the Session's feed ended"),
                    Err(_) => bail!("runner: no answer to `{command}` within {READY_TIMEOUT:?}"),
                },
                status = self.child.wait() => bail!("runner: exited ({}) before answering `{command}`", status?),
            }
        }
    }

    fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        proc_status_kib(self.pid, "VmHWM")
            .map(|kib| kib as f64 / 1024.0)
            .with_context(|| format!("cannot read VmHWM from /proc/{}/status", self.pid))
    }

    /// Ends the Session; the runner runs its end (the final sync) and exits
    /// by itself. Returns its log.
    async fn end(mut self, bench: &Bench, failed: bool) -> anyhow::Result<String> {
        emit(
            &bench.app.ctx,
            &self.session,
            vec![EventBody::SessionStatusTerminated],
        )
        .await
        .map_err(|e| anyhow::anyhow!("terminating the Session: {e:?}"))?;
        let exited = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await;
        let log_path = self.scratch.log();
        let status = match exited {
            Ok(status) => status?,
            Err(_) => {
                self.child.kill().await.ok();
                print_log_tail(&log_path, "runner");
                bail!("runner: did not exit within {EXIT_TIMEOUT:?} of the Session's end");
            }
        };
        if failed || !status.success() {
            print_log_tail(&log_path, "runner");
        }
        ensure!(status.success(), "runner: exited with {status}");
        std::fs::read_to_string(&log_path).context("reading the runner's log")
    }
}

/// The SDK driver's `stage` for Session `session`: its JSON report.
async fn sdk_stage(
    python: &Path,
    driver: &Path,
    bench: &Bench,
    work: &mango_protocol::Work,
    session: &str,
    scratch: &Scratch,
    stage: &str,
) -> anyhow::Result<Value> {
    let secret = work.secret.as_deref().context("Poll returned no secret")?;
    let run = clean_command(python)
        .arg(driver)
        .arg(stage)
        .arg(scratch.workspace())
        .env("ANTHROPIC_BASE_URL", &bench.app.base)
        .env("ANTHROPIC_SESSION_ID", session)
        .env("ANTHROPIC_WORK_SECRET", secret)
        .current_dir(scratch.workspace())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(READY_TIMEOUT, run)
        .await
        .with_context(|| format!("sdk: the {stage} stage took over {READY_TIMEOUT:?}"))?
        .context("running the SDK driver")?;
    if !out.status.success() {
        bail!(
            "sdk: the {stage} stage exited with {}: {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr))
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).with_context(|| {
        format!(
            "sdk: the {stage} stage printed no report: {}",
            tail(&stdout)
        )
    })
}

/// After the SDK driver: the Work stopped with its sessions token (as the
/// worker's own final stop), then the Session ended.
async fn stop_and_end(
    bench: &Bench,
    api: &Api,
    work: &mango_protocol::Work,
    session: &str,
) -> anyhow::Result<()> {
    let secret = work.secret.as_deref().context("Poll returned no secret")?;
    let claim = Claim {
        id: work.id.clone(),
        token: try_sessions_token(secret)?,
    };
    api.stop(&claim).await?;
    emit(
        &bench.app.ctx,
        session,
        vec![EventBody::SessionStatusTerminated],
    )
    .await
    .map_err(|e| anyhow::anyhow!("terminating the Session: {e:?}"))?;
    Ok(())
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn number(report: &Value, key: &str) -> anyhow::Result<f64> {
    report[key]
        .as_f64()
        .with_context(|| format!("no number {key} in {report}"))
}

/// The fields of the runner's (JSON) log line whose message is `message`.
fn logged(log: &str, message: &str) -> anyhow::Result<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == message)
        .map(|line| line["fields"].clone())
        .with_context(|| format!("runner: no `{message}` in its log"))
}

fn logged_ms(log: &str, message: &str) -> anyhow::Result<f64> {
    number(&logged(log, message)?, "elapsed_ms")
}

fn report(opts: &Options, result: &InputsResult) {
    let r = &result.runner;
    println!(
        "inputs: medians over {} rounds           runner         SDK   ratio (target ≤ {TARGET_RATIO})",
        opts.rounds
    );
    let rows = [
        (
            format!("materialize {} Skills", opts.skills),
            r.skills(),
            result.sdk.as_ref().map(Figures::skills),
        ),
        (
            format!("download a {}-file store", opts.memories),
            r.download(),
            result.sdk.as_ref().map(Figures::download),
        ),
        (
            "one idle sync pass".to_string(),
            r.idle_sync(),
            result.sdk.as_ref().map(Figures::idle_sync),
        ),
    ];
    for (what, ours, theirs) in rows {
        match theirs {
            Some(theirs) => {
                let ratio = ours / theirs;
                println!(
                    "  {what:<32} {ours:>9.1} ms {theirs:>9.1} ms   {ratio:.3} {}",
                    verdict(ratio <= TARGET_RATIO)
                );
            }
            None => println!("  {what:<32} {ours:>9.1} ms       n/a (SDK half skipped)"),
        }
    }
    let rss = result.runner_rss_mib();
    println!(
        "inputs: runner peak RSS materializing the Skills {rss:.2} MiB (target ≤ {TARGET_RSS_MIB:.0}: {}), downloading the store {:.2} MiB{}",
        verdict(rss <= TARGET_RSS_MIB),
        peak(&r.store_rss_mib),
        result.sdk.as_ref().map_or(String::new(), |s| format!(
            "; SDK driver {:.2} / {:.2} MiB",
            peak(&s.skills_rss_mib),
            peak(&s.store_rss_mib)
        ))
    );
}
