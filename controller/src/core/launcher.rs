//! What a launcher does for the supervisor: one sandbox per acknowledged
//! item, from creation to removal. The supervisor core decides when; a
//! launcher (`docker`, `local`, and next `kubernetes`) only knows how.

use crate::core::naming;
use crate::core::secret::Secret;
use mango_protocol::WorkType;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// Which item a sandbox serves: the non-secret identity of spec §7.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemIdentity {
    pub work_id: String,
    /// The claim this sandbox was made for (Poll's `claim`).
    pub claim: i64,
    pub environment_id: String,
    pub work_type: WorkType,
    /// Session Work only.
    pub session_id: Option<String>,
}

/// Everything a launcher needs to make one item's sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique per Work id and claim ([`naming::sandbox_name`]):
    /// a second create for the same claim conflicts.
    pub name: String,
    pub item: ItemIdentity,
    /// `mango.dev/…` labels, so operators find an item's sandbox.
    pub labels: BTreeMap<String, String>,
    /// The runner's environment: identity only, never a credential.
    pub env: Vec<(String, String)>,
}

impl SandboxSpec {
    /// The sandbox of `item` in `pool`, whose runner reaches the api at `base_url`.
    pub fn for_item(item: &ItemIdentity, pool: &str, base_url: &str) -> SandboxSpec {
        SandboxSpec {
            name: naming::sandbox_name(&item.work_id, item.claim),
            item: item.clone(),
            labels: naming::labels(item, pool),
            env: naming::runner_env(item, base_url),
        }
    }
}

/// A sandbox a launcher made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub name: String,
    /// The launcher's own handle (a container id, a process id…).
    pub handle: String,
    pub item: ItemIdentity,
}

/// A sandbox left by an earlier run of the supervisor.
#[derive(Debug, Clone)]
pub struct Found {
    pub sandbox: Sandbox,
    /// Running with its secret delivered (the supervisor may adopt it);
    /// otherwise it exited, or never got its secret, and is removed.
    pub running: bool,
}

/// A started sandbox no item owns yet (spec §7.1): its runner waits,
/// identity-less, for an envelope. The supervisor's warm pool holds each
/// by value and hands it out once.
#[derive(Debug, PartialEq, Eq)]
pub struct Warm {
    pub name: String,
    /// The launcher's own handle (a container id…).
    pub handle: String,
    /// The image it runs, as the engine identifies it: a pool whose image
    /// changed recycles the warm sandboxes of the old one.
    pub image: String,
}

/// When the hand-off's two stages happened.
#[derive(Debug, Clone, Copy)]
pub struct HandOff {
    /// The runner's process started.
    pub started: Instant,
    /// The secret was written and stdin closed.
    pub delivered: Instant,
}

/// How a sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxExit {
    /// The runner exited with this status (see `mango_runner::exit::Exit`).
    Exited(i64),
    /// The sandbox disappeared (removed from outside).
    Gone,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A sandbox of this name exists: this claim has one already.
    #[error("a sandbox named {0} exists already")]
    AlreadyExists(String),
    /// The warm sandbox is bound to another item already: not the caller's
    /// to bind or remove.
    #[error("warm sandbox {0} is bound to another item")]
    Taken(String),
    /// The sandbox does not exist (any more).
    #[error("sandbox {0} does not exist")]
    NotFound(String),
    /// The engine (Docker daemon, Kubernetes API, the local system) did not answer.
    #[error("the {engine} is unavailable: {message}")]
    Unavailable {
        engine: &'static str,
        message: String,
    },
    /// The sandbox's workspace could not be prepared.
    #[error("the workspace could not be prepared: {0}")]
    Workspace(String),
    /// The image, the runner binary or another input does not exist.
    #[error("{0}")]
    Missing(String),
    /// The engine refused or failed the request.
    #[error("{0}")]
    Failed(String),
}

/// One kind of sandbox. Every call is bounded by the caller.
pub trait Launcher: Send + Sync + 'static {
    /// What to call it in logs and metrics (`docker`, `local`).
    fn kind(&self) -> &'static str;

    /// The sandboxes of this supervisor's pool that already exist.
    fn existing(&self) -> impl Future<Output = Result<Vec<Found>, LaunchError>> + Send;

    /// Makes the sandbox, not yet started, with its workspace (a Session's
    /// persists across activations; a healthcheck's is ephemeral). A name
    /// that exists is [`LaunchError::AlreadyExists`], never a second sandbox.
    fn create(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<Sandbox, LaunchError>> + Send;

    /// Starts the sandbox's runner and writes the secret to its stdin, once,
    /// then closes stdin. The secret goes nowhere else.
    fn hand_off(
        &self,
        sandbox: &Sandbox,
        secret: Secret,
    ) -> impl Future<Output = Result<HandOff, LaunchError>> + Send;

    /// Until the runner exits.
    fn wait(
        &self,
        sandbox: &Sandbox,
    ) -> impl Future<Output = Result<SandboxExit, LaunchError>> + Send;

    /// Asks the sandbox's runner to stop (its Work is `stopping`): SIGTERM
    /// to the runner, which ends the item as a graceful Stop does and exits
    /// by itself. `grace` is how long the supervisor waits for that exit
    /// before it removes the sandbox; an engine that kills after a grace of
    /// its own gives it no less. A sandbox already gone is asked.
    fn signal_stop(
        &self,
        sandbox: &Sandbox,
        grace: Duration,
    ) -> impl Future<Output = Result<(), LaunchError>> + Send;

    /// Removes the sandbox at once (zero grace: the runner has finished, or
    /// its Work was stopped or reclaimed), keeping a Session's workspace.
    /// A sandbox already gone is removed.
    fn remove(&self, sandbox: &Sandbox) -> impl Future<Output = Result<(), LaunchError>> + Send;

    /// The Sessions of Environment `environment_id` this launcher keeps a
    /// workspace for (a volume, a PVC, a folder).
    fn workspaces(
        &self,
        environment_id: &str,
    ) -> impl Future<Output = Result<Vec<String>, LaunchError>> + Send;

    /// Removes Session `session_id`'s workspace, whose Session is deleted.
    /// A workspace already gone is removed.
    fn remove_workspace(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<(), LaunchError>> + Send;

    // The warm half (spec §7.1). The defaults mean "no warm sandboxes":
    // the supervisor then starts every item cold.

    /// The image new warm sandboxes would run now; `None`: this launcher
    /// makes no warm sandboxes.
    fn warm_image(&self) -> impl Future<Output = Result<Option<String>, LaunchError>> + Send {
        async { Ok(None) }
    }

    /// Makes and starts one warm sandbox of `owner` (the supervisor's
    /// worker id), with a fresh workspace and no identity.
    fn create_warm(&self, owner: &str) -> impl Future<Output = Result<Warm, LaunchError>> + Send {
        let _ = owner;
        async {
            Err(LaunchError::Failed(
                "this launcher has no warm sandboxes".into(),
            ))
        }
    }

    /// The unbound warm sandboxes `owner` left (another supervisor's are
    /// never listed: only their owner may bind them).
    fn existing_warm(
        &self,
        owner: &str,
    ) -> impl Future<Output = Result<Vec<Warm>, LaunchError>> + Send {
        let _ = owner;
        async { Ok(Vec::new()) }
    }

    /// Whether Session `session_id` has a workspace already: then it never
    /// goes warm (a warm sandbox's workspace is fresh).
    fn has_workspace(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<bool, LaunchError>> + Send {
        let _ = session_id;
        async { Ok(true) }
    }

    /// Makes `warm` the sandbox of `spec`'s item: findable by its name and
    /// item as a cold one is, and, for Session Work, its workspace the
    /// Session's from now on.
    fn bind(
        &self,
        warm: &Warm,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<Sandbox, LaunchError>> + Send {
        let _ = (warm, spec);
        async {
            Err(LaunchError::Failed(
                "this launcher has no warm sandboxes".into(),
            ))
        }
    }

    /// Writes the envelope line to the bound sandbox's waiting runner, once.
    /// Returns when it was written.
    fn deliver(
        &self,
        sandbox: &Sandbox,
        envelope: Secret,
    ) -> impl Future<Output = Result<Instant, LaunchError>> + Send {
        let _ = (sandbox, envelope);
        async {
            Err(LaunchError::Failed(
                "this launcher has no warm sandboxes".into(),
            ))
        }
    }

    /// Until the runner of the warm sandbox `handle` exits (it should not
    /// while it waits).
    fn wait_warm(
        &self,
        handle: &str,
    ) -> impl Future<Output = Result<SandboxExit, LaunchError>> + Send {
        let _ = handle;
        async { Ok(SandboxExit::Gone) }
    }

    /// Removes an unbound warm sandbox and its workspace. One already gone
    /// is removed.
    fn remove_warm(&self, warm: &Warm) -> impl Future<Output = Result<(), LaunchError>> + Send {
        let _ = warm;
        async { Ok(()) }
    }

    // The kept half (spec §7.1). The defaults mean "nothing is kept": every
    // sandbox is removed after its activation.

    /// Whether `sandbox` (made cold, or warm and bound) runs a runner that
    /// takes one envelope per activation and, after an idle end, waits for
    /// its Session's next: then, made cold, it is started with
    /// [`Launcher::start_waiting`] and gets [`Launcher::deliver`], never
    /// [`Launcher::hand_off`], and it may be kept. Asked of the sandbox, not
    /// of its item: whether its runner can wait is its image's to say.
    /// Never for a healthcheck.
    fn waits(&self, sandbox: &Sandbox) -> bool {
        let _ = sandbox;
        false
    }

    /// Starts a created sandbox whose runner waits for an envelope (see
    /// [`Launcher::waits`]); returns when it started.
    fn start_waiting(
        &self,
        sandbox: &Sandbox,
    ) -> impl Future<Output = Result<Instant, LaunchError>> + Send {
        let _ = sandbox;
        async {
            Err(LaunchError::Failed(
                "this launcher keeps no sandboxes".into(),
            ))
        }
    }

    /// The image `sandbox` runs, as [`Launcher::warm_image`] names images;
    /// `None`: not known, and then never the reason to recycle it.
    fn image_of(
        &self,
        sandbox: &Sandbox,
    ) -> impl Future<Output = Result<Option<String>, LaunchError>> + Send {
        let _ = sandbox;
        async { Ok(None) }
    }

    /// Makes the kept `sandbox` (its runner waiting after an idle end) the
    /// sandbox of `spec`'s item, of the same Session: found by the new item's
    /// name and identity from now on, by operators and by a restarted
    /// supervisor's [`Launcher::existing`], and no longer by the old.
    fn rebind(
        &self,
        sandbox: &Sandbox,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<Sandbox, LaunchError>> + Send {
        let _ = (sandbox, spec);
        async {
            Err(LaunchError::Failed(
                "this launcher keeps no sandboxes".into(),
            ))
        }
    }
}
