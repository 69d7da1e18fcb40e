//! Expanding one Skill archive into a fresh directory, refusing anything a
//! hostile archive could do: members whose path is absolute, holds `..` or
//! breaks the other path rules; symbolic and hard links, devices, FIFOs and
//! sockets; duplicate members and members that share their data; and more
//! files or bytes than the Session has left ([`Budget`]), judged from the
//! declared sizes before anything is written and held while writing (a
//! member never yields more than it declared). Files are created new (never
//! through an existing path), with mode 0755 when the archive marks them
//! executable, else 0644.

use mango_protocol::skills::{
    is_directory_mode, member_path, special_file_kind, PKWARE_UNIX_EXTRA_FIELD,
};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// What the Session may still write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub expanded_bytes: u64,
    pub files: u64,
}

struct Planned {
    index: usize,
    rest: Vec<String>,
    is_dir: bool,
    size: u64,
    executable: bool,
}

/// Expands `archive` into `dest` (which must not exist), taking what it
/// writes from `budget`. The error says what the archive did wrong.
pub fn extract(archive: File, dest: &Path, budget: &mut Budget) -> Result<(), String> {
    let mut zip = zip::ZipArchive::new(archive)
        .map_err(|e| format!("it is not a readable zip archive: {e}"))?;
    if zip.has_duplicate_names() {
        return Err("it lists a member more than once (a duplicate member)".into());
    }
    if zip
        .has_overlapping_files()
        .map_err(|e| format!("it is not a readable zip archive: {e}"))?
    {
        return Err(
            "its members share their data (a hard link or an overlapping-entry zip bomb)".into(),
        );
    }
    let mut planned = Vec::new();
    let mut tops = std::collections::BTreeSet::new();
    for index in 0..zip.len() {
        let entry = zip
            .by_index_raw(index)
            .map_err(|e| format!("member {index} cannot be read: {e}"))?;
        let name = std::str::from_utf8(entry.name_raw())
            .map_err(|_| format!("member {index} has a name that is not UTF-8"))?
            .to_string();
        let parts = member_path(&name)?;
        if entry.encrypted() {
            return Err(format!("{name:?} is encrypted"));
        }
        let mode = entry.unix_mode();
        if let Some(kind) = mode.and_then(special_file_kind) {
            return Err(format!(
                "{name:?} is {kind}; only regular files and directories are allowed"
            ));
        }
        if entry.is_symlink() {
            return Err(format!(
                "{name:?} is a symbolic link; only regular files and directories are allowed"
            ));
        }
        if entry.extra_data_fields().any(|f| {
            matches!(f, zip::extra_fields::ExtraField::Custom(c)
                if c.header_id == PKWARE_UNIX_EXTRA_FIELD && c.data.len() > 12)
        }) {
            return Err(format!(
                "{name:?} is a hard or symbolic link (PKWARE Unix extra field)"
            ));
        }
        tops.insert(parts[0].to_string());
        planned.push(Planned {
            index,
            rest: parts.iter().map(|p| p.to_string()).collect(),
            is_dir: entry.is_dir() || mode.is_some_and(is_directory_mode),
            size: entry.size(),
            executable: mode.is_some_and(|m| m & 0o111 != 0),
        });
    }
    // Skill archives wrap their files in one directory (`<name>/…`): strip it.
    let wrapped = tops.len() == 1 && planned.iter().any(|p| p.rest.len() > 1);
    if wrapped {
        for p in &mut planned {
            p.rest.remove(0);
        }
        planned.retain(|p| !p.rest.is_empty());
    }
    let files = planned.iter().filter(|p| !p.is_dir).count() as u64;
    let declared: u64 = planned
        .iter()
        .filter(|p| !p.is_dir)
        .fold(0u64, |sum, p| sum.saturating_add(p.size));
    if files > budget.files {
        return Err(format!(
            "it holds {files} files, more than the {} the Session's Skills may still have",
            budget.files
        ));
    }
    if declared > budget.expanded_bytes {
        return Err(format!(
            "its files expand to {declared} bytes, more than the {} the Session's Skills may still take",
            budget.expanded_bytes
        ));
    }
    let mut dirs = DirBuilder::new();
    dirs.mode(0o700).recursive(false);
    dirs.create(dest)
        .map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    for p in planned {
        let target = p
            .rest
            .iter()
            .fold(dest.to_path_buf(), |path, part| path.join(part));
        // Parents, one component at a time: an existing file there is a conflict.
        let mut parent = dest.to_path_buf();
        let parents = if p.is_dir {
            &p.rest[..]
        } else {
            &p.rest[..p.rest.len() - 1]
        };
        for part in parents {
            parent.push(part);
            match std::fs::symlink_metadata(&parent) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(format!(
                        "{:?} is both a file and a directory",
                        p.rest.join("/")
                    ))
                }
                Err(_) => dirs
                    .create(&parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?,
            }
        }
        if p.is_dir {
            continue;
        }
        let mut entry = zip
            .by_index(p.index)
            .map_err(|e| format!("{:?} cannot be read: {e}", p.rest.join("/")))?;
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if p.executable { 0o755 } else { 0o644 })
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(|e| format!("cannot create {:?}: {e}", p.rest.join("/")))?;
        let written = copy_at_most(&mut entry, &mut out, p.size)
            .map_err(|e| format!("{:?} cannot be expanded: {e}", p.rest.join("/")))?;
        if written != p.size {
            return Err(format!(
                "{:?} expands to more or fewer bytes than the {} its header declares",
                p.rest.join("/"),
                p.size
            ));
        }
        budget.expanded_bytes -= written;
        budget.files -= 1;
    }
    Ok(())
}

/// Copies at most `limit + 1` bytes (one past is how a lying header shows).
fn copy_at_most(from: &mut impl Read, to: &mut File, limit: u64) -> std::io::Result<u64> {
    let mut buf = [0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let want = ((limit + 1 - total) as usize).min(buf.len());
        if want == 0 {
            return Ok(total);
        }
        let n = from.read(&mut buf[..want])?;
        if n == 0 {
            return Ok(total);
        }
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}
