//! Path confinement for the file tools (SDK reference §4.2).
//!
//! Relative paths resolve against the workspace; `.`/`..` collapse
//! lexically; then every symlink is followed (dangling final component
//! included, at most 40 hops) and the canonical path must lie inside the
//! workspace or an allowed root. `write`/`edit` additionally refuse
//! read-only roots.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::ToolContext;

/// Maximum symlinks followed while resolving one path.
pub const MAX_SYMLINK_HOPS: usize = 40;

/// Whether the caller is going to modify the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Collapses `.` and `..` lexically (`..` at the root stays at the root).
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for comp in path.components() {
        match comp {
            Component::Prefix(p) => out.push(p.as_os_str()),
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(c) => out.push(c),
        }
    }
    out
}

/// Resolves every symlink in an absolute, lexically normal path. Components
/// that do not exist are appended verbatim (so a dangling symlink resolves to
/// its target, and a not-yet-created file resolves to where it would be).
pub fn canonicalize_lenient(path: &Path) -> io::Result<PathBuf> {
    let mut pending: Vec<PathBuf> = Vec::new(); // stack, reversed order
    for comp in path.components().rev() {
        pending.push(PathBuf::from(comp.as_os_str()));
    }
    let mut out = PathBuf::from("/");
    let mut hops = 0usize;
    let mut missing = false;
    while let Some(comp) = pending.pop() {
        let comp_path = comp.as_path();
        match comp_path.components().next() {
            Some(Component::RootDir) | Some(Component::Prefix(_)) => {
                out = PathBuf::from("/");
                continue;
            }
            Some(Component::CurDir) | None => continue,
            Some(Component::ParentDir) => {
                out.pop();
                continue;
            }
            Some(Component::Normal(_)) => {}
        }
        let candidate = out.join(comp_path);
        if missing {
            out = candidate;
            continue;
        }
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(io::Error::other("too many levels of symbolic links"));
                }
                let target = std::fs::read_link(&candidate)?;
                for c in target.components().rev() {
                    pending.push(PathBuf::from(c.as_os_str()));
                }
            }
            Ok(_) => out = candidate,
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                missing = true;
                out = candidate;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn canonical_root(root: &Path) -> PathBuf {
    let abs = normalize_lexically(root);
    canonicalize_lenient(&abs).unwrap_or(abs)
}

/// Resolves `raw` for `tool`, enforcing the roots. Returns the canonical path.
pub fn resolve(
    ctx: &ToolContext,
    tool: &str,
    raw: &str,
    access: Access,
) -> Result<PathBuf, String> {
    if raw.is_empty() {
        return Err(format!("{tool}: path must not be empty"));
    }
    if raw.contains('\0') {
        return Err(format!("{tool}: path '{raw}' contains a NUL byte"));
    }
    let workspace = canonical_root(&ctx.workspace);
    let joined = if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        workspace.join(raw)
    };
    let lexical = normalize_lexically(&joined);
    let canonical = canonicalize_lenient(&lexical).map_err(|e| {
        let why = if e.raw_os_error() == Some(libc::EACCES) {
            "permission denied".to_string()
        } else if e.kind() == io::ErrorKind::Other {
            e.to_string()
        } else {
            "could not be resolved".to_string()
        };
        format!("{tool}: path '{raw}' could not be resolved ({why})")
    })?;
    let inside = std::iter::once(workspace)
        .chain(ctx.allowed_roots.iter().map(|r| canonical_root(r)))
        .any(|root| canonical.starts_with(&root));
    if !inside {
        return Err(format!(
            "{tool}: path '{raw}' is outside the session's working directory"
        ));
    }
    if access == Access::Write {
        for root in &ctx.read_only_roots {
            let croot = canonical_root(root);
            if canonical.starts_with(&croot) {
                return Err(format!(
                    "{tool}: {raw} is inside read-only directory {}",
                    croot.display()
                ));
            }
        }
    }
    Ok(canonical)
}

/// Whether `path` (canonical) lies inside any of the context's roots.
pub fn is_confined(ctx: &ToolContext, path: &Path) -> bool {
    std::iter::once(&ctx.workspace)
        .chain(ctx.allowed_roots.iter())
        .any(|r| path.starts_with(canonical_root(r)))
}
