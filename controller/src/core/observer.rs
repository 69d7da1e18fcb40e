//! What the supervisor tells its surroundings as items come and go, beyond
//! its logs and metrics: the Kubernetes launcher turns these into Events on
//! the pool. The default observer does nothing.

use crate::core::launcher::{ItemIdentity, Sandbox};
use crate::core::metrics::Outcome;
#[cfg(feature = "bench-hooks")]
use crate::core::stages::Stamps;

/// One thing that happened to an item or a workspace.
#[derive(Debug, Clone, Copy)]
pub enum Happening<'a> {
    /// Its sandbox started and holds the secret.
    Launched(&'a Sandbox),
    /// Ack, create or hand-off failed; the lease is left to expire.
    LaunchFailed {
        item: &'a ItemIdentity,
        error: &'a str,
    },
    /// An earlier run's sandbox, adopted.
    Adopted(&'a Sandbox),
    /// Its sandbox was removed after the activation.
    Removed {
        sandbox: &'a Sandbox,
        outcome: Outcome,
    },
    /// The engine did not confirm a removal (it is retried).
    RemovalUnconfirmed {
        sandbox: &'a Sandbox,
        error: &'a str,
    },
    /// A deleted Session's workspace was removed.
    WorkspaceRemoved { session_id: &'a str },
    /// An item is done with (its sandbox gone, or its launch failed): when
    /// each of its stages happened. Only for `mango-bench supervisor`
    /// (feature `bench-hooks`); the stages are the supervisor's metrics and
    /// its `item done` debug line otherwise.
    #[cfg(feature = "bench-hooks")]
    Done {
        item: &'a ItemIdentity,
        stamps: &'a Stamps,
    },
}

pub trait Observer: Send + Sync + 'static {
    fn observe(&self, happening: Happening<'_>);
}

/// Logs and metrics only.
pub struct Quiet;

impl Observer for Quiet {
    fn observe(&self, _: Happening<'_>) {}
}
