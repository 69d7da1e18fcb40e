//! `mango-worker docker` as its own process (next to this executable), on
//! an Environment of its own: its RSS idle with no warm pool (the cold
//! supervisor), then with a warm pool of `burst` full, and a burst of
//! `burst` new Sessions at once on that pool: the largest TTFI among them.

use super::turn::Watched;
use super::Environment;
use crate::harness::Bench;
use crate::supervisor::{beside_me, clean, note_rss, Scratch};
use anyhow::{bail, Context};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A pool of 20 fills within this on a busy machine.
const FILL_TIMEOUT: Duration = Duration::from_secs(240);
/// The burst's sandboxes are gone within this after their Work stopped.
const GONE_TIMEOUT: Duration = Duration::from_secs(120);

pub struct BurstResult {
    /// Sessions in the burst, and how many of them the pool served warm.
    pub sessions: usize,
    pub warm_bound: u64,
    /// The largest TTFI of the burst, ms.
    pub max_ms: f64,
    /// `VmHWM` of the supervisor with no warm pool, idle, MiB.
    pub cold_rss_mib: f64,
    /// `VmHWM` of the supervisor with its warm pool full (before the burst).
    pub warm_rss_mib: f64,
}

/// Where the Docker half's sandboxes reach the api, and their image.
pub struct Sandboxes<'a> {
    pub base_url: &'a str,
    pub image: &'a str,
    pub docker: &'a bollard::Docker,
}

/// One `mango-worker docker` process and where its metrics are served.
struct Worker {
    child: tokio::process::Child,
    pid: u32,
    metrics: String,
    pool: String,
}

impl Worker {
    async fn start(
        bench: &Bench,
        env: &Environment,
        sandboxes: &Sandboxes<'_>,
        warm: usize,
        log: &std::path::Path,
    ) -> anyhow::Result<Worker> {
        let worker = beside_me("mango-worker")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let pool = crate::supervisor::pool(&format!("ttfi-w{warm}"));
        let log_file = std::fs::File::create(log)?;
        let mut child = tokio::process::Command::new(&worker)
            .arg("docker")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone()?))
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .env("MANGO_ENVIRONMENT_KEY", &env.key)
            .env("MANGO_ENVIRONMENT_ID", &env.id)
            .env("MANGO_BASE_URL", &bench.app.base)
            .env("MANGO_POOL", &pool)
            .env("MANGO_WORKER_ID", format!("mango-bench-{pool}"))
            .env("MANGO_WARM", warm.to_string())
            .env("MANGO_MAX_CONCURRENCY", warm.max(1).to_string())
            .env("MANGO_DRAIN", "true")
            .env("MANGO_SHUTDOWN_GRACE_SECONDS", "10")
            .env("MANGO_METRICS_ADDR", format!("127.0.0.1:{port}"))
            .env("MANGO_DOCKER_BASE_URL", sandboxes.base_url)
            .env("MANGO_DOCKER_IMAGE", sandboxes.image)
            .env("MANGO_LOG", "warn")
            .spawn()
            .context("starting mango-worker docker")?;
        let pid = child.id().context("mango-worker's pid")?;
        if let Some(status) = child.try_wait()? {
            bail!(
                "mango-worker exited at once ({status}); its log: {}",
                log.display()
            );
        }
        Ok(Worker {
            child,
            pid,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
            pool,
        })
    }

    /// The value of metric `name` (its one series: the worker serves one
    /// pool, labelled `pool`); `None` until it is served.
    async fn metric(&self, http: &reqwest::Client, name: &str) -> Option<f64> {
        let text = http
            .get(&self.metrics)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                return None;
            }
            rest.rsplit(' ').next()?.trim().parse().ok()
        })
    }

    /// Until `name` reaches `at_least`, reading the RSS peak meanwhile.
    async fn until(
        &mut self,
        http: &reqwest::Client,
        name: &str,
        at_least: f64,
        within: Duration,
        peak: &mut f64,
        log: &std::path::Path,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            note_rss(self.pid, peak)?;
            let value = self.metric(http, name).await;
            if value.is_some_and(|v| v >= at_least) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("mango-worker exited ({status}); its log: {}", log.display());
            }
            if started.elapsed() > within {
                bail!(
                    "{name} is {value:?}, not {at_least}, after {within:?}; mango-worker's log: {}",
                    log.display()
                );
            }
            // A poll interval inside the deadline above.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, with `MANGO_DRAIN`: its sandboxes, warm ones included, go.
    async fn stop(mut self, label: &str) {
        // SAFETY: kill(2) on our own child's pid, which it still is (not reaped).
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => println!("ttfi: {label}: mango-worker exited {status}"),
            _ => {
                let _ = self.child.kill().await;
                println!("ttfi: {label}: mango-worker did not exit on SIGTERM; killed");
            }
        }
    }
}

/// The RSS of `mango-worker docker` idle without a warm pool, MiB.
async fn cold_rss(
    bench: &Bench,
    env: &Environment,
    sandboxes: &Sandboxes<'_>,
    scratch: &Scratch,
) -> anyhow::Result<f64> {
    let log = scratch.0.join("mango-worker-cold.log");
    let mut worker = Worker::start(bench, env, sandboxes, 0, &log).await?;
    let http = reqwest::Client::new();
    let mut peak = 0.0;
    let polled = worker
        .until(
            &http,
            "mango_supervisor_polls_total",
            2.0,
            Duration::from_secs(30),
            &mut peak,
            &log,
        )
        .await;
    let pool = worker.pool.clone();
    worker.stop("cold supervisor").await;
    clean(sandboxes.docker, &[&pool], &[]).await;
    polled?;
    Ok(peak)
}

pub async fn run(
    bench: &Bench,
    agent: &str,
    envs: (&Environment, &Environment),
    sandboxes: &Sandboxes<'_>,
    burst: usize,
) -> anyhow::Result<BurstResult> {
    let scratch = Scratch::new("mango-bench-ttfi-burst")?;
    let cold_rss_mib = cold_rss(bench, envs.0, sandboxes, &scratch).await?;
    println!("ttfi: supervisor without a warm pool, idle and polling: VmHWM {cold_rss_mib:.2} MiB");

    let env = envs.1;
    let log = scratch.0.join("mango-worker-warm.log");
    let mut worker = Worker::start(bench, env, sandboxes, burst, &log).await?;
    let pool = worker.pool.clone();
    let http = reqwest::Client::new();
    let mut sessions = Vec::new();
    let measured = async {
        let mut peak = 0.0;
        let started = Instant::now();
        worker
            .until(&http, "mango_supervisor_warm_ready", burst as f64, FILL_TIMEOUT, &mut peak, &log)
            .await?;
        println!(
            "ttfi: burst: {burst} warm sandboxes ready after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        // Let the pool's watchers and the first polls settle.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            note_rss(worker.pid, &mut peak)?;
        }
        let warm_rss_mib = peak;
        println!("ttfi: supervisor with a warm pool of {burst}: VmHWM {warm_rss_mib:.2} MiB");
        let bound_before = worker
            .metric(&http, "mango_supervisor_warm_bound_total")
            .await
            .unwrap_or(0.0);
        let mut watched = Vec::with_capacity(burst);
        for _ in 0..burst {
            let w = Watched::open(bench, &env.api, agent, &env.id).await?;
            sessions.push(w.session.clone());
            watched.push(w);
        }
        let sends = watched.iter().map(|w| w.send(&env.api));
        let sent = futures::future::try_join_all(sends).await?;
        let results = watched
            .iter_mut()
            .zip(sent)
            .map(|(w, sent)| async move {
                let ms = w.first_result(sent).await?;
                w.until_idle().await?;
                anyhow::Ok(ms)
            });
        let outcome = futures::future::join_all(results).await;
        for w in watched {
            w.close(bench);
        }
        let times: Vec<f64> = outcome.into_iter().collect::<anyhow::Result<_>>()?;
        let max_ms = times.iter().copied().fold(0.0, f64::max);
        let warm_bound = worker
            .metric(&http, "mango_supervisor_warm_bound_total")
            .await
            .unwrap_or(0.0)
            - bound_before;
        note_rss(worker.pid, &mut peak)?;
        println!(
            "ttfi: burst: {burst} new Sessions at once: largest TTFI {max_ms:.1} ms, {warm_bound} served warm; supervisor peak RSS over the burst {peak:.2} MiB"
        );
        for session in &sessions {
            for (id, state) in bench.app.session_work(session).await {
                if state != "stopped" {
                    env.api.force_stop(&id).await?;
                }
            }
        }
        let gone = Instant::now();
        while worker.metric(&http, "mango_supervisor_live_sandboxes").await.unwrap_or(0.0) > 0.0 {
            if gone.elapsed() > GONE_TIMEOUT {
                bail!("the burst's sandboxes are still live {GONE_TIMEOUT:?} after their Work stopped");
            }
            // A poll interval inside the deadline above.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::Ok(BurstResult {
            sessions: burst,
            warm_bound: warm_bound.max(0.0) as u64,
            max_ms,
            cold_rss_mib,
            warm_rss_mib,
        })
    }
    .await;
    worker.stop("burst").await;
    super::remove_workspaces(sandboxes, &pool, &sessions).await;
    clean(sandboxes.docker, &[&pool], &[]).await;
    if measured.is_err() {
        let kept = std::env::temp_dir().join("mango-bench-ttfi-burst.log");
        let _ = std::fs::copy(&log, &kept);
        println!(
            "ttfi: burst: mango-worker's log is kept at {}",
            kept.display()
        );
    }
    measured
}
