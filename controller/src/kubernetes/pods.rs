//! What the launcher knows of its pool's Pods: one watch of them all (not
//! one per Pod), kept as a map by name, with a version that changes on
//! every event so waiters wake up and look again.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Clone)]
pub struct PodStore {
    inner: Arc<Inner>,
}

struct Inner {
    pods: Mutex<HashMap<String, Arc<Pod>>>,
    /// Pods of a listing in progress, swapped in at its end.
    listing: Mutex<Option<HashMap<String, Arc<Pod>>>>,
    version: watch::Sender<u64>,
}

/// Feeds a [`PodStore`]: the watcher task in production, a test by hand.
#[derive(Clone)]
pub struct PodFeed {
    inner: Arc<Inner>,
}

impl PodStore {
    /// A store and the feed that fills it.
    pub fn new() -> (PodStore, PodFeed) {
        let inner = Arc::new(Inner {
            pods: Mutex::default(),
            listing: Mutex::default(),
            version: watch::channel(0).0,
        });
        (
            PodStore {
                inner: inner.clone(),
            },
            PodFeed { inner },
        )
    }

    /// A store fed by a watch of the Pods `selector` selects; the task runs
    /// (re-listing after errors, with back-off) until aborted.
    pub fn watching(pods: Api<Pod>, selector: &str) -> (PodStore, tokio::task::JoinHandle<()>) {
        let (store, feed) = PodStore::new();
        let config = watcher::Config::default().labels(selector);
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(pods, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => feed.apply(event),
                    Err(err) => {
                        tracing::warn!(error = %err, "watching sandbox Pods failed; retrying")
                    }
                }
            }
        });
        (store, task)
    }

    pub fn get(&self, name: &str) -> Option<Arc<Pod>> {
        self.inner
            .pods
            .lock()
            .expect("pods lock")
            .get(name)
            .cloned()
    }

    /// Waits until `decide` answers for Pod `name` (`None`: no such Pod
    /// now), looking again after every change.
    pub async fn until<T>(
        &self,
        name: &str,
        mut decide: impl FnMut(Option<&Pod>) -> Option<T>,
    ) -> T {
        let mut version = self.inner.version.subscribe();
        loop {
            let pod = self.get(name);
            if let Some(answer) = decide(pod.as_deref()) {
                return answer;
            }
            if version.changed().await.is_err() {
                // No feed any more: nothing will change.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl PodFeed {
    pub fn apply(&self, event: Event<Pod>) {
        match event {
            Event::Apply(pod) => {
                self.inner
                    .pods
                    .lock()
                    .expect("pods lock")
                    .insert(pod.name_any(), Arc::new(pod));
            }
            Event::Delete(pod) => {
                self.inner
                    .pods
                    .lock()
                    .expect("pods lock")
                    .remove(&pod.name_any());
            }
            Event::Init => {
                *self.inner.listing.lock().expect("listing lock") = Some(HashMap::new());
                return;
            }
            Event::InitApply(pod) => {
                if let Some(listing) = self.inner.listing.lock().expect("listing lock").as_mut() {
                    listing.insert(pod.name_any(), Arc::new(pod));
                }
                return;
            }
            Event::InitDone => {
                let listed = self.inner.listing.lock().expect("listing lock").take();
                if let Some(listed) = listed {
                    *self.inner.pods.lock().expect("pods lock") = listed;
                }
            }
        }
        self.inner.version.send_modify(|v| *v += 1);
    }
}
