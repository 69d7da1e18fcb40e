use super::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;

const POOL: &str = r#"
apiVersion: mango.dev/v1alpha1
kind: WorkerPool
metadata:
  name: builders
  namespace: sandboxes
spec:
  apiUrl: http://mango-api.mango.svc:8080
  sandboxApiUrl: http://mango-api.mango.svc.cluster.local:8080
  environmentId: env_abc
  environmentKeySecret:
    name: pool-key
  maxConcurrency: 8
  runtimeClassName: gvisor
  workspace:
    size: 5Gi
    accessMode: ReadWriteOncePod
  pod:
    labels:
      team: build
"#;

fn options(work_type: SampleType) -> Options {
    Options {
        namespace: "default".into(),
        default_api_url: None,
        default_sandbox_api_url: None,
        default_sandbox_image: "mango-sandbox:test".into(),
        work_type,
        identity: "mango-controller-0".into(),
        now: "2026-01-02T03:04:05Z".parse().unwrap(),
    }
}

/// The rendering's documents, parsed.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n")
        .map(|doc| serde_yaml::from_str::<Value>(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

#[test]
fn a_session_item_gets_its_pvc_its_pod_and_an_event_as_the_launcher_makes_them() {
    let yaml = render(POOL, &options(SampleType::Session)).unwrap();
    let docs = documents(&yaml);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["PersistentVolumeClaim", "Pod", "Event"]);

    let pool = parse_pool(POOL, "default").unwrap();
    let item = sample_item(&pool, SampleType::Session);
    let spec = SandboxSpec::for_item(
        &item,
        "builders",
        "http://mango-api.mango.svc.cluster.local:8080",
    );
    let pod: Pod = serde_json::from_value(docs[1].clone()).unwrap();
    assert_eq!(
        pod,
        pod::sandbox_pod(&pool, &spec, "mango-sandbox:test"),
        "exactly the Pod the launcher sends"
    );
    let pvc: PersistentVolumeClaim = serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(pvc, pod::session_pvc(&pool, SAMPLE_SESSION_ID));
    assert_eq!(docs[0]["apiVersion"], "v1");
    assert_eq!(docs[1]["metadata"]["namespace"], "sandboxes");
    assert_eq!(docs[1]["metadata"]["labels"]["mango.dev/pool"], "builders");
    assert_eq!(docs[1]["metadata"]["labels"]["team"], "build");
    assert_eq!(docs[1]["spec"]["runtimeClassName"], "gvisor");
    let env = &docs[1]["spec"]["containers"][0]["env"];
    assert!(env
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == "MANGO_BASE_URL"
            && v["value"] == "http://mango-api.mango.svc.cluster.local:8080"));
    assert!(env
        .as_array()
        .unwrap()
        .iter()
        .all(|v| v["valueFrom"].is_null()));

    let event: KubeEvent = serde_json::from_value(docs[2].clone()).unwrap();
    assert_eq!(event.reason.as_deref(), Some("SandboxStarted"));
    assert_eq!(event.reporting_controller.as_deref(), Some(FIELD_MANAGER));
    assert_eq!(
        event.reporting_instance.as_deref(),
        Some("mango-controller-0")
    );
    assert_eq!(
        event.regarding.as_ref().unwrap().kind.as_deref(),
        Some("WorkerPool")
    );
    assert_eq!(
        event.related.as_ref().unwrap().name.as_deref(),
        Some(spec.name.as_str())
    );
    assert_eq!(event.metadata.namespace.as_deref(), Some("sandboxes"));
    assert!(event.metadata.name.unwrap().starts_with("builders."));
}

/// A `spec.egress` in place of `maxConcurrency`.
const EGRESS: &str = "  egress:
    allow:
    - api.github.com
    - \"*.pypi.org\"
    proxy: mango-egress.mango.svc:3128";

#[test]
fn a_pool_with_egress_renders_the_pod_its_proxy_variables_point_at_the_proxy() {
    let text = with("  maxConcurrency: 8", EGRESS);
    let docs = documents(&render(&text, &options(SampleType::Session)).unwrap());
    let env: Vec<(String, String)> = docs[1]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let text = |k: &str| v[k].as_str().unwrap().to_string();
            (text("name"), text("value"))
        })
        .collect();
    let routing = crate::egress::Routing {
        proxy: "mango-egress.mango.svc:3128".into(),
        no_proxy: "mango-api.mango.svc.cluster.local".into(),
    };
    for var in routing.env(SAMPLE_WORK_ID) {
        assert!(env.contains(&var), "{var:?} in {env:?}");
    }
    let closed = documents(&render(POOL, &options(SampleType::Session)).unwrap());
    assert!(
        !closed[1]["spec"]["containers"][0]["env"]
            .to_string()
            .contains("PROXY"),
        "no proxy without spec.egress"
    );
}

#[test]
fn a_healthcheck_gets_a_pod_with_no_pvc() {
    let yaml = render(POOL, &options(SampleType::Healthcheck)).unwrap();
    let docs = documents(&yaml);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Pod", "Event"]);
    assert_eq!(
        docs[0]["metadata"]["labels"]["mango.dev/work-type"],
        "healthcheck"
    );
    assert!(docs[0]["spec"]["volumes"][0]["emptyDir"].is_object());
}

#[test]
fn no_credential_is_rendered() {
    let yaml = render(POOL, &options(SampleType::Session)).unwrap();
    for needle in [
        "mango_envk_",
        "mango_wsk_",
        "mango_st_",
        "pool-key",
        "secretKeyRef",
    ] {
        assert!(!yaml.contains(needle), "{needle} in:\n{yaml}");
    }
}

#[test]
fn the_default_api_url_and_namespace_apply_when_the_pool_names_none() {
    let pool = POOL
        .replace("  apiUrl: http://mango-api.mango.svc:8080\n", "")
        .replace(
            "  sandboxApiUrl: http://mango-api.mango.svc.cluster.local:8080\n",
            "",
        )
        .replace("  namespace: sandboxes\n", "");
    let err = render(&pool, &options(SampleType::Session)).unwrap_err();
    assert!(err.starts_with("spec.apiUrl is not set"), "{err}");
    assert!(err.contains("InvalidSpec"), "{err}");
    let mut with_default = options(SampleType::Session);
    with_default.default_api_url = Some("http://api.elsewhere:8080".into());
    with_default.namespace = "agents".into();
    let docs = documents(&render(&pool, &with_default).unwrap());
    assert_eq!(docs[1]["metadata"]["namespace"], "agents");
    let env = docs[1]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    assert!(env
        .iter()
        .any(|v| v["name"] == "MANGO_BASE_URL" && v["value"] == "http://api.elsewhere:8080"));
}

/// `POOL` with `from` replaced by `to` (which must be in it).
fn with(from: &str, to: &str) -> String {
    assert!(POOL.contains(from), "{from}");
    POOL.replace(from, to)
}

#[test]
fn a_bad_pool_is_refused_in_one_line_naming_its_field() {
    let name63 = "a".repeat(63);
    let name64 = "a".repeat(64);
    let cases: Vec<(String, &str)> = vec![
        (with("  maxConcurrency: 8\n", "  maxConcurrency: 8\n  maxConcurency: 9\n"), "spec.maxConcurency: unknown field"),
        (with("    labels:\n", "    runAsUserr: 5\n    labels:\n"), "spec.pod.runAsUserr: unknown field"),
        (with("  maxConcurrency: 8", "  maxConcurrency: 0"), "spec.maxConcurrency: must be at least 1"),
        (with("  maxConcurrency: 8", "  maxConcurrency: 1001"), "spec.maxConcurrency: must be at most 1000"),
        (with("  maxConcurrency: 8", "  maxConcurrency: many"), "spec.maxConcurrency: invalid type"),
        (with("  maxConcurrency: 8", "  startTimeoutSeconds: 4"), "spec.startTimeoutSeconds: must be at least 5"),
        (with("  maxConcurrency: 8", "  activeDeadlineSeconds: 2147483648"), "spec.activeDeadlineSeconds: must be at most 2147483647"),
        (with("    labels:\n", "    runAsUser: 0\n    labels:\n"), "spec.pod.runAsUser: must be at least 1"),
        (with("      team: build", "      mango.dev/pool: other"), "spec.pod.labels[mango.dev/pool]: is the supervisor's own label"),
        (with("      team: build", "      team: \"-build\""), "spec.pod.labels[team]:"),
        (with("  environmentId: env_abc\n", ""), "spec: missing field `environmentId`"),
        (with("  environmentId: env_abc", "  environmentId: \"env abc\""), "spec.environmentId: is the label mango.dev/environment-id's value"),
        (with("    accessMode: ReadWriteOncePod", "    accessMode: RWO"), "spec.workspace.accessMode: unknown variant `RWO`"),
        (with("  name: builders", &format!("  name: {name64}")), "metadata.name: is the label mango.dev/pool's value: must be no more than 63 characters"),
        (with("  name: builders", "  name: Builders"), "metadata.name: a lowercase RFC 1123 subdomain"),
        (with("  name: builders\n", ""), "metadata.name: required"),
        (with("  namespace: sandboxes", "  namespace: a.b"), "metadata.namespace: a lowercase RFC 1123 label"),
        (with("apiVersion: mango.dev/v1alpha1", "apiVersion: mango.dev/v1"), "apiVersion: must be mango.dev/v1alpha1"),
        (with("kind: WorkerPool", "kind: Pool"), "kind: must be WorkerPool"),
        (with("  maxConcurrency: 8", EGRESS).replace("api.github.com", "\"*.com\""), "spec.egress.allow[0]: egress allowlist entry \"*.com\": is a wildcard"),
        (with("  maxConcurrency: 8", EGRESS).replace("    allow:", "    alow:"), "spec.egress.alow: unknown field"),
        (with("  maxConcurrency: 8", EGRESS).replace("    proxy: mango-egress.mango.svc:3128\n", ""), "spec.egress.proxy: is required when spec.egress.allow is set"),
        (with("  maxConcurrency: 8", EGRESS).replace("http://mango-api.mango.svc.cluster.local:8080", "http://:8080"), "spec.sandboxApiUrl: the sandboxes' api URL \"http://:8080\" has no host"),
        (format!("{POOL}---\n{POOL}"), "not one YAML document"),
        ("spec: [".to_string(), "not one YAML document"),
        ("- a\n".to_string(), "not a WorkerPool"),
    ];
    for (text, want) in cases {
        let err = render(&text, &options(SampleType::Session)).unwrap_err();
        assert!(err.starts_with(want), "want {want:?}, got {err:?}");
        assert!(!err.contains('\n'), "one line: {err:?}");
    }
    // The edges that pass.
    for text in [
        with("  name: builders", &format!("  name: {name63}")),
        with("  maxConcurrency: 8", "  maxConcurrency: 1000"),
        with("  maxConcurrency: 8", "  startTimeoutSeconds: 5"),
        with("  maxConcurrency: 8", "  activeDeadlineSeconds: 2147483647"),
    ] {
        render(&text, &options(SampleType::Session)).unwrap();
    }
}

#[test]
fn a_pool_read_back_from_the_cluster_renders_with_its_uid() {
    let text = with(
        "  namespace: sandboxes\n",
        "  namespace: sandboxes\n  uid: 6f1c2d9e-1111-2222-3333-444455556666\n  resourceVersion: \"42\"\n  managedFields: []\n",
    ) + "status:\n  liveItems: 2\n  conditions: []\n";
    let yaml = render(&text, &options(SampleType::Session)).unwrap();
    assert!(!yaml.contains("uid is the pool's"));
    let docs = documents(&yaml);
    assert_eq!(
        docs[1]["metadata"]["ownerReferences"][0]["uid"],
        "6f1c2d9e-1111-2222-3333-444455556666"
    );
}
