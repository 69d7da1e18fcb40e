//! Metadata maps: string → string, at most 16 keys, key ≤ 64 and value ≤ 512 characters.

use crate::error::ApiError;
use mango_protocol::ErrorCode;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub const MAX_KEYS: usize = 16;
pub const MAX_KEY_CHARS: usize = 64;
pub const MAX_VALUE_CHARS: usize = 512;

fn invalid(message: String) -> ApiError {
    ApiError::bad_request(message).code(ErrorCode::InvalidMetadata)
}

fn check_entry(key: &str, value: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(invalid("metadata keys must not be empty".into()));
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(invalid(format!(
            "metadata key {key:?} is longer than {MAX_KEY_CHARS} characters"
        )));
    }
    if value.chars().count() > MAX_VALUE_CHARS {
        return Err(invalid(format!(
            "metadata value for {key:?} is longer than {MAX_VALUE_CHARS} characters"
        )));
    }
    Ok(())
}

fn check_count(map: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if map.len() > MAX_KEYS {
        return Err(invalid(format!(
            "metadata has {} keys; at most {MAX_KEYS} are allowed",
            map.len()
        )));
    }
    Ok(())
}

/// A complete metadata map, as given on create.
pub fn validate(value: Option<&Map<String, Value>>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (k, v) in value.into_iter().flatten() {
        let Value::String(s) = v else {
            return Err(invalid(format!(
                "metadata value for {k:?} must be a string"
            )));
        };
        check_entry(k, s)?;
        out.insert(k.clone(), s.clone());
    }
    check_count(&out)?;
    Ok(out)
}

/// Applies a patch: a string upserts, null deletes (and so does "" when `empty_deletes`).
pub fn merge(
    current: &BTreeMap<String, String>,
    patch: &Map<String, Value>,
    empty_deletes: bool,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = current.clone();
    for (k, v) in patch {
        match v {
            Value::Null => {
                out.remove(k);
            }
            Value::String(s) if empty_deletes && s.is_empty() => {
                out.remove(k);
            }
            Value::String(s) => {
                check_entry(k, s)?;
                out.insert(k.clone(), s.clone());
            }
            _ => {
                return Err(invalid(format!(
                    "metadata value for {k:?} must be a string or null"
                )))
            }
        }
    }
    check_count(&out)?;
    Ok(out)
}

pub fn to_json(map: &BTreeMap<String, String>) -> Value {
    serde_json::to_value(map).expect("a string map serializes")
}

pub fn from_json(value: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(value.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(n: usize) -> Map<String, Value> {
        (0..n).map(|i| (format!("k{i}"), json!("v"))).collect()
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().expect("an object").clone()
    }

    #[test]
    fn limits_hold_at_their_edges() {
        assert!(validate(Some(&keys(16))).is_ok());
        assert!(validate(Some(&keys(17))).is_err());
        let k64 = "k".repeat(64);
        let k65 = "k".repeat(65);
        assert!(validate(Some(&map(json!({ k64: "v" })))).is_ok());
        assert!(validate(Some(&map(json!({ k65: "v" })))).is_err());
        assert!(
            validate(Some(&map(json!({"k": "é".repeat(512)})))).is_ok(),
            "counted in characters"
        );
        assert!(validate(Some(&map(json!({"k": "v".repeat(513)})))).is_err());
        assert!(validate(Some(&map(json!({"k": 1})))).is_err());
        assert!(validate(Some(&map(json!({"": "v"})))).is_err());
    }

    #[test]
    fn merge_upserts_deletes_and_counts_the_result() {
        let base = validate(Some(&keys(16))).unwrap();
        let patch = json!({"k0": null, "new": "x"});
        let merged = merge(&base, &map(patch), false).unwrap();
        assert_eq!(merged.len(), 16);
        assert_eq!(merged["new"], "x");
        assert!(!merged.contains_key("k0"));
        let over = json!({"another": "x"});
        assert!(merge(&base, &map(over), false).is_err());
        let empty = json!({"k1": ""});
        assert_eq!(merge(&base, &map(empty.clone()), true).unwrap().len(), 15);
        assert_eq!(merge(&base, &map(empty), false).unwrap()["k1"], "");
    }
}
