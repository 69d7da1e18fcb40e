//! What the suite sees of its sandboxes: the Docker pool's containers and
//! volumes, the local pool's records and workspaces (their output is
//! followed by `container_logs.rs`).

use super::system::{names, WORKSPACE_BYTES};
use bollard::query_parameters::{
    ListContainersOptions, ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use bollard::Docker;
use mango_controller::core::naming::{
    LABEL_CLAIM, LABEL_MANAGED_BY, LABEL_POOL, LABEL_SESSION_ID, LABEL_WORK_ID,
};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// A live sandbox of an item: which pool, Work, claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Live {
    pub pool: String,
    pub work_id: String,
    pub claim: i64,
    /// The container's id (Docker pool only).
    pub container: Option<String>,
}

async fn containers(docker: &Docker, all: bool) -> Vec<bollard::models::ContainerSummary> {
    docker
        .list_containers(Some(ListContainersOptions {
            all,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{LABEL_POOL}={}", names().docker_pool)],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap_or_default()
}

/// The Docker pool's containers (`all`: exited ones too).
pub async fn pool_containers(docker: &Docker, all: bool) -> Vec<bollard::models::ContainerSummary> {
    containers(docker, all).await
}

/// The running containers and live local runners that serve an item.
pub async fn live(docker: &Docker, local_root: &Path) -> Vec<Live> {
    let mut out = Vec::new();
    for c in containers(docker, false).await {
        let labels = c.labels.unwrap_or_default();
        if let (Some(work), Some(claim)) = (labels.get(LABEL_WORK_ID), labels.get(LABEL_CLAIM)) {
            out.push(Live {
                pool: names().docker_pool.clone(),
                work_id: work.clone(),
                claim: claim.parse().unwrap_or(-1),
                container: c.id.clone(),
            });
        }
    }
    for record in local_records(local_root) {
        let labels = &record["labels"];
        let pid = record["pid"].as_i64().unwrap_or(0) as i32;
        let lives =
            pid > 0 && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty());
        if let (true, Some(work)) = (lives, labels[LABEL_WORK_ID].as_str()) {
            out.push(Live {
                pool: names().local_pool.clone(),
                work_id: work.to_string(),
                claim: labels[LABEL_CLAIM]
                    .as_str()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(-1),
                container: None,
            });
        }
    }
    out
}

fn local_records(root: &Path) -> Vec<serde_json::Value> {
    std::fs::read_dir(root.join("sandboxes"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|t| serde_json::from_str(&t).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What is left of `sessions`: containers, volumes and local workspaces
/// (and local sandbox records) that name one of them.
pub async fn leftovers(
    docker: &Docker,
    local_root: &Path,
    sessions: &HashSet<String>,
) -> Vec<String> {
    let mut objects = Vec::new();
    for c in containers(docker, true).await {
        let name = c.names.clone().unwrap_or_default().join(",");
        objects.push((format!("container {name}"), c.labels.unwrap_or_default()));
    }
    let volumes = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![LABEL_SESSION_ID.to_string()],
            )])),
        }))
        .await
        .map(|v| v.volumes.unwrap_or_default())
        .unwrap_or_default();
    for v in volumes {
        objects.push((format!("volume {}", v.name), v.labels));
    }
    for record in local_records(local_root) {
        let labels: HashMap<String, String> = record["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let work = labels.get(LABEL_WORK_ID).cloned().unwrap_or_default();
        objects.push((format!("local sandbox record of {work}"), labels));
    }
    let workspaces: Vec<String> = sessions
        .iter()
        .filter(|s| local_root.join("sessions").join(s).exists())
        .cloned()
        .collect();
    left_of(&objects, &workspaces, sessions)
}

/// Of the labelled `objects` (what, labels) and the local workspaces found,
/// those that belong to one of the gone `sessions`.
pub fn left_of(
    objects: &[(String, HashMap<String, String>)],
    workspaces: &[String],
    sessions: &HashSet<String>,
) -> Vec<String> {
    let mut left: Vec<String> = objects
        .iter()
        .filter(|(_, labels)| {
            labels
                .get(LABEL_SESSION_ID)
                .is_some_and(|s| sessions.contains(s))
        })
        .map(|(what, _)| what.clone())
        .collect();
    left.extend(
        workspaces
            .iter()
            .filter(|s| sessions.contains(*s))
            .map(|s| format!("local workspace of {s}")),
    );
    left
}

/// Removes every container of the suite's Docker pool and every volume
/// the suite's supervisors made (with their bounded filesystems).
pub async fn remove_all(docker: &Docker, scratch: &Path) {
    for c in containers(docker, true).await {
        let _ = docker
            .remove_container(
                c.id.as_deref().unwrap_or_default(),
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
    }
    let workspaces = mango_controller::docker::workspace::Workspaces::new(
        &scratch.join("workspaces"),
        WORKSPACE_BYTES,
    );
    let volumes = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{LABEL_MANAGED_BY}=mango-worker")],
            )])),
        }))
        .await
        .map(|v| v.volumes.unwrap_or_default())
        .unwrap_or_default();
    for v in volumes {
        let ours = v
            .labels
            .get(LABEL_POOL)
            .is_some_and(|p| *p == names().docker_pool)
            || v.mountpoint.starts_with(&*scratch.to_string_lossy())
            || v.options
                .values()
                .any(|val| val.contains(&*scratch.to_string_lossy()));
        if ours {
            let _ = docker
                .remove_volume(&v.name, None::<RemoveVolumeOptions>)
                .await;
            let _ = workspaces.remove(&v.name).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(what: &str, session: &str) -> (String, HashMap<String, String>) {
        (
            what.to_string(),
            HashMap::from([(LABEL_SESSION_ID.to_string(), session.to_string())]),
        )
    }

    #[test]
    fn what_names_a_gone_session_is_left_and_what_names_another_is_not() {
        let gone: HashSet<String> = ["sesn_gone".to_string()].into();
        let objects = vec![
            labelled("container a", "sesn_gone"),
            labelled("volume b", "sesn_gone"),
            labelled("container c", "sesn_live"),
            ("container unlabelled".to_string(), HashMap::new()),
        ];
        let left = left_of(
            &objects,
            &["sesn_gone".to_string(), "sesn_live".to_string()],
            &gone,
        );
        assert_eq!(
            left,
            ["container a", "volume b", "local workspace of sesn_gone"]
        );
        assert!(left_of(&objects[2..], &[], &gone).is_empty());
    }
}
