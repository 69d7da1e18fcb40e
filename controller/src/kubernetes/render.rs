//! `mango-worker kubernetes render`: a dry run of one WorkerPool, needing
//! no cluster. The pool file is refused where the cluster (the CRD's
//! schema, strict field validation) or the operator (`pod::validate`, the
//! api URL) would refuse it; otherwise the PVC, the Pod and the Event the
//! controller would make for a sample item are printed as YAML, built by
//! the launcher's and the observer's own functions.

use crate::core::launcher::{ItemIdentity, Sandbox, SandboxSpec};
use crate::core::observer::Happening;
use crate::kubernetes::crd::WorkerPool;
use crate::kubernetes::events;
use crate::kubernetes::launcher::{pod_manifest, pvc_manifest};
use crate::kubernetes::operator::{self, FIELD_MANAGER};
use crate::kubernetes::pod;
use crate::kubernetes::validation;
use kube::runtime::events::Reporter;
use kube::{CustomResourceExt, Resource, ResourceExt};
use mango_protocol::WorkType;
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;

/// The sample item's ids: shaped as the api's (`work_` and 24 characters).
pub const SAMPLE_WORK_ID: &str = "work_sample000000000000000000";
pub const SAMPLE_SESSION_ID: &str = "sesn_sample000000000000000000";
const SAMPLE_CLAIM: i64 = 1;

#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    /// The WorkerPool's YAML (one document, as `kubectl apply -f` takes it).
    #[arg(long)]
    pub pool: PathBuf,
    /// The namespace when the pool names none (the controller's own).
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The api URL for a pool whose `spec.apiUrl` is empty, as the operator's flag.
    #[arg(long, env = "MANGO_DEFAULT_API_URL")]
    pub default_api_url: Option<String>,
    /// The api URL sandboxes use for a pool that names neither
    /// `spec.sandboxApiUrl` nor `spec.apiUrl`, as the operator's flag.
    #[arg(long, env = "MANGO_DEFAULT_SANDBOX_API_URL")]
    pub default_sandbox_api_url: Option<String>,
    /// The sandbox image for a pool whose `spec.image` is empty, as the operator's flag.
    #[arg(long, env = "MANGO_DEFAULT_SANDBOX_IMAGE", default_value = concat!("mango-sandbox:", env!("CARGO_PKG_VERSION")))]
    pub default_sandbox_image: String,
    /// The sample item's type: `session` (a PVC, then its Pod) or `healthcheck` (a Pod).
    #[arg(long, value_enum, default_value = "session")]
    pub work_type: SampleType,
    /// The controller replica named in the Event.
    #[arg(long, default_value = "mango-controller-0")]
    pub identity: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleType {
    Session,
    Healthcheck,
}

/// What the dry run needs besides the pool file.
#[derive(Debug, Clone)]
pub struct Options {
    pub namespace: String,
    pub default_api_url: Option<String>,
    pub default_sandbox_api_url: Option<String>,
    pub default_sandbox_image: String,
    pub work_type: SampleType,
    pub identity: String,
    pub now: jiff::Timestamp,
}

/// Prints the rendering on stdout, or one line on stderr saying what is wrong.
pub fn run(args: RenderArgs) -> ExitCode {
    let shown = args.pool.display().to_string();
    let text = match std::fs::read_to_string(&args.pool) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("mango-worker kubernetes render: cannot read {shown}: {err}");
            return ExitCode::from(2);
        }
    };
    let options = Options {
        namespace: args.namespace,
        default_api_url: args.default_api_url,
        default_sandbox_api_url: args.default_sandbox_api_url,
        default_sandbox_image: args.default_sandbox_image,
        work_type: args.work_type,
        identity: args.identity,
        now: jiff::Timestamp::now(),
    };
    match render(&text, &options) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("mango-worker kubernetes render: {shown}: {err}");
            ExitCode::from(2)
        }
    }
}

/// The pool of `text`, checked as the cluster and the operator check it.
pub fn parse_pool(text: &str, default_namespace: &str) -> Result<WorkerPool, String> {
    let value: Value = serde_yaml::from_str(text).map_err(|e| {
        format!("not one YAML document: {e}")
            .lines()
            .collect::<Vec<_>>()
            .join(" ")
    })?;
    if !value.is_object() {
        return Err("not a WorkerPool: the document is no mapping".into());
    }
    let api_version = WorkerPool::api_version(&());
    if value["apiVersion"] != api_version.as_ref() {
        return Err(format!(
            "apiVersion: must be {api_version} (it is {})",
            value["apiVersion"]
        ));
    }
    if value["kind"] != "WorkerPool" {
        return Err(format!(
            "kind: must be WorkerPool (it is {})",
            value["kind"]
        ));
    }
    check_metadata(&value["metadata"])?;
    let crd = serde_json::to_value(WorkerPool::crd()).expect("the CRD serializes");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    check_schema(&value, schema, "")?;
    let mut pool: WorkerPool = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        }
    })?;
    if pool.metadata.namespace.is_none() {
        pool.metadata.namespace = Some(default_namespace.to_string());
    }
    pod::validate(&pool).map_err(|e| e.to_string())?;
    Ok(pool)
}

/// The object metadata the API server checks before any schema.
fn check_metadata(metadata: &Value) -> Result<(), String> {
    let name = metadata["name"]
        .as_str()
        .ok_or("metadata.name: required (the pool's name)")?;
    validation::dns1123_subdomain(name).map_err(|e| format!("metadata.name: {e}"))?;
    if let Some(namespace) = metadata.get("namespace") {
        let namespace = namespace
            .as_str()
            .ok_or("metadata.namespace: must be a string")?;
        validation::dns1123_label(namespace).map_err(|e| format!("metadata.namespace: {e}"))?;
    }
    for (field, map) in [
        ("labels", &metadata["labels"]),
        ("annotations", &metadata["annotations"]),
    ] {
        if map.is_null() {
            continue;
        }
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_value(map.clone())
                .map_err(|_| format!("metadata.{field}: must map strings to strings"))?;
        if field == "labels" {
            validation::labels(&map)
                .map_err(|e| format!("metadata.labels[{}]: {}", e.key, e.problem))?;
        } else {
            validation::annotations(&map).map_err(|e| format!("metadata.annotations: {e}"))?;
        }
    }
    Ok(())
}

/// The CRD's structural schema as the apiextensions-apiserver applies it
/// under strict field validation (`kubectl apply`'s default): an unknown
/// field is refused, not pruned, and numbers and strings stay within their
/// bounds. Types and enums are the deserialization's to refuse.
fn check_schema(value: &Value, schema: &Value, path: &str) -> Result<(), String> {
    let at = |child: &str| {
        if path.is_empty() {
            child.to_string()
        } else {
            format!("{path}.{child}")
        }
    };
    match value {
        Value::Object(map) => {
            if schema["x-kubernetes-preserve-unknown-fields"] == true {
                return Ok(());
            }
            let properties = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(sub), _) => check_schema(child, sub, &at(key))?,
                    (None, Some(sub)) => check_schema(child, sub, &format!("{path}[{key}]"))?,
                    (None, None) if properties.is_some() => {
                        return Err(format!(
                            "{}: unknown field (the WorkerPool schema has no such field)",
                            at(key)
                        ))
                    }
                    (None, None) => {}
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_schema(item, &schema["items"], &format!("{path}[{i}]"))?;
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or_default();
            if let Some(min) = schema["minimum"].as_f64().filter(|min| n < *min) {
                return Err(format!("{path}: must be at least {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64().filter(|max| n > *max) {
                return Err(format!("{path}: must be at most {max}"));
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64().filter(|min| chars < *min) {
                return Err(format!("{path}: must have at least {min} characters"));
            }
            if let Some(max) = schema["maxLength"].as_u64().filter(|max| chars > *max) {
                return Err(format!("{path}: must have at most {max} characters"));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The sample item of `pool`'s Environment.
pub fn sample_item(pool: &WorkerPool, work_type: SampleType) -> ItemIdentity {
    let session = work_type == SampleType::Session;
    ItemIdentity {
        work_id: SAMPLE_WORK_ID.into(),
        claim: SAMPLE_CLAIM,
        environment_id: pool.spec.environment_id.clone(),
        work_type: if session {
            WorkType::Session
        } else {
            WorkType::Healthcheck
        },
        session_id: session.then(|| SAMPLE_SESSION_ID.to_string()),
    }
}

/// The pool of `text` and, as YAML documents, the PVC (Session Work only),
/// the Pod and the `SandboxStarted` Event the controller would make for
/// its sample item.
pub fn render(text: &str, options: &Options) -> Result<String, String> {
    let pool = parse_pool(text, &options.namespace)?;
    let api = operator::api_url(&pool, options.default_api_url.as_deref()).map_err(|p| {
        format!(
            "{} (the operator refuses the pool: {})",
            p.message(),
            p.reason()
        )
    })?;
    let sandbox_api =
        operator::sandbox_api_url(&pool, options.default_sandbox_api_url.as_deref(), &api);
    pod::egress_routing(&pool, &sandbox_api)
        .map_err(|e| format!("{e} (the operator refuses the pool: InvalidSpec)"))?;
    let item = sample_item(&pool, options.work_type);
    let spec = SandboxSpec::for_item(&item, &pool.name_any(), &sandbox_api);
    let refused = |e: crate::core::launcher::LaunchError| e.to_string();
    let mut out = format!(
        "# mango-worker kubernetes render: what the controller creates for one {} item of WorkerPool {} (a dry run).\n",
        item.work_type.as_str(),
        pool.name_any()
    );
    if pool.uid().is_none() {
        out.push_str(
            "# The ownerReference's uid is the pool's, which the cluster assigns: empty here.\n",
        );
    }
    if let Some(session) = &item.session_id {
        out.push_str("---\n");
        out.push_str(&yaml(&pvc_manifest(&pool, session).map_err(refused)?));
    }
    out.push_str("---\n");
    out.push_str(&yaml(
        &pod_manifest(&pool, &spec, &options.default_sandbox_image).map_err(refused)?,
    ));
    let sandbox = Sandbox {
        name: spec.name.clone(),
        handle: spec.name.clone(),
        item: item.clone(),
    };
    if let Some((type_, reason, action, note, related)) =
        events::describe(Happening::Launched(&sandbox), pool.namespace())
    {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(options.identity.clone()),
        };
        let event = events::event(type_, reason, action, &note, related);
        out.push_str("---\n");
        out.push_str(&yaml(&events::event_object(
            &pool.object_ref(&()),
            &reporter,
            &event,
            options.now,
        )));
    }
    Ok(out)
}

fn yaml<T: k8s_openapi::Resource + serde::Serialize>(object: &T) -> String {
    // k8s-openapi leaves apiVersion and kind to the request: a manifest names them.
    let mut value = serde_json::to_value(object).expect("a Kubernetes object serializes");
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), T::API_VERSION.into());
        map.insert("kind".into(), T::KIND.into());
    }
    serde_yaml::to_string(&value).expect("JSON serializes as YAML")
}

#[cfg(test)]
mod tests;
