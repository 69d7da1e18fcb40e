//! `pods/attach` as a 1.30+ cluster answers it. The apiserver first
//! checks the Pod and container (pkg/registry/core/pod/strategy.go
//! `streamLocation`: 404 for no Pod, 400 for a container the Pod does not
//! have or a Pod with no node). A v5 WebSocket is then accepted by the
//! stream translator (apiserver/pkg/util/proxy/streamtranslator.go), and
//! whatever the kubelet fails at afterwards (the container not running,
//! its stdin not open, or a failure a test asks for) arrives as a Failure
//! `Status` on the error channel (3); Success arrives there once stdin is
//! closed (`[255, 0]`). A v4 WebSocket is proxied to the kubelet as it is,
//! so its failures are the upgrade's HTTP answer, and closing the
//! WebSocket is its end of stdin.
//!
//! `stdinOnce` is no failure: containerd's CRI attach
//! (internal/cri/io/container_io.go `ContainerIO.Attach`) copies the
//! attach's stdin into the container's, and with `StdinOnce` (and no tty)
//! closes the container's stdin once that copy ends, that is when the
//! first attach detaches. A later attach is accepted as any other; its
//! copy into the closed pipe fails, which containerd only logs, and the
//! kubelet's attach ends as a Success. What it wrote reached nothing
//! ([`Attached::reached`] is false, its `stdin` empty). Without
//! `stdinOnce` the container's stdin stays open, and every attach's bytes
//! reach the one process reading it.

use super::errors::ApiError;
use super::{resources, store, Attached, Shared, V4, V5};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;

/// A kubelet-side failure a test asks the next attach to report.
#[derive(Debug, Clone)]
pub struct AttachFailure {
    pub status: Value,
    /// Whether the container got the stdin before the failure.
    pub delivered: bool,
}

impl AttachFailure {
    /// The Status the translator writes for a SPDY failure (`NewInternalError`).
    pub fn internal(message: &str) -> AttachFailure {
        AttachFailure {
            status: ApiError::internal(message).status(),
            delivered: false,
        }
    }

    /// The kubelet cannot be reached (node gone, TLS refused).
    pub fn kubelet_unreachable() -> AttachFailure {
        AttachFailure::internal(
            "error dialing backend: dial tcp 10.0.0.1:10250: connect: connection refused",
        )
    }

    /// The container went between the Running status and the attach.
    pub fn container_gone(container: &str) -> AttachFailure {
        AttachFailure::internal(&format!(
            "unable to upgrade connection: container not found (\"{container}\")"
        ))
    }
}

fn protocols(parts: &Parts) -> Vec<String> {
    parts
        .headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// What the kubelet would say of attaching to `container` now, if it fails.
fn kubelet_refusal(pod: &Value, container: &str, stdin: bool) -> Option<String> {
    let running = pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["name"] == container && c["state"]["running"].is_object());
    if !running {
        return Some(format!(
            "unable to upgrade connection: container not found (\"{container}\")"
        ));
    }
    let spec = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == container)?;
    if stdin && spec["stdin"] != json!(true) {
        return Some(format!(
            "unable to upgrade connection: stdin is not enabled for container {container}"
        ));
    }
    None
}

pub async fn serve(
    shared: Shared,
    parts: &mut Parts,
    namespace: String,
    name: String,
    query: HashMap<String, String>,
) -> Response {
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let pod = {
        let state = shared.lock();
        state
            .store
            .get(store::table(&resources::PODS), &namespace, &name)
            .cloned()
    };
    let Some(pod) = pod else {
        return ApiError::not_found("", "pods", &name).into_response();
    };
    let containers: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    let container = match query.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(c) => c.clone(),
        Some(c) => {
            return ApiError::bad_request(format!("container {c} is not valid for pod {name}"))
                .into_response()
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            ))
            .into_response()
        }
    };
    if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
        return ApiError::bad_request(format!("pod {name} does not have a host assigned"))
            .into_response();
    }
    let stdin = query.get("stdin").is_some_and(|v| v == "true" || v == "1");
    let offered = protocols(parts);
    let supported = shared.lock().options.attach_protocols.clone();
    let Some(protocol) = supported.iter().find(|p| offered.iter().any(|o| o == *p)) else {
        return ApiError::bad_request(format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {supported:?}"
        ))
        .into_response();
    };
    let key = (namespace.clone(), name.clone(), container.clone());
    let refusal = kubelet_refusal(&pod, &container, stdin);
    // v4 reaches the kubelet itself: its refusal is the upgrade's answer.
    if *protocol == V4 {
        if let Some(why) = refusal.clone() {
            return ApiError::internal(why).into_response();
        }
    }
    let upgrade = match WebSocketUpgrade::from_request_parts(parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(_) => {
            return ApiError::bad_request("Upgrade request required").into_response();
        }
    };
    let protocol = protocol.to_string();
    let stdin_once = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == container.as_str() && c["stdinOnce"] == json!(true));
    upgrade
        .protocols([if protocol == V5 { V5 } else { V4 }])
        .on_upgrade(move |socket| async move {
            let failure = match refusal {
                Some(why) => Some(AttachFailure::internal(&why)),
                None => shared.lock().attach_failures.pop_front(),
            };
            session(
                socket, shared, key, raw_query, protocol, stdin, stdin_once, failure,
            )
            .await
        })
}

#[allow(clippy::too_many_arguments)]
async fn session(
    mut socket: WebSocket,
    shared: Shared,
    key: (String, String, String),
    query: String,
    protocol: String,
    stdin: bool,
    stdin_once: bool,
    failure: Option<AttachFailure>,
) {
    let v5 = protocol == V5;
    // The streams open with one frame naming each channel.
    for channel in [0u8, 1, 2, 3] {
        let _ = socket.send(Message::Binary(vec![channel].into())).await;
    }
    let mut received = Vec::new();
    let mut closed_by_client = false;
    // A failure before the kubelet took the stream comes at once.
    if stdin && failure.as_ref().is_none_or(|f| f.delivered) {
        while let Some(Ok(message)) = socket.recv().await {
            match message {
                Message::Binary(frame) if frame.first() == Some(&0) => {
                    received.extend_from_slice(&frame[1..])
                }
                Message::Binary(frame) if v5 && frame.as_ref() == [255, 0] => break,
                Message::Close(_) => {
                    closed_by_client = true;
                    break;
                }
                _ => {}
            }
        }
    }
    let delivered = failure.as_ref().is_none_or(|f| f.delivered);
    let status = match &failure {
        Some(f) => f.status.clone(),
        None => json!({"metadata": {}, "status": "Success"}),
    };
    let sent = if closed_by_client {
        None
    } else {
        let mut frame = vec![3u8];
        frame.extend_from_slice(status.to_string().as_bytes());
        let _ = socket.send(Message::Binary(frame.into())).await;
        let _ = socket.send(Message::Close(None)).await;
        Some(status)
    };
    let (namespace, pod, _) = key.clone();
    let (manifest, reached) = {
        let mut state = shared.lock();
        // An earlier attach closed a `stdinOnce` stdin: nothing reaches it.
        let reached = delivered && !state.stdin_spent.contains(&key);
        if stdin && stdin_once && delivered {
            state.stdin_spent.insert(key);
        }
        let manifest = state
            .store
            .get(store::table(&resources::PODS), &namespace, &pod)
            .cloned()
            .unwrap_or(Value::Null);
        (manifest, reached)
    };
    let _ = shared.attached.send(Attached {
        pod,
        namespace,
        query,
        stdin: if reached { received } else { Vec::new() },
        reached,
        manifest,
        protocol,
        status: sent,
    });
}
