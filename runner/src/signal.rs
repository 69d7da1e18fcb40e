//! SIGTERM and SIGINT: a Stop request from the runner's supervisor (or the
//! sandbox shut down from outside: an eviction, `docker stop`). The runner
//! may be PID 1 of its container, where a signal with no handler is
//! ignored, so both are handled explicitly: the first ends the item the way
//! a graceful Stop does ([`crate::item`]), and from then on the process
//! exits within [`EXIT_BOUND`] whatever is still running; a second signal
//! ends it at once.

use crate::exit::Exit;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// After the first signal the runner is gone within this: its tail (the
/// running tool call cancelled, the Memory flush bounded by
/// [`crate::memory::SIGNAL_FLUSH_BOUND`], the final Stop) fits inside it,
/// and a supervisor's grace after signalling should be longer.
pub const EXIT_BOUND: Duration = Duration::from_secs(15);

/// A token cancelled at the first SIGTERM or SIGINT (within a runtime).
pub fn listen() -> CancellationToken {
    let asked = CancellationToken::new();
    let signals = signal(SignalKind::terminate())
        .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
    let (mut term, mut int) = match signals {
        Ok(signals) => signals,
        Err(err) => {
            tracing::error!(error = %err, "cannot handle SIGTERM and SIGINT; a Stop is noticed at the next heartbeat only");
            return asked;
        }
    };
    let token = asked.clone();
    let bound = exit_bound();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, bound = ?EXIT_BOUND, "asked to stop; ending the item");
        token.cancel();
        match bound {
            Some(start) => {
                let _ = start.send(());
            }
            None => {
                tokio::spawn(async {
                    tokio::time::sleep(EXIT_BOUND).await;
                    exit_late();
                });
            }
        }
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("asked to stop a second time; exiting at once");
        std::process::exit(Exit::Signalled as i32);
    });
    asked
}

/// The thread that ends the process [`EXIT_BOUND`] after the first signal,
/// started by the returned sender. A thread, so a runtime busy in a
/// blocking step cannot hold it up; made now, since after a tool filled the
/// pids limit none could be (`None` then: a timer on the runtime stands in).
fn exit_bound() -> Option<std::sync::mpsc::Sender<()>> {
    let (start, started) = std::sync::mpsc::channel::<()>();
    let made = std::thread::Builder::new()
        .name("mango-exit-bound".into())
        .spawn(move || {
            // An error only once the runner is ending anyway.
            if started.recv().is_ok() {
                std::thread::sleep(EXIT_BOUND);
                exit_late();
            }
        });
    match made {
        Ok(_) => Some(start),
        Err(err) => {
            tracing::warn!(error = %err, "no thread for the exit bound; a timer on the runtime keeps it");
            None
        }
    }
}

fn exit_late() {
    tracing::error!(bound = ?EXIT_BOUND, "the item did not end in time after the stop signal; exiting");
    std::process::exit(Exit::Signalled as i32);
}
