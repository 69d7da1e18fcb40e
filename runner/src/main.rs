//! `mango-runner`: runs one acknowledged Work item inside its sandbox.
//! Identity comes from the environment and the Work secret once on stdin;
//! with `--wait`, both arrive later in one envelope on stdin (spec §7.1).

use clap::Parser;
use mango_runner::item::{self, Identity};
use mango_runner::waiting::WaitArgs;
use std::process::ExitCode;

/// Run one acknowledged Work item; the Work secret is read from stdin.
#[derive(Parser)]
#[command(name = "mango-runner", version)]
struct Cli {
    #[command(flatten)]
    identity: Identity,
}

/// Wait, identity-less, for one envelope on stdin, then run its item.
#[derive(Parser)]
#[command(name = "mango-runner", version)]
struct WaitCli {
    /// Wait for an envelope (a warm sandbox) instead of reading the identity
    /// from the environment.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    args: WaitArgs,
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--wait") {
        return item::run_waiting(WaitCli::parse().args);
    }
    item::run(Cli::parse().identity)
}
