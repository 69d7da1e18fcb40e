//! `mango environments list`: each Environment with its queue.

use super::error::{Failure, OrFailure};
use super::print_json;
use super::table::{age_or_dash, Table};
use clap::Subcommand;
use mango_client::Client;
use mango_protocol::time;
use mango_protocol::{Environment, QueueStats};

#[derive(Subcommand)]
pub enum Command {
    /// List the Environments with their queue stats.
    List {
        /// Print `[{"environment": …, "stats": …}]`, the api's objects.
        #[arg(long)]
        json: bool,
    },
}

#[derive(serde::Serialize)]
struct WithStats {
    environment: Environment,
    stats: QueueStats,
}

pub async fn run(client: &Client, command: Command) -> Result<(), Failure> {
    let Command::List { json } = command;
    let mut listed = Vec::new();
    for environment in client.list_environments().await.or_fail(client)? {
        let stats = client.stats(&environment.id).await.or_fail(client)?;
        listed.push(WithStats { environment, stats });
    }
    if json {
        return print_json(&listed);
    }
    if listed.is_empty() {
        println!("No Environments.");
        return Ok(());
    }
    let now = time::now();
    let mut t = Table::new(&[
        "ID",
        "NAME",
        "DEPTH",
        "PENDING",
        "OLDEST QUEUED",
        "WORKERS POLLING",
    ]);
    for WithStats { environment, stats } in &listed {
        t.row(vec![
            environment.id.clone(),
            environment.name.clone(),
            stats.depth.to_string(),
            stats.pending.to_string(),
            age_or_dash(stats.oldest_queued_at, now),
            stats
                .workers_polling
                .map_or("-".to_string(), |n| n.to_string()),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

/// The ids of every Environment, for commands that look across all of them.
pub async fn ids(client: &Client) -> Result<Vec<String>, Failure> {
    Ok(client
        .list_environments()
        .await
        .or_fail(client)?
        .into_iter()
        .map(|e| e.id)
        .collect())
}
