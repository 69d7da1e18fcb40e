//! `mango-runner`: runs one acknowledged Work item inside its sandbox.
//! Identity comes from the environment and the Work secret once on stdin, or
//! (`--wait`) both together in one activation envelope line on stdin.

use clap::Parser;
use mango_runner::init::{self, Role};
use mango_runner::item::{self, Identity};
use std::process::ExitCode;

/// Run one acknowledged Work item; the Work secret is read from stdin.
#[derive(Parser)]
#[command(name = "mango-runner", version)]
struct Cli {
    #[command(flatten)]
    identity: Identity,
}

fn main() -> ExitCode {
    // PID 1 of a sandbox forks the runner and stays its reaper (init.rs).
    if let Role::Exited(code) = init::start() {
        return code;
    }
    item::run(Cli::parse().identity)
}
