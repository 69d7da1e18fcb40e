//! `mango-bench controller`: what the Kubernetes launcher costs per item
//! against a mock API server (testkit's `FakeKubeApi`, real HTTP on
//! loopback, with the v5 attach protocol): building the Pod spec and its
//! API calls (PVC read and create, Pod create, attach and the secret over
//! stdin, the handed-off mark, delete), as CPU time of the launcher's own
//! thread (the mock server runs on other threads and is not counted); and
//! the process's RSS with 200 items tracked at once (live Pods in the
//! launcher's store). The baseline in the same run is the floor of the same
//! client: a minimal Pod created and deleted through `kube::Api`.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher::Event;
use kube::Api;
use mango_controller::core::launcher::{ItemIdentity, Launcher, Sandbox, SandboxSpec};
use mango_controller::core::naming;
use mango_controller::core::secret::Secret;
use mango_controller::kubernetes::crd::{SecretKeyRef, WorkerPool, WorkerPoolSpec};
use mango_controller::kubernetes::launcher::PodLauncher;
use mango_controller::kubernetes::pods::{PodFeed, PodStore};
use mango_protocol::WorkType;
use mango_testkit::kube_api::FakeKubeApi;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "bench";

pub struct Options {
    pub items: usize,
    pub tracked: usize,
}

pub struct ControllerResult {
    pub cpu_ms_per_item: f64,
    pub floor_cpu_ms_per_item: f64,
    pub rss_mib: f64,
}

impl ControllerResult {
    pub fn line(&self) -> String {
        format!(
            "controller_floor_cpu_ms_per_item={:.3} controller_cpu_ratio={:.2} controller_cpu_ms_per_item={:.3} controller_rss_mib={:.1}",
            self.floor_cpu_ms_per_item,
            self.cpu_ms_per_item / self.floor_cpu_ms_per_item,
            self.cpu_ms_per_item,
            self.rss_mib
        )
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn pool() -> Arc<WorkerPool> {
    let mut pool = WorkerPool::new(
        "bench",
        serde_json::from_value::<WorkerPoolSpec>(json!({
            "environmentId": "env_bench",
            "environmentKeySecret": SecretKeyRef { name: "pool-key".into(), key: None },
        }))
        .expect("a pool spec"),
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some("pool-uid".into());
    Arc::new(pool)
}

fn spec(n: usize) -> SandboxSpec {
    let item = ItemIdentity {
        work_id: format!("work_bench{n:06}"),
        claim: 1,
        environment_id: "env_bench".into(),
        work_type: WorkType::Session,
        session_id: Some(format!("sesn_bench{n:06}")),
    };
    SandboxSpec {
        name: naming::sandbox_name(&item.work_id, item.claim),
        labels: naming::labels(&item, "bench"),
        env: naming::runner_env(&item, "http://mango-api.bench.svc:8080"),
        item,
    }
}

fn running(fake: &FakeKubeApi, feed: &PodFeed, name: &str) {
    let status = json!({"phase": "Running", "containerStatuses": [{
        "name": "runner", "image": "mango-sandbox:bench", "imageID": "", "ready": true,
        "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]});
    let pod = fake.set_pod_status(name, status).expect("the Pod exists");
    feed.apply(Event::Apply(serde_json::from_value(pod).expect("a Pod")));
}

fn exited(fake: &FakeKubeApi, feed: &PodFeed, name: &str) {
    let status = json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "runner", "image": "mango-sandbox:bench", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]});
    let pod = fake.set_pod_status(name, status).expect("the Pod exists");
    feed.apply(Event::Apply(serde_json::from_value(pod).expect("a Pod")));
}

async fn one_item(
    launcher: &PodLauncher,
    fake: &FakeKubeApi,
    feed: &PodFeed,
    n: usize,
) -> anyhow::Result<Sandbox> {
    let sandbox = launcher.create(&spec(n)).await?;
    running(fake, feed, &sandbox.name);
    let secret = Secret::new(format!("bench-secret-{n:06}-{}", "x".repeat(400)));
    launcher.hand_off(&sandbox, secret).await?;
    Ok(sandbox)
}

/// Runs on a current-thread runtime on the calling thread, so the thread's
/// CPU time is the launcher's alone; the mock server gets its own runtime.
pub fn run(opts: &Options) -> anyhow::Result<ControllerResult> {
    anyhow::ensure!(
        opts.items > 0 && opts.tracked > 0,
        "--controller-items and --controller-tracked must be at least 1"
    );
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let fake = Arc::new(server.block_on(FakeKubeApi::start()));
    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = local.block_on(async {
        let mut config = kube::Config::new(fake.url.parse()?);
        config.default_namespace = NS.into();
        let client = kube::Client::try_from(config)?;
        let (store, feed) = PodStore::new();
        let launcher = PodLauncher::new(client.clone(), pool(), "mango-sandbox:bench", store);

        // Warm up connections and allocations.
        for n in 0..20 {
            let sandbox = one_item(&launcher, &fake, &feed, 1_000_000 + n).await?;
            exited(&fake, &feed, &sandbox.name);
            launcher.wait(&sandbox).await?;
            launcher.remove(&sandbox).await?;
        }

        println!(
            "controller: floor: {} minimal Pods created and deleted through kube::Api",
            opts.items
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let before = thread_cpu();
        for n in 0..opts.items {
            let minimal: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("floor-{n}")},
                "spec": {"containers": [{"name": "runner", "image": "mango-sandbox:bench"}]},
            }))?;
            pods.create(&PostParams::default(), &minimal).await?;
            pods.delete(&format!("floor-{n}"), &DeleteParams::default())
                .await?;
        }
        let floor = (thread_cpu() - before).as_secs_f64() * 1000.0 / opts.items as f64;

        println!(
            "controller: {} items, each PVC + Pod + attach + mark + delete",
            opts.items
        );
        let before = thread_cpu();
        for n in 0..opts.items {
            let sandbox = one_item(&launcher, &fake, &feed, n).await?;
            exited(&fake, &feed, &sandbox.name);
            launcher.wait(&sandbox).await?;
            launcher.remove(&sandbox).await?;
            if (n + 1) % 50 == 0 {
                println!("controller:   {} of {}", n + 1, opts.items);
            }
        }
        let per_item = (thread_cpu() - before).as_secs_f64() * 1000.0 / opts.items as f64;

        println!("controller: {} items tracked at once", opts.tracked);
        let mut live = Vec::with_capacity(opts.tracked);
        for n in 0..opts.tracked {
            live.push(one_item(&launcher, &fake, &feed, 2_000_000 + n).await?);
        }
        let rss = rss_mib();
        for sandbox in &live {
            launcher.remove(sandbox).await?;
        }
        anyhow::Ok(ControllerResult {
            cpu_ms_per_item: per_item,
            floor_cpu_ms_per_item: floor,
            rss_mib: rss,
        })
    })?;
    drop(fake);
    println!(
        "controller: {:.3} ms CPU per item ({:.2}x the floor of {:.3} ms; target <= 2 ms), RSS {:.1} MiB with {} items tracked (target <= 60 MiB)",
        result.cpu_ms_per_item,
        result.cpu_ms_per_item / result.floor_cpu_ms_per_item,
        result.floor_cpu_ms_per_item,
        result.rss_mib,
        opts.tracked
    );
    Ok(result)
}
