//! A Memory Store's folder on disk, touched only without following links:
//! every open walks from the root with `O_NOFOLLOW`, so a symlink planted by
//! a tool (`bash` is not path-confined) can neither redirect a write nor
//! leak a file outside the folder into the store. Files are written 0600
//! through a temporary file and a rename (a reader never sees half a
//! memory), directories are made 0700.

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Temporary files of [`Folder::put`] start with this; scans skip them.
pub const TMP_PREFIX: &str = ".mango-memory-tmp-";
/// A file changed this recently is hashed again even if it looks unchanged
/// (a write within the timestamp's granularity keeps size and mtime).
const FRESH: Duration = Duration::from_secs(2);

/// Lowercase hex SHA-256 of `bytes`, as the API's `content_sha256` is.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The relative path's components, refused when one could leave the folder.
fn components(rel: &str) -> io::Result<Vec<&str>> {
    let parts: Vec<&str> = rel.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{rel:?} is not a clean relative path"),
        ));
    }
    Ok(parts)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// What a scan found: every regular file's digest by relative path, and the
/// marker's content (`None`: no marker file).
#[derive(Debug, Default)]
pub struct Scan {
    pub files: BTreeMap<String, String>,
    pub marker: Option<Vec<u8>>,
}

/// What makes a cached digest reusable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Digests of files that have not changed since the last scan.
#[derive(Debug, Default)]
pub struct HashCache(HashMap<String, (Stamp, String)>);

/// The digest a file over `max` bytes is known by: never a real SHA-256, so
/// it never matches a memory, and it changes when the file does.
fn oversize(meta: &std::fs::Metadata) -> String {
    format!(
        "oversize:{}:{}.{}",
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    )
}

#[derive(Debug, Clone)]
pub struct Folder {
    root: PathBuf,
}

impl Folder {
    pub fn new(root: PathBuf) -> Folder {
        Folder { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether anything (a link included) is at the root's path.
    pub fn exists(&self) -> bool {
        std::fs::symlink_metadata(&self.root).is_ok()
    }

    /// Makes the root (and missing ancestors) 0700.
    pub fn create(&self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)?;
        // The root itself must be a directory, not a link to one.
        self.open_root().map(drop)
    }

    fn open_root(&self) -> io::Result<OwnedFd> {
        Ok(rfs::openat(
            rfs::CWD,
            &self.root,
            dir_flags(),
            Mode::empty(),
        )?)
    }

    /// The directory holding `rel`'s last component, and that component.
    fn parent<'a>(&self, rel: &'a str, create: bool) -> io::Result<(OwnedFd, &'a str)> {
        let parts = components(rel)?;
        let (name, dirs) = parts.split_last().expect("split yields one part");
        let mut fd = self.open_root()?;
        for dir in dirs {
            let next = match rfs::openat(&fd, *dir, dir_flags(), Mode::empty()) {
                Err(rustix::io::Errno::NOENT) if create => {
                    match rfs::mkdirat(&fd, *dir, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    rfs::openat(&fd, *dir, dir_flags(), Mode::empty())?
                }
                other => other?,
            };
            fd = next;
        }
        Ok((fd, name))
    }

    /// Writes `bytes` at `rel`, atomically, creating directories as needed.
    pub fn put(&self, rel: &str, bytes: &[u8]) -> io::Result<()> {
        let (dir, name) = self.parent(rel, true)?;
        let tmp = format!("{TMP_PREFIX}{:016x}", rand::random::<u64>());
        let fd = rfs::openat(
            &dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut file = File::from(fd);
        let written = file.write_all(bytes).and_then(|()| file.flush());
        drop(file);
        let renamed = written.and_then(|()| Ok(rfs::renameat(&dir, tmp.as_str(), &dir, name)?));
        if renamed.is_err() {
            let _ = rfs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        }
        renamed
    }

    /// The bytes of the regular file at `rel`, at most `max + 1` of them;
    /// `None` when there is none (or something else is there).
    pub fn get(&self, rel: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
        let (dir, name) = match self.parent(rel, false) {
            Ok(found) => found,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let fd = match rfs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if gone(&e.into()) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Ok(None);
        }
        let mut out = Vec::new();
        file.take(max as u64 + 1).read_to_end(&mut out)?;
        Ok(Some(out))
    }

    /// The digest of the file at `rel` (`None`: no regular file there).
    pub fn hash(&self, rel: &str, max: usize) -> io::Result<Option<String>> {
        Ok(self.get(rel, max)?.map(|bytes| {
            if bytes.len() > max {
                format!("oversize:{}", sha256_hex(&bytes))
            } else {
                sha256_hex(&bytes)
            }
        }))
    }

    /// Removes the regular file at `rel`; nothing when it is gone already.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let (dir, name) = match self.parent(rel, false) {
            Ok(found) => found,
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile => {
                Ok(rfs::unlinkat(&dir, name, AtFlags::empty())?)
            }
            Ok(_) => Ok(()),
            Err(e) if gone(&e.into()) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every regular file below the root (links, devices and the like are
    /// not memories), digested, with the marker `marker` names read apart.
    /// Files over `max` bytes are not read: they get a digest no memory has.
    pub fn scan(&self, marker: &str, max: usize, cache: &mut HashCache) -> io::Result<Scan> {
        let mut scan = Scan::default();
        match std::fs::symlink_metadata(&self.root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(scan),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(scan),
            Err(e) => return Err(e),
        }
        let mut fresh = HashMap::new();
        let now = SystemTime::now();
        let walk = walkdir::WalkDir::new(&self.root)
            .follow_links(false)
            .follow_root_links(false)
            .min_depth(1);
        for entry in walk {
            let entry = match entry {
                Ok(e) => e,
                Err(err) => {
                    tracing::debug!(root = %self.root.display(), error = %err, "memory scan skipped an entry");
                    continue;
                }
            };
            if !entry.file_type().is_file() {
                continue;
            }
            let Some(rel) = entry
                .path()
                .strip_prefix(&self.root)
                .ok()
                .and_then(Path::to_str)
            else {
                tracing::warn!(path = %entry.path().display(), "a file whose name is not UTF-8 cannot be a memory; skipped");
                continue;
            };
            if rel == marker {
                scan.marker = self.get(rel, 4096)?;
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let stamp = Stamp {
                len: meta.len(),
                ino: meta.ino(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                ctime: (meta.ctime(), meta.ctime_nsec()),
            };
            let settled = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age >= FRESH);
            let sha = match cache.0.get(rel) {
                Some((seen, sha)) if settled && *seen == stamp => sha.clone(),
                _ if meta.len() > max as u64 => oversize(&meta),
                _ => match self.hash(rel, max)? {
                    Some(sha) => sha,
                    None => continue,
                },
            };
            fresh.insert(rel.to_string(), (stamp, sha.clone()));
            scan.files.insert(rel.to_string(), sha);
        }
        cache.0 = fresh;
        Ok(scan)
    }

    /// Removes the whole folder.
    pub fn dispose(&self) -> io::Result<()> {
        match std::fs::remove_dir_all(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// An error that means "not there": nothing to read or remove.
fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_atomically_and_scans_digest_them() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::new(dir.path().join("store"));
        folder.create().unwrap();
        folder.put("a/b/c.md", b"hello").unwrap();
        folder.put("top.md", b"").unwrap();
        folder.put(".marker", b"m").unwrap();
        assert_eq!(folder.get("a/b/c.md", 100).unwrap().unwrap(), b"hello");
        let mut cache = HashCache::default();
        let scan = folder.scan(".marker", 100, &mut cache).unwrap();
        assert_eq!(scan.marker.as_deref(), Some(&b"m"[..]));
        assert_eq!(
            scan.files.keys().collect::<Vec<_>>(),
            ["a/b/c.md", "top.md"]
        );
        assert_eq!(scan.files["a/b/c.md"], sha256_hex(b"hello"));
        let mode = std::fs::metadata(dir.path().join("store/a/b/c.md"))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(dir.path().join("store/a"))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        folder.remove("a/b/c.md").unwrap();
        folder.remove("a/b/c.md").unwrap();
        assert!(folder.get("a/b/c.md", 100).unwrap().is_none());
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("store"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(TMP_PREFIX))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn links_are_never_followed_in_or_out() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"not a memory").unwrap();
        let folder = Folder::new(dir.path().join("store"));
        folder.create().unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("store/linked")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), dir.path().join("store/file-link"))
            .unwrap();
        // A scan sees neither link nor what is behind them.
        let scan = folder.scan(".m", 100, &mut HashCache::default()).unwrap();
        assert!(scan.files.is_empty(), "{:?}", scan.files);
        // Reads through them find nothing; writes through them fail.
        assert!(folder.get("linked/secret", 100).unwrap().is_none());
        assert!(folder.get("file-link", 100).unwrap().is_none());
        assert!(folder.put("linked/new", b"x").is_err());
        assert!(!outside.join("new").exists());
        // A write onto a link's name replaces the link, not its target.
        folder.put("file-link", b"replaced").unwrap();
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"not a memory"
        );
        // Escaping paths are refused outright.
        for bad in ["../x", "a/../../x", "/abs", "a//b", ""] {
            assert!(folder.put(bad, b"x").is_err(), "{bad}");
        }
    }

    #[test]
    fn big_files_are_not_read_and_a_root_link_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::new(dir.path().join("store"));
        folder.create().unwrap();
        folder.put("big", &[b'x'; 11]).unwrap();
        let scan = folder.scan(".m", 10, &mut HashCache::default()).unwrap();
        assert!(scan.files["big"].starts_with("oversize:"));
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("f"), b"f").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("linked-root")).unwrap();
        let linked = Folder::new(dir.path().join("linked-root"));
        let scan = linked.scan(".m", 10, &mut HashCache::default()).unwrap();
        assert!(scan.files.is_empty());
        assert!(linked.put("g", b"g").is_err());
    }
}
