//! Whether a Session's Memory Stores fit their mount, decided before
//! anything is downloaded (issues 25 and 27): a store that cannot fit must
//! fail the Session's start loudly, not land in part. Each store's
//! footprint is measured from a listing of its memories' sizes (every file
//! rounded up to the filesystem's blocks, the marker's block, and a block
//! per directory where directories take blocks; tmpfs's take none) and the
//! stores on one filesystem are summed against `statvfs`: more than the
//! filesystem holds in all can never fit (permanent); more than is free
//! now may fit another time (transient).

use super::sync::{marker_for, mirrorable};
use mango_client::{Client, ClientError};
use mango_protocol::memory::{MemoryListItem, MemoryView};
use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `statfs`'s `f_type` of tmpfs, whose directories take no blocks.
const TMPFS_MAGIC: u64 = 0x0102_1994;
/// Pages of a sizes-only listing.
const SIZES_PAGE: u32 = 100;

/// What a store's files will take: the size of every memory to be written,
/// and the directories holding them (the root included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    pub sizes: Vec<u64>,
    pub dirs: usize,
}

impl Footprint {
    /// The footprint of a store with memories at `paths` (relative, with
    /// their sizes) and its marker for store `id`.
    pub fn of<'a>(id: &str, paths: impl IntoIterator<Item = (&'a str, u64)>) -> Footprint {
        let mut sizes = vec![marker_for(id).len() as u64];
        let mut dirs = BTreeSet::from([String::new()]);
        for (rel, size) in paths {
            sizes.push(size);
            let mut at = rel;
            while let Some((parent, _)) = at.rsplit_once('/') {
                if !dirs.insert(parent.to_string()) {
                    break;
                }
                at = parent;
            }
        }
        Footprint {
            sizes,
            dirs: dirs.len(),
        }
    }

    /// The content bytes it holds (the marker's included).
    pub fn bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// Blocks of `block` bytes it takes on a filesystem whose directories
    /// take a block each (`dirs_take_blocks`) or none.
    pub fn blocks(&self, block: u64, dirs_take_blocks: bool) -> u64 {
        let block = block.max(1);
        let files: u64 = self.sizes.iter().map(|s| s.div_ceil(block)).sum();
        files
            + if dirs_take_blocks {
                self.dirs as u64
            } else {
                0
            }
    }
}

/// A filesystem as `statvfs` and `statfs` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// `st_dev` of the directory measured: stores on one device share it.
    pub device: u64,
    pub block: u64,
    pub total_blocks: u64,
    pub available_blocks: u64,
    pub dirs_take_blocks: bool,
}

/// The space of the filesystem `path` will be made on: that of its nearest
/// ancestor that exists.
pub fn space_for(path: &Path) -> io::Result<(PathBuf, Space)> {
    let mut at = path;
    loop {
        match std::fs::metadata(at) {
            Ok(meta) => {
                let vfs = rustix::fs::statvfs(at)?;
                let fs = rustix::fs::statfs(at)?;
                let space = Space {
                    device: meta.dev(),
                    block: vfs.f_frsize.max(1),
                    total_blocks: vfs.f_blocks,
                    available_blocks: vfs.f_bavail,
                    dirs_take_blocks: fs.f_type as u64 != TMPFS_MAGIC,
                };
                return Ok((at.to_path_buf(), space));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match at.parent() {
                Some(parent) => at = parent,
                None => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
}

/// How stores needing `need_blocks` go with `space`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    Fits,
    /// More than the filesystem holds: never, here.
    Never,
    /// More than is free now.
    NotNow,
}

pub fn fit(need_blocks: u64, space: &Space) -> Fit {
    // A filesystem that reports no size (ramfs, some FUSE ones) has no
    // limit statvfs can tell: the download finds out.
    if space.total_blocks == 0 {
        return Fit::Fits;
    }
    if need_blocks > space.total_blocks {
        Fit::Never
    } else if need_blocks > space.available_blocks {
        Fit::NotNow
    } else {
        Fit::Fits
    }
}

/// The footprint of store `id` as its memories are now (`view=basic`: sizes, no content).
pub async fn measure(client: &Client, id: &str) -> Result<Footprint, ClientError> {
    let mut paths: Vec<(String, u64)> = Vec::new();
    let mut page: Option<String> = None;
    loop {
        let listed = client
            .list_memories(id, MemoryView::Basic, SIZES_PAGE, page.as_deref())
            .await?;
        for item in listed.data {
            if let MemoryListItem::Memory(m) = item {
                let rel = m.path.trim_start_matches('/').to_string();
                if mirrorable(&rel) {
                    paths.push((rel, m.content_size_bytes.max(0) as u64));
                }
            }
        }
        match listed.next_page {
            Some(next) if !next.is_empty() => page = Some(next),
            _ => break,
        }
    }
    Ok(Footprint::of(
        id,
        paths.iter().map(|(rel, size)| (rel.as_str(), *size)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footprint_rounds_every_file_up_and_counts_each_directory_once() {
        let f = Footprint::of(
            "memstore_1",
            [
                ("a.md", 1),
                ("notes/b.md", 4096),
                ("notes/deep/c.md", 4097),
                ("empty.md", 0),
            ],
        );
        // The marker ("version 1\nmemstore_1"), then the memories.
        assert_eq!(f.sizes, [20, 1, 4096, 4097, 0]);
        // The root, notes/ and notes/deep/.
        assert_eq!(f.dirs, 3);
        assert_eq!(f.bytes(), 8214);
        assert_eq!(f.blocks(4096, false), 1 + 1 + 1 + 2);
        assert_eq!(f.blocks(4096, true), 5 + 3);
        assert_eq!(f.blocks(1024, false), 1 + 1 + 4 + 5);
    }

    #[test]
    fn a_store_fits_up_to_the_last_free_block() {
        let space = Space {
            device: 1,
            block: 4096,
            total_blocks: 256,
            available_blocks: 200,
            dirs_take_blocks: false,
        };
        assert_eq!(fit(200, &space), Fit::Fits);
        assert_eq!(fit(201, &space), Fit::NotNow);
        assert_eq!(fit(256, &space), Fit::NotNow);
        assert_eq!(fit(257, &space), Fit::Never);
        let unsized_fs = Space {
            total_blocks: 0,
            available_blocks: 0,
            ..space
        };
        assert_eq!(fit(1_000_000, &unsized_fs), Fit::Fits);
    }

    #[test]
    fn the_space_of_a_path_not_made_yet_is_its_nearest_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let (at, space) = space_for(&dir.path().join("mnt/memory/notes")).unwrap();
        assert_eq!(at, dir.path());
        assert!(space.total_blocks > 0 && space.block > 0, "{space:?}");
        assert!(space.available_blocks <= space.total_blocks);
    }
}
