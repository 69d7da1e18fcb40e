//! Size-bounded Session workspaces. Docker's `local` volume driver bounds
//! a volume only on xfs with project quotas, and this engine's storage
//! (fuse-overlayfs, ext4 under `/var/lib/docker`) has none; a tmpfs volume
//! would be bounded but emptied whenever no container uses it, so between
//! two activations of a Session. So each Session's workspace is an ext4
//! filesystem in a sparse file of its own, `<root>/<volume>/disk.img`,
//! which the supervisor (root, on the engine's host) formats once and
//! loop-mounts at `<root>/<volume>/mnt`; the Session's named volume is a
//! bind of that mount. The file can never hold more than its size, so a
//! tool that fills it gets "No space left on device" and the host's disk
//! does not fill; inodes are bounded with it.
//!
//! The mount outlives the supervisor (it belongs to the host), so a
//! restarted supervisor finds it mounted; after a host reboot the next
//! create mounts it again. Until then the mount point is an empty
//! directory owned by root with mode 0700, so a container given it by
//! mistake can write nothing to the host's disk. Removing the Session's
//! volume unmounts the filesystem (the loop device is released with it)
//! and deletes the file.

use super::host;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::process::Command;
use tokio::sync::Mutex;

/// The runner's uid and gid: the owner of a new workspace's root.
const OWNER: &str = "65534:65534";
/// Smaller than this, ext4 has barely room for its own metadata.
pub const MIN_BYTES: u64 = 16 * 1024 * 1024;

/// A workspace size as given: `unbounded`, bytes, or a Kubernetes-style
/// quantity (`512Mi`, `1Gi`, `2G`), as the chart's PVC size is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceSize {
    Unbounded,
    Bytes(u64),
}

impl std::str::FromStr for WorkspaceSize {
    type Err = String;

    fn from_str(given: &str) -> Result<WorkspaceSize, String> {
        let text = given.trim();
        if text == "unbounded" {
            return Ok(WorkspaceSize::Unbounded);
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let multiplier: u64 = match unit {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            _ => {
                return Err(format!(
                    "workspace size {given:?}: use bytes, Ki, Mi, Gi, Ti (or k, M, G, T), or `unbounded`"
                ))
            }
        };
        let count: u64 = digits
            .parse()
            .map_err(|_| format!("workspace size {given:?}: no number before the unit"))?;
        let bytes = count
            .checked_mul(multiplier)
            .ok_or_else(|| format!("workspace size {given:?} is too large"))?;
        if bytes < MIN_BYTES {
            return Err(format!(
                "workspace size {given:?} is below the least, 16Mi (or `unbounded`)"
            ));
        }
        Ok(WorkspaceSize::Bytes(bytes))
    }
}

/// The workspaces of one supervisor: their root and size.
#[derive(Clone)]
pub struct Workspaces {
    root: PathBuf,
    bytes: u64,
    /// One format, mount or removal at a time in this process: two
    /// mounts of one file would be two filesystems on one disk.
    busy: Arc<Mutex<()>>,
}

impl Workspaces {
    /// Workspaces of `bytes` each under `root` (an absolute path as the
    /// engine's host sees it).
    pub fn new(root: &Path, bytes: u64) -> Workspaces {
        Workspaces {
            root: root.to_path_buf(),
            bytes,
            busy: Arc::new(Mutex::new(())),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The backing file of `volume`.
    pub fn image(&self, volume: &str) -> PathBuf {
        self.root.join(volume).join("disk.img")
    }

    /// Where `volume`'s filesystem is mounted: the bind source of its volume.
    pub fn mount_point(&self, volume: &str) -> PathBuf {
        self.root.join(volume).join("mnt")
    }

    /// Formats `volume`'s filesystem if it has none yet and mounts it if it
    /// is not mounted; its mount point.
    pub async fn ensure(&self, volume: &str) -> Result<PathBuf, String> {
        let _one = self.busy.lock().await;
        let (image, mount) = (self.image(volume), self.mount_point(volume));
        if is_mounted(&mount).await? {
            return Ok(mount);
        }
        let dir = self.root.join(volume);
        tokio::fs::create_dir_all(&mount)
            .await
            .map_err(|e| format!("creating {}: {e}", mount.display()))?;
        restrict(&dir).await?;
        restrict(&mount).await?;
        let fresh = !tokio::fs::try_exists(&image)
            .await
            .map_err(|e| format!("{}: {e}", image.display()))?;
        if fresh {
            self.format(&image).await?;
        }
        run(host::command("mount")
            .arg("-o")
            .arg("loop,nosuid,nodev")
            .arg(&image)
            .arg(&mount))
        .await?;
        if fresh {
            // The runner's alone, and without ext4's lost+found in sight of tools.
            let _ = tokio::fs::remove_dir(mount.join("lost+found")).await;
            restrict(&mount).await?;
        }
        Ok(mount)
    }

    /// A sparse file of the size, formatted, then renamed into place, so a
    /// half-made one is never mounted.
    async fn format(&self, image: &Path) -> Result<(), String> {
        let partial = image.with_extension("img.partial");
        let file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| format!("creating {}: {e}", partial.display()))?;
        file.set_len(self.bytes)
            .await
            .map_err(|e| format!("sizing {}: {e}", partial.display()))?;
        drop(file);
        run(host::command("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-E"])
            .arg(format!("root_owner={OWNER}"))
            .arg(&partial))
        .await?;
        tokio::fs::rename(&partial, image)
            .await
            .map_err(|e| format!("renaming {}: {e}", partial.display()))
    }

    /// Unmounts `volume`'s filesystem (releasing its loop device) and
    /// deletes it. Nothing there is not an error.
    pub async fn remove(&self, volume: &str) -> Result<(), String> {
        let _one = self.busy.lock().await;
        let mount = self.mount_point(volume);
        if is_mounted(&mount).await? {
            run(host::command("umount").arg(&mount)).await?;
        }
        match tokio::fs::remove_dir_all(self.root.join(volume)).await {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(format!(
                "removing {}: {err}",
                self.root.join(volume).display()
            )),
        }
    }
}

/// Root's only: what lies under it before a mount is no one else's to use.
async fn restrict(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .await
        .map_err(|e| format!("chmod {}: {e}", dir.display()))
}

/// Whether `path` is a mount point, from this process's mount table.
async fn is_mounted(path: &Path) -> Result<bool, String> {
    let table = tokio::fs::read_to_string("/proc/self/mountinfo")
        .await
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    Ok(mounted_in(&table, path))
}

/// Whether `table` (mountinfo's format) has a mount at `path`.
fn mounted_in(table: &str, path: &Path) -> bool {
    table.lines().any(|line| {
        line.split(' ')
            .nth(4)
            .is_some_and(|at| unescape(at) == path.as_os_str().to_string_lossy())
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

async fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{:?}", command.as_std());
    let out = command
        .output()
        .await
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{shown} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_the_chart_writes_them_and_the_least_is_enforced() {
        let parse = |s: &str| s.parse::<WorkspaceSize>();
        assert_eq!(parse("1Gi"), Ok(WorkspaceSize::Bytes(1 << 30)));
        assert_eq!(parse("512Mi"), Ok(WorkspaceSize::Bytes(512 << 20)));
        assert_eq!(parse("2G"), Ok(WorkspaceSize::Bytes(2_000_000_000)));
        assert_eq!(parse("16Mi"), Ok(WorkspaceSize::Bytes(MIN_BYTES)));
        assert_eq!(parse("16777216"), Ok(WorkspaceSize::Bytes(MIN_BYTES)));
        assert_eq!(parse("unbounded"), Ok(WorkspaceSize::Unbounded));
        let below = parse("16777215").unwrap_err();
        assert!(below.contains("below the least"), "{below}");
        for bad in ["", "Gi", "1.5Gi", "1gb", "-1Gi", "99999999999999999999Ti"] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn a_mount_point_is_found_in_the_mount_table_with_its_escapes() {
        let table = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop0 rw\n\
                     37 35 98:0 / /srv/ws/mnt rw - ext4 /dev/loop1 rw\n";
        assert!(mounted_in(table, Path::new("/mnt/a b")));
        assert!(mounted_in(table, Path::new("/srv/ws/mnt")));
        assert!(!mounted_in(table, Path::new("/srv/ws")));
        assert!(!mounted_in(table, Path::new("/srv/ws/mnt/x")));
    }
}
