//! The suite's own PostgreSQL cluster (`scripts/pg.sh` with its own state
//! folder and port), so that a scenario can restart it without touching the
//! cluster every other test uses.

use anyhow::Context;
use std::path::PathBuf;

pub struct Cluster {
    script: PathBuf,
    state: PathBuf,
    port: u16,
    /// `postgres://…/mango`: the suite creates its run's database beside it.
    pub admin_url: String,
}

/// How PostgreSQL is told to stop (`pg_ctl -m`).
#[derive(Clone, Copy, Debug)]
pub enum Shutdown {
    /// Sessions rolled back, a clean checkpoint.
    Fast,
    /// No checkpoint: crash recovery at the next start.
    Immediate,
}

impl Shutdown {
    fn as_str(self) -> &'static str {
        match self {
            Shutdown::Fast => "fast",
            Shutdown::Immediate => "immediate",
        }
    }
}

impl Cluster {
    /// Starts (or finds running) the cluster in `state` on `port`.
    pub async fn start(script: PathBuf, state: PathBuf, port: u16) -> anyhow::Result<Cluster> {
        let mut cluster = Cluster {
            script,
            state,
            port,
            admin_url: String::new(),
        };
        cluster.admin_url = cluster.pg(&["start"]).await?;
        cluster.durable_commits().await?;
        Ok(cluster)
    }

    /// `synchronous_commit = on`, as a production server has it. The
    /// development cluster turns it off for speed, and then an immediate
    /// stop loses the last commits the api already streamed: a runner holds
    /// a tool call the restarted database never had, and its result is
    /// refused. The suite tests what a production database promises.
    async fn durable_commits(&self) -> anyhow::Result<()> {
        use sqlx::Connection;
        let mut db = sqlx::PgConnection::connect(&self.admin_url)
            .await
            .context("connecting to the suite's cluster")?;
        // Two statements: one query string of both is one transaction
        // block, which ALTER SYSTEM refuses.
        for statement in [
            "ALTER SYSTEM SET synchronous_commit = on",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(statement)
                .execute(&mut db)
                .await
                .context("setting synchronous_commit")?;
        }
        db.close().await?;
        let mut db = sqlx::PgConnection::connect(&self.admin_url).await?;
        let (setting,): (String,) = sqlx::query_as("SHOW synchronous_commit")
            .fetch_one(&mut db)
            .await?;
        anyhow::ensure!(
            setting == "on",
            "the suite's cluster has synchronous_commit = {setting}"
        );
        Ok(())
    }

    /// Stops it with `mode` and starts it again on the same port.
    pub async fn restart(&self, mode: Shutdown) -> anyhow::Result<()> {
        self.pg(&["restart", mode.as_str()]).await.map(drop)
    }

    pub async fn stop(&self) -> anyhow::Result<()> {
        self.pg(&["stop", "fast"]).await.map(drop)
    }

    async fn pg(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = tokio::process::Command::new(&self.script)
            .args(args)
            .env("MANGO_PG_STATE", &self.state)
            .env("MANGO_PG_PORT", self.port.to_string())
            .output()
            .await
            .with_context(|| format!("running {}", self.script.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} {args:?}: {}",
            self.script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}
