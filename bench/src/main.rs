//! `mango-bench`: throughput and latency of the Work lease API, end to end.
//!
//! Creates a throw-away database `mango_bench_<random>` on the server of
//! `--database-url` / `MANGO_DATABASE_URL`, migrates it, serves the api
//! in-process on 127.0.0.1:0 and drives it over HTTP like workers do:
//!
//! * `lease`: N workers cycling poll → ack → heartbeat ×3 → forced stop, and
//!   the ceiling: the same statements issued directly, without HTTP;
//! * `wake`: latency from a healthcheck's creation to a blocked poller returning it;
//! * `depth`: poll → ack latency with 1,000 vs 100,000 items queued;
//! * `events`: Session event admission (own Sessions vs one Session) and the
//!   fan-out of one Session's SSE stream to many readers;
//! * `runner`: the item runner's (`mango-runner`, a separate process)
//!   tool round trip and peak RSS, against the official Python SDK's
//!   `EnvironmentWorker` serving the same script on the same server, in
//!   `--runner-rounds` independent rounds (new worker processes each);
//! * `all` (the default): all five;
//! * `controller`: the Kubernetes launcher's CPU per item (the Pod spec
//!   and its API calls) and RSS with 200 items tracked, against a mock API
//!   server; it needs no database. Its last line:
//!   `controller_floor_cpu_ms_per_item=… controller_cpu_ratio=…
//!   controller_cpu_ms_per_item=… controller_rss_mib=…`.
//! * `inputs` (not part of `all`, `make bench-inputs`): a Session's inputs
//!   made ready by `mango-runner` and by the Python SDK's worker code on
//!   the same server: 500 pinned Skills materialized, a 10,000-memory store
//!   downloaded, one idle sync pass, and the runner's peak RSS; its last
//!   line: `skills_ratio=… store_download_ratio=… idle_sync_ratio=…
//!   runner_inputs_rss_mib=…`;
//! * `supervisor` (not part of `all`: it needs a Docker engine and the
//!   sandbox image for its Docker half, `make bench-supervisor`): the
//!   supervisor core with the Docker and the local launcher, 20 healthchecks
//!   each (poll → first heartbeat, create → succeeded, the stages), 20 at
//!   once, and `mango-worker`'s peak RSS with 20 live sandboxes, against the
//!   bare cost of the same image's container in the same run.
//! * `ttfi` (not part of `all`, `make bench-ttfi`): time to first tool call
//!   end to end, with a scripted model asking for one `bash` call: Docker
//!   cold, Docker warm, local, and the official Python SDK's worker per
//!   item, interleaved; a burst of new Sessions on a warm pool, and the
//!   supervisor's RSS with that pool (see `ttfi`'s module docs). Its last
//!   line: `ttfi_cold_p50_ms=… ttfi_warm_p50_ms=… ttfi_kept_p50_ms=…
//!   ttfi_sdk_p50_ms=… warm_first_beat_p50_ms=… warm_first_beat_p99_ms=…
//!   burst20_max_ms=… k8s_warm_delivered_p50_ms=… supervisor_warm_rss_mib=…`
//!   (`n/a` where a case cannot run, the reason printed above).
//!
//! The last line is machine-readable:
//! `cycles_per_s=… ceiling_ratio=… wake_p50_ms=… wake_p99_ms=… depth_ratio=…
//! admitted_events_per_s=… admitted_one_session_per_s=… fanout_p50_ms=… fanout_p99_ms=…
//! runner_p50_ms=… runner_p99_ms=… sdk_p50_ms=… sdk_p99_ms=… runner_rss_mib=…
//! sdk_rss_mib=… p50_ratio=… rss_ratio=… floor_p50_ms=…` (`n/a` where the SDK half was skipped;
//! the runner keys are those of the round with the median p50 ratio)
//! (a single phase prints only its own keys; `supervisor`'s are
//! `docker_first_beat_p50_ms=… docker_first_beat_p90_ms=… docker_floor_p50_ms=…
//! docker_ratio=… docker_healthcheck_p50_ms=… local_first_beat_p50_ms=…
//! supervisor_rss_mib=… concurrent_ok=20/20`, `n/a` for a skipped Docker half).
//! The database is dropped at the end.

mod chart;
mod controller;
mod depth;
mod events;
mod faults;
mod harness;
mod http;
mod inputs;
mod lease;
mod measure;
mod runner;
mod supervisor;
mod ttfi;
mod wake;

use clap::{Parser, Subcommand};
use harness::Bench;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "mango-bench",
    about = "Benchmarks of the Mango Work lease and Session event APIs, the item runner and the supervisor"
)]
struct Cli {
    /// Admin PostgreSQL URL; the bench creates and drops its own database there.
    #[arg(
        long,
        env = "MANGO_DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://mango@127.0.0.1:54329/mango",
        global = true
    )]
    database_url: String,
    /// Connections in the api's pool.
    #[arg(long, default_value_t = 10, global = true)]
    db_max_connections: u32,
    /// Concurrent simulated workers (lease).
    #[arg(long, default_value_t = 16, global = true)]
    workers: usize,
    /// Measured seconds (lease, and again for its ceiling).
    #[arg(long, default_value_t = 5.0, global = true)]
    seconds: f64,
    /// Warm-up seconds before each measured window (lease).
    #[arg(long, default_value_t = 1.0, global = true)]
    warmup: f64,
    /// Blocked pollers (wake).
    #[arg(long, default_value_t = 4, global = true)]
    pollers: usize,
    /// Latency samples (wake).
    #[arg(long, default_value_t = 300, global = true)]
    wake_samples: usize,
    /// Milliseconds between creates (wake).
    #[arg(long, default_value_t = 20, global = true)]
    wake_interval_ms: u64,
    /// Measured poll → ack cycles at each depth (depth).
    #[arg(long, default_value_t = 300, global = true)]
    depth_polls: usize,
    /// The shallow queue (depth).
    #[arg(long, default_value_t = 1_000, global = true)]
    depth_small: i64,
    /// The deep queue (depth).
    #[arg(long, default_value_t = 100_000, global = true)]
    depth_large: i64,
    /// Concurrent event senders (events admission).
    #[arg(long, default_value_t = 16, global = true)]
    senders: usize,
    /// SSE readers of one Session (events fan-out).
    #[arg(long, default_value_t = 50, global = true)]
    readers: usize,
    /// Events sent per second while readers stream (events fan-out).
    #[arg(long, default_value_t = 200.0, global = true)]
    fanout_rate: f64,
    /// Seconds of sending while readers stream (events fan-out).
    #[arg(long, default_value_t = 5.0, global = true)]
    fanout_seconds: f64,
    /// Print diagnostics: the pool's plan-cache use after `lease`, and
    /// EXPLAIN ANALYZE of the claim at each depth.
    #[arg(long, global = true)]
    profile: bool,
    /// Measured tool round trips per worker (runner).
    #[arg(long, default_value_t = 100, global = true)]
    runner_calls: usize,
    /// Warm-up tool round trips before them (runner).
    #[arg(long, default_value_t = 5, global = true)]
    runner_warmup: usize,
    /// Independent rounds of the runner phase, each with new worker
    /// processes (a few seconds each); the summary reports the round with the
    /// median p50 ratio. One SDK process's p50 moves by up to 1.7x from the
    /// next one's, so a single round says little about the ratio.
    #[arg(long, default_value_t = 5, global = true)]
    runner_rounds: usize,
    /// Items run one after another through the Kubernetes launcher (controller).
    #[arg(long, default_value_t = 200, global = true)]
    controller_items: usize,
    /// Items tracked at once for the RSS figure (controller).
    #[arg(long, default_value_t = 200, global = true)]
    controller_tracked: usize,
    /// Measured healthchecks, one at a time, per launcher (supervisor).
    #[arg(long, default_value_t = 20, global = true)]
    supervisor_items: usize,
    /// Unmeasured healthchecks before them (supervisor).
    #[arg(long, default_value_t = 2, global = true)]
    supervisor_warmup: usize,
    /// Healthchecks created at once, and the live sandboxes of the peak-RSS
    /// measurement, per launcher (supervisor).
    #[arg(long, default_value_t = 20, global = true)]
    supervisor_concurrent: usize,
    /// The sandbox image of the Docker half (supervisor); built by
    /// `make bench-supervisor` with the release runner.
    #[arg(
        long,
        env = "MANGO_BENCH_SANDBOX_IMAGE",
        default_value = "mango-sandbox:bench",
        global = true
    )]
    sandbox_image: String,
    /// Skills the Session pins (inputs; at most the 500 scope-pins a
    /// Session may have, spec §9).
    #[arg(long, default_value_t = 500, global = true)]
    input_skills: usize,
    /// Memories of the attached store (inputs).
    #[arg(long, default_value_t = 10_000, global = true)]
    input_memories: usize,
    /// Rounds of the inputs phase, each side once per stage per round; the
    /// medians are compared.
    #[arg(long, default_value_t = 3, global = true)]
    input_rounds: usize,
    /// The fault suite's scenarios, comma-separated (default: all, in order).
    #[arg(long, value_delimiter = ',', global = true)]
    faults_scenarios: Vec<faults::Name>,
    /// The port of the fault suite's own PostgreSQL cluster (which it restarts).
    #[arg(
        long,
        env = "MANGO_FAULTS_PG_PORT",
        default_value_t = 54339,
        global = true
    )]
    faults_pg_port: u16,
    /// The fault suite's name: its pools `<name>-docker` and `<name>-local`,
    /// its network `mango-<name>`, its cluster `.mango/<name>-pg` (two runs
    /// on one Docker engine need two names).
    #[arg(
        long,
        env = "MANGO_FAULTS_NAME",
        default_value = "faults",
        global = true
    )]
    faults_name: String,
    /// How long the soak runs (minutes, 3 to 1440).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=1440), global = true)]
    soak_minutes: u64,
    /// Minutes from one fault of the soak to the next (1 to 60).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60), global = true)]
    soak_fault_minutes: u64,
    /// The soak's name, as --faults-name is the fault suite's.
    #[arg(long, env = "MANGO_SOAK_NAME", default_value = "soak", global = true)]
    soak_name: String,
    /// The port of the soak's own PostgreSQL cluster (`.mango/<soak name>-pg`).
    #[arg(
        long,
        env = "MANGO_SOAK_PG_PORT",
        default_value_t = 54349,
        global = true
    )]
    soak_pg_port: u16,
    /// The lease TTL the fault suite's api processes give (seconds, 5 to 300).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(5..=300), global = true)]
    faults_ttl_seconds: u64,
    /// Where each phase's latency chart goes, as `<phase>.svg` (made if
    /// missing); its path is printed after the phase's figures.
    #[arg(long, default_value = "target/bench", global = true)]
    svg_dir: std::path::PathBuf,
    /// Measured turns per case (ttfi).
    #[arg(long, default_value_t = 30, global = true)]
    ttfi_turns: usize,
    /// The Docker warm case's pool (ttfi).
    #[arg(long, default_value_t = 2, global = true)]
    ttfi_warm: usize,
    /// New Sessions at once on a warm pool of as many (ttfi).
    #[arg(long, default_value_t = 20, global = true)]
    ttfi_burst: usize,
    /// Only this part of ttfi (`k8s`: the Kubernetes launcher against the
    /// strict fake, cold, warm and kept; no Docker engine, image or Python).
    #[arg(long, value_enum, global = true)]
    ttfi_only: Option<ttfi::Only>,
    /// A quick run of ttfi (2 turns per case, a burst of 2): that it runs
    /// and reports, not figures.
    #[arg(long, global = true)]
    quick: bool,
    /// Keep the bench database instead of dropping it.
    #[arg(long, global = true)]
    keep_db: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// Lease cycles per second over HTTP, and the SQL-only ceiling.
    Lease,
    /// Creation → blocked-poller latency.
    Wake,
    /// Poll latency at a shallow vs a deep queue.
    Depth,
    /// Event admission per second, and SSE fan-out latency to many readers.
    Events,
    /// The item runner's tool round trip and peak RSS vs the Python SDK's
    /// EnvironmentWorker (needs target/release/mango-runner; the SDK half
    /// needs .venv, see scripts/venv.sh).
    Runner,
    /// The Kubernetes launcher's CPU per item and RSS with 200 items
    /// tracked, against a mock API server (no database; not in `all`).
    Controller,
    /// The lease, wake, depth, events and runner phases (the default).
    All,
    /// A Session's inputs made ready: 500 Skills materialized, a
    /// 10,000-file Memory Store downloaded, one idle sync, by the runner vs
    /// the Python SDK's worker code, and the runner's peak RSS (needs
    /// target/release/mango-runner; the SDK half needs .venv). Not part of `all`.
    Inputs,
    /// The supervisor core with the Docker and the local launcher vs the
    /// bare container of the same image, and `mango-worker`'s peak RSS
    /// (needs target/release/mango-runner and mango-worker; the Docker half
    /// needs an engine and --sandbox-image). Not part of `all`.
    Supervisor,
    /// The fault suite (`make faults`): the real binaries under load, one
    /// fault per scenario, the invariants after each (needs Docker,
    /// --sandbox-image and the debug or release `mango`, `mango-worker`
    /// and `mango-runner` beside this binary). Not part of `all`.
    Faults,
    /// The soak (`make soak`, 30 minutes): the fault suite's system under
    /// steady load with a fault every few minutes; resident sets, table
    /// bloat and lease-cycle p99 over time, judged flat. Not part of `all`.
    Soak,
    /// Time to first tool call end to end: Docker cold, warm, local and
    /// the Python SDK's worker per item, a burst on a warm pool, and the
    /// supervisor's RSS with it (needs target/release/mango-runner and
    /// mango-worker; the Docker cases need an engine and --sandbox-image).
    /// Not part of `all`.
    Ttfi,
}

#[derive(Default)]
struct Summary {
    lease: Option<lease::LeaseResult>,
    wake: Option<wake::WakeResult>,
    depth: Option<depth::DepthResult>,
    events: Option<events::EventsResult>,
    runner: Option<runner::RunnerResult>,
    supervisor: Option<supervisor::SupervisorResult>,
    inputs: Option<inputs::InputsResult>,
    ttfi: Option<ttfi::TtfiResult>,
}

impl Summary {
    fn line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(l) = &self.lease {
            parts.push(format!("cycles_per_s={:.1}", l.cycles_per_s));
            parts.push(format!("ceiling_ratio={:.3}", l.ceiling_ratio()));
        }
        if let Some(w) = &self.wake {
            parts.push(format!("wake_p50_ms={:.2}", w.p50_ms));
            parts.push(format!("wake_p99_ms={:.2}", w.p99_ms));
        }
        if let Some(d) = &self.depth {
            parts.push(format!("depth_ratio={:.3}", d.ratio()));
        }
        if let Some(e) = &self.events {
            parts.push(format!("admitted_events_per_s={:.1}", e.admitted_per_s));
            parts.push(format!(
                "admitted_one_session_per_s={:.1}",
                e.admitted_one_session_per_s
            ));
            parts.push(format!("fanout_p50_ms={:.2}", e.fanout_p50_ms));
            parts.push(format!("fanout_p99_ms={:.2}", e.fanout_p99_ms));
        }
        if let Some(r) = &self.runner {
            let na = |v: Option<f64>, digits: usize| {
                v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
            };
            parts.push(format!("runner_p50_ms={:.2}", r.runner.p50_ms));
            parts.push(format!("runner_p99_ms={:.2}", r.runner.p99_ms));
            parts.push(format!(
                "sdk_p50_ms={}",
                na(r.sdk.as_ref().map(|s| s.p50_ms), 2)
            ));
            parts.push(format!(
                "sdk_p99_ms={}",
                na(r.sdk.as_ref().map(|s| s.p99_ms), 2)
            ));
            parts.push(format!("runner_rss_mib={:.2}", r.runner.rss_mib));
            parts.push(format!(
                "sdk_rss_mib={}",
                na(r.sdk.as_ref().map(|s| s.rss_mib), 2)
            ));
            parts.push(format!("p50_ratio={}", na(r.p50_ratio(), 3)));
            parts.push(format!("rss_ratio={}", na(r.rss_ratio(), 3)));
            parts.push(format!("floor_p50_ms={:.2}", r.floor.p50_ms));
        }
        if let Some(s) = &self.supervisor {
            let na = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
            let docker = s.docker.as_ref();
            parts.push(format!(
                "docker_first_beat_p50_ms={}",
                na(docker.map(|d| d.first_beat.p50))
            ));
            parts.push(format!(
                "docker_first_beat_p90_ms={}",
                na(docker.map(|d| d.first_beat.p90))
            ));
            parts.push(format!(
                "docker_floor_p50_ms={}",
                na(s.floor.map(|f| f.p50))
            ));
            parts.push(format!(
                "docker_ratio={}",
                s.docker_ratio()
                    .map_or("n/a".to_string(), |r| format!("{r:.3}"))
            ));
            parts.push(format!(
                "docker_healthcheck_p50_ms={}",
                na(docker.map(|d| d.healthcheck.p50))
            ));
            parts.push(format!(
                "local_first_beat_p50_ms={:.2}",
                s.local.first_beat.p50
            ));
            parts.push(format!("supervisor_rss_mib={:.2}", s.rss_mib()));
            let (ok, of) = s.concurrent_ok();
            parts.push(format!("concurrent_ok={ok}/{of}"));
        }
        if let Some(i) = &self.inputs {
            parts.push(i.line());
        }
        if let Some(t) = &self.ttfi {
            parts.push(t.line());
        }
        parts.join(" ")
    }
}

/// Writes a phase's chart into `--svg-dir` and says where.
fn write_chart(cli: &Cli, chart: &chart::Chart) -> anyhow::Result<()> {
    let path = chart.write(&cli.svg_dir)?;
    println!("{}: chart {}", chart.stem, path.display());
    Ok(())
}

async fn run(
    cli: &Cli,
    bench: &Arc<Bench>,
    command: Command,
    docker: Option<Result<supervisor::DockerEnv, String>>,
) -> anyhow::Result<Summary> {
    let all = command == Command::All;
    let mut summary = Summary::default();
    if all || command == Command::Lease {
        let opts = lease::Options {
            workers: cli.workers,
            seconds: cli.seconds,
            warmup: cli.warmup,
            profile: cli.profile,
        };
        let lease = lease::run(bench, &opts).await?;
        write_chart(cli, &lease.chart)?;
        summary.lease = Some(lease);
    }
    if all || command == Command::Wake {
        let opts = wake::Options {
            pollers: cli.pollers,
            samples: cli.wake_samples,
            interval: Duration::from_millis(cli.wake_interval_ms),
        };
        let wake = wake::run(bench, &opts).await?;
        write_chart(cli, &wake.chart)?;
        summary.wake = Some(wake);
    }
    if all || command == Command::Depth {
        let opts = depth::Options {
            small: cli.depth_small,
            large: cli.depth_large,
            polls: cli.depth_polls,
            profile: cli.profile,
        };
        let depth = depth::run(bench, &opts).await?;
        write_chart(cli, &depth.chart)?;
        summary.depth = Some(depth);
    }
    if all || command == Command::Events {
        let opts = events::Options {
            senders: cli.senders,
            seconds: cli.seconds,
            warmup: cli.warmup,
            readers: cli.readers,
            rate: cli.fanout_rate,
            fanout_seconds: cli.fanout_seconds,
        };
        let events = events::run(bench, &opts).await?;
        write_chart(cli, &events.chart)?;
        summary.events = Some(events);
    }
    if all || command == Command::Runner {
        let opts = runner::Options {
            calls: cli.runner_calls,
            warmup: cli.runner_warmup,
        };
        let mut rounds = Vec::with_capacity(cli.runner_rounds);
        for round in 1..=cli.runner_rounds {
            if cli.runner_rounds > 1 {
                println!("runner: round {round} of {}", cli.runner_rounds);
            }
            rounds.push(runner::run(bench, &opts).await?);
        }
        let runner = runner::across_rounds(rounds);
        write_chart(cli, &runner.chart())?;
        summary.runner = Some(runner);
    }
    match command {
        Command::Supervisor => {
            let opts = supervisor::Options {
                items: cli.supervisor_items,
                warmup: cli.supervisor_warmup,
                concurrent: cli.supervisor_concurrent,
            };
            let supervisor = supervisor::run(bench, &opts, docker).await?;
            write_chart(cli, &supervisor.chart())?;
            summary.supervisor = Some(supervisor);
        }
        Command::Ttfi => {
            summary.ttfi = Some(ttfi::run(bench, &ttfi_options(cli), docker).await?);
        }
        _ => {}
    }
    if command == Command::Inputs {
        let opts = inputs::Options {
            skills: cli.input_skills,
            memories: cli.input_memories,
            rounds: cli.input_rounds,
        };
        let inputs = inputs::run(bench, &opts).await?;
        write_chart(cli, &inputs.chart(&opts))?;
        summary.inputs = Some(inputs);
    }
    Ok(summary)
}

fn ttfi_options(cli: &Cli) -> ttfi::Options {
    ttfi::Options::new(
        cli.ttfi_turns,
        cli.ttfi_warm,
        cli.ttfi_burst,
        cli.quick,
        cli.ttfi_only,
    )
}

fn check(cli: &Cli) -> anyhow::Result<()> {
    ttfi_options(cli).check()?;
    anyhow::ensure!(cli.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(cli.pollers > 0, "--pollers must be at least 1");
    anyhow::ensure!(
        cli.seconds > 0.0 && cli.warmup >= 0.0,
        "--seconds must be positive"
    );
    anyhow::ensure!(
        cli.depth_small > 0 && cli.depth_large > cli.depth_small,
        "--depth-large must exceed --depth-small"
    );
    anyhow::ensure!(
        cli.depth_small as usize > cli.depth_polls + 20,
        "--depth-small must exceed --depth-polls + 20 warm-up cycles"
    );
    anyhow::ensure!(
        cli.senders > 0 && cli.readers > 0,
        "--senders and --readers must be at least 1"
    );
    anyhow::ensure!(
        cli.fanout_rate > 0.0 && cli.fanout_seconds > 0.0,
        "--fanout-rate and --fanout-seconds must be positive"
    );
    anyhow::ensure!(cli.wake_samples > 0, "--wake-samples must be at least 1");
    anyhow::ensure!(cli.runner_calls > 0, "--runner-calls must be at least 1");
    anyhow::ensure!(cli.runner_rounds > 0, "--runner-rounds must be at least 1");
    anyhow::ensure!(
        cli.supervisor_items > 0 && cli.supervisor_concurrent > 0,
        "--supervisor-items and --supervisor-concurrent must be at least 1"
    );
    anyhow::ensure!(
        (1..=500).contains(&cli.input_skills),
        "--input-skills must be from 1 to 500 (a Session's scope-pins)"
    );
    anyhow::ensure!(
        cli.input_memories > 0 && cli.input_rounds > 0,
        "--input-memories and --input-rounds must be at least 1"
    );
    // Before any phase runs, so an unusable folder costs no bench time.
    std::fs::create_dir_all(&cli.svg_dir).map_err(|e| {
        anyhow::anyhow!("--svg-dir {}: cannot create it: {e}", cli.svg_dir.display())
    })?;
    Ok(())
}

/// The fault suite or the soak: its own cluster and processes, not the
/// bench's in-process api; the last line, and a failure for each broken
/// invariant or judgment.
async fn run_faults(cli: &Cli, command: Command) -> std::process::ExitCode {
    let bin_dir = match std::env::current_exe() {
        Ok(exe) => exe
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default(),
        Err(err) => {
            eprintln!("error: where is this binary? {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let opts = faults::Options {
        name: cli.faults_name.clone(),
        repo: std::env::current_dir().unwrap_or_default(),
        bin_dir,
        image: cli.sandbox_image.clone(),
        pg_port: cli.faults_pg_port,
        ttl_seconds: cli.faults_ttl_seconds,
        scenarios: if cli.faults_scenarios.is_empty() {
            faults::Name::all()
        } else {
            cli.faults_scenarios.clone()
        },
    };
    let repo = opts.repo.clone();
    let started = std::time::Instant::now();
    let outcome = if command == Command::Soak {
        let soak = faults::soak::Soak {
            minutes: cli.soak_minutes,
            fault_minutes: cli.soak_fault_minutes,
        };
        let opts = faults::Options {
            name: cli.soak_name.clone(),
            pg_port: cli.soak_pg_port,
            ..opts
        };
        faults::soak::run(opts, soak)
            .await
            .map(|report| (report.summary, report.line))
    } else {
        faults::run(opts).await.map(|summary| {
            let line = summary.line(&repo);
            (summary, line)
        })
    };
    let label = if command == Command::Soak {
        "soak"
    } else {
        "faults"
    };
    match outcome {
        Ok((summary, line)) => {
            for failure in &summary.failures {
                eprintln!("{label}: FAILED {failure}");
            }
            println!("{label}: {:.0} s", started.elapsed().as_secs_f64());
            println!("{line}");
            if summary.failures.is_empty() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MANGO_LOG")
        .unwrap_or_else(|_| "warn,sqlx=error".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::All);
    if let Err(err) = check(&cli) {
        eprintln!("error: {err:#}");
        return std::process::ExitCode::FAILURE;
    }
    if matches!(command, Command::Faults | Command::Soak) {
        return run_faults(&cli, command).await;
    }
    if command == Command::Controller {
        let opts = controller::Options {
            items: cli.controller_items,
            tracked: cli.controller_tracked,
        };
        let outcome = std::thread::spawn(move || controller::run(&opts))
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the controller bench panicked")));
        return match outcome {
            Ok(result) => {
                println!("{}", result.line());
                std::process::ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    // The supervisor's Docker half needs the api where sandboxes reach the
    // host (the bridge's gateway), so the engine is looked at first.
    let docker = if command == Command::Supervisor
        || (command == Command::Ttfi && ttfi_options(&cli).all_cases())
    {
        println!(
            "mango-bench: looking for a Docker engine and {}",
            cli.sandbox_image
        );
        Some(supervisor::docker_env(&cli.sandbox_image).await)
    } else {
        None
    };
    let also_on: Vec<std::net::IpAddr> = match &docker {
        Some(Ok(env)) => vec![env.gateway],
        _ => Vec::new(),
    };
    // ttfi's api runs its agent loop against a scripted model.
    let model = if command == Command::Ttfi {
        Some(
            mango_testkit::ScriptedModel::start_answering(mango_testkit::one_bash_call(
                ttfi::COMMAND,
            ))
            .await,
        )
    } else {
        None
    };
    let model_base = model.as_ref().map(|m| m.base.as_str());
    let bench = match Bench::setup(
        &cli.database_url,
        cli.db_max_connections,
        &also_on,
        model_base,
    )
    .await
    {
        Ok(bench) => Arc::new(bench),
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!(
        "mango-bench: database {}, api at {}, environment {}",
        bench.db_name, bench.app.base, bench.app.env_id
    );
    let outcome = tokio::select! {
        outcome = run(&cli, &bench, command, docker) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if let Err(err) = bench.teardown(cli.keep_db).await {
        eprintln!("warning: cleanup failed: {err:#}");
    }
    match outcome {
        Ok(summary) => {
            println!("{}", summary.line());
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
