//! What the soak samples: each process's resident set from `/proc`, the hot
//! tables' sizes from PostgreSQL, and the lease cycle's latency in the
//! probe Environment.

use super::probe;
use super::soak_judge::{Sample, TableSize};
use super::system::System;
use std::collections::BTreeMap;
use std::time::Instant;

/// The tables every lease cycle, heartbeat, poll and Session event writes.
pub const HOT_TABLES: [&str; 6] = [
    "work",
    "worker_sightings",
    "sessions",
    "session_events",
    "session_tool_calls",
    "outbox",
];

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssShmem`, …).
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The parent pid in a `/proc/<pid>/stat` line (its command may hold
/// spaces and parentheses: the fields after the last `)` are read).
pub fn parent_pid(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// PostgreSQL's memory from its processes' `/proc/<pid>/status`: each one's
/// anonymous memory summed, and the pages they share (the shared buffers,
/// `RssShmem`; the executable and libraries, `RssFile`) once each, as the
/// most any one process has touched: every backend's VmRSS counts the same
/// shared pages again.
pub fn postgres_kib(statuses: &[String]) -> u64 {
    let field = |f: &'static str| statuses.iter().map(move |s| status_kib(s, f).unwrap_or(0));
    field("RssAnon").sum::<u64>()
        + field("RssFile").max().unwrap_or(0)
        + field("RssShmem").max().unwrap_or(0)
}

fn status_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// The postmaster of the backend serving this connection, and its children.
async fn postgres_statuses(system: &System) -> Option<Vec<String>> {
    let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&system.db)
        .await
        .ok()?;
    let postmaster = parent_pid(&std::fs::read_to_string(format!("/proc/{backend}/stat")).ok()?)?;
    let mut out = vec![status_of(postmaster)?];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if parent_pid(&stat) == Some(postmaster) {
            out.extend(status_of(pid));
        }
    }
    Some(out)
}

/// The resident set (KiB) of both api processes, both supervisors and
/// PostgreSQL; a process down at the moment (a fault) is left out.
async fn resident_sets(system: &System) -> BTreeMap<String, u64> {
    let mut pids: Vec<(String, i32)> = Vec::new();
    for api in &system.apis {
        let api = api.lock().unwrap();
        if let Some(pid) = api.proc.as_ref().and_then(|p| p.pid()) {
            pids.push((api.name.clone(), pid));
        }
    }
    for (_, proc) in system.workers.lock().unwrap().iter() {
        if let Some(pid) = proc.pid() {
            pids.push((proc.name.clone(), pid));
        }
    }
    let mut out: BTreeMap<String, u64> = pids
        .into_iter()
        .filter_map(|(name, pid)| Some((name, status_kib(&status_of(pid)?, "VmRSS")?)))
        .collect();
    if let Some(statuses) = postgres_statuses(system).await {
        out.insert("postgres".into(), postgres_kib(&statuses));
    }
    out
}

async fn table_sizes(system: &System) -> BTreeMap<String, TableSize> {
    let mut out = BTreeMap::new();
    for table in HOT_TABLES {
        let size: Result<(i64, i64, i64), _> = sqlx::query_as(
            "SELECT pg_total_relation_size(relid), pg_indexes_size(relid), n_dead_tup
             FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(table)
        .fetch_one(&system.db)
        .await;
        // `table` is one of HOT_TABLES, never input.
        let rows: Result<(i64,), _> = sqlx::query_as(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&system.db)
            .await;
        // The database restarting under the sample: this table is missing from it.
        if let (Ok((total, index, dead)), Ok((live,))) = (size, rows) {
            out.insert(
                table.to_string(),
                TableSize {
                    total_bytes: total,
                    index_bytes: index,
                    live_rows: live,
                    dead_rows: dead,
                },
            );
        }
    }
    out
}

/// One sample, `at` seconds into the soak.
pub async fn sample(system: &System, at: f64) -> Sample {
    Sample {
        at,
        rss_kib: resident_sets(system).await,
        tables: table_sizes(system).await,
    }
}

/// One lease cycle in the probe Environment, timed from the Poll to the
/// Result's answer (Poll, Ack, first heartbeat, Result); its milliseconds.
pub async fn lease_cycle(system: &System) -> anyhow::Result<f64> {
    probe::create(system).await?;
    let started = Instant::now();
    let held = probe::claim(system).await?;
    let end = probe::result(system, &held).await?;
    anyhow::ensure!(
        end.status < 300,
        "the Result of {}: {} {}",
        held.work_id,
        end.status,
        end.body
    );
    Ok(crate::measure::ms(started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tpostgres\nVmPeak:\t  300000 kB\nVmRSS:\t   24680 kB\n\
        RssAnon:\t    4000 kB\nRssFile:\t    6000 kB\nRssShmem:\t   14680 kB\n";

    #[test]
    fn a_status_field_is_read_by_its_exact_name() {
        assert_eq!(status_kib(STATUS, "VmRSS"), Some(24680));
        assert_eq!(status_kib(STATUS, "RssShmem"), Some(14680));
        assert_eq!(status_kib(STATUS, "Vm"), None);
        assert_eq!(status_kib("VmRSS:\tlots kB\n", "VmRSS"), None);
    }

    #[test]
    fn the_parent_is_read_after_a_command_with_spaces_and_parentheses() {
        assert_eq!(
            parent_pid("4242 (postgres: a (b) c) S 17 4242 4242 0"),
            Some(17)
        );
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn postgres_counts_its_shared_buffers_once() {
        let other = STATUS.replace("14680", "9000").replace("6000", "7000");
        // 2 × 4000 anonymous, the larger file-backed 7000 and shared 14680 once.
        assert_eq!(postgres_kib(&[STATUS.to_string(), other]), 29680);
    }
}
