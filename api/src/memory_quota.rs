//! Memory Store quotas, pure (no I/O; docs/memory.md, "Quotas"): what a
//! store may hold (its live memories' content and their count), how much
//! history it keeps (versions that are no memory's current one, by count
//! and by content), and how fast one sessions token may write (a GCRA
//! allowance: writes per minute with a burst).

use crate::error::{ApiError, ApiResult};
use mango_protocol::ErrorCode;
use serde_json::json;

/// A store's content, at most: with [`DEFAULT_STORE_MAX_MEMORIES`] it fits
/// the sandboxes' 64 MiB mount at `/mnt/memory` (see the test below).
pub const DEFAULT_STORE_MAX_BYTES: i64 = 40 * 1024 * 1024;
/// A store's memories, at most.
pub const DEFAULT_STORE_MAX_MEMORIES: i64 = 4_000;
/// Content a store's history (its versions that are no memory's current
/// one) keeps before its oldest versions are pruned.
pub const DEFAULT_HISTORY_MAX_BYTES: i64 = 64 * 1024 * 1024;
/// Versions a store's history keeps before its oldest are pruned.
pub const DEFAULT_HISTORY_MAX_VERSIONS: i64 = 10_000;
/// Memory writes a sessions token makes per minute, sustained.
pub const DEFAULT_WRITES_PER_MINUTE: u32 = 600;
/// Memory writes a sessions token may make at once before the rate applies.
pub const DEFAULT_WRITE_BURST: u32 = 1_000;

/// The limits of every Memory Store (`mango serve --memory-store-max-bytes`
/// and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    pub store_max_bytes: i64,
    pub store_max_memories: i64,
    pub history_max_bytes: i64,
    pub history_max_versions: i64,
    pub writes_per_minute: u32,
    pub write_burst: u32,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        MemoryLimits {
            store_max_bytes: DEFAULT_STORE_MAX_BYTES,
            store_max_memories: DEFAULT_STORE_MAX_MEMORIES,
            history_max_bytes: DEFAULT_HISTORY_MAX_BYTES,
            history_max_versions: DEFAULT_HISTORY_MAX_VERSIONS,
            writes_per_minute: DEFAULT_WRITES_PER_MINUTE,
            write_burst: DEFAULT_WRITE_BURST,
        }
    }
}

/// What a store holds, as its row counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory_count: i64,
    pub content_bytes: i64,
    pub version_count: i64,
    pub version_bytes: i64,
}

impl Usage {
    /// After creating a memory of `size` bytes (and its version).
    pub fn created(self, size: i64) -> Usage {
        Usage {
            memory_count: self.memory_count + 1,
            content_bytes: self.content_bytes + size,
            version_count: self.version_count + 1,
            version_bytes: self.version_bytes + size,
        }
    }

    /// After a memory of `old` bytes got new content (or a new path) of `new` bytes.
    pub fn modified(self, old: i64, new: i64) -> Usage {
        Usage {
            content_bytes: self.content_bytes - old + new,
            version_count: self.version_count + 1,
            version_bytes: self.version_bytes + new,
            ..self
        }
    }

    /// After deleting a memory of `size` bytes (its `deleted` version holds no content).
    pub fn deleted(self, size: i64) -> Usage {
        Usage {
            memory_count: self.memory_count - 1,
            content_bytes: self.content_bytes - size,
            version_count: self.version_count + 1,
            ..self
        }
    }

    /// Versions that are no memory's current one.
    pub fn history_versions(&self) -> i64 {
        self.version_count - self.memory_count
    }

    /// The content those versions hold (a current version holds exactly its
    /// memory's content, and cannot be redacted).
    pub fn history_bytes(&self) -> i64 {
        self.version_bytes - self.content_bytes
    }
}

/// Refuses a write that takes store `store_id` from `before` to `after` past
/// a limit (413 `memory_store_full`). Only growth is refused: a write that
/// shrinks a store already past a limit (one lowered since) goes through.
pub fn check_quota(
    store_id: &str,
    limits: &MemoryLimits,
    before: Usage,
    after: Usage,
) -> ApiResult<()> {
    let full = |quota: &str, what: &str, limit: i64, current: i64, requested: i64| {
        ApiError::too_large(format!(
            "memory store {store_id} holds {current} {what} of the {limit} it may; this write would make it {requested}, so nothing was written (delete or shorten memories to make room)"
        ))
        .code(ErrorCode::MemoryStoreFull)
        .detail("quota", json!(quota))
        .detail("limit", json!(limit))
        .detail("current", json!(current))
        .detail("requested", json!(requested))
        .final_answer()
    };
    if after.memory_count > before.memory_count && after.memory_count > limits.store_max_memories {
        return Err(full(
            "memory_count",
            "memories",
            limits.store_max_memories,
            before.memory_count,
            after.memory_count,
        ));
    }
    if after.content_bytes > before.content_bytes && after.content_bytes > limits.store_max_bytes {
        return Err(full(
            "content_size_bytes",
            "bytes of content",
            limits.store_max_bytes,
            before.content_bytes,
            after.content_bytes,
        ));
    }
    Ok(())
}

/// How far a store's history is past its bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Excess {
    pub versions: i64,
    pub bytes: i64,
}

impl Excess {
    pub fn any(&self) -> bool {
        self.versions > 0 || self.bytes > 0
    }
}

pub fn history_excess(limits: &MemoryLimits, usage: &Usage) -> Excess {
    Excess {
        versions: (usage.history_versions() - limits.history_max_versions).max(0),
        bytes: (usage.history_bytes() - limits.history_max_bytes).max(0),
    }
}

/// Of history versions oldest first (their content bytes), how many to
/// prune so that `excess` is freed: the fewest oldest ones, or all of them
/// when they cannot free it.
pub fn prune_count(oldest_first: &[i64], excess: Excess) -> usize {
    let (mut versions, mut bytes) = (0i64, 0i64);
    for (n, size) in oldest_first.iter().enumerate() {
        if versions >= excess.versions && bytes >= excess.bytes {
            return n;
        }
        versions += 1;
        bytes += size;
    }
    oldest_first.len()
}

/// A sessions token's write allowance as GCRA parameters: one write every
/// `interval_us`, and a write admitted while the next one due is at most
/// `tolerance_us` ahead of now (so `burst` writes at once from rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub interval_us: i64,
    pub tolerance_us: i64,
}

impl Allowance {
    pub fn of(limits: &MemoryLimits) -> Allowance {
        let interval_us = 60_000_000 / i64::from(limits.writes_per_minute.max(1));
        Allowance {
            interval_us,
            tolerance_us: interval_us * (i64::from(limits.write_burst.max(1)) - 1),
        }
    }

    /// Whole seconds until a write is admitted again, when the next write
    /// is due `due_in_us` from now (at least 1).
    pub fn retry_after_seconds(&self, due_in_us: i64) -> u64 {
        let wait_us = (due_in_us - self.tolerance_us).max(1);
        (wait_us as u64).div_ceil(1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_store_fits_the_sandboxes_memory_mount() {
        // Docker's tmpfs at /mnt/memory and the Pod's emptyDir there are
        // 64 MiB (controller: `--tmpfs-mib`, `tmpSizeLimit`). On 4 KiB
        // blocks each memory rounds up by less than a block, and the marker
        // takes one.
        const MOUNT: i64 = 64 * 1024 * 1024;
        const BLOCK: i64 = 4096;
        let worst = DEFAULT_STORE_MAX_BYTES + (DEFAULT_STORE_MAX_MEMORIES + 1) * BLOCK;
        assert!(worst <= MOUNT, "{worst} > {MOUNT}");
    }

    fn usage(memory_count: i64, content_bytes: i64) -> Usage {
        Usage {
            memory_count,
            content_bytes,
            version_count: memory_count,
            version_bytes: content_bytes,
        }
    }

    fn limits(max_memories: i64, max_bytes: i64) -> MemoryLimits {
        MemoryLimits {
            store_max_memories: max_memories,
            store_max_bytes: max_bytes,
            ..MemoryLimits::default()
        }
    }

    #[test]
    fn quotas_hold_at_their_edges_and_only_refuse_growth() {
        let l = limits(3, 100);
        let two = usage(2, 60);
        check_quota("s", &l, two, two.created(40)).unwrap();
        let err = check_quota("s", &l, two, two.created(41)).unwrap_err();
        assert_eq!(err.status.as_u16(), 413);
        assert_eq!(err.details["error_code"], "memory_store_full");
        assert_eq!(err.details["quota"], "content_size_bytes");
        assert_eq!(err.details["limit"], 100);
        assert_eq!(err.details["current"], 60);
        assert_eq!(err.details["requested"], 101);
        let three = two.created(0);
        let err = check_quota("s", &l, three, three.created(0)).unwrap_err();
        assert_eq!(err.details["quota"], "memory_count");
        assert_eq!(err.details["requested"], 4);
        // A full store takes edits that do not grow it, and deletions.
        let full = usage(3, 100);
        check_quota("s", &l, full, full.modified(10, 10)).unwrap();
        check_quota("s", &l, full, full.modified(10, 9)).unwrap();
        assert!(check_quota("s", &l, full, full.modified(10, 11)).is_err());
        // Past a lowered limit: shrinking passes, growing does not.
        let over = usage(5, 500);
        check_quota("s", &l, over, over.deleted(10)).unwrap();
        check_quota("s", &l, over, over.modified(100, 50)).unwrap();
        assert!(check_quota("s", &l, over, over.created(0)).is_err());
    }

    #[test]
    fn history_is_what_current_versions_are_not() {
        let u = usage(2, 30).modified(10, 25).deleted(20);
        // Versions: 2 created, 1 modified, 1 deleted; one memory left (25 bytes).
        assert_eq!(u.version_count, 4);
        assert_eq!(u.memory_count, 1);
        assert_eq!(u.history_versions(), 3);
        assert_eq!(u.history_bytes(), 30);
        let l = MemoryLimits {
            history_max_versions: 3,
            history_max_bytes: 30,
            ..MemoryLimits::default()
        };
        assert!(!history_excess(&l, &u).any());
        let more = u.modified(25, 5);
        assert_eq!(
            history_excess(&l, &more),
            Excess {
                versions: 1,
                bytes: 25
            }
        );
    }

    #[test]
    fn pruning_takes_the_fewest_oldest_versions_that_free_the_excess() {
        let sizes = [10, 0, 30, 5];
        let ex = |versions, bytes| Excess { versions, bytes };
        assert_eq!(prune_count(&sizes, ex(0, 0)), 0);
        assert_eq!(prune_count(&sizes, ex(1, 0)), 1);
        assert_eq!(prune_count(&sizes, ex(0, 10)), 1);
        assert_eq!(prune_count(&sizes, ex(0, 11)), 3);
        assert_eq!(prune_count(&sizes, ex(2, 1)), 2);
        assert_eq!(prune_count(&sizes, ex(0, 1_000)), 4);
        assert_eq!(prune_count(&sizes, ex(9, 0)), 4);
    }

    #[test]
    fn the_allowance_admits_a_burst_then_the_rate() {
        let a = Allowance::of(&MemoryLimits {
            writes_per_minute: 60,
            write_burst: 3,
            ..MemoryLimits::default()
        });
        assert_eq!(a.interval_us, 1_000_000);
        assert_eq!(a.tolerance_us, 2_000_000);
        // The next write due 2.5 s ahead: half a second past the tolerance.
        assert_eq!(a.retry_after_seconds(2_500_000), 1);
        assert_eq!(a.retry_after_seconds(4_000_001), 3);
        let one = Allowance::of(&MemoryLimits {
            writes_per_minute: 600,
            write_burst: 1,
            ..MemoryLimits::default()
        });
        assert_eq!(one.tolerance_us, 0);
        assert_eq!(one.retry_after_seconds(100_000), 1);
    }
}
