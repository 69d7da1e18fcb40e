//! Watches as the watch cache serves them (apiserver/pkg/storage/cacher):
//! a chunked stream of newline-delimited `{"type", "object"}` events;
//! from no resourceVersion or "0", synthetic ADDED events for what exists
//! first; from a resourceVersion older than the kept history, one ERROR
//! event with a 410 Expired Status; a selector that stops (or starts)
//! matching turns a change into DELETED (or ADDED); BOOKMARKs when asked;
//! the stream ends after `timeoutSeconds`. `sendInitialEvents` (the
//! streaming list) ends its initial events with an annotated BOOKMARK.

use super::errors::ApiError;
use super::http::selectors;
use super::resources::ResourceType;
use super::selector::{FieldSelector, Selector};
use super::store::{self, Change, Record};
use super::Shared;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// A real server picks 30–60 minutes when the client names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

struct Filter {
    table: store::Table,
    namespace: Option<String>,
    labels: Selector,
    fields: FieldSelector,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event a watcher sees for one change, if any.
    fn event(&self, record: &Record) -> Option<(&'static str, Value)> {
        if record.table != self.table
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != record.namespace)
        {
            return None;
        }
        let now = self.selects(&record.object);
        let before = record.previous.as_ref().is_some_and(|p| self.selects(p));
        match record.change {
            Change::Added if now => Some(("ADDED", record.object.clone())),
            Change::Modified if now && before => Some(("MODIFIED", record.object.clone())),
            Change::Modified if now => Some(("ADDED", record.object.clone())),
            Change::Modified if before => Some(("DELETED", record.object.clone())),
            Change::Deleted if now => Some(("DELETED", record.object.clone())),
            _ => None,
        }
    }
}

fn line(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

pub async fn serve(
    shared: Shared,
    rt: ResourceType,
    namespace: Option<String>,
    query: HashMap<String, String>,
) -> Response {
    let (labels, fields) = match selectors(&rt, &query) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let initial_events = query.get("sendInitialEvents").is_some_and(|v| v == "true");
    if initial_events
        && (query.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
            || !bookmarks)
    {
        return ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[super::errors::FieldError::forbidden(
                "sendInitialEvents",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan and allowWatchBookmarks to true",
            )],
        )
        .into_response();
    }
    let asked = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty())
        .cloned();
    let from: Option<u64> = match asked.as_deref() {
        None | Some("0") => None,
        Some(v) => match v.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                return ApiError::bad_request(format!("invalid resource version: {v}"))
                    .into_response()
            }
        },
    };
    let (cap, bookmark_every) = {
        let state = shared.lock();
        (state.options.watch_cap, state.options.bookmark_every)
    };
    let mut timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    if let Some(cap) = cap {
        timeout = timeout.min(cap);
    }
    let filter = Filter {
        table: store::table(&rt),
        namespace,
        labels,
        fields,
    };
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(stream(
        shared,
        rt,
        filter,
        from,
        initial_events || from.is_none(),
        initial_events,
        bookmarks,
        bookmark_every,
        timeout,
        tx,
    ));
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), rx))
    }));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

#[allow(clippy::too_many_arguments)]
async fn stream(
    shared: Shared,
    rt: ResourceType,
    filter: Filter,
    from: Option<u64>,
    synthetic: bool,
    initial_end_marker: bool,
    bookmarks: bool,
    bookmark_every: Duration,
    timeout: Duration,
    tx: mpsc::Sender<String>,
) {
    let mut revision_rx = shared.revision.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    let bookmark = |revision: u64, annotations: Option<Value>| {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if let Some(a) = annotations {
            metadata["annotations"] = a;
        }
        line(
            "BOOKMARK",
            &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}),
        )
    };
    // Where the stream starts: (its revision, the synthetic events), or
    // the Status of a start that is too old.
    let start: Result<(u64, Vec<String>), Value> = {
        let state = shared.lock();
        match from {
            Some(n) if state.store.since(n).is_none() => Err(ApiError::expired(format!(
                "too old resource version: {n} ({})",
                state.store.compacted()
            ))
            .status()),
            Some(n) => Ok((n, Vec::new())),
            None => {
                let lines = if synthetic {
                    state
                        .store
                        .list(filter.table, filter.namespace.as_deref())
                        .iter()
                        .filter(|o| filter.selects(o))
                        .map(|o| line("ADDED", o))
                        .collect()
                } else {
                    Vec::new()
                };
                Ok((state.store.revision(), lines))
            }
        }
    };
    let mut at = match start {
        Err(status) => {
            let _ = tx.send(line("ERROR", &status)).await;
            return;
        }
        Ok((at, lines)) => {
            for l in lines {
                if tx.send(l).await.is_err() {
                    return;
                }
            }
            at
        }
    };
    if initial_end_marker {
        let marker = bookmark(at, Some(json!({"k8s.io/initial-events-end": "true"})));
        if tx.send(marker).await.is_err() {
            return;
        }
    }
    let mut next_bookmark = tokio::time::Instant::now() + bookmark_every;
    loop {
        let (records, latest) = {
            let state = shared.lock();
            (state.store.since(at), state.store.revision())
        };
        let Some(records) = records else {
            let status = ApiError::expired(format!("too old resource version: {at}")).status();
            let _ = tx.send(line("ERROR", &status)).await;
            return;
        };
        for record in &records {
            if let Some((kind, object)) = filter.event(record) {
                if tx.send(line(kind, &object)).await.is_err() {
                    return;
                }
            }
        }
        at = latest.max(at);
        tokio::select! {
            _ = revision_rx.changed() => {}
            _ = tokio::time::sleep_until(next_bookmark), if bookmarks => {
                if tx.send(bookmark(at, None)).await.is_err() {
                    return;
                }
                next_bookmark = tokio::time::Instant::now() + bookmark_every;
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tx.closed() => return,
        }
    }
}
