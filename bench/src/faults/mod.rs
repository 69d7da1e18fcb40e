//! `mango-bench faults` (`make faults`): the fault suite. It drives the real
//! binaries — two `mango serve` on one database of its own PostgreSQL
//! cluster, `mango-worker docker` (runners in containers on its own fenced
//! network) and `mango-worker local`, a scripted model — injects one fault
//! per scenario while Sessions call tools and healthchecks run, and checks
//! the invariants after each (`invariants.rs`). Its last line:
//! `faults_scenarios=… faults_lost=0 faults_doubled=0 faults_leaked=0
//! faults_secret_lines=0 faults_containers=… faults_unread_container_logs=0
//! max_reclaim_s=… proptest_cases=… fuzz_targets=…`;
//! it exits non-zero naming every invariant that failed.

mod clock;
mod cluster;
mod container_logs;
mod exhausted;
mod invariants;
mod kept_kills;
mod kept_watch;
mod load;
mod memory_full;
mod model;
mod model_faults;
mod network_cut;
mod probe;
mod procs;
mod sandboxes;
mod scenarios;
pub mod soak;
mod soak_judge;
mod soak_sample;
mod stop_races;
mod system;
mod watch;

pub use scenarios::Name;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Options {
    /// The run's name: its pools, network and cluster (`system::Names`).
    pub name: String,
    /// Where `mango`, `mango-worker` and `mango-runner` are.
    pub bin_dir: PathBuf,
    /// The checkout (for `scripts/pg.sh`, and `fuzz/fuzz_targets`).
    pub repo: PathBuf,
    pub image: String,
    pub pg_port: u16,
    pub ttl_seconds: u64,
    pub scenarios: Vec<Name>,
}

#[derive(Default)]
pub struct Summary {
    pub scenarios: usize,
    pub lost: usize,
    pub doubled: usize,
    pub leaked: usize,
    pub secret_lines: usize,
    /// Containers of the Docker pool seen, and those whose logs were not read.
    pub containers: usize,
    pub unread_container_logs: usize,
    pub max_reclaim_s: f64,
    pub failures: Vec<String>,
}

impl Summary {
    pub fn line(&self, repo: &std::path::Path) -> String {
        format!(
            "faults_scenarios={} faults_lost={} faults_doubled={} faults_leaked={} faults_secret_lines={} faults_containers={} faults_unread_container_logs={} max_reclaim_s={:.1} proptest_cases={} fuzz_targets={}",
            self.scenarios,
            self.lost,
            self.doubled,
            self.leaked,
            self.secret_lines,
            self.containers,
            self.unread_container_logs,
            self.max_reclaim_s,
            proptest_cases(),
            fuzz_targets(repo),
        )
    }
}

/// The lease-model property test's configured case count:
/// `MANGO_PROPTEST_CASES`, else proptest's own `PROPTEST_CASES`, else
/// proptest's default (256).
fn proptest_cases() -> u64 {
    ["MANGO_PROPTEST_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(256)
}

fn fuzz_targets(repo: &std::path::Path) -> usize {
    std::fs::read_dir(repo.join("fuzz/fuzz_targets"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
                .count()
        })
        .unwrap_or(0)
}

pub async fn run(opts: Options) -> anyhow::Result<Summary> {
    let (system, scratch) = start_system(&opts).await?;
    let followers = follow_containers(&system);
    let outcome = run_scenarios(&system, &opts.scenarios, &followers).await;
    let mut summary = match outcome {
        Ok(summary) => summary,
        Err(err) => Summary {
            failures: vec![format!("the suite could not go on: {err:#}")],
            ..Summary::default()
        },
    };
    finish(&system, &scratch, followers, &mut summary).await;
    Ok(summary)
}

/// The Docker pool's containers, followed from before the first one starts.
fn follow_containers(system: &system::System) -> container_logs::ContainerLogs {
    container_logs::ContainerLogs::follow(
        system.docker.clone(),
        system::names().docker_pool.clone(),
        system.logs.clone(),
    )
}

/// The run's system, in a scratch folder of its own.
async fn start_system(opts: &Options) -> anyhow::Result<(Arc<system::System>, PathBuf)> {
    system::use_names(&opts.name)?;
    let scratch =
        crate::harness::scratch_root().join(format!("mango-{}-{}", opts.name, std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let settings = system::Settings {
        bin_dir: opts.bin_dir.clone(),
        repo: opts.repo.clone(),
        scratch: scratch.clone(),
        pg_port: opts.pg_port,
        image: opts.image.clone(),
        ttl_seconds: opts.ttl_seconds,
        concurrency: 4,
    };
    Ok((Arc::new(system::System::start(settings).await?), scratch))
}

/// The teardown, the end of the containers' follows (each ends with its
/// container), then the secret check over every log; the run's logs stay
/// for a failed run, to be read.
async fn finish(
    system: &system::System,
    scratch: &std::path::Path,
    followers: container_logs::ContainerLogs,
    summary: &mut Summary,
) {
    system.teardown().await;
    let (containers, unread) = followers.finish(Duration::from_secs(15)).await;
    println!("faults: the whole run: {}", containers.line());
    summary.containers = containers.seen;
    summary.unread_container_logs = containers.unreadable + containers.following;
    summary
        .failures
        .extend(unread.into_iter().map(|f| format!("container logs: {f}")));
    let mut logs = invariants::Verdict::default();
    invariants::check_logs(system, &mut logs);
    summary.secret_lines = logs.secret_lines;
    summary.failures.extend(logs.failures);
    if summary.failures.is_empty() {
        let _ = std::fs::remove_dir_all(scratch);
    } else {
        eprintln!(
            "{}: the run's logs are in {}",
            system::names().suite,
            scratch.join("logs").display()
        );
    }
}

async fn run_scenarios(
    system: &Arc<system::System>,
    names: &[Name],
    followers: &container_logs::ContainerLogs,
) -> anyhow::Result<Summary> {
    system.start_worker(system::Launcher::Docker).await?;
    system.start_worker(system::Launcher::Local).await?;
    let mut summary = Summary::default();
    // A scenario that could not go on ends the run: the system it leaves
    // is not one the next scenario's fault is meant for.
    for name in names {
        let started = Instant::now();
        let containers_before = followers.mark();
        println!("faults: {} …", name.label());
        let outcome = match scenarios::run(system, *name).await {
            Ok(mut outcome) => {
                outcome.verdict.failures.extend(
                    followers
                        .take_unreadable()
                        .into_iter()
                        .map(|f| format!("container logs: {f}")),
                );
                outcome
            }
            Err(err) => {
                summary.failures.push(format!(
                    "{}: the scenario could not go on: {err:#}",
                    name.label()
                ));
                break;
            }
        };
        let v = &outcome.verdict;
        let worst = outcome.reclaims.iter().map(|r| r.1).fold(0.0, f64::max);
        println!(
            "faults: {} in {:.1} s: lost={} doubled={} leaked={} reclaims={} max_reclaim_s={worst:.1}",
            name.label(),
            started.elapsed().as_secs_f64(),
            v.lost,
            v.doubled,
            v.leaked,
            outcome.reclaims.len(),
        );
        println!(
            "faults: {}: {}",
            name.label(),
            followers.counts_since(containers_before).line()
        );
        for failure in &v.failures {
            println!("faults: {}: {failure}", name.label());
        }
        summary.scenarios += 1;
        summary.lost += v.lost;
        summary.doubled += v.doubled;
        summary.leaked += v.leaked;
        summary.max_reclaim_s = summary.max_reclaim_s.max(worst);
        summary
            .failures
            .extend(v.failures.iter().map(|f| format!("{}: {f}", name.label())));
        let _ = outcome.seconds;
    }
    Ok(summary)
}
