//! The Memory Stores a Session attaches, mounted (spec §9): before any tool
//! runs the stores are measured against their mount's free space
//! ([`fit`]; stores that cannot fit fail the Session's start), then each is
//! downloaded to its `mount_path` (which must not exist yet) with a marker
//! naming it, completely or not at all; the file tools get the roots,
//! read-only ones refused by `write` and `edit`. After tool calls the stores are
//! reconciled at most every 15 s ([`sync::Store::sync`]). At the end, after
//! the shell is gone: on a clean end one final full sync, then on every end
//! a push-only flush that cannot pull or delete, each bounded by 30 s (the
//! flush by 10 s after a stop signal); then the folders are removed (one
//! failing the marker check while it holds files is left for inspection).

pub mod disk;
pub mod fit;
pub mod sync;

use crate::prepare::PrepareError;
use disk::Folder;
use mango_client::{Client, ClientError};
use mango_protocol::sessions::{MemoryAccess, Session, SessionResource};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use sync::{PullError, Store};
use tokio::time::Instant;

/// The least time between two syncs after tool calls.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(15);
/// Bound of the final sync, and separately of the flush.
pub const END_BOUND: Duration = Duration::from_secs(30);
/// Bound of the flush after a stop signal, which must fit inside the
/// supervisor's grace ([`crate::signal::EXIT_BOUND`]).
pub const SIGNAL_FLUSH_BOUND: Duration = Duration::from_secs(10);

/// The stores of one Session, on disk.
pub struct Mounted {
    client: Option<Client>,
    stores: Vec<Store>,
    interval: Duration,
    last_sync: Instant,
}

/// `mount_path` as a root: absolute, and nothing but plain components.
fn clean_root(mount_path: &str) -> Option<PathBuf> {
    let body = mount_path.strip_prefix('/')?;
    let clean = !body.is_empty()
        && body
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\0'));
    clean.then(|| PathBuf::from(mount_path))
}

fn retrieval(store: &str, err: ClientError) -> PrepareError {
    let what = format!("Memory Store {store}");
    match err.status().map(|s| s.as_u16()) {
        Some(401 | 403) => PrepareError::Rejected(format!("downloading the {what}: {err}")),
        Some(s) if (400..500).contains(&s) && !matches!(s, 408 | 409 | 429) => {
            PrepareError::Permanent(format!(
                "the Session attaches {what}, which cannot be retrieved: {err}"
            ))
        }
        _ => PrepareError::Transient(format!("downloading the {what}: {err}")),
    }
}

/// A download that stopped short: never complete, and why.
fn pull_failed(store: &str, root: &Path, err: PullError) -> PrepareError {
    match err {
        PullError::Api(err) => retrieval(store, *err),
        // The stores fit when measured: the mount filled up meanwhile (the
        // store grew, or something else wrote there). The next activation
        // measures again, and fails the Session if it cannot fit then.
        err @ PullError::NoSpace { .. } => PrepareError::Transient(format!(
            "Memory Store {store} did not fit at {} after all ({err}); its download is incomplete, so the Work is left to be tried again",
            root.display()
        )),
        err @ PullError::Disk { .. } => PrepareError::Transient(format!(
            "Memory Store {store} could not be written at {}: {err}; its download is incomplete",
            root.display()
        )),
    }
}

/// One store to mount.
struct Planned {
    id: String,
    root: PathBuf,
    read_only: bool,
}

/// The stores `session` attaches and where they mount: each root clean and
/// not there yet.
fn plan(session: &Session, workspace: &Path) -> Result<Vec<Planned>, PrepareError> {
    let mut planned = Vec::new();
    for resource in &session.resources {
        let SessionResource::MemoryStore(m) = resource else {
            continue;
        };
        let root = match &m.mount_path {
            Some(path) => clean_root(path).ok_or_else(|| {
                PrepareError::Permanent(format!(
                    "Memory Store {} has mount_path {path:?}, which is not a clean absolute path",
                    m.memory_store_id
                ))
            })?,
            None => workspace.join("memory").join(&m.memory_store_id),
        };
        if Folder::new(root.clone()).exists() {
            return Err(PrepareError::Transient(format!(
                "something already exists at {} where Memory Store {} mounts; it must not exist when the Session's Work starts (a runner that died left it? remove it)",
                root.display(),
                m.memory_store_id
            )));
        }
        planned.push(Planned {
            id: m.memory_store_id.clone(),
            root,
            read_only: m.access == Some(MemoryAccess::ReadOnly),
        });
    }
    Ok(planned)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Measures every store and checks the ones sharing a filesystem fit it
/// together: more than it holds in all is permanent (the Session cannot
/// start here, ever), more than is free now transient.
async fn check_fit(client: &Client, planned: &[Planned]) -> Result<(), PrepareError> {
    // Per filesystem: where it was measured, its space, and its stores with their footprints.
    type Shared = (PathBuf, fit::Space, Vec<(String, fit::Footprint)>);
    let mut filesystems: BTreeMap<u64, Shared> = BTreeMap::new();
    for p in planned {
        let (at, space) = fit::space_for(&p.root).map_err(|e| {
            PrepareError::Transient(format!(
                "cannot measure the free space where Memory Store {} mounts ({}): {e}",
                p.id,
                p.root.display()
            ))
        })?;
        let footprint = fit::measure(client, &p.id)
            .await
            .map_err(|err| retrieval(&p.id, err))?;
        filesystems
            .entry(space.device)
            .or_insert_with(|| (at, space, Vec::new()))
            .2
            .push((p.id.clone(), footprint));
    }
    for (at, space, stores) in filesystems.values() {
        let blocks = |f: &fit::Footprint| f.blocks(space.block, space.dirs_take_blocks);
        let need: u64 = stores.iter().map(|(_, f)| blocks(f)).sum();
        let verdict = fit::fit(need, space);
        if verdict == fit::Fit::Fits {
            continue;
        }
        let mib = |blocks: u64| (blocks * space.block) as f64 / MIB;
        let named: Vec<String> = stores
            .iter()
            .map(|(id, f)| {
                let memories = f.sizes.len() - 1;
                format!(
                    "Memory Store {id} ({memories} {}, {:.1} MiB on disk)",
                    if memories == 1 { "memory" } else { "memories" },
                    mib(blocks(f))
                )
            })
            .collect();
        let what = format!(
            "{} {} {:.1} MiB at {}",
            named.join(" and "),
            if named.len() == 1 { "needs" } else { "need" },
            mib(need),
            at.display()
        );
        return Err(match verdict {
            fit::Fit::Never => PrepareError::Permanent(format!(
                "the Session's Memory Stores cannot fit their mount: {what}, which holds {:.1} MiB in all",
                mib(space.total_blocks)
            )),
            _ => PrepareError::Transient(format!(
                "the Session's Memory Stores do not fit their mount now: {what}, where {:.1} MiB of {:.1} MiB are free",
                mib(space.available_blocks),
                mib(space.total_blocks)
            )),
        });
    }
    Ok(())
}

/// Dropped before its end (a lease lost mid-download): the folders go.
impl Drop for Mounted {
    fn drop(&mut self) {
        self.dispose();
    }
}

impl Mounted {
    /// No stores: every call is a no-op.
    pub fn none() -> Mounted {
        Mounted {
            client: None,
            stores: Vec::new(),
            interval: SYNC_INTERVAL,
            last_sync: Instant::now(),
        }
    }

    /// Downloads every store `session` attaches, `interval` apart syncs
    /// after, once they are measured to fit their mount. `workspace/memory/<id>`
    /// is the root of a resource without a `mount_path` (Mango's api always
    /// sets one). On failure nothing is left on disk.
    pub async fn download(
        client: &Client,
        session: &Session,
        workspace: &Path,
        interval: Duration,
    ) -> Result<Mounted, PrepareError> {
        let planned = plan(session, workspace)?;
        check_fit(client, &planned).await?;
        let mut mounted = Mounted {
            client: Some(client.clone()),
            stores: Vec::new(),
            interval,
            last_sync: Instant::now(),
        };
        for Planned {
            id,
            root,
            read_only,
        } in planned
        {
            let folder = Folder::new(root.clone());
            if let Err(e) = folder.create() {
                mounted.dispose();
                return Err(PrepareError::Transient(format!(
                    "cannot create {} for Memory Store {id}: {e}",
                    root.display(),
                )));
            }
            let started = Instant::now();
            let mut store = Store::new(id.clone(), folder, read_only);
            let pulled = store.stamp_and_pull(client).await;
            mounted.stores.push(store);
            if let Err(err) = pulled {
                mounted.dispose();
                return Err(pull_failed(&id, &root, err));
            }
            tracing::info!(memory_store_id = %id, root = %root.display(),
                memories = mounted.stores.last().map_or(0, |s| s.baseline().len()), read_only,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "memory store downloaded");
        }
        mounted.last_sync = Instant::now();
        Ok(mounted)
    }

    /// Every store's root, for the file tools' allowed roots.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.stores
            .iter()
            .map(|s| s.folder.root().to_path_buf())
            .collect()
    }

    /// The roots `write` and `edit` refuse.
    pub fn read_only_roots(&self) -> Vec<PathBuf> {
        self.stores
            .iter()
            .filter(|s| s.read_only)
            .map(|s| s.folder.root().to_path_buf())
            .collect()
    }

    pub fn stores(&self) -> &[Store] {
        &self.stores
    }

    /// After a tool call: one sync of every store, if the last was at least
    /// the interval ago. Never fails; problems are logged.
    pub async fn sync_if_due(&mut self) {
        if self.stores.is_empty() || self.last_sync.elapsed() < self.interval {
            return;
        }
        self.sync_all(false).await;
    }

    /// One sync of every store now (`last`: the final one).
    pub async fn sync_all(&mut self, last: bool) -> Vec<Option<sync::Outcome>> {
        let Some(client) = self.client.clone() else {
            return Vec::new();
        };
        let outcomes = futures::future::join_all(self.stores.iter_mut().map(|store| {
            let client = client.clone();
            async move {
                let started = Instant::now();
                match store.sync(&client, last).await {
                    Ok(outcome) => {
                        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
                        if last {
                            tracing::info!(memory_store_id = %store.id, ?outcome, elapsed_ms, "memory store synced for the last time");
                        } else {
                            tracing::debug!(memory_store_id = %store.id, ?outcome, elapsed_ms, "memory store synced");
                        }
                        Some(outcome)
                    }
                    Err(err) => {
                        tracing::warn!(memory_store_id = %store.id, error = %err, "memory sync failed");
                        None
                    }
                }
            }
        }))
        .await;
        self.last_sync = Instant::now();
        outcomes
    }

    /// The push-only flush of every store.
    pub async fn flush(&mut self) -> Vec<Option<sync::Outcome>> {
        let Some(client) = self.client.clone() else {
            return Vec::new();
        };
        futures::future::join_all(self.stores.iter_mut().map(|store| {
            let client = client.clone();
            async move {
                match store.flush(&client).await {
                    Ok(outcome) => Some(outcome),
                    Err(err) => {
                        tracing::warn!(memory_store_id = %store.id, error = %err, "memory flush failed");
                        None
                    }
                }
            }
        }))
        .await
    }

    /// The end of the Session's Work, once nothing writes any more: on a
    /// `clean` end the final sync, then always the flush (each within
    /// [`END_BOUND`]); then the folders go.
    pub async fn end(&mut self, clean: bool) {
        self.end_within(clean, END_BOUND).await
    }

    /// [`Mounted::end`] with the final sync and the flush each within `bound`.
    pub async fn end_within(&mut self, clean: bool, bound: Duration) {
        if self.stores.is_empty() {
            return;
        }
        if clean
            && tokio::time::timeout(bound, self.sync_all(true))
                .await
                .is_err()
        {
            tracing::warn!(
                "the final memory sync was cut off; the flush still uploads changed files"
            );
        }
        if tokio::time::timeout(bound, self.flush()).await.is_err() {
            tracing::warn!(
                "the memory flush was cut off; files it had not uploaded yet are not saved"
            );
        }
        self.dispose();
    }

    /// Removes every folder this runner made, except one that fails the
    /// marker check while holding files.
    pub fn dispose(&mut self) {
        for store in self.stores.drain(..) {
            if !store.disposable() {
                tracing::warn!(memory_store_id = %store.id, root = %store.folder.root().display(),
                    "the store folder fails the marker check and holds files; left on disk for inspection");
                continue;
            }
            if let Err(e) = store.folder.dispose() {
                tracing::warn!(memory_store_id = %store.id, root = %store.folder.root().display(), error = %e,
                    "could not remove the store folder");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_absolute_mount_paths_are_roots() {
        assert_eq!(
            clean_root("/mnt/memory/notes"),
            Some(PathBuf::from("/mnt/memory/notes"))
        );
        for bad in [
            "mnt/memory",
            "/",
            "/mnt/../etc",
            "/mnt/./x",
            "/mnt//x",
            "/mnt/x/",
            "",
        ] {
            assert_eq!(clean_root(bad), None, "{bad}");
        }
    }
}
