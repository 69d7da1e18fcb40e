//! `ttfi`: time to first tool call, end to end (issue 26 item 5). The api
//! runs its agent loop against a scripted model (mango-testkit's, asking
//! for one `bash` call at once, then ending the turn); a sample is the time
//! from a `user.message` send returning to the Session's first
//! `user.tool_result`, as the api publishes it.
//!
//! Cases, interleaved turn by turn (each a new Session, its first
//! activation, but for the kept case), each on its own Environment:
//! * Docker cold: the supervisor core in this process, `--warm 0`;
//! * Docker warm: the same with a warm pool (`--ttfi-warm`), full before
//!   each turn; also poll → first heartbeat (the supervisor's `polled`
//!   stamp to the api's `started_at`) p50/p99;
//! * Docker kept: the core keeping Sessions' sandboxes (`--keep-idle`);
//!   each turn is a follow-up of one Session, sent once its last
//!   activation ended idle and its sandbox is kept (see [`kept_image`] for
//!   how the bench shortens the runner's wait for that idle end);
//! * local: the core with the local launcher (`mango-worker local`);
//! * SDK: the bench polls and acks, and starts the official Python SDK's
//!   `EnvironmentWorker.handle_item()` per item (the peer baseline);
//!
//! Then the Kubernetes launcher against the strict fake apiserver
//! ([`k8s`]): Ack → delivered, cold, warm and kept.
//!
//! Then `mango-worker docker` as its own process: its RSS idle without a
//! pool and with a pool of `--ttfi-burst` (20) full, and that many new
//! Sessions at once on that pool (the largest TTFI).
//!
//! Every figure is printed as a ratio against Docker cold of the same run
//! (Kubernetes warm and kept against Kubernetes cold). `--ttfi-only k8s`
//! runs the Kubernetes cases alone (no Docker engine, image or Python).

mod burst;
mod cases;
mod k8s;
mod kept_image;
mod turn;

use crate::harness::Bench;
use crate::http::Api;
use crate::runner::{locate_python, Scratch, SDK_DRIVER};
use crate::supervisor::{beside_me, clean, config, docker_args, DockerEnv, InProcess};
use anyhow::Context;
use cases::{Case, Server};
use mango_controller::core::launcher::Launcher;
use mango_controller::docker::DockerLauncher;
use mango_controller::local::{LocalLauncher, RunnerCommand};
use std::time::Duration;
pub use turn::{Spread, COMMAND};

/// The targets of issue 26 item 5.
const TARGET_WARM_BEAT_P50_MS: f64 = 30.0;
const TARGET_WARM_BEAT_P99_MS: f64 = 100.0;
const TARGET_WARM_RATIO: f64 = 0.15;
const TARGET_KEPT_RATIO: f64 = 0.1;
const TARGET_WARM_VS_SDK: f64 = 0.2;
const TARGET_BURST_MAX_MS: f64 = 1500.0;
const TARGET_RSS_MIB: f64 = 30.0;
/// The most `--ttfi-burst` and `--ttfi-warm` may ask for: `--warm`'s bound.
pub const MAX_WARM: usize = 100;

const TARGET_K8S_DELIVERED_P50_MS: f64 = 15.0;
/// How long the kept case's sandboxes wait for their Session's next
/// envelope: far longer than a round of the other cases.
const KEEP_IDLE: Duration = Duration::from_secs(300);

/// A part of `ttfi` run alone (`--ttfi-only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// The Kubernetes launcher against the strict fake: cold, warm, kept.
    K8s,
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Measured turns per case.
    pub turns: usize,
    /// Unmeasured turns per case before them.
    pub warmup: usize,
    /// The Docker warm case's pool.
    pub warm: usize,
    /// Sessions at once in the burst, and its pool.
    pub burst: usize,
    /// Only this part; `None`: every case.
    pub only: Option<Only>,
}

impl Options {
    /// The figures' defaults, or the smoke test's quick run.
    pub fn new(
        turns: usize,
        warm: usize,
        burst: usize,
        quick: bool,
        only: Option<Only>,
    ) -> Options {
        if quick {
            return Options {
                turns: 2,
                warmup: 0,
                warm: 1,
                burst: 2,
                only,
            };
        }
        Options {
            turns,
            warmup: 1,
            warm,
            burst,
            only,
        }
    }

    /// Whether the Docker, local and SDK cases run (they need an engine,
    /// an image or Python).
    pub fn all_cases(&self) -> bool {
        self.only.is_none()
    }

    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.turns > 0, "--ttfi-turns must be at least 1");
        anyhow::ensure!(
            (1..=MAX_WARM).contains(&self.warm),
            "--ttfi-warm must be from 1 to {MAX_WARM} (mango-worker's --warm bound)"
        );
        anyhow::ensure!(
            (1..=MAX_WARM).contains(&self.burst),
            "--ttfi-burst must be from 1 to {MAX_WARM} (mango-worker's --warm bound)"
        );
        Ok(())
    }
}

/// An Environment of its own for one case, its key, and the calls against it.
pub struct Environment {
    pub id: String,
    pub key: String,
    pub api: Api,
}

impl Environment {
    async fn new(bench: &Bench, name: &str) -> Environment {
        let id = bench.app.create_environment(name).await;
        let (_, key) = bench.app.environment_key(&id).await;
        let api = bench.api.on_environment(&id, &key);
        Environment { id, key, api }
    }
}

pub struct TtfiResult {
    pub cold: Option<Spread>,
    pub cold_beat: Option<Spread>,
    pub warm: Option<Spread>,
    pub warm_beat: Option<Spread>,
    pub kept: Option<Spread>,
    pub local: Option<Spread>,
    pub sdk: Option<Spread>,
    pub burst: Option<burst::BurstResult>,
    pub k8s: k8s::KubeResult,
}

fn na(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
}

impl TtfiResult {
    /// The machine-readable line.
    pub fn line(&self) -> String {
        let p50 = |s: &Option<Spread>| s.map(|s| s.p50);
        let burst = self.burst.as_ref();
        format!(
            "ttfi_cold_p50_ms={} ttfi_warm_p50_ms={} ttfi_kept_p50_ms={} ttfi_sdk_p50_ms={} warm_first_beat_p50_ms={} warm_first_beat_p99_ms={} burst20_max_ms={} k8s_warm_delivered_p50_ms={} supervisor_warm_rss_mib={}",
            na(p50(&self.cold), 1),
            na(p50(&self.warm), 1),
            na(p50(&self.kept), 1),
            na(p50(&self.sdk), 1),
            na(p50(&self.warm_beat), 1),
            na(self.warm_beat.map(|s| s.p99), 1),
            na(burst.map(|b| b.max_ms), 1),
            na(p50(&self.k8s.warm), 2),
            na(burst.map(|b| b.warm_rss_mib), 2),
        )
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "MISSES"
    }
}

/// `= 0.123× Docker cold's 456.7 ms`, or why there is no ratio.
fn vs(value: f64, base: Option<f64>, what: &str) -> String {
    match base {
        Some(b) if b > 0.0 => format!("= {:.3}× Docker cold's {b:.1} {what}", value / b),
        _ => "(no Docker cold figure to compare with)".into(),
    }
}

/// The machine's load average, said with the figures: other work on it
/// weighs on every case alike (they are interleaved), not on the ratios'
/// fairness.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Removes the Docker workspaces of `sessions` through a launcher of `pool`
/// (a bounded workspace's filesystem goes with its volume).
async fn remove_workspaces(sandboxes: &burst::Sandboxes<'_>, pool: &str, sessions: &[String]) {
    let Ok(args) = docker_args(sandboxes.image, sandboxes.base_url) else {
        return;
    };
    let Ok(launcher) = DockerLauncher::connect(&args, pool).await else {
        return;
    };
    for session in sessions {
        if let Err(err) = launcher.remove_workspace(session).await {
            println!("ttfi: could not remove {session}'s workspace: {err}");
        }
    }
}

pub async fn run(
    bench: &Bench,
    opts: &Options,
    docker: Option<Result<DockerEnv, String>>,
) -> anyhow::Result<TtfiResult> {
    if opts.only == Some(Only::K8s) {
        return run_k8s_only(bench, opts).await;
    }
    println!(
        "ttfi: {} measured turns per case (after {} warm-up), interleaved; the scripted model asks for `{COMMAND}` at once; load average {}",
        opts.turns,
        opts.warmup,
        load()
    );
    let agent = bench
        .api
        .create_agent_with_tools("bench-ttfi", "claude-scripted")
        .await?;
    let scratch = Scratch::new(&format!("{}_ttfi", bench.db_name))?;
    let driver = scratch.0.join("sdk_worker.py");
    std::fs::write(&driver, SDK_DRIVER).context("writing the SDK driver")?;
    let python = locate_python(&driver, "ttfi").await;

    let mut cases: Vec<Case> = Vec::new();
    let docker = match docker {
        Some(Ok(env)) => Some(env),
        Some(Err(why)) => {
            println!("ttfi: Docker cases n/a: {why}");
            None
        }
        None => None,
    };
    let sandbox_base = match bench.app.also.first() {
        Some(addr) => format!("http://host.docker.internal:{}", addr.port()),
        None => String::new(),
    };
    let mut docker_pools = Vec::new();
    let mut kept_image = None;
    if let Some(env) = &docker {
        let args = docker_args(&env.image, &sandbox_base)?;
        for (label, warm) in [("docker cold", 0), ("docker warm", opts.warm)] {
            let pool = crate::supervisor::pool(if warm == 0 { "ttfi-cold" } else { "ttfi-warm" });
            let launcher = DockerLauncher::connect(&args, &pool)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let environment = Environment::new(bench, label).await;
            let mut config = config(bench, &sandbox_base, &pool, 2);
            config.environment_id = environment.id.clone();
            config.warm = warm;
            // Stopped Work's sandboxes go sooner (between turns, not measured).
            config.claims_every = Duration::from_millis(500);
            let running =
                InProcess::start_with_key(bench, config, launcher, &environment.key).await?;
            docker_pools.push(pool);
            cases.push(Case::new(
                label,
                environment,
                Server::Core { running, warm },
            ));
        }
        let image = kept_image::derive(&env.docker, &env.image).await?;
        kept_image = Some(image.clone());
        let pool = crate::supervisor::pool("ttfi-kept");
        let launcher = DockerLauncher::connect(&docker_args(&image, &sandbox_base)?, &pool)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .with_keep_idle(KEEP_IDLE);
        let environment = Environment::new(bench, "docker kept").await;
        let mut config = config(bench, &sandbox_base, &pool, 2);
        config.environment_id = environment.id.clone();
        config.warm = 0;
        config.keep_idle = KEEP_IDLE;
        // The idle end is read sooner, so the sandbox is kept sooner
        // (between turns, not measured).
        config.claims_every = Duration::from_millis(500);
        let running = InProcess::start_with_key(bench, config, launcher, &environment.key).await?;
        docker_pools.push(pool);
        cases.push(Case::new(
            "docker kept",
            environment,
            Server::Kept {
                running,
                session: None,
            },
        ));
    }
    {
        let runner = beside_me("mango-runner")?;
        let pool = crate::supervisor::pool("ttfi-local");
        let launcher =
            LocalLauncher::new(RunnerCommand::new(runner), scratch.0.join("local"), &pool)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        let environment = Environment::new(bench, "local").await;
        let mut config = config(bench, &bench.app.base, &pool, 2);
        config.environment_id = environment.id.clone();
        config.claims_every = Duration::from_millis(500);
        let running = InProcess::start_with_key(bench, config, launcher, &environment.key).await?;
        cases.push(Case::new(
            "local",
            environment,
            Server::Core { running, warm: 0 },
        ));
    }
    match &python {
        Some(python) => {
            let environment = Environment::new(bench, "sdk").await;
            cases.push(Case::new(
                "sdk",
                environment,
                Server::Sdk {
                    python: python.clone(),
                    driver: driver.clone(),
                },
            ));
        }
        None => println!("ttfi: sdk case n/a: no Python with the official SDK (see above)"),
    }

    let interleaved = interleave(bench, &agent, &mut cases, opts).await;
    let mut failure = interleaved.err();
    let mut finished = Vec::new();
    for case in cases {
        case.report_steps();
        let Case {
            label,
            server,
            ttfi,
            first_beat,
            went_cold,
            sessions,
            ..
        } = case;
        if let Server::Core { running, .. } | Server::Kept { running, .. } = server {
            if let Err(err) = running.shutdown().await {
                println!("ttfi: {label}: {err:#}");
                failure.get_or_insert(err);
            }
        }
        finished.push((label, ttfi, first_beat, went_cold, sessions));
    }
    if let Some(env) = &docker {
        let sandboxes = burst::Sandboxes {
            base_url: &sandbox_base,
            image: &env.image,
            docker: &env.docker,
        };
        for ((.., sessions), pool) in finished
            .iter()
            .filter(|(label, ..)| label.starts_with("docker"))
            .zip(&docker_pools)
        {
            remove_workspaces(&sandboxes, pool, sessions).await;
        }
        let pools: Vec<&str> = docker_pools.iter().map(String::as_str).collect();
        clean(&env.docker, &pools, &[]).await;
        if let Some(image) = &kept_image {
            kept_image::remove(&env.docker, image).await;
        }
    }
    if let Some(err) = failure {
        return Err(err);
    }
    let spread_of = |name: &str, beats: bool| {
        finished
            .iter()
            .find(|(label, ..)| *label == name)
            .and_then(|(_, ttfi, beat, ..)| Spread::of(if beats { beat } else { ttfi }))
    };
    let went_cold = |name: &str| {
        finished
            .iter()
            .find(|(label, ..)| *label == name)
            .map(|(.., went_cold, _)| *went_cold)
    };
    let went_cold = (went_cold("docker warm"), went_cold("docker kept"));
    let mut result = TtfiResult {
        cold: spread_of("docker cold", false),
        cold_beat: spread_of("docker cold", true),
        warm: spread_of("docker warm", false),
        warm_beat: spread_of("docker warm", true),
        kept: spread_of("docker kept", false),
        local: Some(spread_of("local", false).context("the local case has no samples")?),
        sdk: spread_of("sdk", false),
        burst: None,
        k8s: k8s::run(bench, &agent, opts).await?,
    };
    if let Some(env) = &docker {
        let sandboxes = burst::Sandboxes {
            base_url: &sandbox_base,
            image: &env.image,
            docker: &env.docker,
        };
        let cold_env = Environment::new(bench, "rss cold").await;
        let warm_env = Environment::new(bench, "burst").await;
        result.burst = Some(
            burst::run(
                bench,
                &agent,
                (&cold_env, &warm_env),
                &sandboxes,
                opts.burst,
            )
            .await?,
        );
    }
    report(&result, went_cold, opts);
    println!("ttfi: load average at the end {}", load());
    Ok(result)
}

/// `--ttfi-only k8s`: the Kubernetes cases alone.
async fn run_k8s_only(bench: &Bench, opts: &Options) -> anyhow::Result<TtfiResult> {
    println!(
        "ttfi: kubernetes only: {} measured turns per case (after {} warm-up), interleaved; load average {}",
        opts.turns,
        opts.warmup,
        load()
    );
    let agent = bench
        .api
        .create_agent_with_tools("bench-ttfi", "claude-scripted")
        .await?;
    let k8s = k8s::run(bench, &agent, opts).await?;
    k8s::report(&k8s, TARGET_K8S_DELIVERED_P50_MS);
    println!("ttfi: load average at the end {}", load());
    Ok(TtfiResult {
        cold: None,
        cold_beat: None,
        warm: None,
        warm_beat: None,
        kept: None,
        local: None,
        sdk: None,
        burst: None,
        k8s,
    })
}

/// Every case one turn at a time, round after round; each round starts
/// one case later, so no case always follows the same one.
async fn interleave(
    bench: &Bench,
    agent: &str,
    cases: &mut [Case],
    opts: &Options,
) -> anyhow::Result<()> {
    for round in 0..opts.warmup + opts.turns {
        let measured = round >= opts.warmup;
        let n = cases.len();
        for i in 0..n {
            cases[(round + i) % n].turn(bench, agent, measured).await?;
        }
    }
    Ok(())
}

/// `went_cold`: how many measured turns of the warm and of the kept case
/// found no sandbox to reuse.
fn report(r: &TtfiResult, went_cold: (Option<usize>, Option<usize>), opts: &Options) {
    let cold = r.cold.map(|s| s.p50);
    match r.cold {
        Some(c) => println!("ttfi: docker cold: TTFI {c}"),
        None => println!("ttfi: docker cold: n/a (no Docker engine or image; see above)"),
    }
    if let Some(b) = r.cold_beat {
        println!("ttfi: docker cold: poll → first heartbeat {b}");
    }
    match r.warm {
        Some(w) => {
            println!(
                "ttfi: docker warm (pool of {}): TTFI {w} {} (target ≤ {TARGET_WARM_RATIO}×): {}",
                opts.warm,
                vs(w.p50, cold, "ms"),
                verdict(cold.is_some_and(|c| w.p50 <= TARGET_WARM_RATIO * c))
            );
            if let Some(n) = went_cold.0 {
                println!(
                    "ttfi: docker warm: {} of {} measured turns bound a warm sandbox",
                    w.n - n,
                    w.n
                );
            }
        }
        None => println!("ttfi: docker warm: n/a (no Docker engine or image; see above)"),
    }
    if let Some(b) = r.warm_beat {
        println!(
            "ttfi: docker warm: poll → first heartbeat {b} {} (targets p50 ≤ {TARGET_WARM_BEAT_P50_MS} ms: {}, p99 ≤ {TARGET_WARM_BEAT_P99_MS} ms: {})",
            vs(b.p50, r.cold_beat.map(|c| c.p50), "ms (p50)"),
            verdict(b.p50 <= TARGET_WARM_BEAT_P50_MS),
            verdict(b.p99 <= TARGET_WARM_BEAT_P99_MS)
        );
    }
    match r.kept {
        Some(k) => {
            println!(
                "ttfi: docker kept (follow-up turns, runner idle end after {} s): TTFI {k} {} (target ≤ {TARGET_KEPT_RATIO}×): {}",
                kept_image::IDLE_AFTER_END_TURN_SECONDS,
                vs(k.p50, cold, "ms"),
                verdict(cold.is_some_and(|c| k.p50 <= TARGET_KEPT_RATIO * c))
            );
            if let Some(n) = went_cold.1 {
                println!(
                    "ttfi: docker kept: {} of {} measured turns were served by the Session's kept sandbox",
                    k.n - n,
                    k.n
                );
            }
        }
        None => println!("ttfi: docker kept: n/a (no Docker engine or image; see above)"),
    }
    if let Some(local) = r.local {
        println!("ttfi: local: TTFI {local} {}", vs(local.p50, cold, "ms"));
    }
    match (r.sdk, r.warm) {
        (Some(s), warm) => {
            println!(
                "ttfi: sdk (EnvironmentWorker per item): TTFI {s} {}",
                vs(s.p50, cold, "ms")
            );
            if let Some(w) = warm {
                let ratio = w.p50 / s.p50;
                println!(
                    "ttfi: docker warm / sdk, p50: {ratio:.3} (target ≤ {TARGET_WARM_VS_SDK}): {}",
                    verdict(ratio <= TARGET_WARM_VS_SDK)
                );
            }
        }
        (None, _) => println!("ttfi: sdk: n/a (see above)"),
    }
    k8s::report(&r.k8s, TARGET_K8S_DELIVERED_P50_MS);
    match &r.burst {
        Some(b) => {
            println!(
                "ttfi: burst of {} new Sessions with {} warm: largest TTFI {:.1} ms {} (target ≤ {TARGET_BURST_MAX_MS} ms with 20: {}); {} of {} served warm",
                b.sessions,
                b.sessions,
                b.max_ms,
                vs(b.max_ms, cold, "ms TTFI p50"),
                verdict(b.max_ms <= TARGET_BURST_MAX_MS),
                b.warm_bound,
                b.sessions
            );
            println!(
                "ttfi: supervisor RSS with a warm pool of {}: {:.2} MiB = {:.3}× the cold supervisor's idle {:.2} MiB (target ≤ {TARGET_RSS_MIB} MiB with 20: {})",
                b.sessions,
                b.warm_rss_mib,
                b.warm_rss_mib / b.cold_rss_mib,
                b.cold_rss_mib,
                verdict(b.warm_rss_mib <= TARGET_RSS_MIB)
            );
        }
        None => {
            println!("ttfi: burst and supervisor RSS: n/a (no Docker engine or image; see above)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_at_their_edges() {
        let ok = |turns, warm, burst| Options::new(turns, warm, burst, false, None).check();
        assert!(ok(1, 1, 1).is_ok());
        assert!(ok(30, MAX_WARM, MAX_WARM).is_ok());
        assert!(ok(0, 2, 20)
            .unwrap_err()
            .to_string()
            .contains("--ttfi-turns"));
        assert!(ok(30, 0, 20)
            .unwrap_err()
            .to_string()
            .contains("--ttfi-warm"));
        assert!(ok(30, MAX_WARM + 1, 20)
            .unwrap_err()
            .to_string()
            .contains("--ttfi-warm"));
        assert!(ok(30, 2, 0)
            .unwrap_err()
            .to_string()
            .contains("--ttfi-burst"));
        assert!(ok(30, 2, MAX_WARM + 1)
            .unwrap_err()
            .to_string()
            .contains("--ttfi-burst"));
        let quick = Options::new(0, 0, 0, true, Some(Only::K8s));
        assert!(quick.check().is_ok(), "quick mode ignores the counts");
        assert!(quick.turns < 30 && quick.burst < 20);
        assert_eq!(
            quick.only,
            Some(Only::K8s),
            "quick keeps the part asked for"
        );
    }

    #[test]
    fn the_line_has_every_key_in_order_and_n_a_where_a_case_did_not_run() {
        let s = |p50| Spread {
            p50,
            p90: p50,
            p99: p50 * 2.0,
            n: 30,
        };
        let r = TtfiResult {
            cold: None,
            cold_beat: None,
            warm: None,
            warm_beat: None,
            kept: None,
            local: Some(s(50.0)),
            sdk: Some(s(900.0)),
            burst: None,
            k8s: k8s::KubeResult {
                cold: None,
                warm: None,
                kept: None,
                warm_went_cold: 0,
                kept_went_cold: 0,
            },
        };
        assert_eq!(
            r.line(),
            "ttfi_cold_p50_ms=n/a ttfi_warm_p50_ms=n/a ttfi_kept_p50_ms=n/a ttfi_sdk_p50_ms=900.0 warm_first_beat_p50_ms=n/a warm_first_beat_p99_ms=n/a burst20_max_ms=n/a k8s_warm_delivered_p50_ms=n/a supervisor_warm_rss_mib=n/a"
        );
        let r = TtfiResult {
            cold: Some(s(600.0)),
            warm: Some(s(80.0)),
            warm_beat: Some(s(20.0)),
            kept: Some(s(45.34)),
            burst: Some(burst::BurstResult {
                sessions: 20,
                warm_bound: 20,
                max_ms: 1234.56,
                cold_rss_mib: 10.0,
                warm_rss_mib: 21.5,
            }),
            k8s: k8s::KubeResult {
                cold: Some(s(30.0)),
                warm: Some(s(4.126)),
                kept: Some(s(2.0)),
                warm_went_cold: 0,
                kept_went_cold: 0,
            },
            ..r
        };
        assert_eq!(
            r.line(),
            "ttfi_cold_p50_ms=600.0 ttfi_warm_p50_ms=80.0 ttfi_kept_p50_ms=45.3 ttfi_sdk_p50_ms=900.0 warm_first_beat_p50_ms=20.0 warm_first_beat_p99_ms=40.0 burst20_max_ms=1234.6 k8s_warm_delivered_p50_ms=4.13 supervisor_warm_rss_mib=21.50"
        );
    }

    #[test]
    fn spreads_are_nearest_rank_percentiles_of_the_samples() {
        assert!(Spread::of(&[]).is_none(), "no samples, no figure");
        let one = Spread::of(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p90, one.p99, one.n), (7.0, 7.0, 7.0, 1));
        // 1..=30 in reverse: the sort is the spread's, not the caller's.
        let samples: Vec<f64> = (1..=30).rev().map(f64::from).collect();
        let s = Spread::of(&samples).unwrap();
        assert_eq!((s.p50, s.p90, s.p99, s.n), (15.0, 27.0, 30.0, 30));
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        hundred.swap(0, 99);
        let h = Spread::of(&hundred).unwrap();
        assert_eq!((h.p50, h.p90, h.p99), (50.0, 90.0, 99.0));
    }
}
