//! Custom resources as the apiextensions-apiserver admits them: fields the
//! structural schema does not name are pruned, and the rest is checked
//! against it (type, required, nullable, enum, minimum/maximum,
//! minLength/maxLength, minItems/maxItems). After
//! apiextensions-apiserver/pkg/apiserver/schema/pruning and
//! kube-openapi/pkg/validation/validate, with their messages. The
//! WorkerPool schema is the one in `crds/`, as `helm install` applies it.

use super::errors::FieldError;
use serde_json::{json, Map, Value};

pub(crate) const WORKER_POOL_CRD: &str = include_str!("../../../crds/workerpool.yaml");

pub struct Schemas {
    worker_pool: Value,
}

impl Schemas {
    pub fn builtin() -> Schemas {
        let crd: Value =
            serde_yaml::from_str(WORKER_POOL_CRD).expect("crds/workerpool.yaml parses");
        let worker_pool = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        Schemas { worker_pool }
    }

    /// The schema of a custom kind, if it has one.
    pub fn of(&self, kind: &str) -> Option<&Value> {
        (kind == "WorkerPool").then_some(&self.worker_pool)
    }
}

/// Drops what the schema does not name (`apiVersion`, `kind` and
/// `metadata` are always kept); returns the pruned paths, for warnings.
pub fn prune(object: &mut Value, schema: &Value) -> Vec<String> {
    let mut pruned = Vec::new();
    if let Some(map) = object.as_object_mut() {
        let properties = schema["properties"].as_object();
        map.retain(|key, value| {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                return true;
            }
            match properties.and_then(|p| p.get(key)) {
                Some(child) => {
                    pruned.extend(prune_inner(value, child, key));
                    true
                }
                None => {
                    pruned.push(key.clone());
                    false
                }
            }
        });
    }
    pruned
}

fn prune_inner(value: &mut Value, schema: &Value, path: &str) -> Vec<String> {
    let mut pruned = Vec::new();
    if schema["x-kubernetes-preserve-unknown-fields"] == json!(true) {
        return pruned;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema["properties"].as_object() {
                map.retain(|key, child| match properties.get(key) {
                    Some(s) => {
                        pruned.extend(prune_inner(child, s, &format!("{path}.{key}")));
                        true
                    }
                    None => {
                        pruned.push(format!("{path}.{key}"));
                        false
                    }
                });
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (key, child) in map.iter_mut() {
                    pruned.extend(prune_inner(child, additional, &format!("{path}[{key}]")));
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    pruned.extend(prune_inner(item, item_schema, &format!("{path}[{i}]")));
                }
            }
        }
        _ => {}
    }
    pruned
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every violation of `schema` in `object`, with the validator's wording.
pub fn validate(object: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (key, child) in properties {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(value) = object.get(key) {
                check(value, child, key, &mut errs);
            }
        }
    }
    required(object, schema, "", &mut errs);
    errs
}

fn required(object: &Value, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    for key in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if object.get(key).is_none() {
            let field = if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            };
            errs.push(FieldError::required(&field, ""));
        }
    }
}

fn check(value: &Value, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if value.is_null() {
        if schema["nullable"] != json!(true) {
            errs.push(FieldError::type_invalid(
                path,
                Value::Null,
                &format!(
                    "{path} in body must be of type {}",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        if !(value.is_string() || type_name(value) == "integer") {
            errs.push(FieldError::type_invalid(
                path,
                value.clone(),
                &format!(
                    "{path} in body must be of type integer,string: \"{}\"",
                    type_name(value)
                ),
            ));
        }
        return;
    }
    if let Some(expected) = schema["type"].as_str() {
        let actual = type_name(value);
        let fits = actual == expected || (expected == "number" && actual == "integer");
        if !fits {
            errs.push(FieldError::type_invalid(
                path,
                value.clone(),
                &format!("{path} in body must be of type {expected}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(value) {
            let supported: Vec<String> = options
                .iter()
                .map(|o| {
                    o.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| o.to_string())
                })
                .collect();
            let supported: Vec<&str> = supported.iter().map(String::as_str).collect();
            errs.push(FieldError::not_supported(path, value.clone(), &supported));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64() {
            if n < min {
                errs.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!(
                        "{path} in body should be greater than or equal to {}",
                        fmt_number(min)
                    ),
                ));
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            if n > max {
                errs.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!(
                        "{path} in body should be less than or equal to {}",
                        fmt_number(max)
                    ),
                ));
            }
        }
        // The integer formats bound what the value may be.
        let bounds = match schema["format"].as_str() {
            Some("int32") => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
            Some("uint32") => Some((0.0, f64::from(u32::MAX))),
            _ => None,
        };
        if let Some((lo, hi)) = bounds {
            if n < lo || n > hi {
                errs.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!(
                        "{path} in body must be of type {}",
                        schema["format"].as_str().unwrap_or_default()
                    ),
                ));
            }
        }
    }
    if let Some(text) = value.as_str() {
        let chars = text.chars().count() as u64;
        if let Some(max) = schema["maxLength"].as_u64() {
            if chars > max {
                errs.push(FieldError::too_long(path, max as usize, "characters"));
            }
        }
        if let Some(min) = schema["minLength"].as_u64() {
            if chars < min {
                errs.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
        }
    }
    match value {
        Value::Object(map) => {
            let properties: Option<&Map<String, Value>> = schema["properties"].as_object();
            for (key, child) in map {
                let child_path = format!("{path}.{key}");
                if let Some(s) = properties.and_then(|p| p.get(key)) {
                    check(child, s, &child_path, errs);
                } else if let Some(additional) =
                    schema.get("additionalProperties").filter(|a| a.is_object())
                {
                    check(child, additional, &format!("{path}[{key}]"), errs);
                }
            }
            required(value, schema, path, errs);
        }
        Value::Array(items) => {
            if let Some(max) = schema["maxItems"].as_u64() {
                if items.len() as u64 > max {
                    errs.push(FieldError::too_long(path, max as usize, "items"));
                }
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item, item_schema, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn fmt_number(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(spec: Value) -> Value {
        json!({"apiVersion": "mango.dev/v1alpha1", "kind": "WorkerPool",
               "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn the_worker_pool_schema_bounds_and_prunes() {
        let schemas = Schemas::builtin();
        let schema = schemas.of("WorkerPool").unwrap();
        let good = pool(json!({"environmentId": "env_1",
            "environmentKeySecret": {"name": "k"}, "maxConcurrency": 1000}));
        assert!(
            validate(&good, schema).is_empty(),
            "{:?}",
            validate(&good, schema)
        );
        let too_many = pool(json!({"environmentId": "env_1",
            "environmentKeySecret": {"name": "k"}, "maxConcurrency": 1001}));
        let errs = validate(&too_many, schema);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.maxConcurrency");
        let missing = pool(json!({"environmentKeySecret": {"name": "k"}}));
        assert!(validate(&missing, schema)
            .iter()
            .any(|e| e.field == "spec.environmentId" && e.reason == "FieldValueRequired"));
        let mut unknown = good.clone();
        unknown["spec"]["bogus"] = json!(1);
        assert_eq!(prune(&mut unknown, schema), vec!["spec.bogus".to_string()]);
        assert_eq!(unknown, good);
    }
}
