//! Materializing a Session's Skills before any tool runs (spec §9). The
//! frozen snapshot names every custom Skill the primary Agent and its
//! roster pin, each with its archive's length and SHA-256. Each archive is
//! downloaded (streamed to disk, never past its declared length), verified,
//! and expanded ([`archive::extract`]) into one fresh tree staged directly
//! below the workspace: primary Skills at `<name>/`, roster Agents' at
//! `.agents/<agent id>/<name>/`. The Session as a whole stays within
//! [`Limits`] (500 scope-pins, 500 MiB compressed and expanded, 10,000
//! files). The staged tree then replaces `skills/` in one rename (an
//! exchange when one exists: whatever an earlier tool left there, even a
//! symbolic link, is moved aside without being followed, then removed), and
//! [`SkillsTree::remove`] takes it away when the Work ends.
//!
//! A wrong length or digest, an archive that breaks a rule, or a snapshot
//! past a limit can never get better: [`PrepareError::Permanent`], and the
//! Work is Failed. A download that fails for a transient reason is retried,
//! then [`PrepareError::Transient`] leaves the lease to expire.

pub mod archive;

use crate::prepare::{classify, Pinned, PrepareError};
use archive::Budget;
use futures::StreamExt;
use mango_client::Client;
use mango_protocol::agents::{SkillKind, SkillPin};
use mango_protocol::sessions::Session;
use mango_protocol::skills::{is_slug, session_limits};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What one Session's Skills may amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub scope_pins: usize,
    pub compressed_bytes: u64,
    pub expanded_bytes: u64,
    pub files: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            scope_pins: session_limits::MAX_SCOPE_PINS,
            compressed_bytes: session_limits::MAX_COMPRESSED_BYTES,
            expanded_bytes: session_limits::MAX_EXPANDED_BYTES,
            files: session_limits::MAX_FILES,
        }
    }
}

/// Whose Skill a pin is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Primary,
    /// A roster Agent of a coordinator, by id.
    Roster(String),
}

/// One pinned version of a custom Skill, in one scope, as the snapshot froze it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScopePin {
    pub scope: Scope,
    pub skill_id: String,
    pub version: String,
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

impl ScopePin {
    /// Where it goes below `skills/`.
    pub fn relative_dir(&self) -> PathBuf {
        match &self.scope {
            Scope::Primary => PathBuf::from(&self.name),
            Scope::Roster(agent) => Path::new(".agents").join(agent).join(&self.name),
        }
    }
}

fn permanent(why: String) -> PrepareError {
    PrepareError::Permanent(why)
}

/// A roster Agent's id becomes a directory: one plain path component.
fn safe_component(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn pin_of(scope: &Scope, pin: &SkillPin) -> Result<ScopePin, PrepareError> {
    let what = format!("custom Skill {} version {}", pin.skill_id, pin.version);
    let frozen = pin.frozen().ok_or_else(|| {
        permanent(format!(
            "the Session's snapshot pins {what} without its frozen name, length and digest"
        ))
    })?;
    if pin.version == "latest" {
        return Err(permanent(format!(
            "the Session's snapshot pins custom Skill {} as latest, not as a frozen version",
            pin.skill_id
        )));
    }
    if !is_slug(&frozen.name) {
        return Err(permanent(format!(
            "{what} is named {:?}, which is not a Skill's slug",
            frozen.name
        )));
    }
    let size = u64::try_from(frozen.content_size_bytes)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| permanent(format!("{what} has no valid archive length")))?;
    let digest = frozen.content_sha256.clone();
    if digest.len() != 64
        || !digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(permanent(format!("{what} has no valid SHA-256")));
    }
    Ok(ScopePin {
        scope: scope.clone(),
        skill_id: pin.skill_id.clone(),
        version: pin.version.clone(),
        name: frozen.name,
        size,
        sha256: digest,
    })
}

/// Every distinct custom Skill pin of the snapshot, primary first, checked
/// against `limits` before anything is downloaded.
pub fn scope_pins(session: &Session, limits: &Limits) -> Result<Vec<ScopePin>, PrepareError> {
    let agent = &session.agent;
    let mut scopes: Vec<(Scope, Vec<SkillPin>)> =
        vec![(Scope::Primary, agent.definition.skills.clone())];
    if let Some(multi) = agent.multiagent.as_ref().filter(|m| !m.is_null()) {
        for member in multi["agents"].as_array().into_iter().flatten() {
            if member["type"] != "agent" || member["id"] == agent.id.as_str() {
                continue;
            }
            let id = member["id"].as_str().unwrap_or_default();
            if !safe_component(id) {
                return Err(permanent(format!(
                    "the Session's roster names an Agent {id:?} that cannot be a directory name"
                )));
            }
            let skills: Vec<SkillPin> =
                serde_json::from_value(member["skills"].clone()).map_err(|e| {
                    permanent(format!(
                        "the roster Agent {id}'s skills are unreadable: {e}"
                    ))
                })?;
            scopes.push((Scope::Roster(id.to_string()), skills));
        }
    }
    let mut seen = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut out = Vec::new();
    for (scope, skills) in &scopes {
        for pin in skills.iter().filter(|p| p.kind == SkillKind::Custom) {
            let pin = pin_of(scope, pin)?;
            if !seen.insert((pin.scope.clone(), pin.skill_id.clone(), pin.version.clone())) {
                continue;
            }
            if !dirs.insert(pin.relative_dir()) {
                return Err(permanent(format!(
                    "two Skills pinned by the Session share the directory skills/{}",
                    pin.relative_dir().display()
                )));
            }
            out.push(pin);
        }
    }
    if out.len() > limits.scope_pins {
        return Err(permanent(format!(
            "the Session pins {} Skill versions; at most {} are materialized",
            out.len(),
            limits.scope_pins
        )));
    }
    let compressed = out.iter().fold(0u64, |sum, p| sum.saturating_add(p.size));
    if compressed > limits.compressed_bytes {
        return Err(permanent(format!(
            "the Session's Skill archives total {compressed} bytes; at most {} are downloaded",
            limits.compressed_bytes
        )));
    }
    Ok(out)
}

/// The materialized `skills/` tree of the Work.
#[derive(Debug)]
pub struct SkillsTree {
    root: PathBuf,
}

impl SkillsTree {
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Removes the tree (whatever is at `skills/` now; a symbolic link a
    /// tool put there is removed, not followed).
    pub async fn remove(self) {
        let root = self.root;
        let removed = tokio::task::spawn_blocking(move || remove_any(&root).map(|_| root)).await;
        match removed {
            Ok(Ok(root)) => tracing::info!(path = %root.display(), "removed the Session's Skills"),
            Ok(Err(err)) => tracing::warn!(error = %err, "could not remove the Session's Skills"),
            Err(err) => tracing::warn!(error = %err, "could not remove the Session's Skills"),
        }
    }
}

fn remove_stale_staging(workspace: &Path) {
    let Ok(entries) = std::fs::read_dir(workspace) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(".skills-staging-")
        {
            let _ = remove_any(&entry.path());
        }
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// Attempts of one download (the client retries each request too).
const DOWNLOAD_ATTEMPTS: u32 = 5;

/// Materializes every Skill the Session pins into `<workspace>/skills`;
/// `None` when it pins none (the workspace is left as it is).
pub async fn materialize(
    client: &Client,
    session: &Session,
    workspace: &Path,
    limits: Limits,
) -> Result<Option<SkillsTree>, PrepareError> {
    let started = std::time::Instant::now();
    let pins = scope_pins(session, &limits)?;
    if pins.is_empty() {
        return Ok(None);
    }
    let workspace = tokio::fs::canonicalize(workspace).await.map_err(|e| {
        PrepareError::Transient(format!(
            "the workspace {} is unusable: {e}",
            workspace.display()
        ))
    })?;
    // An earlier activation cancelled mid-way may have left its staging.
    let leftovers = workspace.clone();
    let _ = tokio::task::spawn_blocking(move || remove_stale_staging(&leftovers)).await;
    let suffix: u64 = rand::random();
    let staging = workspace.join(format!(".skills-staging-{suffix:016x}"));
    let staged = stage(client, &pins, &staging, limits).await;
    if let Err(err) = staged {
        let _ = tokio::task::spawn_blocking(move || remove_any(&staging)).await;
        return Err(err);
    }
    let root = workspace.join("skills");
    let (from, to) = (staging.clone(), root.clone());
    let swapped = tokio::task::spawn_blocking(move || replace(&from, &to))
        .await
        .map_err(|e| PrepareError::Transient(format!("installing the Skills: {e}")))?;
    if let Err(err) = swapped {
        let _ = tokio::task::spawn_blocking(move || remove_any(&staging)).await;
        return Err(PrepareError::Transient(format!(
            "installing the Skills at {}: {err}",
            root.display()
        )));
    }
    tracing::info!(skills = pins.len(), path = %root.display(),
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "materialized the Session's Skills");
    Ok(Some(SkillsTree { root }))
}

/// Puts the staged tree at `root` in one step, and removes what was there.
fn replace(staged: &Path, root: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, staged, CWD, root, RenameFlags::EXCHANGE) {
        // `staged` now names what was at `root`.
        Ok(()) => remove_any(staged),
        Err(rustix::io::Errno::NOENT) => std::fs::rename(staged, root),
        Err(err) => Err(err.into()),
    }
}

async fn stage(
    client: &Client,
    pins: &[ScopePin],
    staging: &Path,
    limits: Limits,
) -> Result<(), PrepareError> {
    let dir = staging.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(false);
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(&dir)
    })
    .await
    .map_err(|e| PrepareError::Transient(format!("staging the Skills: {e}")))?
    .map_err(|e| PrepareError::Transient(format!("staging the Skills: {e}")))?;
    let mut budget = Budget {
        expanded_bytes: limits.expanded_bytes,
        files: limits.files,
    };
    for (n, pin) in pins.iter().enumerate() {
        let download = staging.join(format!(".download-{n}"));
        fetch(client, pin, &download).await?;
        let dest = staging.join(pin.relative_dir());
        let what = format!("custom Skill {} version {}", pin.skill_id, pin.version);
        let left = budget;
        let result = tokio::task::spawn_blocking(move || {
            let mut left = left;
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            let file = std::fs::File::open(&download).map_err(|e| e.to_string())?;
            let extracted = archive::extract(file, &dest, &mut left);
            let _ = std::fs::remove_file(&download);
            extracted.map(|()| left)
        })
        .await
        .map_err(|e| PrepareError::Transient(format!("expanding the {what}: {e}")))?;
        budget =
            result.map_err(|why| permanent(format!("the archive of {what} is refused: {why}")))?;
    }
    Ok(())
}

/// Downloads one archive to `path`, checking its length and digest.
async fn fetch(client: &Client, pin: &ScopePin, path: &Path) -> Result<(), PrepareError> {
    let what = Pinned::Skill {
        skill_id: pin.skill_id.clone(),
        version: pin.version.clone(),
    };
    let mut attempt = 1;
    loop {
        let resp = client
            .skill_content(&pin.skill_id, &pin.version)
            .await
            .map_err(|err| classify(&what, &err))?;
        match read_body(resp, pin, path).await {
            Ok(()) => return Ok(()),
            Err(Body::Wrong(why)) => {
                return Err(permanent(format!(
                    "the archive of {what} is refused: {why}"
                )))
            }
            Err(Body::Interrupted(why)) if attempt < DOWNLOAD_ATTEMPTS => {
                tracing::warn!(input = %what, attempt, error = %why, "Skill download interrupted; retrying");
                tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                attempt += 1;
            }
            Err(Body::Interrupted(why)) => {
                return Err(PrepareError::Transient(format!(
                    "downloading the {what}: {why}"
                )))
            }
        }
    }
}

enum Body {
    /// The bytes are not what the snapshot froze.
    Wrong(String),
    /// The transfer broke off.
    Interrupted(String),
}

async fn read_body(resp: reqwest::Response, pin: &ScopePin, path: &Path) -> Result<(), Body> {
    if let Some(len) = resp.content_length().filter(|len| *len != pin.size) {
        return Err(Body::Wrong(format!(
            "it is {len} bytes long, not the {} the Session's snapshot froze",
            pin.size
        )));
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| Body::Interrupted(format!("cannot write {}: {e}", path.display())))?;
    let mut hash = Sha256::new();
    let mut total = 0u64;
    let mut body = resp.bytes_stream();
    let outcome = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Body::Interrupted(e.to_string()))?;
            total += chunk.len() as u64;
            if total > pin.size {
                return Err(Body::Wrong(format!(
                    "it is longer than the {} bytes the Session's snapshot froze",
                    pin.size
                )));
            }
            hash.update(&chunk);
            file.write_all(&chunk)
                .map_err(|e| Body::Interrupted(format!("cannot write {}: {e}", path.display())))?;
        }
        if total != pin.size {
            return Err(Body::Wrong(format!(
                "it is {total} bytes long, not the {} the Session's snapshot froze",
                pin.size
            )));
        }
        let digest = hex::encode(hash.finalize());
        if digest != pin.sha256 {
            return Err(Body::Wrong(format!(
                "its SHA-256 is {digest}, not the {} the Session's snapshot froze (a digest mismatch)",
                pin.sha256
            )));
        }
        Ok(())
    }
    .await;
    if outcome.is_err() {
        drop(file);
        let _ = std::fs::remove_file(path);
    }
    outcome
}

#[cfg(test)]
mod tests;
