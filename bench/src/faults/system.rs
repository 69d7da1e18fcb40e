//! The system under attack, as operators run it: the suite's PostgreSQL
//! cluster, two `mango serve` processes on one database, `mango-worker
//! docker` (runners in containers on the suite's fenced network) and
//! `mango-worker local`, the model endpoint, and every Workspace,
//! Environment and model key the suite made (the secrets no log may hold).

use super::cluster::Cluster;
use super::model::Model;
use super::procs::{free_port, Proc};
use anyhow::Context;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The run's pools, network and PostgreSQL state, all from one name
/// (`faults`, or `soak`): its own, so that it never meets another
/// supervisor's sandboxes, and two runs of different names on one engine
/// never see (nor remove) each other's.
pub struct Names {
    pub suite: String,
    pub docker_pool: String,
    pub local_pool: String,
    pub network: String,
}

static NAMES: OnceLock<Names> = OnceLock::new();

impl Names {
    /// `<name>-docker`, `<name>-local`, `mango-<name>`, `.mango/<name>-pg`.
    pub fn of(name: &str) -> anyhow::Result<Names> {
        let valid = (1..=20).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        anyhow::ensure!(
            valid,
            "the run's name {name:?} must be 1 to 20 lowercase letters, digits or '-', starting with a letter"
        );
        Ok(Names {
            suite: name.to_string(),
            docker_pool: format!("{name}-docker"),
            local_pool: format!("{name}-local"),
            network: format!("mango-{name}"),
        })
    }
}

/// Fixes the run's names, once per process and before its system starts.
pub fn use_names(name: &str) -> anyhow::Result<()> {
    let wanted = Names::of(name)?;
    let fixed = NAMES.get_or_init(|| wanted);
    anyhow::ensure!(
        fixed.suite == name,
        "this process already runs as {:?}, not {name:?}",
        fixed.suite
    );
    Ok(())
}

/// The run's names (`faults` unless [`use_names`] fixed others).
pub fn names() -> &'static Names {
    NAMES.get_or_init(|| Names::of("faults").expect("a valid name"))
}
/// Each Session workspace's size in the Docker pool.
pub const WORKSPACE_BYTES: u64 = 32 << 20;
/// Each Docker sandbox's `/tmp` and Memory Store mount (tmpfs), MiB: small,
/// so that a store (up to 40 MiB) can be larger than its mount.
pub const TMPFS_MIB: u32 = 8;

pub struct Settings {
    pub bin_dir: PathBuf,
    pub repo: PathBuf,
    pub scratch: PathBuf,
    pub pg_port: u16,
    pub image: String,
    pub ttl_seconds: u64,
    pub concurrency: u32,
}

/// One `mango serve`: its operators' and sandboxes' addresses stay the same
/// across restarts, so supervisors and runners find it again.
pub struct ApiProcess {
    pub name: String,
    pub port: u16,
    pub sandbox_port: u16,
    pub proc: Option<Proc>,
}

impl ApiProcess {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Which supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Docker,
    Local,
}

pub struct System {
    pub settings: Settings,
    pub cluster: Cluster,
    pub db_url: String,
    pub db: PgPool,
    pub logs: PathBuf,
    pub model: Model,
    pub apis: Vec<Mutex<ApiProcess>>,
    pub ws_key: String,
    pub env_id: String,
    pub env_key: Mutex<String>,
    pub env_key_id: Mutex<String>,
    /// An Environment no supervisor polls: the suite holds its leases itself.
    pub probe_env_id: String,
    pub probe_env_key: String,
    pub agent_id: String,
    pub docker: bollard::Docker,
    pub gateway: std::net::IpAddr,
    pub workers: Mutex<Vec<(Launcher, Proc)>>,
    pub warm: Mutex<u32>,
    /// The Docker supervisor's keep (`MANGO_KEEP_IDLE`) and its runners'
    /// idle end after an end-of-turn idle; `None`: nothing kept.
    pub keep_idle: Mutex<Option<(Duration, u32)>>,
    /// Every secret the suite made or saw: no log line may hold one.
    pub secrets: Mutex<Vec<String>>,
    pub http: reqwest::Client,
    model_key: String,
}

/// The model endpoint's key: a secret the api holds and must never log.
fn model_key() -> String {
    format!("sk-faults-{:032x}", rand::random::<u128>())
}

impl System {
    pub async fn start(settings: Settings) -> anyhow::Result<System> {
        let logs = settings.scratch.join("logs");
        std::fs::create_dir_all(&logs)?;
        let cluster = Cluster::start(
            settings.repo.join("scripts/pg.sh"),
            settings.repo.join(format!(".mango/{}-pg", names().suite)),
            settings.pg_port,
        )
        .await?;
        let db_name = format!("mango_faults_{:08x}", rand::random::<u32>());
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&cluster.admin_url)
            .await
            .context("the suite's cluster")?;
        sqlx::query(&format!("CREATE DATABASE \"{db_name}\""))
            .execute(&admin)
            .await?;
        admin.close().await;
        let db_url = cluster
            .admin_url
            .rsplit_once('/')
            .expect("a URL")
            .0
            .to_string()
            + "/"
            + &db_name;
        let db = PgPoolOptions::new()
            .max_connections(4)
            .connect(&db_url)
            .await?;
        mango_api::MIGRATOR.run(&db).await?;

        let docker = bollard::Docker::connect_with_local_defaults()?
            .negotiate_version()
            .await
            .context("no Docker engine answers")?;
        docker
            .inspect_image(&settings.image)
            .await
            .with_context(|| {
                format!(
                    "the sandbox image {} (scripts/sandbox-image.sh)",
                    settings.image
                )
            })?;
        let gateway = std::net::IpAddr::V4(
            mango_controller::docker::fenced_network(&docker, &names().network)
                .await
                .map_err(|e| anyhow::anyhow!("the fenced network {}: {e}", names().network))?
                .gateway,
        );
        let model = Model::start().await?;
        let mut apis = Vec::new();
        for name in ["api-a", "api-b"] {
            apis.push(Mutex::new(ApiProcess {
                name: name.into(),
                port: free_port()?,
                sandbox_port: free_port()?,
                proc: None,
            }));
        }
        let key = model_key();
        let mut system = System {
            settings,
            cluster,
            db_url,
            db,
            logs,
            model,
            apis,
            ws_key: String::new(),
            env_id: String::new(),
            env_key: Mutex::new(String::new()),
            env_key_id: Mutex::new(String::new()),
            probe_env_id: String::new(),
            probe_env_key: String::new(),
            agent_id: String::new(),
            docker,
            gateway,
            workers: Mutex::new(Vec::new()),
            warm: Mutex::new(0),
            keep_idle: Mutex::new(None),
            secrets: Mutex::new(vec![key.clone()]),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            model_key: key,
        };
        for i in 0..2 {
            system.start_api(i).await?;
        }
        system.ws_key = system.create_key(None).await?.0;
        system.env_id = system.create_environment("faults").await?;
        let (key, id) = system.create_key(Some(&system.env_id.clone())).await?;
        *system.env_key.lock().unwrap() = key;
        *system.env_key_id.lock().unwrap() = id;
        system.probe_env_id = system.create_environment("faults-probe").await?;
        system.probe_env_key = system
            .create_key(Some(&system.probe_env_id.clone()))
            .await?
            .0;
        system.agent_id = system.create_agent().await?;
        Ok(system)
    }
}

/// An answer: its status and JSON body (`null` when it had none).
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl System {
    fn bin(&self, name: &str) -> PathBuf {
        self.settings.bin_dir.join(name)
    }

    /// Starts api process `i` (again) on its fixed ports; returns once it is ready.
    pub async fn start_api(&self, i: usize) -> anyhow::Result<()> {
        let (name, port, sandbox_port) = {
            let api = self.apis[i].lock().unwrap();
            (api.name.clone(), api.port, api.sandbox_port)
        };
        let scratch = &self.settings.scratch;
        let env = vec![
            ("MANGO_DATABASE_URL".to_string(), self.db_url.clone()),
            ("MANGO_LISTEN_ADDR".into(), format!("127.0.0.1:{port}")),
            (
                "MANGO_SANDBOX_LISTEN_ADDR".into(),
                format!("{}:{sandbox_port}", self.gateway),
            ),
            (
                "MANGO_METRICS_ADDR".into(),
                format!("127.0.0.1:{}", free_port()?),
            ),
            ("MANGO_MODEL_BASE_URL".into(), self.model.base.clone()),
            ("MANGO_MODEL_API_KEY".into(), self.model_key.clone()),
            ("MANGO_MODEL_TIMEOUT_SECONDS".into(), "20".into()),
            (
                "MANGO_DEFAULT_TTL_SECONDS".into(),
                self.settings.ttl_seconds.to_string(),
            ),
            (
                "MANGO_OBJECT_STORE".into(),
                scratch.join("objects").to_string_lossy().into_owned(),
            ),
            // Sessions mount their Memory Stores at the default root, where
            // the Docker pool's sandboxes have their tmpfs for them; the
            // scenarios that attach stores run on that pool alone.
            ("MANGO_LOG".into(), "info".into()),
        ];
        let proc = Proc::spawn(
            &name,
            &self.bin("mango"),
            &["serve", "--no-migrate"],
            &env,
            &self.logs,
        )?;
        self.apis[i].lock().unwrap().proc = Some(proc);
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.http.get(&ready).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} was not ready within 30 s"
            );
            // Poll interval of this deadline loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `signal` to api process `i` and reaps it.
    pub async fn end_api(&self, i: usize, signal: i32) -> anyhow::Result<()> {
        let proc = self.apis[i].lock().unwrap().proc.take();
        if let Some(mut proc) = proc {
            proc.signal(signal)?;
            proc.exit(Duration::from_secs(15)).await?;
        }
        Ok(())
    }

    pub fn api_base(&self, i: usize) -> String {
        self.apis[i].lock().unwrap().base()
    }

    /// `mango api-key create` (an Environment key with `environment`):
    /// the secret and the key's id.
    pub async fn create_key(&self, environment: Option<&str>) -> anyhow::Result<(String, String)> {
        let mut args = vec![
            "api-key",
            "create",
            "--workspace",
            "wrkspc_default",
            "--label",
            "faults",
            "--json",
        ];
        if let Some(env) = environment {
            args.extend(["--environment", env]);
        }
        let out = self.mango_cli(&args).await?;
        let secret = out["api_key"]
            .as_str()
            .context("api-key create printed no api_key")?
            .to_string();
        let id = out["id"].as_str().unwrap_or_default().to_string();
        self.secrets.lock().unwrap().push(secret.clone());
        Ok((secret, id))
    }

    /// `mango api-key revoke --id`.
    pub async fn revoke_key(&self, id: &str) -> anyhow::Result<()> {
        self.mango_cli(&["api-key", "revoke", "--id", id, "--json"])
            .await
            .map(drop)
    }

    async fn mango_cli(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = tokio::process::Command::new(self.bin("mango"))
            .args(args)
            .env_clear()
            .env("MANGO_DATABASE_URL", &self.db_url)
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "mango {}: {}",
            args[..2].join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// One call with `key`, to whichever api process answers first (in
    /// turn from `prefer`): an operator's client fails over. A connection
    /// that fails is retried on the other process for up to `within`.
    pub async fn call_with(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<&Value>,
        within: Duration,
    ) -> anyhow::Result<Reply> {
        let deadline = Instant::now() + within;
        let mut turn = rand::random::<u8>() as usize;
        loop {
            let base = self.api_base(turn % self.apis.len());
            turn += 1;
            let mut request = self
                .http
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(key);
            if let Some(body) = body {
                request = request.json(body);
            }
            match request.send().await {
                Ok(reply) => {
                    let status = reply.status().as_u16();
                    let bytes = reply.bytes().await.unwrap_or_default();
                    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    // A process that went down mid-request, or a database
                    // restarting under it, is tried again, as a client would.
                    if status < 500 || Instant::now() >= deadline {
                        return Ok(Reply { status, body });
                    }
                }
                Err(err) if Instant::now() >= deadline => {
                    anyhow::bail!("{method} {path}: no api process answered: {err}")
                }
                Err(_) => {}
            }
            // Poll interval of this retry deadline loop.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// [`System::call_with`] the Workspace key, within 60 s.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        self.call_with(method, path, &self.ws_key, body, Duration::from_secs(60))
            .await
    }

    /// `method path` that must answer `want`; its body.
    pub async fn expect(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        want: u16,
    ) -> anyhow::Result<Value> {
        let reply = self.call(method.clone(), path, body).await?;
        anyhow::ensure!(
            reply.status == want,
            "{method} {path}: {} {}",
            reply.status,
            reply.body
        );
        Ok(reply.body)
    }

    pub async fn create_environment(&self, name: &str) -> anyhow::Result<String> {
        let body = json!({"name": name, "config": {"type": "self_hosted"}});
        let env = self
            .expect(reqwest::Method::POST, "/v1/environments", Some(&body), 200)
            .await?;
        Ok(env["id"].as_str().context("an Environment id")?.to_string())
    }

    async fn create_agent(&self) -> anyhow::Result<String> {
        let body = json!({"name": "faults", "model": "faults-scripted", "system": "be brief",
            "tools": [{"type": "agent_toolset_20260401"}]});
        let agent = self
            .expect(reqwest::Method::POST, "/v1/agents", Some(&body), 200)
            .await?;
        Ok(agent["id"].as_str().context("an Agent id")?.to_string())
    }

    /// The api process a launcher's supervisor and its runners use: Docker
    /// the first, local the second, so killing one api leaves one pool served.
    fn api_of(launcher: Launcher) -> usize {
        match launcher {
            Launcher::Docker => 0,
            Launcher::Local => 1,
        }
    }

    /// Starts `launcher`'s supervisor with the current Environment key.
    pub async fn start_worker(&self, launcher: Launcher) -> anyhow::Result<()> {
        let api = Self::api_of(launcher);
        let (base, sandbox_port) = {
            let a = self.apis[api].lock().unwrap();
            (a.base(), a.sandbox_port)
        };
        let scratch = &self.settings.scratch;
        let mut env = vec![
            (
                "MANGO_ENVIRONMENT_KEY".to_string(),
                self.env_key.lock().unwrap().clone(),
            ),
            ("MANGO_ENVIRONMENT_ID".into(), self.env_id.clone()),
            ("MANGO_BASE_URL".into(), base),
            (
                "MANGO_MAX_CONCURRENCY".into(),
                self.settings.concurrency.to_string(),
            ),
            ("MANGO_METRICS_ADDR".into(), "127.0.0.1:0".into()),
            ("MANGO_WORKSPACE_SWEEP_SECONDS".into(), "2".into()),
            ("MANGO_LOG".into(), "info".into()),
        ];
        let (name, args): (&str, Vec<String>) = match launcher {
            Launcher::Docker => {
                env.extend([
                    (
                        "MANGO_DOCKER_BASE_URL".to_string(),
                        format!("http://host.docker.internal:{sandbox_port}"),
                    ),
                    ("MANGO_DOCKER_IMAGE".into(), self.settings.image.clone()),
                    ("MANGO_POOL".into(), names().docker_pool.clone()),
                    ("MANGO_WORKER_ID".into(), names().docker_pool.clone()),
                    ("MANGO_DOCKER_NETWORK".into(), names().network.clone()),
                    (
                        "MANGO_DOCKER_WORKSPACE_ROOT".into(),
                        scratch.join("workspaces").to_string_lossy().into_owned(),
                    ),
                    ("MANGO_WORKSPACE_SIZE".into(), WORKSPACE_BYTES.to_string()),
                    ("MANGO_SANDBOX_TMPFS_MIB".into(), TMPFS_MIB.to_string()),
                    ("MANGO_WARM".into(), self.warm.lock().unwrap().to_string()),
                ]);
                if let Some((keep, idle)) = *self.keep_idle.lock().unwrap() {
                    env.extend([
                        ("MANGO_KEEP_IDLE".to_string(), keep.as_secs().to_string()),
                        (
                            "MANGO_DOCKER_IDLE_AFTER_END_TURN_SECONDS".into(),
                            idle.to_string(),
                        ),
                    ]);
                } else {
                    // The other scenarios' sandboxes go after each activation,
                    // whatever mango-worker's default keep is.
                    env.push(("MANGO_KEEP_IDLE".to_string(), "0".to_string()));
                }
                ("worker-docker", vec!["docker".into()])
            }
            Launcher::Local => {
                env.extend([
                    ("MANGO_POOL".to_string(), names().local_pool.clone()),
                    ("MANGO_WORKER_ID".into(), names().local_pool.clone()),
                    (
                        "MANGO_RUNNER_BIN".into(),
                        self.bin("mango-runner").to_string_lossy().into_owned(),
                    ),
                ]);
                (
                    "worker-local",
                    vec![
                        "local".into(),
                        "--root".into(),
                        self.local_root().to_string_lossy().into_owned(),
                    ],
                )
            }
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = self.logs.join(format!("{name}.log"));
        let polling = |log: &Path| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .matches("\"supervisor polling\"")
                .count()
        };
        let before = polling(&log);
        let proc = Proc::spawn(name, &self.bin("mango-worker"), &args, &env, &self.logs)?;
        self.workers.lock().unwrap().push((launcher, proc));
        // Ready once it polls: a signal before then (its handlers are not
        // yet installed) would be a different fault from the one meant.
        let deadline = Instant::now() + Duration::from_secs(60);
        while polling(&log) <= before {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the {launcher:?} supervisor did not start polling within 60 s"
            );
            // Poll interval of this deadline loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Sends `signal` to `launcher`'s supervisor; its exit status within `within`.
    pub async fn end_worker(
        &self,
        launcher: Launcher,
        signal: i32,
        within: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let taken = {
            let mut workers = self.workers.lock().unwrap();
            let at = workers
                .iter()
                .position(|(l, _)| *l == launcher)
                .with_context(|| format!("no {launcher:?} supervisor runs"))?;
            workers.remove(at).1
        };
        let mut proc = taken;
        proc.signal(signal)?;
        proc.exit(within).await
    }

    /// Supervisors that exited by themselves (name and status).
    pub fn exited_workers(&self) -> Vec<String> {
        let mut workers = self.workers.lock().unwrap();
        workers
            .iter_mut()
            .filter_map(|(l, p)| p.exited().map(|s| format!("{l:?} supervisor exited: {s}")))
            .collect()
    }

    pub fn local_root(&self) -> PathBuf {
        self.settings.scratch.join("local")
    }

    /// Ends every process, removes the suite's containers and volumes, drops
    /// the database and stops the cluster.
    pub async fn teardown(&self) {
        let workers: Vec<_> = self.workers.lock().unwrap().drain(..).collect();
        for (_, mut proc) in workers {
            proc.kill().await;
        }
        for api in &self.apis {
            let proc = api.lock().unwrap().proc.take();
            if let Some(mut proc) = proc {
                proc.kill().await;
            }
        }
        super::sandboxes::remove_all(&self.docker, &self.settings.scratch).await;
        self.db.close().await;
        if let Err(err) = self.cluster.stop().await {
            eprintln!("faults: stopping the suite's PostgreSQL: {err:#}");
        }
    }

    /// All the logs so far, each file's path and text.
    pub fn all_logs(&self) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        collect_logs(&self.logs, &mut out);
        collect_logs(&self.local_root().join("logs"), &mut out);
        out
    }
}

fn collect_logs(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Names;

    #[test]
    fn a_name_gives_every_name_of_the_run_and_a_bad_one_is_refused() {
        let n = Names::of("soak").unwrap();
        assert_eq!(
            (
                n.docker_pool.as_str(),
                n.local_pool.as_str(),
                n.network.as_str()
            ),
            ("soak-docker", "soak-local", "mango-soak")
        );
        assert!(Names::of(&"a".repeat(20)).is_ok());
        for bad in ["", "Soak", "1soak", "so_ak", "so ak", &"a".repeat(21)] {
            let err = Names::of(bad).err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.contains("must be")), "{bad:?}");
        }
    }
}
