//! Validation and create-time preparation of the other kinds served:
//! PVCs (pkg/apis/core/validation `ValidatePersistentVolumeClaim*`, the
//! StorageObjectInUseProtection admission plugin's finalizer), Secrets
//! (`ValidateSecret*`, `stringData` folded into `data` as the v1
//! conversion does), Leases (pkg/apis/coordination/validation), Events
//! (pkg/apis/core/validation/events.go; its errors name the internal
//! fields `involvedObject` and `message`), Namespaces.

use super::errors::FieldError;
use super::names;
use super::quantity;
use base64::Engine;
use serde_json::{json, Value};

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const SECRET_MAX: usize = 1024 * 1024;
/// `ReportingInstanceLengthLimit`, `ActionLengthLimit`, `ReasonLengthLimit`.
const EVENT_FIELD_MAX: usize = 128;
/// `NoteLengthLimit`: bytes (Go's `len`), not characters.
pub const EVENT_NOTE_MAX: usize = 1024;

pub fn prepare_pvc(pvc: &mut Value) {
    if let Some(spec) = pvc["spec"].as_object_mut() {
        spec.entry("volumeMode").or_insert(json!("Filesystem"));
    }
    pvc["status"] = json!({"phase": "Pending"});
    let finalizers = pvc["metadata"]
        .as_object_mut()
        .expect("metadata")
        .entry("finalizers")
        .or_insert_with(|| json!([]));
    if let Some(list) = finalizers.as_array_mut() {
        if !list.iter().any(|f| f == PVC_PROTECTION) {
            list.push(json!(PVC_PROTECTION));
        }
    }
}

pub fn pvc_decode_error(pvc: &Value) -> Option<String> {
    pvc["spec"]["resources"]["requests"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .find_map(|q| quantity::of_json(q).err())
        .map(|e| {
            format!("PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: {e}")
        })
}

pub fn validate_pvc(pvc: &Value) -> Vec<FieldError> {
    let spec = &pvc["spec"];
    let mut errs = Vec::new();
    let modes: Vec<&str> = spec["accessModes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if modes.is_empty() {
        errs.push(FieldError::required(
            "spec.accessModes",
            "at least 1 access mode is required",
        ));
    }
    for mode in &modes {
        if !ACCESS_MODES.contains(mode) {
            errs.push(FieldError::not_supported(
                "spec.accessModes",
                json!(mode),
                &ACCESS_MODES,
            ));
        }
    }
    if modes.contains(&"ReadWriteOncePod") && modes.len() > 1 {
        errs.push(FieldError::forbidden(
            "spec.accessModes",
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    match spec["resources"]["requests"].get("storage") {
        None => errs.push(FieldError::required("spec.resources[storage]", "")),
        Some(q) => {
            if quantity::of_json(q).is_ok_and(|v| v <= 0.0) {
                errs.push(FieldError::invalid(
                    "spec.resources[storage]",
                    q.clone(),
                    "must be greater than zero".into(),
                ));
            }
        }
    }
    if let Some(mode) = spec["volumeMode"].as_str() {
        if !["Block", "Filesystem"].contains(&mode) {
            errs.push(FieldError::not_supported(
                "spec.volumeMode",
                json!(mode),
                &["Block", "Filesystem"],
            ));
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        for msg in names::dns1123_subdomain(class) {
            errs.push(FieldError::invalid(
                "spec.storageClassName",
                json!(class),
                msg,
            ));
        }
    }
    errs
}

/// A claim's spec is fixed once made, but for its requests (expansion).
pub fn validate_pvc_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let strip = |pvc: &Value| {
        let mut spec = pvc["spec"].clone();
        if let Some(resources) = spec.get_mut("resources").and_then(Value::as_object_mut) {
            resources.remove("requests");
        }
        spec
    };
    if strip(old) != strip(new) {
        return vec![FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        )];
    }
    Vec::new()
}

/// `stringData` is write-only: folded into `data` (it wins), never stored.
pub fn prepare_secret(secret: &mut Value) -> Result<(), String> {
    if let Some(map) = secret.as_object_mut() {
        map.entry("type").or_insert(json!("Opaque"));
        if let Some(Value::Object(strings)) = map.remove("stringData") {
            let data = map.entry("data").or_insert_with(|| json!({}));
            for (k, v) in strings {
                let text = v.as_str().unwrap_or_default();
                data[k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
            }
        }
    }
    for v in secret["data"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let text = v.as_str().unwrap_or_default();
        if let Err(err) = base64::engine::general_purpose::STANDARD.decode(text) {
            return Err(format!(
                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data: {err}"
            ));
        }
    }
    Ok(())
}

pub fn validate_secret(secret: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (key, value) in secret["data"].as_object().into_iter().flatten() {
        for msg in names::config_map_key(key) {
            errs.push(FieldError::invalid(
                &format!("data[{key}]"),
                json!(key),
                msg,
            ));
        }
        total += base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .map_or(0, |b| b.len());
    }
    if total > SECRET_MAX {
        errs.push(FieldError::too_long("data", SECRET_MAX, "bytes"));
    }
    errs
}

pub fn validate_secret_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if old["type"] != new["type"] {
        errs.push(FieldError::invalid(
            "type",
            new["type"].clone(),
            "field is immutable".into(),
        ));
    }
    if old["immutable"] == json!(true) {
        if old["data"] != new["data"] {
            errs.push(FieldError::forbidden(
                "data",
                "field is immutable when `immutable` is set",
            ));
        }
        if new["immutable"] != json!(true) {
            errs.push(FieldError::forbidden(
                "immutable",
                "field is immutable when `immutable` is set",
            ));
        }
    }
    errs
}

/// `metav1.MicroTime` decodes only with six fractional digits
/// (`RFC3339Micro`): anything else fails decoding, a 400.
pub fn is_micro_time(text: &str) -> bool {
    let Some((date_time, frac_zone)) = text.split_once('.') else {
        return false;
    };
    let digits: String = frac_zone.chars().take_while(char::is_ascii_digit).collect();
    let zone = &frac_zone[digits.len()..];
    digits.len() == 6
        && date_time.len() == 19
        && (zone == "Z" || (zone.len() == 6 && (zone.starts_with('+') || zone.starts_with('-'))))
        && jiff::Timestamp::strptime("%Y-%m-%dT%H:%M:%S%.f%:z", text.replace('Z', "+00:00")).is_ok()
}

fn micro_time_error(kind: &str, field: &str, value: &Value) -> Option<String> {
    let text = value.as_str()?;
    (!is_micro_time(text)).then(|| {
        format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: parsing time \"{text}\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse ({field})"
        )
    })
}

pub fn lease_decode_error(lease: &Value) -> Option<String> {
    ["acquireTime", "renewTime"]
        .iter()
        .find_map(|f| micro_time_error("Lease", f, &lease["spec"][*f]))
}

pub fn validate_lease(lease: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = &lease["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64() {
        if d <= 0 {
            errs.push(FieldError::invalid(
                "spec.leaseDurationSeconds",
                json!(d),
                "must be greater than 0".into(),
            ));
        }
    }
    if let Some(t) = spec["leaseTransitions"].as_i64() {
        if t < 0 {
            errs.push(FieldError::invalid(
                "spec.leaseTransitions",
                json!(t),
                "must be greater than or equal to 0".into(),
            ));
        }
    }
    errs
}

pub fn event_decode_error(event: &Value) -> Option<String> {
    micro_time_error("Event", "eventTime", &event["eventTime"]).or_else(|| {
        micro_time_error(
            "Event",
            "series.lastObservedTime",
            &event["series"]["lastObservedTime"],
        )
    })
}

fn bounded(errs: &mut Vec<FieldError>, event: &Value, field: &str, internal: &str, max: usize) {
    let text = event[field].as_str().unwrap_or_default();
    if text.is_empty() {
        if field != "note" {
            errs.push(FieldError::required(internal, ""));
        }
    } else if text.len() > max {
        errs.push(FieldError::invalid(
            internal,
            json!(""),
            format!("can have at most {max} characters"),
        ));
    }
}

/// `ValidateEventCreate` for events.k8s.io/v1.
pub fn validate_event(event: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let namespace = event["metadata"]["namespace"].as_str().unwrap_or_default();
    if event["eventTime"].as_str().is_none() {
        errs.push(FieldError::required("eventTime", ""));
    }
    let regarding_ns = event["regarding"]["namespace"].as_str().unwrap_or_default();
    if regarding_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
        errs.push(FieldError::invalid(
            "involvedObject.namespace",
            json!(regarding_ns),
            "does not match event.namespace".into(),
        ));
    }
    let controller = event["reportingController"].as_str().unwrap_or_default();
    if controller.is_empty() {
        errs.push(FieldError::required("reportingController", ""));
    } else {
        for msg in names::qualified_name(controller) {
            errs.push(FieldError::invalid(
                "reportingController",
                json!(controller),
                msg,
            ));
        }
    }
    bounded(
        &mut errs,
        event,
        "reportingInstance",
        "reportingInstance",
        EVENT_FIELD_MAX,
    );
    bounded(&mut errs, event, "action", "action", EVENT_FIELD_MAX);
    bounded(&mut errs, event, "reason", "reason", EVENT_FIELD_MAX);
    bounded(&mut errs, event, "note", "message", EVENT_NOTE_MAX);
    match event["type"].as_str() {
        Some("Normal" | "Warning") => {}
        other => errs.push(FieldError::invalid(
            "type",
            json!(""),
            format!("has invalid value: {}", other.unwrap_or_default()),
        )),
    }
    if let Some(series) = event.get("series").filter(|s| !s.is_null()) {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errs.push(FieldError::invalid(
                "series.count",
                json!(""),
                "should be at least 2".into(),
            ));
        }
        if series["lastObservedTime"].as_str().is_none() {
            errs.push(FieldError::required("series.lastObservedTime", ""));
        }
    }
    for deprecated in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
    ] {
        if event.get(deprecated).is_some_and(|v| !v.is_null()) {
            errs.push(FieldError::invalid(
                deprecated,
                json!(""),
                "needs to be unset".into(),
            ));
        }
    }
    errs
}

/// `ValidateEventUpdate`: only the series (and metadata) may change.
pub fn validate_event_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (field, internal) in [
        ("regarding", "involvedObject"),
        ("reason", "reason"),
        ("note", "message"),
        ("type", "type"),
        ("eventTime", "eventTime"),
        ("action", "action"),
        ("related", "related"),
        ("reportingController", "reportingController"),
        ("reportingInstance", "reportingInstance"),
    ] {
        if old[field] != new[field] {
            errs.push(FieldError::invalid(
                internal,
                new[field].clone(),
                "field is immutable".into(),
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_need_six_digits() {
        assert!(is_micro_time("2026-01-01T00:00:00.000000Z"));
        assert!(is_micro_time("2026-01-01T00:00:00.123456+02:00"));
        assert!(!is_micro_time("2026-01-01T00:00:00Z"));
        assert!(!is_micro_time("2026-01-01T00:00:00.123Z"));
        assert!(!is_micro_time("2026-01-01T00:00:00.123456789Z"));
    }

    #[test]
    fn event_notes_are_counted_in_bytes() {
        let event = |note: String| {
            json!({"metadata": {"namespace": "ns"}, "eventTime": "2026-01-01T00:00:00.000000Z",
               "regarding": {"namespace": "ns"}, "reportingController": "mango-controller",
               "reportingInstance": "r", "action": "Launch", "reason": "LaunchFailed",
               "type": "Warning", "note": note})
        };
        assert!(validate_event(&event("a".repeat(1024))).is_empty());
        assert_eq!(validate_event(&event("a".repeat(1025)))[0].field, "message");
        // 1,000 characters of two bytes each: 2,000 bytes.
        assert!(!validate_event(&event("é".repeat(1000))).is_empty());
    }

    #[test]
    fn secrets_fold_string_data() {
        let mut secret = json!({"stringData": {"k": "v"}});
        prepare_secret(&mut secret).unwrap();
        assert_eq!(secret, json!({"type": "Opaque", "data": {"k": "dg=="}}));
        assert!(prepare_secret(&mut json!({"data": {"k": "%%"}})).is_err());
    }
}
