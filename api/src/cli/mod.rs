//! The operator's commands (`mango work|sessions|environments …`): the api
//! read and driven over HTTP with a Workspace key, so they work against a
//! remote api as well as a local one. Tables for people, `--json` for
//! scripts; errors are one line on stderr and an exit code
//! ([`Failure::code`], docs/operator-cli.md).

mod environments;
mod error;
mod events;
mod sessions;
mod table;
mod work;

use clap::{Args, Subcommand};
use mango_client::{Client, RetryPolicy};
use std::process::ExitCode;
use std::time::Duration;

pub use error::Failure;

/// Where the api is and the Workspace key to call it with.
#[derive(Args, Clone)]
pub struct Remote {
    /// The api's base URL.
    #[arg(
        long,
        global = true,
        env = "MANGO_BASE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    base_url: String,
    /// A Workspace key (`mango api-key create`); never printed.
    #[arg(long, global = true, env = "MANGO_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

impl Remote {
    fn client(&self) -> Result<Client, Failure> {
        let key = self
            .api_key
            .as_deref()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| {
                Failure::usage("no Workspace key: set MANGO_API_KEY or pass --api-key")
            })?;
        // An operator waits for an answer: a short retry, so an api that is
        // down is reported within seconds.
        let retry = RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(1),
        };
        Ok(Client::new(&self.base_url, key).with_retry(retry))
    }
}

/// The operator's commands, as `mango`'s subcommands.
#[derive(Subcommand)]
pub enum Operator {
    /// Work items: list, get and stop them.
    Work {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: work::Command,
    },
    /// Sessions: list and get them, tail and follow their events.
    Sessions {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: sessions::Command,
    },
    /// Environments and their queues.
    Environments {
        #[command(flatten)]
        remote: Remote,
        #[command(subcommand)]
        command: environments::Command,
    },
}

/// Runs one operator command; on failure prints its one line on stderr
/// and answers its exit code.
pub async fn run(operator: Operator) -> ExitCode {
    let (remote, result) = match operator {
        Operator::Work { remote, command } => {
            let result = match remote.client() {
                Ok(client) => work::run(&client, command).await,
                Err(e) => Err(e),
            };
            (remote, result)
        }
        Operator::Sessions { remote, command } => {
            let result = match remote.client() {
                Ok(client) => sessions::run(&client, command).await,
                Err(e) => Err(e),
            };
            (remote, result)
        }
        Operator::Environments { remote, command } => {
            let result = match remote.client() {
                Ok(client) => environments::run(&client, command).await,
                Err(e) => Err(e),
            };
            (remote, result)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.line(remote.api_key.as_deref()));
            ExitCode::from(failure.code())
        }
    }
}

/// Prints `value` as JSON on stdout: what `--json` answers.
fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::other(format!("could not write JSON: {e}")))?;
    println!("{text}");
    Ok(())
}
