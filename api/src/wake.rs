//! In-process wake-ups for long polls: the pollers of each Environment wait
//! on its notifier, which the LISTEN connection ([`crate::listener`]) and
//! this process's own commits wake. A wake-up is only a hint: a woken
//! poller always re-queries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

#[derive(Default)]
pub struct WakeHub {
    environments: Mutex<HashMap<String, Arc<Notify>>>,
}

impl WakeHub {
    /// The notifier for one Environment. Create and `enable()` its `notified()`
    /// future before querying, so a wake-up between query and wait is not lost.
    pub fn notifier(&self, environment_id: &str) -> Arc<Notify> {
        let mut map = self.environments.lock().expect("wake hub lock");
        map.entry(environment_id.to_string()).or_default().clone()
    }

    pub fn wake(&self, environment_id: &str) {
        let notify = self
            .environments
            .lock()
            .expect("wake hub lock")
            .get(environment_id)
            .cloned();
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    pub fn wake_all(&self) {
        let all: Vec<_> = self
            .environments
            .lock()
            .expect("wake hub lock")
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}
