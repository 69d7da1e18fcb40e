//! One attached store's reconciliation of its folder with the server, by
//! path, against the baseline of the last download or sync (spec §9; the
//! SDK worker's `SessionMemoryStores` rules, sdk-worker-behaviour §5.2):
//!
//! * changed only remotely: pulled; changed only locally: pushed with a
//!   `content_sha256` precondition (a create for a new file); changed on
//!   both sides: the remote version wins and is pulled;
//! * deleted remotely: removed locally, unless the file holds an unpushed
//!   edit (a writable store re-creates the memory from it);
//! * deleted locally: deleted remotely (with `expected_content_sha256`)
//!   only once a second sync still finds it missing, the marker intact;
//!   a remote change meanwhile restores it instead;
//! * an upload whose answer was lost is settled by the next listing: a
//!   memory holding exactly the bytes sent is that upload;
//! * a read-only store pulls and never writes;
//! * a write refused for the token's write rate (429) ends the pass's
//!   uploads and deletions: what is left goes in a later pass;
//! * a download writes every memory or fails: a memory that never
//!   arrived never enters the baseline, so no later pass takes it for a
//!   local deletion;
//! * the marker decides trust: a folder without it (or with another
//!   store's) is left alone while it holds files, and re-downloaded when
//!   it holds none, as is one whose every file vanished at once.

use super::disk::{sha256_hex, Folder, HashCache, Scan, TMP_PREFIX};
use futures::StreamExt;
use mango_client::{Client, ClientError};
use mango_protocol::memory::{MemoryListItem, MemoryView, MARKER_PATH, MAX_CONTENT_BYTES};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::Duration;

/// Pages of a full listing (the API's most with content).
const FULL_PAGE: u32 = 20;
/// Pages of a digest-only listing.
const BASIC_PAGE: u32 = 100;
/// Memory fetches in flight during one pull pass.
const FETCHES: usize = 16;
/// Uploads in flight during a flush.
const UPLOADS: usize = 32;
/// Bounds of the per-sync delete cap.
const DELETE_CAP_FLOOR: usize = 8;
const DELETE_CAP_CEILING: usize = 50;
/// A flush's pause before an upload the write rate refused is sent again
/// (the flush itself is bounded by its caller).
const THROTTLED_PAUSE: Duration = Duration::from_secs(1);

/// Why a download of a store stopped short. It never counts as done: the
/// memories it did not write are not in the baseline.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Api(Box<ClientError>),
    /// The mount ran out of space (blocks, inodes or quota).
    #[error("no space left to write {path:?} after {written} memories: {error}")]
    NoSpace {
        path: String,
        written: usize,
        error: io::Error,
    },
    #[error("cannot write {path:?}: {error}")]
    Disk { path: String, error: io::Error },
}

impl From<ClientError> for PullError {
    fn from(err: ClientError) -> Self {
        PullError::Api(Box::new(err))
    }
}

impl PullError {
    fn into_client(self) -> ClientError {
        match self {
            PullError::Api(err) => *err,
            other => ClientError::Decode(format!("downloading the store: {other}")),
        }
    }
}

/// What a failed write of a memory's file means.
enum WriteFailure {
    /// The path cannot be a file here (a name too long, a file where a
    /// directory must be): this memory is not mirrored, the rest are.
    Unmirrorable,
    NoSpace,
    Other,
}

fn write_failure(e: &io::Error) -> WriteFailure {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => WriteFailure::NoSpace,
        Some(libc::ENAMETOOLONG | libc::ENOTDIR | libc::EISDIR | libc::EEXIST | libc::ELOOP) => {
            WriteFailure::Unmirrorable
        }
        _ if e.kind() == io::ErrorKind::InvalidInput => WriteFailure::Unmirrorable,
        _ => WriteFailure::Other,
    }
}

/// Scans `folder` on a blocking thread with `cache`; hands the cache back
/// (empty if the thread failed, so everything is hashed afresh next time).
async fn scan_folder(folder: Folder, mut cache: HashCache) -> (std::io::Result<Scan>, HashCache) {
    let scanned = tokio::task::spawn_blocking(move || {
        let scan = folder.scan(MARKER_PATH, MAX_CONTENT_BYTES, &mut cache);
        (scan, cache)
    })
    .await;
    match scanned {
        Ok(done) => done,
        Err(e) => (Err(std::io::Error::other(e)), HashCache::default()),
    }
}

/// The marker's content for store `id`.
pub fn marker_for(id: &str) -> Vec<u8> {
    format!("version 1\n{id}").into_bytes()
}

/// A memory as a listing shows it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: String,
    pub sha: String,
}

/// How one sync pass went, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub pulled: usize,
    pub pushed: usize,
    pub removed_locally: usize,
    pub deleted_remotely: usize,
    /// The folder failed the marker check while holding files: nothing synced.
    pub distrusted: bool,
    /// The folder was rebuilt from the server.
    pub recovered: bool,
}

/// What a push came to.
enum Pushed {
    Saved(String),
    /// 409: the precondition lost a race, or the path was taken meanwhile.
    Lost,
    /// 400/413, too big, not UTF-8 or past the store's quota: refused
    /// until the file changes.
    Refused(String),
    /// 429: the token's write rate is spent; a later pass tries again.
    Throttled,
    /// Anything else; the next pass tries again.
    Failed(String),
    /// The file went away before it could be read.
    Gone,
}

/// One attached store, its folder and what the last sync agreed on.
pub struct Store {
    pub id: String,
    pub folder: Folder,
    pub read_only: bool,
    /// `rel path → digest` as of the last download or sync.
    baseline: BTreeMap<String, String>,
    /// Digests the server refused (or that cannot be memories): retried once the file changes.
    refused: BTreeMap<String, String>,
    /// Files seen missing, with the pass that first saw it.
    pending_deletes: BTreeMap<String, u64>,
    /// Digests sent whose answer never arrived, until the next listing.
    sent: BTreeMap<String, String>,
    /// Passes so far.
    pass: u64,
    /// The write rate refused a write in this pass: no more are sent in it.
    throttled: bool,
    cache: HashCache,
}

fn status(err: &ClientError) -> Option<u16> {
    err.status().map(|s| s.as_u16())
}

/// A server path this runner may mirror on disk: not the marker and not
/// one of its own temporary names.
pub(crate) fn mirrorable(rel: &str) -> bool {
    rel != MARKER_PATH
        && !rel
            .rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with(TMP_PREFIX))
}

impl Store {
    pub fn new(id: String, folder: Folder, read_only: bool) -> Store {
        Store {
            id,
            folder,
            read_only,
            baseline: BTreeMap::new(),
            refused: BTreeMap::new(),
            pending_deletes: BTreeMap::new(),
            sent: BTreeMap::new(),
            pass: 0,
            throttled: false,
            cache: HashCache::default(),
        }
    }

    pub fn baseline(&self) -> &BTreeMap<String, String> {
        &self.baseline
    }

    /// Writes the marker, then every memory (a full listing); pushes nothing.
    /// Only files written enter the baseline, so a failed write never reads
    /// as a local deletion later. A memory whose path cannot be a file here
    /// is skipped (warned); any other failed write ends the download with
    /// an error: a partial download is never taken for a complete one.
    pub async fn stamp_and_pull(&mut self, client: &Client) -> Result<(), PullError> {
        self.baseline.clear();
        self.sent.clear();
        self.pending_deletes.clear();
        self.put_pulled(MARKER_PATH, &marker_for(&self.id), 0)?;
        let mut page: Option<String> = None;
        loop {
            let listed = client
                .list_memories(&self.id, MemoryView::Full, FULL_PAGE, page.as_deref())
                .await?;
            for item in listed.data {
                let MemoryListItem::Memory(m) = item else {
                    continue;
                };
                let rel = m.path.trim_start_matches('/').to_string();
                if !mirrorable(&rel) {
                    tracing::warn!(memory_store_id = %self.id, path = %m.path, "a memory at a path this runner reserves is not mirrored");
                    continue;
                }
                let content = m.content.as_deref().unwrap_or("");
                if self.put_pulled(&rel, content.as_bytes(), self.baseline.len())? {
                    self.baseline.insert(rel, m.content_sha256);
                }
            }
            match listed.next_page {
                Some(next) if !next.is_empty() => page = Some(next),
                _ => return Ok(()),
            }
        }
    }

    /// One file of a download: `Ok(false)` when its path cannot be a file
    /// here, an error when the download cannot go on.
    fn put_pulled(&self, rel: &str, bytes: &[u8], written: usize) -> Result<bool, PullError> {
        let Err(error) = self.folder.put(rel, bytes) else {
            return Ok(true);
        };
        let path = rel.to_string();
        match write_failure(&error) {
            WriteFailure::Unmirrorable if rel != MARKER_PATH => {
                tracing::warn!(memory_store_id = %self.id, path = rel, error = %error,
                    "a memory whose path cannot be a file here is not mirrored");
                Ok(false)
            }
            WriteFailure::NoSpace => Err(PullError::NoSpace {
                path,
                written,
                error,
            }),
            _ => Err(PullError::Disk { path, error }),
        }
    }

    fn write(&self, rel: &str, content: &str) -> bool {
        match self.folder.put(rel, content.as_bytes()) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(memory_store_id = %self.id, path = rel, error = %e, "could not write a memory to disk");
                false
            }
        }
    }

    /// The server's memories by relative path (digests only).
    async fn list(&self, client: &Client) -> Result<BTreeMap<String, Listed>, ClientError> {
        let mut out = BTreeMap::new();
        let mut page: Option<String> = None;
        loop {
            let listed = client
                .list_memories(&self.id, MemoryView::Basic, BASIC_PAGE, page.as_deref())
                .await?;
            for item in listed.data {
                if let MemoryListItem::Memory(m) = item {
                    let rel = m.path.trim_start_matches('/').to_string();
                    if mirrorable(&rel) {
                        out.insert(
                            rel,
                            Listed {
                                id: m.id,
                                sha: m.content_sha256,
                            },
                        );
                    }
                }
            }
            match listed.next_page {
                Some(next) if !next.is_empty() => page = Some(next),
                _ => return Ok(out),
            }
        }
    }

    /// Scans the folder off the async thread.
    async fn scan(&mut self) -> std::io::Result<Scan> {
        let (scan, cache) = scan_folder(self.folder.clone(), std::mem::take(&mut self.cache)).await;
        self.cache = cache;
        scan
    }

    fn marker_ok(&self, scan: &Scan) -> bool {
        scan.marker.as_deref() == Some(&marker_for(&self.id)[..])
    }

    /// Uploads that landed unheard: a listed memory with exactly the digest
    /// sent is that upload. Every record is dropped after one listing.
    fn settle_sent(&mut self, remote: &BTreeMap<String, Listed>) {
        for (rel, sha) in std::mem::take(&mut self.sent) {
            if remote.get(&rel).is_some_and(|l| l.sha == sha) {
                self.baseline.insert(rel, sha);
            }
        }
    }

    async fn recover(&mut self, client: &Client, why: &str) -> Result<(), ClientError> {
        tracing::warn!(memory_store_id = %self.id, root = %self.folder.root().display(), "{why}; downloading the store again instead of syncing");
        self.folder
            .create()
            .map_err(|e| ClientError::Decode(format!("re-creating the store folder: {e}")))?;
        self.stamp_and_pull(client)
            .await
            .map_err(PullError::into_client)
    }

    /// One reconciliation. `last`: the final sync at a clean end, where no
    /// later pass could corroborate a deletion, so the re-check just before
    /// it is its second observation.
    pub async fn sync(&mut self, client: &Client, last: bool) -> Result<Outcome, ClientError> {
        self.pass += 1;
        self.throttled = false;
        let mut outcome = Outcome::default();
        // The folder is scanned on a blocking thread while the server lists
        // its memories: two independent reads, so a pass takes the longer
        // of the two rather than both.
        let scanning = scan_folder(self.folder.clone(), std::mem::take(&mut self.cache));
        let ((scan, cache), remote) = tokio::join!(scanning, self.list(client));
        self.cache = cache;
        let scan =
            scan.map_err(|e| ClientError::Decode(format!("scanning the store folder: {e}")))?;
        if !self.marker_ok(&scan) {
            if !scan.files.is_empty() {
                tracing::warn!(memory_store_id = %self.id, root = %self.folder.root().display(),
                    "the store marker is missing or names another store; the folder is left as found and not synced");
                outcome.distrusted = true;
                return Ok(outcome);
            }
            self.recover(client, "the store folder or its marker is gone")
                .await?;
            outcome.recovered = true;
            return Ok(outcome);
        }
        let local = scan.files;
        let remote = remote?;
        self.settle_sent(&remote);
        if local.is_empty() && self.baseline.len() > 1 {
            self.recover(client, "every file of the store vanished at once")
                .await?;
            outcome.recovered = true;
            return Ok(outcome);
        }
        let cap = (self.baseline.len() / 4).clamp(DELETE_CAP_FLOOR, DELETE_CAP_CEILING);
        let mut deletes = 0usize;
        let mut pulls: Vec<(String, String)> = Vec::new();
        let mut next = BTreeMap::new();
        let paths: BTreeSet<String> = remote
            .keys()
            .chain(local.keys())
            .chain(self.baseline.keys())
            .cloned()
            .collect();
        for rel in paths {
            let listed = remote.get(&rel);
            let local_sha = local.get(&rel).cloned();
            let base = self.baseline.get(&rel).cloned();
            let keep = match (&local_sha, &base, listed) {
                (None, Some(base), Some(l)) if l.sha == *base && !self.read_only => {
                    self.deletion(client, &rel, l, base, last, cap, &mut deletes, &mut outcome)
                        .await
                }
                _ => {
                    self.path(client, &rel, listed, local_sha, &mut pulls, &mut outcome)
                        .await
                }
            };
            if let Some(sha) = keep {
                next.insert(rel, sha);
            }
        }
        self.baseline = next;
        self.pull(client, pulls, &mut outcome).await;
        Ok(outcome)
    }

    /// The merge of one path that is not a deletion candidate; the digest it
    /// leaves in the baseline.
    async fn path(
        &mut self,
        client: &Client,
        rel: &str,
        listed: Option<&Listed>,
        mut local: Option<String>,
        pulls: &mut Vec<(String, String)>,
        outcome: &mut Outcome,
    ) -> Option<String> {
        let base = self.baseline.get(rel).cloned();
        if local.is_some() {
            self.pending_deletes.remove(rel);
        }
        let Some(listed) = listed else {
            let Some(local_sha) = local.clone() else {
                self.pending_deletes.remove(rel);
                return None;
            };
            if let Some(base) = &base {
                if local_sha == *base {
                    // Deleted remotely, unchanged here: remove the file (unless it changed just now).
                    match self.remove_local(rel, base) {
                        Removal::Removed => {
                            outcome.removed_locally += 1;
                            return None;
                        }
                        Removal::Kept => return Some(base.clone()),
                        Removal::Changed(fresh) => local = Some(fresh),
                    }
                }
                // An unpushed edit is the only copy now: the remote deletion loses.
                if self.read_only {
                    tracing::warn!(memory_store_id = %self.id, path = rel,
                        "memory deleted remotely but edited here; a read-only store keeps the file unsynced");
                } else {
                    tracing::info!(memory_store_id = %self.id, path = rel,
                        "memory deleted remotely but edited here; re-creating it from the file");
                }
            }
            let local_sha = local.expect("a local file");
            if self.read_only || self.refused.get(rel) == Some(&local_sha) {
                return None;
            }
            return self.push_one(client, rel, &local_sha, None, outcome).await;
        };
        let remote_changed = Some(&listed.sha) != base.as_ref();
        let edited = local
            .as_ref()
            .is_some_and(|l| Some(l) != base.as_ref() && *l != listed.sha);
        if local.is_none() && base.is_some() {
            // Deleted here (a real deletion: only written files enter the baseline).
            if remote_changed {
                tracing::warn!(memory_store_id = %self.id, path = rel,
                    "memory deleted here but changed remotely; restoring the remote version");
                self.pending_deletes.remove(rel);
                pulls.push((rel.to_string(), listed.id.clone()));
            }
            return base;
        }
        if remote_changed {
            if local.as_ref() == Some(&listed.sha) {
                return Some(listed.sha.clone());
            }
            if edited {
                tracing::warn!(memory_store_id = %self.id, path = rel,
                    "memory changed here and remotely; the remote version wins");
            }
            pulls.push((rel.to_string(), listed.id.clone()));
            return base;
        }
        if edited && !self.read_only {
            let local_sha = local.expect("an edited file");
            if self.refused.get(rel) == Some(&local_sha) {
                return Some(listed.sha.clone());
            }
            return Some(
                self.push_one(client, rel, &local_sha, Some(listed), outcome)
                    .await
                    .unwrap_or_else(|| listed.sha.clone()),
            );
        }
        Some(listed.sha.clone())
    }

    /// A file missing here whose memory is unchanged remotely: deleted on the
    /// server only when a second observation confirms it.
    #[allow(clippy::too_many_arguments)]
    async fn deletion(
        &mut self,
        client: &Client,
        rel: &str,
        listed: &Listed,
        base: &str,
        last: bool,
        cap: usize,
        deletes: &mut usize,
        outcome: &mut Outcome,
    ) -> Option<String> {
        let first = *self
            .pending_deletes
            .entry(rel.to_string())
            .or_insert(self.pass);
        if first == self.pass && !last {
            return Some(base.to_string());
        }
        // The second observation: the marker still there, the file still gone.
        let marker_ok = self
            .folder
            .get(MARKER_PATH, 4096)
            .ok()
            .flatten()
            .is_some_and(|m| m == marker_for(&self.id));
        if !marker_ok {
            return Some(base.to_string());
        }
        match self.folder.hash(rel, MAX_CONTENT_BYTES) {
            Ok(None) => {}
            Ok(Some(_)) => {
                self.pending_deletes.remove(rel);
                return Some(base.to_string());
            }
            Err(_) => return Some(base.to_string()),
        }
        if *deletes >= cap || self.throttled {
            return Some(base.to_string());
        }
        *deletes += 1;
        match client.delete_memory(&self.id, &listed.id, base).await {
            Ok(()) => {
                tracing::info!(memory_store_id = %self.id, path = rel, "a file deleted here deleted its memory");
                outcome.deleted_remotely += 1;
                self.pending_deletes.remove(rel);
                None
            }
            Err(e) if status(&e) == Some(404) => {
                self.pending_deletes.remove(rel);
                None
            }
            Err(e) if matches!(status(&e), Some(409 | 412)) => {
                tracing::warn!(memory_store_id = %self.id, path = rel,
                    "memory deleted here but changed remotely; the remote version stays");
                Some(base.to_string())
            }
            Err(e) if status(&e) == Some(429) => {
                self.throttle();
                Some(base.to_string())
            }
            Err(e) => {
                tracing::warn!(memory_store_id = %self.id, path = rel, error = %e, "could not delete a memory");
                Some(base.to_string())
            }
        }
    }

    /// The write rate refused a write: the rest of this pass sends none.
    fn throttle(&mut self) {
        if !self.throttled {
            tracing::info!(memory_store_id = %self.id,
                "the sessions token's memory write rate is spent; the remaining changes go in a later sync");
        }
        self.throttled = true;
    }

    fn remove_local(&self, rel: &str, expect: &str) -> Removal {
        match self.folder.hash(rel, MAX_CONTENT_BYTES) {
            Ok(None) => Removal::Removed,
            Ok(Some(fresh)) if fresh != expect => Removal::Changed(fresh),
            Ok(Some(_)) => match self.folder.remove(rel) {
                Ok(()) => Removal::Removed,
                Err(e) => {
                    tracing::warn!(memory_store_id = %self.id, path = rel, error = %e, "could not remove a memory deleted remotely");
                    Removal::Kept
                }
            },
            Err(_) => Removal::Kept,
        }
    }

    /// Reads `rel` for upload: its content, or why it cannot be one.
    fn load(&self, rel: &str) -> Result<String, Pushed> {
        match self.folder.get(rel, MAX_CONTENT_BYTES) {
            Ok(None) => Err(Pushed::Gone),
            Ok(Some(bytes)) if bytes.len() > MAX_CONTENT_BYTES => Err(Pushed::Refused(format!(
                "larger than a memory's {MAX_CONTENT_BYTES} bytes"
            ))),
            Ok(Some(bytes)) => {
                String::from_utf8(bytes).map_err(|_| Pushed::Refused("not UTF-8 text".into()))
            }
            Err(e) => Err(Pushed::Failed(e.to_string())),
        }
    }

    /// One push, and what it leaves in the baseline (`None`: keep the old).
    async fn push_one(
        &mut self,
        client: &Client,
        rel: &str,
        local_sha: &str,
        existing: Option<&Listed>,
        outcome: &mut Outcome,
    ) -> Option<String> {
        if self.throttled {
            return None;
        }
        let content = match self.load(rel) {
            Ok(content) => content,
            Err(why) => return self.pushed(rel, local_sha, why, outcome),
        };
        self.sent
            .insert(rel.to_string(), sha256_hex(content.as_bytes()));
        let result = push(client, &self.id, rel, &content, existing).await;
        self.pushed(rel, local_sha, result, outcome)
    }

    fn pushed(
        &mut self,
        rel: &str,
        local_sha: &str,
        result: Pushed,
        outcome: &mut Outcome,
    ) -> Option<String> {
        match result {
            Pushed::Saved(sha) => {
                self.refused.remove(rel);
                self.sent.remove(rel);
                outcome.pushed += 1;
                Some(sha)
            }
            Pushed::Lost => {
                // The next listing tells a lost answer (our own bytes) from a winner to pull.
                tracing::warn!(memory_store_id = %self.id, path = rel,
                    "memory changed remotely before the upload; the local edit loses");
                None
            }
            Pushed::Refused(why) => {
                self.sent.remove(rel);
                if self.refused.insert(rel.to_string(), local_sha.to_string())
                    != Some(local_sha.to_string())
                {
                    tracing::warn!(memory_store_id = %self.id, path = rel, reason = %why,
                        "this file cannot be a memory; it stays unsynced until it changes");
                }
                None
            }
            Pushed::Throttled => {
                self.sent.remove(rel);
                self.throttle();
                None
            }
            Pushed::Failed(why) => {
                tracing::warn!(memory_store_id = %self.id, path = rel, error = %why, "could not upload a memory");
                None
            }
            Pushed::Gone => {
                self.sent.remove(rel);
                None
            }
        }
    }

    async fn pull(&mut self, client: &Client, pulls: Vec<(String, String)>, outcome: &mut Outcome) {
        if pulls.is_empty() {
            return;
        }
        let id = self.id.clone();
        let mut fetched = futures::stream::iter(pulls)
            .map(|(rel, memory)| {
                let id = id.clone();
                async move { (rel, client.memory(&id, &memory).await) }
            })
            .buffer_unordered(FETCHES);
        while let Some((rel, got)) = fetched.next().await {
            match got {
                Ok(m) => {
                    if self.write(&rel, m.content.as_deref().unwrap_or("")) {
                        self.baseline.insert(rel, m.content_sha256);
                        outcome.pulled += 1;
                    }
                }
                // Deleted since the listing: the next pass reconciles it.
                Err(e) if status(&e) == Some(404) => {}
                Err(e) => {
                    tracing::warn!(memory_store_id = %self.id, path = %rel, error = %e, "could not fetch a memory")
                }
            }
        }
    }

    /// Push-only: uploads new and changed files, sends no deletion and pulls
    /// nothing. Skips read-only stores, refused files and a folder failing
    /// the marker check; where both sides changed the remote version stays.
    pub async fn flush(&mut self, client: &Client) -> Result<Outcome, ClientError> {
        let mut outcome = Outcome::default();
        if self.read_only {
            return Ok(outcome);
        }
        let scan = self
            .scan()
            .await
            .map_err(|e| ClientError::Decode(format!("scanning the store folder: {e}")))?;
        if !self.marker_ok(&scan) {
            tracing::warn!(memory_store_id = %self.id, root = %self.folder.root().display(),
                "the store marker is missing or names another store; nothing is uploaded from the folder");
            outcome.distrusted = true;
            return Ok(outcome);
        }
        let dirty: BTreeMap<String, String> = scan
            .files
            .into_iter()
            .filter(|(rel, sha)| {
                (self.baseline.get(rel) != Some(sha) || self.sent.contains_key(rel))
                    && self.refused.get(rel) != Some(sha)
            })
            .collect();
        if dirty.is_empty() {
            return Ok(outcome);
        }
        let remote = self.list(client).await?;
        self.settle_sent(&remote);
        let mut jobs = Vec::new();
        for (rel, local_sha) in dirty {
            let base = self.baseline.get(&rel);
            let existing = remote.get(&rel).cloned();
            if base == Some(&local_sha) {
                continue;
            }
            if let Some(e) = &existing {
                if e.sha == local_sha {
                    self.baseline.insert(rel, local_sha);
                    continue;
                }
                if Some(&e.sha) != base {
                    tracing::warn!(memory_store_id = %self.id, path = %rel,
                        "memory changed here and remotely; the flush leaves the remote version");
                    continue;
                }
            }
            match self.load(&rel) {
                Ok(content) => {
                    self.sent
                        .insert(rel.clone(), sha256_hex(content.as_bytes()));
                    jobs.push((rel, local_sha, content, existing));
                }
                Err(why) => {
                    self.pushed(&rel, &local_sha, why, &mut outcome);
                }
            }
        }
        let id = self.id.clone();
        let mut uploads = futures::stream::iter(jobs)
            .map(|(rel, local_sha, content, existing)| {
                let id = id.clone();
                async move {
                    // No later pass comes: a throttled upload waits its turn
                    // (the caller bounds the flush).
                    let result = loop {
                        match push(client, &id, &rel, &content, existing.as_ref()).await {
                            Pushed::Throttled => tokio::time::sleep(THROTTLED_PAUSE).await,
                            other => break other,
                        }
                    };
                    (rel, local_sha, result)
                }
            })
            .buffer_unordered(UPLOADS);
        while let Some((rel, local_sha, result)) = uploads.next().await {
            if let Some(sha) = self.pushed(&rel, &local_sha, result, &mut outcome) {
                self.baseline.insert(rel, sha);
            }
        }
        Ok(outcome)
    }

    /// Whether the folder may be removed: it passes the marker check, or holds nothing.
    pub fn disposable(&self) -> bool {
        match self.folder.scan(MARKER_PATH, 0, &mut HashCache::default()) {
            Ok(scan) => self.marker_ok(&scan) || scan.files.is_empty(),
            Err(_) => false,
        }
    }
}

enum Removal {
    Removed,
    Kept,
    Changed(String),
}

/// Creates (`existing` none) or updates with a precondition; an update of a
/// memory deleted meanwhile becomes a create.
async fn push(
    client: &Client,
    store: &str,
    rel: &str,
    content: &str,
    existing: Option<&Listed>,
) -> Pushed {
    let path = format!("/{rel}");
    let answer = match existing {
        Some(e) => match client.update_memory(store, &e.id, content, &e.sha).await {
            Err(err) if status(&err) == Some(404) => {
                client.create_memory(store, &path, content).await
            }
            other => other,
        },
        None => client.create_memory(store, &path, content).await,
    };
    match answer {
        Ok(m) => Pushed::Saved(m.content_sha256),
        Err(e) if status(&e) == Some(409) => Pushed::Lost,
        Err(e) if status(&e) == Some(429) => Pushed::Throttled,
        Err(e) if matches!(status(&e), Some(400 | 413)) => Pushed::Refused(e.to_string()),
        Err(e) => Pushed::Failed(e.to_string()),
    }
}
