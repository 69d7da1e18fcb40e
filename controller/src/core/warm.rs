//! The warm pool's bookkeeping (spec §7.1): the warm sandboxes ready to be
//! bound, oldest first, each held by value so it is handed out once, and
//! how many are being made. The supervisor fills it and takes from it.

use crate::core::launcher::Warm;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

struct Ready {
    warm: Warm,
    /// The task that notices the sandbox dying while it waits.
    watcher: Option<AbortHandle>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Ready>,
    making: usize,
}

pub struct WarmPool {
    target: usize,
    state: Mutex<State>,
    /// Wakes the filler: one was taken, died or was recycled.
    pub wake: Notify,
}

impl WarmPool {
    pub fn new(target: usize) -> WarmPool {
        WarmPool {
            target,
            state: Mutex::default(),
            wake: Notify::new(),
        }
    }

    pub fn target(&self) -> usize {
        self.target
    }

    pub fn ready(&self) -> usize {
        self.state.lock().expect("warm lock").ready.len()
    }

    /// The oldest ready one, now the caller's alone.
    pub fn take(&self) -> Option<Warm> {
        let taken = self.state.lock().expect("warm lock").ready.pop_front();
        taken.map(|ready| {
            if let Some(watcher) = ready.watcher {
                watcher.abort();
            }
            self.wake.notify_one();
            ready.warm
        })
    }

    /// How many more to make now; they count as being made until
    /// [`WarmPool::made`].
    pub fn start_making(&self) -> usize {
        let mut state = self.state.lock().expect("warm lock");
        let missing = self.target.saturating_sub(state.ready.len() + state.making);
        state.making += missing;
        missing
    }

    /// One being made is done (admitted or failed).
    pub fn made(&self) {
        let mut state = self.state.lock().expect("warm lock");
        state.making = state.making.saturating_sub(1);
    }

    /// Adds a ready one unless the pool is full; a refused one is returned
    /// for removal.
    pub fn admit(&self, warm: Warm) -> Result<(), Warm> {
        let mut state = self.state.lock().expect("warm lock");
        if state.ready.len() >= self.target {
            return Err(warm);
        }
        state.ready.push_back(Ready {
            warm,
            watcher: None,
        });
        Ok(())
    }

    /// Records the task watching a ready one; if it is no longer ready the
    /// task is ended at once.
    pub fn watch(&self, handle: &str, watcher: AbortHandle) {
        let mut state = self.state.lock().expect("warm lock");
        match state.ready.iter_mut().find(|r| r.warm.handle == handle) {
            Some(ready) => ready.watcher = Some(watcher),
            None => watcher.abort(),
        }
    }

    /// Takes the ready one `handle` out (it died); `None` when it is not
    /// ready any more (bound meanwhile: no longer the pool's).
    pub fn forget(&self, handle: &str) -> Option<Warm> {
        let mut state = self.state.lock().expect("warm lock");
        let at = state.ready.iter().position(|r| r.warm.handle == handle)?;
        let ready = state.ready.remove(at)?;
        drop(state);
        self.wake.notify_one();
        Some(ready.warm)
    }

    /// Takes out every ready one that `keep` refuses (an old image), or all.
    pub fn drain(&self, keep: impl Fn(&Warm) -> bool) -> Vec<Warm> {
        let mut state = self.state.lock().expect("warm lock");
        let (kept, out): (VecDeque<Ready>, VecDeque<Ready>) =
            state.ready.drain(..).partition(|r| keep(&r.warm));
        state.ready = kept;
        out.into_iter()
            .map(|r| {
                if let Some(watcher) = r.watcher {
                    watcher.abort();
                }
                r.warm
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warm(n: u32) -> Warm {
        Warm {
            name: format!("w{n}"),
            handle: format!("h{n}"),
            image: "img".into(),
        }
    }

    #[test]
    fn oldest_first_and_each_once() {
        let pool = WarmPool::new(2);
        assert_eq!(pool.start_making(), 2);
        assert_eq!(pool.start_making(), 0, "those being made count");
        pool.admit(warm(1)).unwrap();
        pool.made();
        pool.admit(warm(2)).unwrap();
        pool.made();
        assert_eq!(pool.admit(warm(3)), Err(warm(3)), "never past its bound");
        assert_eq!(pool.take(), Some(warm(1)));
        assert_eq!(
            pool.forget("h1"),
            None,
            "a taken one is no longer the pool's"
        );
        assert_eq!(pool.start_making(), 1);
        assert_eq!(pool.take(), Some(warm(2)));
        assert_eq!(pool.take(), None);
    }

    #[test]
    fn a_dead_or_recycled_one_leaves_the_pool() {
        let pool = WarmPool::new(3);
        for n in 1..=3 {
            pool.admit(warm(n)).unwrap();
        }
        assert_eq!(pool.forget("h2"), Some(warm(2)));
        let old = pool.drain(|w| w.handle != "h3");
        assert_eq!(old, vec![warm(3)]);
        assert_eq!(pool.ready(), 1);
        assert_eq!(pool.drain(|_| false), vec![warm(1)]);
        assert_eq!(pool.take(), None);
    }

    #[test]
    fn a_pool_of_zero_makes_none() {
        let pool = WarmPool::new(0);
        assert_eq!(pool.start_making(), 0);
        assert_eq!(pool.admit(warm(1)), Err(warm(1)));
    }
}
