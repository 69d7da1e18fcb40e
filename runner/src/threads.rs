//! The runner's threads, all made at start. A tool may fill the sandbox's
//! pids limit (a fork bomb, background jobs by the hundred), and then no
//! thread or process can be made in it until they end. The runner's
//! blocking steps (the file tools, reqwest's DNS lookups of the api's
//! host, Skills and Memory Store disk work, reading the secret) run on
//! tokio's blocking pool, which makes threads on demand, lets them go after
//! 10 s idle, and panics when it needs one and the OS refuses it. So the
//! runner makes every thread of that pool before it reads the secret and
//! keeps them for its life: a later step waits for a free thread, never
//! for a new one, and the item still answers its calls, heartbeats and
//! stops however many processes a tool left behind.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The blocking pool's threads: a file tool, lookups for the requests that
/// may run beside it (a heartbeat, a result, the stream), and one spare
/// for a step abandoned at its deadline that is still finishing.
pub const BLOCKING_THREADS: usize = 4;
/// Making the threads takes milliseconds; a sandbox that cannot in this
/// long cannot run the item.
const START_BOUND: Duration = Duration::from_secs(5);

/// The runtime the item runs on, with its blocking threads made and kept.
/// An error, not a panic, where the OS refuses them.
pub fn runtime() -> io::Result<Runtime> {
    // Tokio panics when it can make not even a first thread: ask the OS first.
    std::thread::Builder::new()
        .name("mango-probe".into())
        .spawn(|| {})?
        .join()
        .map_err(|_| io::Error::other("a probe thread panicked"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("mango-blocking")
        .max_blocking_threads(BLOCKING_THREADS)
        // Never idle out: one let go could not be made again.
        .thread_keep_alive(Duration::MAX)
        .build()?;
    start_blocking_threads(&runtime)?;
    Ok(runtime)
}

/// Makes every thread of the blocking pool now: as many tasks as threads,
/// each held until all have started, so each takes a thread of its own.
fn start_blocking_threads(runtime: &Runtime) -> io::Result<()> {
    let started = Arc::new((Mutex::new(0usize), Condvar::new()));
    let deadline = Instant::now() + START_BOUND;
    let tasks: Vec<_> = (0..BLOCKING_THREADS)
        .map(|_| {
            let started = started.clone();
            runtime.spawn_blocking(move || {
                let (count, all) = &*started;
                let mut count = count.lock().unwrap_or_else(|e| e.into_inner());
                *count += 1;
                all.notify_all();
                // A task the OS gave no thread runs later on one of the
                // others, which gave up waiting for it at the deadline.
                while *count < BLOCKING_THREADS {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    count = all
                        .wait_timeout(count, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                std::thread::current().id()
            })
        })
        .collect();
    let threads: HashSet<ThreadId> = runtime.block_on(async {
        let mut threads = HashSet::new();
        for task in tasks {
            threads.insert(task.await.map_err(io::Error::other)?);
        }
        Ok::<_, io::Error>(threads)
    })?;
    if threads.len() < BLOCKING_THREADS {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "only {} of {BLOCKING_THREADS} threads could be made (the sandbox's process limit?)",
                threads.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every thread is made at start, and more blocking work than threads
    /// waits for them rather than making more.
    #[test]
    fn the_pool_is_made_at_start_and_never_grows() {
        let runtime = runtime().unwrap();
        let threads: HashSet<ThreadId> = runtime.block_on(async {
            let tasks: Vec<_> = (0..4 * BLOCKING_THREADS)
                .map(|_| {
                    tokio::task::spawn_blocking(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        std::thread::current().id()
                    })
                })
                .collect();
            let mut threads = HashSet::new();
            for task in tasks {
                threads.insert(task.await.unwrap());
            }
            threads
        });
        assert_eq!(threads.len(), BLOCKING_THREADS);
    }
}
