//! `mango-worker`: the supervisor's binary. Its launchers (`docker`,
//! `kubernetes`, `local`) start one sandbox per acknowledged Work item;
//! `item` runs one item in this process, as the seed's `HandleItem` does
//! (the same code as `mango-runner`).

use clap::{Parser, Subcommand};
use mango_runner::item::{self, Identity};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "mango-worker", version, about = "The Mango supervisor")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one acknowledged Work item here; the Work secret is read from
    /// stdin (an alias of `mango-runner`).
    Item(Identity),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Item(identity) => item::run(identity),
    }
}
