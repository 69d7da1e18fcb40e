//! A sandbox Pod's container as a test's kubelet runs it: the real runner
//! as a local process, with the Pod's environment and what the attach
//! delivered on its stdin, stopped when the Pod is deleted, its exit then
//! written back as the container's terminated state. Shared by the
//! controller's tests against this fake and `mango-bench`, which each
//! play the kubelet their own way (a poll, a watch) around it.

use super::{ApiServer, Attached};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// How the runner is started: the Pod's command (`mango-runner --wait …`)
/// runs as `program`, `args` first, then the command's arguments.
#[derive(Debug, Clone)]
pub struct Runner {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// How often the container looks whether its Pod was deleted.
const DELETION_POLL: Duration = Duration::from_millis(50);

/// Whether the Pod is gone or being deleted.
pub fn terminating(fake: &ApiServer, pod: &str) -> bool {
    fake.pod(pod)
        .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
}

/// The container of `attached`'s Pod: its workspace is `volumes/<claim>`
/// (or `volumes/empty-<pod>` without a PVC), its environment the Pod's,
/// `extra` and `PATH`. With `later` (`stdinOnce: false`) its stdin stays
/// open for later attaches; otherwise it closes after the first, as the
/// kubelet closes it. `running_now` names its Pod until it ended.
pub async fn run_container(
    fake: Arc<ApiServer>,
    runner: Arc<Runner>,
    volumes: PathBuf,
    attached: Attached,
    extra: Arc<Vec<(String, String)>>,
    later: Option<tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>>,
    running_now: Arc<Mutex<HashSet<String>>>,
) {
    let spec = &attached.manifest["spec"];
    let workspace = match spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
    {
        Some(claim) => volumes.join(claim),
        None => volumes.join(format!("empty-{}", attached.pod)),
    };
    std::fs::create_dir_all(&workspace).expect("the container's workspace");
    let mut command = tokio::process::Command::new(&runner.program);
    command.args(&runner.args);
    // A waiting Pod's command (`mango-runner --wait …`) past the program.
    let runner_args = spec["containers"][0]["command"]
        .as_array()
        .into_iter()
        .flatten()
        .skip(1)
        .filter_map(|a| a.as_str());
    command.args(runner_args);
    command
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true);
    for var in spec["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) {
            command.env(name, value);
        }
    }
    command.env("MANGO_WORKSPACE", &workspace);
    for (name, value) in extra.iter() {
        command.env(name, value);
    }
    command.env("PATH", std::env::var("PATH").unwrap_or_default());
    let mut child = command.spawn().expect("the runner starts");
    let mut stdin = child.stdin.take().expect("a piped stdin");
    // A runner that already ended finds its stdin closed: its exit says why.
    let _ = stdin.write_all(&attached.stdin).await;
    let feeding = tokio::spawn(async move {
        let Some(mut later) = later else { return };
        while let Some(bytes) = later.recv().await {
            if stdin.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let deleted = async {
        while !terminating(&fake, &attached.pod) {
            tokio::time::sleep(DELETION_POLL).await;
        }
    };
    let code = tokio::select! {
        status = child.wait() => Some(status.expect("the runner's status").code().unwrap_or(137)),
        _ = deleted => {
            let _ = child.kill().await;
            None
        }
    };
    if let Some(code) = code {
        fake.set_pod_status(&attached.pod, terminated(&attached.manifest, code));
    }
    feeding.abort();
    running_now
        .lock()
        .expect("running lock")
        .remove(&attached.pod);
}

/// The status of a Pod whose runner exited with `code`.
fn terminated(pod: &Value, code: i32) -> Value {
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let image = pod["spec"]["containers"][0]["image"].clone();
    json!({"phase": phase, "containerStatuses": [{
        "name": "runner", "image": image, "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": code,
            "finishedAt": super::now_rfc3339()}}}]})
}
