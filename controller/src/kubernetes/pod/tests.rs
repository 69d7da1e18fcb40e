use super::*;
use crate::core::launcher::ItemIdentity;
use crate::kubernetes::crd::{SecretKeyRef, WorkerPoolSpec, WorkspaceStorage};
use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, NodeAffinity};
use mango_protocol::WorkType;

fn pool() -> WorkerPool {
    let mut pool = WorkerPool::new(
        "builders",
        WorkerPoolSpec {
            api_url: None,
            sandbox_api_url: None,
            environment_id: "env_1".into(),
            environment_key_secret: SecretKeyRef {
                name: "pool-key".into(),
                key: None,
            },
            image: None,
            image_pull_policy: None,
            resources: None,
            runtime_class_name: None,
            node_selector: None,
            tolerations: None,
            workspace: WorkspaceStorage::default(),
            max_concurrency: 4,
            active_deadline_seconds: None,
            start_timeout_seconds: None,
            pod: PodOverrides::default(),
            keep_idle: None,
            warm: None,
            egress: None,
        },
    );
    pool.metadata.namespace = Some("sandboxes".into());
    pool.metadata.uid = Some("uid-1".into());
    pool
}

fn sandbox(session: Option<&str>) -> SandboxSpec {
    let item = ItemIdentity {
        work_id: "work_abc".into(),
        claim: 2,
        environment_id: "env_1".into(),
        work_type: if session.is_some() {
            WorkType::Session
        } else {
            WorkType::Healthcheck
        },
        session_id: session.map(str::to_string),
    };
    SandboxSpec {
        name: naming::sandbox_name(&item.work_id, item.claim),
        labels: naming::labels(&item, "builders"),
        env: naming::runner_env(&item, "http://mango-api:8080"),
        item,
    }
}

/// Every hardened field of spec §7, whatever the pool added.
fn assert_hardened(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.host_network, Some(false));
    assert_eq!(spec.host_pid, Some(false));
    assert_eq!(spec.host_ipc, Some(false));
    assert_ne!(spec.host_users, Some(true));
    assert!(spec.active_deadline_seconds.is_some_and(|d| d >= 30));
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(psc.run_as_user.is_some_and(|u| u > 0));
    assert!(psc.run_as_group.is_some_and(|g| g > 0));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(psc.sysctls.is_none() && psc.supplemental_groups.is_none());
    assert_eq!(spec.containers.len(), 1);
    assert!(spec.init_containers.is_none() && spec.ephemeral_containers.is_none());
    let c = &spec.containers[0];
    assert_eq!(c.stdin, Some(true));
    assert_eq!(c.stdin_once, Some(true));
    assert_eq!(c.tty, Some(false));
    assert!(
        c.command.is_none() && c.args.is_none(),
        "the image's runner runs"
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert!(sc.run_as_user.is_some_and(|u| u > 0));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert!(caps.add.is_none());
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert!(limits.contains_key("cpu") && limits.contains_key("memory"));
    let mounts = c.volume_mounts.as_ref().unwrap();
    let tmp = mounts.iter().find(|m| m.mount_path == "/tmp").unwrap();
    let volumes = spec.volumes.as_ref().unwrap();
    let tmp_volume = volumes.iter().find(|v| v.name == tmp.name).unwrap();
    assert!(tmp_volume.empty_dir.is_some(), "/tmp is an emptyDir");
    assert!(volumes.iter().all(|v| v.host_path.is_none()), "no hostPath");
    assert!(mounts.iter().any(|m| m.mount_path == WORKSPACE));
    // No credential anywhere in the spec: identity only.
    let text = serde_json::to_string(pod).unwrap();
    for marker in ["mango_st_", "mango_envk_", "mango_wsk_", "sessions_token"] {
        assert!(!text.contains(marker), "{marker} in {text}");
    }
    let env = c.env.as_ref().unwrap();
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    for want in [
        "MANGO_BASE_URL",
        "MANGO_WORK_ID",
        "MANGO_ENVIRONMENT_ID",
        "MANGO_WORK_TYPE",
        "MANGO_WORKSPACE",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    assert!(env.iter().all(|e| e.value_from.is_none()));
    let labels = pod.metadata.labels.as_ref().unwrap();
    for label in [
        naming::LABEL_WORK_ID,
        naming::LABEL_ENVIRONMENT_ID,
        naming::LABEL_WORK_TYPE,
        naming::LABEL_POOL,
        naming::LABEL_CLAIM,
        naming::LABEL_MANAGED_BY,
    ] {
        assert!(labels.contains_key(label), "{label}");
    }
    assert_eq!(labels[naming::LABEL_MANAGED_BY], naming::MANAGED_BY);
}

#[test]
fn a_session_pod_is_hardened_named_per_claim_and_owned_by_its_pool() {
    let pool = pool();
    let pod = sandbox_pod(&pool, &sandbox(Some("sesn_X1")), "mango-sandbox:1");
    assert_hardened(&pod);
    assert_eq!(pod.metadata.name.as_deref(), Some("mango-work-abc-2"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("sandboxes"));
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("WorkerPool", "builders", "uid-1")
    );
    assert_eq!(owner.api_version, "mango.dev/v1alpha1");
    assert_eq!(owner.controller, Some(true));
    let spec = pod.spec.unwrap();
    let c = &spec.containers[0];
    assert_eq!(c.name, CONTAINER);
    assert_eq!(c.image.as_deref(), Some("mango-sandbox:1"));
    assert_eq!(spec.active_deadline_seconds, Some(86400));
    let labels = pod.metadata.labels.unwrap();
    assert_eq!(labels[naming::LABEL_SESSION_ID], "sesn_X1");
    assert_eq!(labels[naming::LABEL_CLAIM], "2");
    let memory = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == MEMORY_ROOT)
        .expect("Session Work has a writable Memory Store root");
    let volumes = spec.volumes.unwrap();
    let memory = volumes.iter().find(|v| v.name == memory.name).unwrap();
    assert!(memory.empty_dir.is_some() && memory.persistent_volume_claim.is_none());
    let workspace = volumes.into_iter().find(|v| v.name == "workspace").unwrap();
    assert_eq!(
        workspace.persistent_volume_claim.unwrap().claim_name,
        "mango-session-sesn-x1"
    );
    let psc = spec.security_context.unwrap();
    assert_eq!(
        (psc.run_as_user, psc.run_as_group, psc.fs_group),
        (Some(65534), Some(65534), Some(65534))
    );
}

#[test]
fn a_healthcheck_pod_has_a_memory_workspace_and_no_claim_on_storage() {
    let pod = sandbox_pod(&pool(), &sandbox(None), "img");
    assert_hardened(&pod);
    let spec = pod.spec.unwrap();
    assert!(!spec.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .any(|m| m.mount_path == MEMORY_ROOT));
    let volumes = spec.volumes.unwrap();
    let workspace = volumes.iter().find(|v| v.name == "workspace").unwrap();
    assert!(workspace.persistent_volume_claim.is_none());
    assert_eq!(
        workspace.empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );
    assert!(!pod
        .metadata
        .labels
        .unwrap()
        .contains_key(naming::LABEL_SESSION_ID));
}

#[test]
fn the_pools_choices_are_applied() {
    let mut pool = pool();
    pool.spec.image = Some("registry.local/sandbox:2".into());
    pool.spec.image_pull_policy = Some(crate::kubernetes::crd::PullPolicy::Always);
    pool.spec.runtime_class_name = Some("gvisor".into());
    pool.spec.active_deadline_seconds = Some(600);
    pool.spec.node_selector = Some(BTreeMap::from([("pool".into(), "sandbox".into())]));
    pool.spec.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([("memory".into(), Quantity("2Gi".into()))])),
        ..Default::default()
    });
    pool.spec.pod = PodOverrides {
        labels: BTreeMap::from([("team".into(), "ml".into())]),
        annotations: BTreeMap::from([("note".into(), "x".into())]),
        priority_class_name: Some("low".into()),
        service_account_name: Some("sandbox".into()),
        image_pull_secrets: vec![LocalObjectReference {
            name: "regcred".into(),
        }],
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            ..Default::default()
        }),
        run_as_user: Some(1000),
        run_as_group: Some(1000),
        fs_group: Some(2000),
        host_users: Some(false),
        env: vec![EnvVar {
            name: "TZ".into(),
            value: Some("UTC".into()),
            value_from: None,
        }],
        tmp_size_limit: Some(Quantity("1Gi".into())),
        ..Default::default()
    };
    validate(&pool).expect("these overrides are allowed");
    let pod = sandbox_pod(&pool, &sandbox(Some("sesn_1")), "default-image");
    assert_hardened(&pod);
    let spec = pod.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.local/sandbox:2"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(spec.active_deadline_seconds, Some(600));
    assert_eq!(spec.host_users, Some(false));
    assert_eq!(spec.service_account_name.as_deref(), Some("sandbox"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["memory"], Quantity("2Gi".into()));
    assert_eq!(
        limits["cpu"],
        Quantity("1".into()),
        "a missing limit gets the default"
    );
    assert_eq!(c.security_context.as_ref().unwrap().run_as_user, Some(1000));
    assert_eq!(spec.security_context.as_ref().unwrap().fs_group, Some(2000));
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["team"], "ml");
    assert!(c.env.as_ref().unwrap().iter().any(|e| e.name == "TZ"));
}

#[test]
fn overrides_that_would_weaken_the_sandbox_are_refused() {
    type Weaken = Box<dyn Fn(&mut PodOverrides)>;
    let cases: Vec<(&str, Weaken)> = vec![
        ("pod.runAsUser", Box::new(|p| p.run_as_user = Some(0))),
        ("pod.runAsGroup", Box::new(|p| p.run_as_group = Some(0))),
        ("pod.fsGroup", Box::new(|p| p.fs_group = Some(0))),
        ("pod.hostUsers", Box::new(|p| p.host_users = Some(true))),
        (
            "pod.labels[mango.dev/work-id]",
            Box::new(|p| {
                p.labels.insert("mango.dev/work-id".into(), "x".into());
            }),
        ),
        (
            "pod.labels[app.kubernetes.io/managed-by]",
            Box::new(|p| {
                p.labels
                    .insert("app.kubernetes.io/managed-by".into(), "me".into());
            }),
        ),
        (
            "pod.annotations[mango.dev/handed-off]",
            Box::new(|p| {
                p.annotations
                    .insert(ANNOTATION_HANDED_OFF.into(), "yes".into());
            }),
        ),
        (
            "pod.env[MANGO_BASE_URL]",
            Box::new(|p| {
                p.env.push(EnvVar {
                    name: "MANGO_BASE_URL".into(),
                    value: Some("http://evil".into()),
                    value_from: None,
                })
            }),
        ),
        (
            "pod.env[K].valueFrom",
            Box::new(|p| {
                p.env.push(EnvVar {
                    name: "K".into(),
                    value: None,
                    value_from: Some(Default::default()),
                })
            }),
        ),
    ];
    for (field, weaken) in cases {
        let mut pool = pool();
        weaken(&mut pool.spec.pod);
        let err = validate(&pool).expect_err(field);
        assert_eq!(
            format!("spec.{field}"),
            format!("spec.{}", err.field),
            "{err}"
        );
        assert!(
            err.to_string().starts_with(&format!("spec.{field}: ")),
            "{err}"
        );
    }
    let mut pool = pool();
    pool.spec.active_deadline_seconds = Some(5);
    assert_eq!(validate(&pool).unwrap_err().field, "activeDeadlineSeconds");
    let mut pool = pool.clone();
    pool.spec.active_deadline_seconds = None;
    pool.spec.max_concurrency = 0;
    assert_eq!(validate(&pool).unwrap_err().field, "maxConcurrency");
}

/// Whatever combination of allowed overrides a pool sets, the Pod stays
/// hardened and keeps the supervisor's labels and identity.
#[test]
fn no_allowed_override_removes_the_hardening() {
    let choices: [fn(&mut WorkerPool); 8] = [
        |p| p.spec.pod.run_as_user = Some(1),
        |p| p.spec.pod.host_users = Some(false),
        |p| {
            p.spec.resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("4".into()))])),
                ..Default::default()
            })
        },
        |p| {
            p.spec.resources = Some(ResourceRequirements {
                limits: Some(BTreeMap::new()),
                requests: Some(BTreeMap::new()),
                ..Default::default()
            })
        },
        |p| p.spec.pod.service_account_name = Some("default".into()),
        |p| {
            p.spec
                .pod
                .labels
                .insert("mango.dev.evil/x".into(), "y".into());
        },
        |p| p.spec.runtime_class_name = Some("kata".into()),
        |p| {
            p.spec.pod.env.push(EnvVar {
                name: "PATH".into(),
                value: Some("/evil".into()),
                value_from: None,
            })
        },
    ];
    for mask in 0u32..(1 << choices.len()) {
        let mut pool = pool();
        for (i, choose) in choices.iter().enumerate() {
            if mask & (1 << i) != 0 {
                choose(&mut pool);
            }
        }
        validate(&pool).unwrap_or_else(|e| panic!("mask {mask:b}: {e}"));
        for session in [None, Some("sesn_1")] {
            let pod = sandbox_pod(&pool, &sandbox(session), "img");
            assert_hardened(&pod);
            let labels = pod.metadata.labels.unwrap();
            assert_eq!(labels[naming::LABEL_WORK_ID], "work_abc");
            assert_eq!(labels[naming::LABEL_POOL], "builders");
        }
    }
}

#[test]
fn a_session_pvc_is_named_from_the_session_and_sized_by_the_pool() {
    let mut pool = pool();
    let pvc = session_pvc(&pool, "sesn_AbC");
    assert_eq!(pvc.metadata.name.as_deref(), Some("mango-session-sesn-abc"));
    assert_eq!(pvc.metadata.namespace.as_deref(), Some("sandboxes"));
    assert!(
        pvc.metadata.owner_references.is_none(),
        "a Session's files outlive its pool"
    );
    let labels = pvc.metadata.labels.clone().unwrap();
    assert_eq!(labels[naming::LABEL_SESSION_ID], "sesn_AbC");
    assert_eq!(labels[naming::LABEL_ENVIRONMENT_ID], "env_1");
    assert_eq!(labels[naming::LABEL_MANAGED_BY], naming::MANAGED_BY);
    let spec = pvc.spec.unwrap();
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(spec.storage_class_name, None);
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"],
        Quantity("1Gi".into())
    );
    pool.spec.workspace = WorkspaceStorage {
        storage_class_name: Some("fast".into()),
        size: Some(Quantity("20Gi".into())),
        access_mode: Some(AccessMode::ReadWriteOncePod),
    };
    let spec = session_pvc(&pool, "sesn_1").spec.unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        spec.access_modes,
        Some(vec!["ReadWriteOncePod".to_string()])
    );
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"],
        Quantity("20Gi".into())
    );
}

/// What the API server would refuse in each of the pool's Pods (or in the
/// selectors the controller lists them with) is refused once, in the pool,
/// at the same edges as the API server's validation.
#[test]
fn what_the_api_server_would_refuse_in_every_pod_is_refused_in_the_pool() {
    type Change = Box<dyn Fn(&mut WorkerPool)>;
    let at_63 = "e".repeat(63);
    let at_64 = "e".repeat(64);
    let cases: Vec<(&str, Change, Option<&str>)> = vec![
        (
            "environmentId of 63",
            Box::new({
                let v = at_63.clone();
                move |p| p.spec.environment_id = v.clone()
            }),
            None,
        ),
        (
            "environmentId of 64",
            Box::new({
                let v = at_64.clone();
                move |p| p.spec.environment_id = v.clone()
            }),
            Some("environmentId"),
        ),
        (
            "environmentId with a space",
            Box::new(|p| p.spec.environment_id = "env 1".into()),
            Some("environmentId"),
        ),
        (
            "environmentId ending in -",
            Box::new(|p| p.spec.environment_id = "env-".into()),
            Some("environmentId"),
        ),
        (
            "a name of 63",
            Box::new({
                let v = at_63.clone();
                move |p| p.metadata.name = Some(v.clone())
            }),
            None,
        ),
        (
            "a name of 64",
            Box::new({
                let v = at_64.clone();
                move |p| p.metadata.name = Some(v.clone())
            }),
            Some("metadata.name"),
        ),
        (
            "activeDeadlineSeconds 30",
            Box::new(|p| p.spec.active_deadline_seconds = Some(30)),
            None,
        ),
        (
            "activeDeadlineSeconds 29",
            Box::new(|p| p.spec.active_deadline_seconds = Some(29)),
            Some("activeDeadlineSeconds"),
        ),
        (
            "activeDeadlineSeconds 2^31-1",
            Box::new(|p| p.spec.active_deadline_seconds = Some(2147483647)),
            None,
        ),
        (
            "activeDeadlineSeconds 2^31",
            Box::new(|p| p.spec.active_deadline_seconds = Some(2147483648)),
            Some("activeDeadlineSeconds"),
        ),
        (
            "runAsUser 2^31-1",
            Box::new(|p| p.spec.pod.run_as_user = Some(2147483647)),
            None,
        ),
        (
            "runAsUser 2^31",
            Box::new(|p| p.spec.pod.run_as_user = Some(2147483648)),
            Some("pod.runAsUser"),
        ),
        (
            "runAsGroup 2^31",
            Box::new(|p| p.spec.pod.run_as_group = Some(2147483648)),
            Some("pod.runAsGroup"),
        ),
        (
            "fsGroup 2^31",
            Box::new(|p| p.spec.pod.fs_group = Some(2147483648)),
            Some("pod.fsGroup"),
        ),
        (
            "a label value of 64",
            Box::new({
                let v = at_64.clone();
                move |p| {
                    p.spec.pod.labels.insert("team".into(), v.clone());
                }
            }),
            Some("pod.labels[team]"),
        ),
        (
            "a label key with a space",
            Box::new(|p| {
                p.spec.pod.labels.insert("my team".into(), "a".into());
            }),
            Some("pod.labels[my team]"),
        ),
        (
            "an annotation key with a space",
            Box::new(|p| {
                p.spec.pod.annotations.insert("a b".into(), "x".into());
            }),
            Some("pod.annotations"),
        ),
        (
            "annotations over 256 KiB",
            Box::new(|p| {
                p.spec
                    .pod
                    .annotations
                    .insert("big".into(), "x".repeat(256 * 1024));
            }),
            Some("pod.annotations"),
        ),
        (
            "a RuntimeClass in capitals",
            Box::new(|p| p.spec.runtime_class_name = Some("Kata".into())),
            Some("runtimeClassName"),
        ),
        (
            "a PriorityClass with _",
            Box::new(|p| p.spec.pod.priority_class_name = Some("low_prio".into())),
            Some("pod.priorityClassName"),
        ),
        (
            "a ServiceAccount with /",
            Box::new(|p| p.spec.pod.service_account_name = Some("a/b".into())),
            Some("pod.serviceAccountName"),
        ),
    ];
    for (what, change, refused) in cases {
        let mut pool = pool();
        change(&mut pool);
        match (validate(&pool), refused) {
            (Ok(()), None) => {
                // What passes builds Pods whose every label the API server takes.
                let name = pool.metadata.name.clone().unwrap();
                let mut spec = sandbox(Some("sesn_1"));
                spec.labels = naming::labels(&spec.item, &name);
                let pod = sandbox_pod(&pool, &spec, "img");
                crate::kubernetes::validation::labels(pod.metadata.labels.as_ref().unwrap())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            (Err(err), Some(field)) => {
                assert_eq!(err.field, field, "{what}: {err}");
                let shown = err.to_string();
                let prefix = if field.starts_with("metadata.") {
                    format!("{field}: ")
                } else {
                    format!("spec.{field}: ")
                };
                assert!(shown.starts_with(&prefix), "{what}: {shown}");
            }
            (got, want) => panic!("{what}: got {got:?}, wanted a refusal of {want:?}"),
        }
    }
}

/// The create's answer is the stored Pod: a hardening field it does not
/// hold as sent (a feature gate that is off drops `hostUsers`; a webhook
/// may rewrite the security context) is named; canonical quantities and
/// the API server's defaults are not.
#[test]
fn hardening_the_api_server_did_not_store_is_named() {
    let mut pool = pool();
    pool.spec.pod.host_users = Some(false);
    pool.spec.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([("cpu".into(), Quantity("0.5".into()))])),
        ..Default::default()
    });
    let sent = sandbox_pod(&pool, &sandbox(Some("sesn_1")), "img");
    let mut stored = serde_json::to_value(&sent).unwrap();
    // What every API server does: defaults, canonical quantities, status.
    stored["spec"]["dnsPolicy"] = "ClusterFirst".into();
    stored["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "500m".into();
    stored["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log".into();
    stored["status"] = serde_json::json!({"phase": "Pending"});
    let stored_pod: Pod = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(
        hardening_not_stored(&sent, &stored_pod),
        Vec::<String>::new()
    );

    // The UserNamespacesSupport gate off, and a webhook's changes.
    stored["spec"].as_object_mut().unwrap().remove("hostUsers");
    stored["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = false.into();
    stored["spec"]["containers"][0]["resources"]["limits"]
        .as_object_mut()
        .unwrap()
        .remove("memory");
    // A sidecar put first does not hide the runner.
    let runner = stored["spec"]["containers"][0].clone();
    stored["spec"]["containers"] =
        serde_json::json!([{"name": "istio-proxy", "image": "proxy"}, runner]);
    let stored_pod: Pod = serde_json::from_value(stored).unwrap();
    assert_eq!(
        hardening_not_stored(&sent, &stored_pod),
        vec![
            "spec.hostUsers".to_string(),
            "spec.containers[runner].securityContext.readOnlyRootFilesystem".into(),
            "spec.containers[runner].resources.limits.memory".into(),
        ]
    );
    // A field the pool did not set is not expected back.
    let plain = sandbox_pod(&pool_without_host_users(), &sandbox(None), "img");
    assert!(hardening_not_stored(&plain, &plain).is_empty());
}

fn pool_without_host_users() -> WorkerPool {
    let mut pool = pool();
    pool.spec.pod.host_users = None;
    pool
}

fn hardening_of(pod: &Pod) -> serde_json::Value {
    let mut pod = serde_json::to_value(pod).unwrap();
    let spec = &mut pod["spec"];
    spec.as_object_mut()
        .unwrap()
        .remove("activeDeadlineSeconds");
    spec.as_object_mut().unwrap().remove("volumes");
    let runner = spec["containers"][0].as_object_mut().unwrap();
    for field in ["command", "stdinOnce", "env"] {
        runner.remove(field);
    }
    pod["spec"].clone()
}

#[test]
fn a_warm_pod_is_hardened_as_a_cold_one_with_no_identity_and_stdin_kept_open() {
    let mut pool = pool();
    pool.spec.warm = Some(crate::kubernetes::crd::WarmPods {
        replicas: 2,
        max_age: Some(600),
    });
    let warm = warm::warm_pod(&pool, "mango-warm-00ff", "img:1", "http://api:8080");
    let cold = sandbox_pod(&pool, &sandbox(Some("sesn_1")), "img:1");
    assert_eq!(
        hardening_of(&warm),
        hardening_of(&cold),
        "the same Pod but for its runner's command, env, stdinOnce, deadline and PVC"
    );
    let spec = warm.spec.as_ref().unwrap();
    let runner = &spec.containers[0];
    assert_eq!((runner.stdin, runner.stdin_once), (Some(true), Some(false)));
    assert_eq!(
        cold.spec.as_ref().unwrap().containers[0].stdin_once,
        Some(true),
        "a cold Pod keeps stdinOnce"
    );
    assert_eq!(
        runner.command.as_deref(),
        Some(
            &[
                "/usr/local/bin/mango-runner".to_string(),
                "--wait".into(),
                "--wait-timeout-seconds".into(),
                "660".into()
            ][..]
        )
    );
    let env: Vec<(&str, &str)> = runner
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [
            ("MANGO_BASE_URL", "http://api:8080"),
            ("MANGO_WORKSPACE", WORKSPACE)
        ]
    );
    assert_eq!(
        spec.active_deadline_seconds,
        Some(DEFAULT_DEADLINE_SECONDS + 660),
        "the longest wait, then a whole item"
    );
    let labels = warm.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            naming::LABEL_MANAGED_BY,
            naming::LABEL_POOL,
            warm::LABEL_WARM
        ],
        "no work, Session or environment label"
    );
    let claims: Vec<&str> = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
        .collect();
    assert_eq!(claims, ["mango-warm-00ff"], "its own PVC");
    let pvc = warm::warm_pvc(&pool, "mango-warm-00ff", Some("pod-uid"));
    let owner = &pvc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", "pod-uid")
    );
    assert!(!pvc
        .metadata
        .labels
        .as_ref()
        .unwrap()
        .contains_key(naming::LABEL_SESSION_ID));
}

#[test]
fn the_warm_template_names_what_a_warm_pod_is_made_from_not_its_name() {
    let pool = pool();
    let template = |pool: &WorkerPool, name: &str, image: &str| {
        warm::warm_pod(pool, name, image, "http://api:8080")
            .metadata
            .annotations
            .unwrap()[warm::ANNOTATION_TEMPLATE]
            .clone()
    };
    let first = template(&pool, "mango-warm-1", "img:1");
    assert_eq!(first.len(), 16);
    assert_eq!(first, template(&pool, "mango-warm-2", "img:1"));
    assert_ne!(first, template(&pool, "mango-warm-1", "img:2"), "the image");
    let mut resized = pool.clone();
    resized.spec.workspace.size = Some(Quantity("5Gi".into()));
    assert_ne!(
        first,
        template(&resized, "mango-warm-1", "img:1"),
        "the PVC"
    );
    let mut limited = pool.clone();
    limited.spec.active_deadline_seconds = Some(60);
    assert_ne!(
        first,
        template(&limited, "mango-warm-1", "img:1"),
        "the Pod"
    );
}

#[test]
fn warm_bounds_are_refused_past_their_edges() {
    use crate::kubernetes::crd::WarmPods;
    let with = |replicas: u32, max_age: Option<u32>| {
        let mut pool = pool();
        pool.spec.warm = Some(WarmPods { replicas, max_age });
        validate(&pool).map_err(|e| e.to_string())
    };
    assert_eq!(with(0, None), Ok(()));
    assert_eq!(with(100, Some(60)), Ok(()));
    assert_eq!(with(1, Some(86400)), Ok(()));
    assert_eq!(
        with(101, None),
        Err("spec.warm.replicas: must be 0 to 100".into())
    );
    assert_eq!(
        with(1, Some(59)),
        Err("spec.warm.maxAge: must be 60 to 86400 seconds".into())
    );
    assert_eq!(
        with(1, Some(86401)),
        Err("spec.warm.maxAge: must be 60 to 86400 seconds".into())
    );
    let mut long = pool();
    long.spec.active_deadline_seconds = Some(MAX_POD_INT - 3600 - 60);
    long.spec.warm = Some(WarmPods {
        replicas: 1,
        max_age: None,
    });
    assert_eq!(validate(&long), Ok(()));
    long.spec.active_deadline_seconds = Some(MAX_POD_INT - 3600 - 59);
    assert!(validate(&long)
        .unwrap_err()
        .to_string()
        .contains("warm.maxAge"));
}

fn egress_pool(allow: &[&str], proxy: Option<&str>) -> WorkerPool {
    let mut pool = pool();
    pool.spec.egress = Some(crate::kubernetes::crd::EgressSpec {
        allow: allow.iter().map(|a| a.to_string()).collect(),
        proxy: proxy.map(str::to_string),
        ..Default::default()
    });
    pool
}

/// The runner's env of `pod` as (name, value) pairs, in order.
fn env_of(pod: &Pod) -> Vec<(String, String)> {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn proxy_vars(pod: &Pod) -> Vec<(String, String)> {
    env_of(pod)
        .into_iter()
        .filter(|(name, _)| name.to_ascii_uppercase().ends_with("_PROXY"))
        .collect()
}

#[test]
fn a_pool_that_allows_egress_points_cold_and_warm_pods_at_its_proxy() {
    let pool = egress_pool(&["api.github.com"], Some("mango-egress.mango.svc:3128"));
    let routing = crate::egress::Routing {
        proxy: "mango-egress.mango.svc:3128".into(),
        // The host of the runner's MANGO_BASE_URL (`sandbox`'s http://mango-api:8080).
        no_proxy: "mango-api".into(),
    };
    let cold = sandbox_pod(&pool, &sandbox(Some("sesn_1")), "img");
    assert_hardened(&cold);
    assert_eq!(proxy_vars(&cold), routing.env("work_abc"));
    assert!(env_of(&cold).contains(&(
        "HTTPS_PROXY".into(),
        "http://work_abc@mango-egress.mango.svc:3128".into()
    )));
    let healthcheck = sandbox_pod(&pool, &sandbox(None), "img");
    assert_eq!(proxy_vars(&healthcheck), routing.env("work_abc"));

    let warm = warm::warm_pod(&pool, "mango-warm-00ff", "img", "http://api.mango.svc:8081");
    let warm_routing = crate::egress::Routing {
        no_proxy: "api.mango.svc".into(),
        ..routing
    };
    assert_eq!(proxy_vars(&warm), warm_routing.env(""));
    assert!(env_of(&warm).contains(&(
        "https_proxy".into(),
        "http://mango-egress.mango.svc:3128".into()
    )));
}

#[test]
fn a_pool_that_allows_no_egress_gives_its_pods_no_proxy() {
    for pool in [
        pool(),
        egress_pool(&[], None),
        egress_pool(&[], Some("mango-egress.mango.svc:3128")),
    ] {
        assert_eq!(validate(&pool), Ok(()));
        let cold = sandbox_pod(&pool, &sandbox(Some("sesn_1")), "img");
        let warm = warm::warm_pod(&pool, "mango-warm-00ff", "img", "http://api:8080");
        assert_eq!(proxy_vars(&cold), [], "{:?}", pool.spec.egress);
        assert_eq!(proxy_vars(&warm), [], "{:?}", pool.spec.egress);
    }
}

#[test]
fn the_warm_template_changes_with_the_proxy_its_pods_name() {
    let template = |pool: &WorkerPool| warm::template(pool, "img", "http://api:8080");
    let closed = template(&pool());
    let proxied = template(&egress_pool(&["a.example"], Some("egress.mango.svc:3128")));
    assert_ne!(
        closed, proxied,
        "a pool that opens egress recycles its warm Pods"
    );
    assert_ne!(
        proxied,
        template(&egress_pool(&["a.example"], Some("egress.other.svc:3128"))),
        "another proxy"
    );
    // The proxy reads the allowlist from the pool and applies an edit
    // live: the Pods' environment is the same, and they are kept.
    assert_eq!(
        proxied,
        template(&egress_pool(
            &["a.example", "*.b.example:8443"],
            Some("egress.mango.svc:3128")
        ))
    );
}

#[test]
fn a_bad_egress_spec_is_refused_naming_the_entry_or_field() {
    let refused = |pool: &WorkerPool| validate(pool).map_err(|e| e.to_string());
    let proxy = Some("mango-egress.mango.svc:3128");
    let err = refused(&egress_pool(&["ok.example", "https://x.example/"], proxy)).unwrap_err();
    assert!(
        err.starts_with("spec.egress.allow[1]: egress allowlist entry \"https://x.example/\": "),
        "{err}"
    );
    let err = refused(&egress_pool(&["*.com"], proxy)).unwrap_err();
    assert!(
        err.starts_with("spec.egress.allow[0]: egress allowlist entry \"*.com\": is a wildcard"),
        "{err}"
    );
    let mut any = egress_pool(&["*.com", "*"], proxy);
    any.spec.egress.as_mut().unwrap().allow_any = true;
    assert_eq!(refused(&any), Ok(()), "allowAny admits them");
    assert!(refused(&egress_pool(&["a.example", ""], proxy))
        .unwrap_err()
        .starts_with("spec.egress.allow[1]: egress allowlist entry \"\": is empty"));
    for missing in [None, Some("")] {
        assert_eq!(
            refused(&egress_pool(&["a.example"], missing)),
            Err("spec.egress.proxy: is required when spec.egress.allow is set".into())
        );
    }
    for (proxy, ok) in [
        ("mango-egress.mango.svc:3128", true),
        ("egress:1", true),
        ("egress:65535", true),
        ("10.0.0.7:3128", true),
        ("[fd00::7]:3128", true),
        ("egress:0", false),
        ("egress:65536", false),
        ("egress:+80", false),
        ("egress:", false),
        ("egress", false),
        ("http://egress:3128", false),
        ("Egress:3128", false),
        (":3128", false),
        ("fd00::7:3128", false),
    ] {
        assert_eq!(
            refused(&egress_pool(&["a.example"], Some(proxy))).is_ok(),
            ok,
            "{proxy}: {:?}",
            refused(&egress_pool(&["a.example"], Some(proxy)))
        );
    }
    assert!(
        refused(&egress_pool(&[], Some("egress")))
            .unwrap_err()
            .starts_with("spec.egress.proxy: \"egress\" is not host:port"),
        "a proxy named without allow is checked too"
    );
}

#[test]
fn a_pool_with_a_proxy_may_not_set_the_proxy_variables_itself() {
    let set = |pool: &mut WorkerPool, name: &str| {
        pool.spec.pod.env = vec![EnvVar {
            name: name.into(),
            value: Some("http://elsewhere:3128".into()),
            value_from: None,
        }];
    };
    for name in ["HTTPS_PROXY", "http_proxy", "NO_PROXY", "no_proxy"] {
        let mut proxied = egress_pool(&["a.example"], Some("egress:3128"));
        set(&mut proxied, name);
        assert_eq!(
            validate(&proxied).map_err(|e| e.to_string()),
            Err(format!(
                "spec.pod.env[{name}]: is set from spec.egress.proxy when spec.egress.allow is set"
            ))
        );
        let mut closed = pool();
        set(&mut closed, name);
        assert_eq!(
            validate(&closed),
            Ok(()),
            "without a proxy it is the pool's"
        );
    }
}

#[test]
fn the_no_proxy_host_is_the_one_the_runner_reaches_the_api_at() {
    let proxied = egress_pool(&["a.example"], Some("egress:3128"));
    let routing = egress_routing(&proxied, "http://[fd00::1]:8081/")
        .unwrap()
        .unwrap();
    assert_eq!(routing.no_proxy, "fd00::1");
    assert_eq!(
        egress_routing(&proxied, "http://:8081").map_err(|e| e.to_string()),
        Err("spec.sandboxApiUrl: the sandboxes' api URL \"http://:8081\" has no host, which their NO_PROXY names".into())
    );
    assert_eq!(egress_routing(&pool(), "http://:8081"), Ok(None));
}
