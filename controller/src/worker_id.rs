//! The worker id a `mango-worker docker` or `local` process runs as.
//!
//! The id owns the warm sandboxes the process makes (`mango.dev/warm-owner`):
//! only a supervisor of the same id adopts them after a restart. So the
//! default must be the same at every start of the same supervisor, and two
//! live processes must never share one, or both would bind the same warm
//! sandbox. The default is made of what names a supervisor (this host, its
//! Environment, its pool), and a lock held for the process's life refuses a
//! second live process of the same id on this host.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Which `mango-worker` a default id is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Docker,
    Local,
}

/// `mango-worker-<host>-<environment id>-<pool>` (`…-local` for `mango-worker
/// local`): the same at every start of the supervisor of one pool of one
/// Environment on this host, and another for each kind, so a `docker` and a
/// `local` supervisor of one Environment can run side by side. Docker's
/// has no suffix: it owns the warm containers an earlier start left.
pub fn default_for(kind: Kind, environment_id: &str, pool: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let id = format!("mango-worker-{host}-{environment_id}-{pool}");
    match kind {
        Kind::Docker => id,
        Kind::Local => format!("{id}-local"),
    }
}

/// How long a start waits for a previous process of its id to exit: a
/// restart that starts the new process before the old one has detached.
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(10);

/// Holds a worker id on this host for as long as it lives; the kernel
/// releases it when the process ends, however it ends.
#[derive(Debug)]
pub struct Held {
    _lock: File,
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error(
        "another mango-worker with worker id {id:?} is running on this host{holder}; \
         give each supervisor its own --worker-id (MANGO_WORKER_ID), or stop that one first"
    )]
    InUse { id: String, holder: String },
    #[error("cannot lock the worker id {id:?} at {path}: {error}")]
    Unlockable {
        id: String,
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Where this user's locks live: `/tmp/mango-worker-<uid>`, whatever the
/// process's environment says (`TMPDIR`, `XDG_RUNTIME_DIR`), so that every
/// start of one user's supervisor on this host looks in the same place.
/// (A systemd unit with `PrivateTmp=` has a `/tmp` of its own.)
pub fn lock_dir() -> PathBuf {
    PathBuf::from(format!(
        "/tmp/mango-worker-{}",
        rustix::process::getuid().as_raw()
    ))
}

/// Makes `dir` this user's own (0700), or refuses one that is not: a
/// directory someone else made, or a link, could point the lock anywhere.
fn own_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of uid {uid} that only it may write",
            dir.display()
        )));
    }
    Ok(())
}

/// Takes `id` in `dir`, waiting up to `wait` for a process that holds it to
/// exit.
pub fn hold(id: &str, dir: &Path, wait: Duration) -> Result<Held, HoldError> {
    let path = dir.join(format!("{}.lock", file_name(id)));
    let unlockable = |error| HoldError::Unlockable {
        id: id.to_string(),
        path: path.clone(),
        error,
    };
    own_dir(dir).map_err(unlockable)?;
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(unlockable)?
    };
    let deadline = Instant::now() + wait;
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                if !std::mem::replace(&mut told, true) {
                    tracing::info!(
                        worker_id = id,
                        ?wait,
                        "another process holds this worker id; waiting for it to exit"
                    );
                }
                // Polled within `wait`: the holder detaches within seconds.
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|pid| pid.trim().parse::<u32>().ok())
                    .map(|pid| format!(" (pid {pid})"))
                    .unwrap_or_default();
                return Err(HoldError::InUse {
                    id: id.to_string(),
                    holder,
                });
            }
            Err(TryLockError::Error(error)) => return Err(unlockable(error)),
        }
    }
    // Only the holder writes: who holds it, for the next one's error.
    let _ = file.set_len(0);
    let _ = std::io::Write::write_all(&mut &file, std::process::id().to_string().as_bytes());
    Ok(Held { _lock: file, path })
}

/// `id` as one file name: anything but `[A-Za-z0-9._-]` becomes `_`, and a
/// digest keeps two ids that map to the same name apart.
fn file_name(id: &str) -> String {
    let plain: String = id
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let digest = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{plain}-{digest:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_same_at_every_start_and_names_the_environment_and_pool() {
        let id = default_for(Kind::Docker, "env_abc", "builders");
        assert_eq!(id, default_for(Kind::Docker, "env_abc", "builders"));
        assert!(id.ends_with("-env_abc-builders"), "{id}");
        assert_ne!(id, default_for(Kind::Docker, "env_abc", "other"));
        assert_ne!(id, default_for(Kind::Docker, "env_other", "builders"));
        let local = default_for(Kind::Local, "env_abc", "builders");
        assert_ne!(
            local, id,
            "a docker and a local supervisor run side by side"
        );
        assert!(local.ends_with("-env_abc-builders-local"), "{local}");
    }

    #[test]
    fn a_second_holder_of_one_id_is_refused_naming_the_first_and_takes_it_once_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let first = hold("mango-worker-h-env-default", dir.path(), Duration::ZERO).unwrap();
        let err = hold(
            "mango-worker-h-env-default",
            dir.path(),
            Duration::from_millis(300),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("(pid {})", std::process::id())),
            "{text}"
        );
        assert!(text.contains("--worker-id"), "{text}");
        let other = hold("mango-worker-h-env-other", dir.path(), Duration::ZERO);
        assert!(other.is_ok(), "another id is free: {other:?}");
        drop(first);
        hold("mango-worker-h-env-default", dir.path(), Duration::ZERO)
            .expect("free once its holder is gone");
    }

    #[test]
    fn a_start_waits_for_the_previous_holder_to_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = hold("w", dir.path(), Duration::ZERO).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });
        hold("w", dir.path(), Duration::from_secs(5)).expect("taken once the first lets go");
        release.join().unwrap();
    }

    #[test]
    fn a_lock_directory_someone_else_could_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = hold("w", &open, Duration::ZERO).unwrap_err();
        assert!(matches!(err, HoldError::Unlockable { .. }), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(
            hold("w", &link, Duration::ZERO).is_err(),
            "a link is refused"
        );
        let made = dir.path().join("made");
        hold("w", &made, Duration::ZERO).expect("one it makes is its own");
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_lock_file_that_is_a_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        hold("w", &locks, Duration::ZERO).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me").unwrap();
        let lock = std::fs::read_dir(&locks)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::remove_file(&lock).unwrap();
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        assert!(hold("w", &locks, Duration::ZERO).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    }

    #[test]
    fn ids_that_differ_only_in_unsafe_characters_get_their_own_files() {
        assert_ne!(file_name("a/b"), file_name("a_b"));
        assert_eq!(file_name("a/b"), file_name("a/b"));
        assert!(!file_name("../../etc/passwd").contains('/'));
    }
}
