//! The API server's rules for what the controller puts into objects and
//! requests: object names, label keys and values, annotations, label
//! selectors. They follow apimachinery's `util/validation` (and the
//! `api/validate/content` package it delegates to), so the controller
//! refuses a pool whose Pods the API server would refuse one by one (422),
//! or whose watch it would refuse (400).

use std::collections::BTreeMap;

/// A label value, and the name part of a label key, at most.
pub const LABEL_VALUE_MAX: usize = 63;
/// A DNS-1123 label (most object names of `core/v1` that are not subdomains).
pub const DNS1123_LABEL_MAX: usize = 63;
/// A DNS-1123 subdomain (Pod, PVC, Event and most other object names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// All of an object's annotations together (keys and values), in bytes.
pub const ANNOTATIONS_TOTAL_MAX: usize = 256 * 1024;

/// Alphanumeric at both ends, `-`, `_` and `.` inside: the shape of a
/// label value and of a label key's name part.
fn label_shaped(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// A label value: empty, or at most 63 characters of `[A-Za-z0-9_.-]`
/// that start and end alphanumeric.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > LABEL_VALUE_MAX {
        return Err(format!(
            "must be no more than {LABEL_VALUE_MAX} characters (it has {})",
            value.len()
        ));
    }
    if !value.is_empty() && !label_shaped(value) {
        return Err("a label value must be empty or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

/// A lowercase RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    if value.len() > DNS1123_LABEL_MAX {
        return Err(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters (it has {})",
            value.len()
        ));
    }
    let bytes = value.as_bytes();
    let ok = match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            lower_alnum(*first)
                && lower_alnum(*last)
                && bytes.iter().all(|b| lower_alnum(*b) || *b == b'-')
        }
        _ => false,
    };
    if !ok {
        return Err("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

fn lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// A lowercase RFC 1123 subdomain: dot-separated RFC 1123 labels, at most 253.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters (it has {})",
            value.len()
        ));
    }
    // Each part is a label in shape; only the whole is bounded by length.
    let ok = !value.is_empty()
        && value.split('.').all(|part| {
            let bytes = part.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    lower_alnum(*first)
                        && lower_alnum(*last)
                        && bytes.iter().all(|b| lower_alnum(*b) || *b == b'-')
                }
                _ => false,
            }
        });
    if !ok {
        return Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

/// A qualified name (a label or annotation key): `[prefix/]name`, the
/// prefix a DNS-1123 subdomain, the name at most 63 label-shaped characters.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => return Err(
            "a qualified name has at most one '/' (an optional DNS subdomain prefix, then a name)"
                .into(),
        ),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("the prefix part must be non-empty".into());
        }
        dns1123_subdomain(prefix).map_err(|e| format!("the prefix part {e}"))?;
    }
    if name.is_empty() {
        return Err("the name part must be non-empty".into());
    }
    if name.len() > LABEL_VALUE_MAX {
        return Err(format!(
            "the name part must be no more than {LABEL_VALUE_MAX} characters (it has {})",
            name.len()
        ));
    }
    if !label_shaped(name) {
        return Err("the name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

/// A label that the API server would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label {key}={value:?}: {problem}")]
pub struct InvalidLabel {
    pub key: String,
    pub value: String,
    pub problem: String,
}

/// Checks one label.
pub fn label(key: &str, value: &str) -> Result<(), InvalidLabel> {
    let invalid = |problem: String| InvalidLabel {
        key: key.to_string(),
        value: value.to_string(),
        problem,
    };
    qualified_name(key).map_err(|e| invalid(format!("the key is invalid: {e}")))?;
    label_value(value).map_err(|e| invalid(format!("the value is invalid: {e}")))
}

/// Checks every label of an object.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), InvalidLabel> {
    labels.iter().try_for_each(|(k, v)| label(k, v))
}

/// Checks annotations as the API server does: each key a qualified name
/// (compared lower-cased), all of them together at most 256 KiB.
pub fn annotations(annotations: &BTreeMap<String, String>) -> Result<(), String> {
    for key in annotations.keys() {
        qualified_name(&key.to_ascii_lowercase())
            .map_err(|e| format!("annotation key {key:?} is invalid: {e}"))?;
    }
    let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > ANNOTATIONS_TOTAL_MAX {
        return Err(format!(
            "the annotations are {total} bytes together; at most {ANNOTATIONS_TOTAL_MAX}"
        ));
    }
    Ok(())
}

/// An equality-based label selector (`k=v,k2=v2`) of valid labels only: the
/// API server refuses a list or watch whose selector does not parse (400).
pub fn selector(terms: &[(&str, &str)]) -> Result<String, InvalidLabel> {
    terms
        .iter()
        .map(|(k, v)| label(k, v).map(|()| format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()
        .map(|terms| terms.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_at_each_edge() {
        let max = "a".repeat(63);
        let over = "a".repeat(64);
        let edge_mid = format!("a{}b", "-_.".repeat(20));
        for (value, valid) in [
            ("", true),
            ("a", true),
            ("A", true),
            ("0", true),
            ("env_01HXYZ", true),
            ("a.b-c_d", true),
            (max.as_str(), true),
            (edge_mid.as_str(), true),
            (over.as_str(), false),
            ("-a", false),
            ("a-", false),
            ("_a", false),
            ("a_", false),
            (".a", false),
            ("a.", false),
            ("a b", false),
            ("a/b", false),
            ("a:b", false),
            ("é", false),
            ("a\n", false),
        ] {
            assert_eq!(label_value(value).is_ok(), valid, "{value:?}");
        }
        assert!(label_value(&over)
            .unwrap_err()
            .contains("no more than 63 characters (it has 64)"));
    }

    #[test]
    fn dns_labels_and_subdomains_at_each_edge() {
        let label63 = "a".repeat(63);
        let label64 = "a".repeat(64);
        for (value, valid) in [
            ("a", true),
            ("0", true),
            ("my-name", true),
            ("123-abc", true),
            (label63.as_str(), true),
            (label64.as_str(), false),
            ("", false),
            ("A", false),
            ("-a", false),
            ("a-", false),
            ("a_b", false),
            ("a.b", false),
        ] {
            assert_eq!(dns1123_label(value).is_ok(), valid, "label {value:?}");
        }
        // 4 × 63 + 3 dots = 255; 3 × 63 + 2 dots + 62 = 253.
        let sub253 = format!("{}.{}.{}.{}", label63, label63, label63, "a".repeat(61));
        let sub254 = format!("{}.{}.{}.{}", label63, label63, label63, "a".repeat(62));
        assert_eq!(sub253.len(), 253);
        for (value, valid) in [
            ("example.com", true),
            ("a", true),
            ("a.b.c", true),
            ("a-1.b-2", true),
            (sub253.as_str(), true),
            (sub254.as_str(), false),
            ("", false),
            ("a..b", false),
            (".a", false),
            ("a.", false),
            ("a.-b", false),
            ("A.b", false),
            ("a_b.c", false),
        ] {
            assert_eq!(
                dns1123_subdomain(value).is_ok(),
                valid,
                "subdomain {value:?}"
            );
        }
    }

    #[test]
    fn qualified_names_at_each_edge() {
        let name63 = "n".repeat(63);
        let name64 = "n".repeat(64);
        let long_prefix = format!("{}/x", "p".repeat(254));
        for (key, valid) in [
            ("team", true),
            ("Team_1.x-y", true),
            ("mango.dev/work-id", true),
            ("app.kubernetes.io/managed-by", true),
            (name63.as_str(), true),
            (name64.as_str(), false),
            ("", false),
            ("/x", false),
            ("mango.dev/", false),
            ("a/b/c", false),
            ("Mango.dev/x", false),
            ("mango_dev/x", false),
            (long_prefix.as_str(), false),
            ("-x", false),
            ("x-", false),
        ] {
            assert_eq!(qualified_name(key).is_ok(), valid, "{key:?}");
        }
    }

    #[test]
    fn annotations_are_keyed_by_qualified_names_and_bounded_together() {
        let ok = BTreeMap::from([("Note".to_string(), "x".to_string())]);
        annotations(&ok).expect("keys are compared lower-cased");
        let bad = BTreeMap::from([("a b".to_string(), "x".to_string())]);
        assert!(annotations(&bad).unwrap_err().contains("\"a b\""));
        let at_max = BTreeMap::from([("k".to_string(), "v".repeat(ANNOTATIONS_TOTAL_MAX - 1))]);
        annotations(&at_max).expect("256 KiB together is allowed");
        let over = BTreeMap::from([("k".to_string(), "v".repeat(ANNOTATIONS_TOTAL_MAX))]);
        assert!(annotations(&over).unwrap_err().contains("at most 262144"));
    }

    #[test]
    fn selectors_are_built_from_valid_labels_only() {
        assert_eq!(
            selector(&[
                ("app.kubernetes.io/managed-by", "mango-worker"),
                ("mango.dev/pool", "p")
            ]),
            Ok("app.kubernetes.io/managed-by=mango-worker,mango.dev/pool=p".to_string())
        );
        let long = "p".repeat(64);
        let err = selector(&[("mango.dev/pool", long.as_str())]).unwrap_err();
        assert_eq!(err.key, "mango.dev/pool");
        assert!(err.to_string().contains("no more than 63"), "{err}");
        assert!(
            selector(&[("mango.dev/pool", "a,b")]).is_err(),
            "a comma would split the selector"
        );
        assert!(selector(&[("mango.dev/pool", "a=b")]).is_err());
    }
}
