//! The apimachinery string rules: DNS-1123 labels and subdomains, qualified
//! names (label and annotation keys), label values, annotation size.
//! Each returns the messages upstream returns, so a refusal reads as a real
//! apiserver's. After k8s.io/apimachinery/pkg/util/validation/validation.go
//! and pkg/api/validation/objectmeta.go (our own code; the rules and their
//! wording are theirs).

use super::errors::FieldError;
use serde_json::{Map, Value};

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const QUALIFIED_NAME_MAX: usize = 63;
pub const LABEL_VALUE_MAX: usize = 63;
/// `TotalAnnotationSizeLimitB` in objectmeta.go: keys and values together.
pub const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

fn regex_error(what: &str, fmt: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}'")).collect();
    format!(
        "{what} (e.g. {}, regex used for validation is '{fmt}')",
        examples.join(",  or ")
    )
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// `IsDNS1123Label`: lowercase alphanumerics and '-', at most 63.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !matches_dns1123_label(value) {
        errs.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

/// `IsDNS1123Subdomain`: dot-separated labels, at most 253 in all.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if value.is_empty() || !value.split('.').all(matches_dns1123_label) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

fn matches_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// `IsQualifiedName`: an optional DNS subdomain prefix and '/', then a
/// name of at most 63 characters. Label and annotation keys are these.
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX)));
    }
    if !name.is_empty() && !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"],
            )
        ));
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 of the qualified-name characters.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(max_len_error(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !matches_qualified_name_part(value) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `ValidateLabels` (apimachinery's metav1 validation): every key a
/// qualified name, every value a label value; the field is the map's.
pub fn validate_labels(labels: &Map<String, Value>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (key, value) in labels {
        for msg in qualified_name(key) {
            errs.push(FieldError::invalid(path, Value::String(key.clone()), msg));
        }
        match value.as_str() {
            Some(v) => {
                for msg in label_value(v) {
                    errs.push(FieldError::invalid(path, Value::String(v.into()), msg));
                }
            }
            None => errs.push(FieldError::invalid(
                &format!("{path}[{key}]"),
                value.clone(),
                "must be a string".into(),
            )),
        }
    }
    errs
}

/// `ValidateAnnotations`: keys are qualified names (checked lowercased),
/// and keys with values total at most 256 KiB.
pub fn validate_annotations(annotations: &Map<String, Value>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (key, value) in annotations {
        for msg in qualified_name(&key.to_lowercase()) {
            errs.push(FieldError::invalid(path, Value::String(key.clone()), msg));
        }
        total += key.len() + value.as_str().map_or(0, str::len);
    }
    if total > TOTAL_ANNOTATION_SIZE {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE, "bytes"));
    }
    errs
}

/// `IsValidUserID` / `IsValidGroupID`: 0 to 2^31-1.
pub fn id_range(value: i64) -> Option<String> {
    (!(0..=i64::from(i32::MAX)).contains(&value)).then(|| inclusive_range(0, i64::from(i32::MAX)))
}

/// `InclusiveRangeError`.
pub fn inclusive_range(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// `IsConfigMapKey`: Secret and ConfigMap data keys.
pub fn config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
    if !ok {
        errs.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if value == "." || value == ".." || value.starts_with("..") {
        errs.push("must not be '.' or '..' or start with '..'".into());
    }
    errs
}

/// `IsEnvVarName`.
pub fn env_var_name(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
    if ok {
        Vec::new()
    } else {
        vec![regex_error(
            "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit",
            "[-._a-zA-Z][-._a-zA-Z0-9]*",
            &["my.env-name", "MY_ENV.NAME", "MyEnvName1"],
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: usize) -> String {
        "a".repeat(n)
    }

    /// Each rule at its edges: (value, valid).
    #[test]
    fn names_and_label_values_at_each_edge() {
        let label_cases: Vec<(String, bool)> = vec![
            (a(63), true),
            (a(64), false),
            ("a".into(), true),
            ("0".into(), true),
            ("a-b".into(), true),
            ("-a".into(), false),
            ("a-".into(), false),
            ("A".into(), false),
            ("a.b".into(), false),
            ("a_b".into(), false),
            (String::new(), false),
        ];
        for (value, valid) in &label_cases {
            assert_eq!(
                dns1123_label(value).is_empty(),
                *valid,
                "DNS-1123 label {value:?}"
            );
        }
        let subdomain_cases: Vec<(String, bool)> = vec![
            (format!("{}.{}.{}.{}", a(63), a(63), a(63), a(61)), true), // 253
            (format!("{}.{}.{}.{}", a(63), a(63), a(63), a(62)), false), // 254
            ("a.b".into(), true),
            ("a..b".into(), false),
            (".a".into(), false),
            ("a.".into(), false),
            ("a-.b".into(), false),
            ("A.b".into(), false),
            // The subdomain pattern bounds only the whole, not each label.
            (a(64), true),
            (String::new(), false),
            ("mango-hc-1".into(), true),
        ];
        for (value, valid) in &subdomain_cases {
            assert_eq!(
                dns1123_subdomain(value).is_empty(),
                *valid,
                "DNS-1123 subdomain {value:?} ({} chars)",
                value.len()
            );
        }
        let value_cases: Vec<(String, bool)> = vec![
            (String::new(), true),
            (a(63), true),
            (a(64), false),
            ("A.b_c-D".into(), true),
            ("_a".into(), false),
            ("a_".into(), false),
            ("a b".into(), false),
            ("a/b".into(), false),
            ("é".into(), false),
            ("env_0123".into(), true),
        ];
        for (value, valid) in &value_cases {
            assert_eq!(
                label_value(value).is_empty(),
                *valid,
                "label value {value:?}"
            );
        }
        let key_cases: Vec<(String, bool)> = vec![
            ("mango.dev/pool".into(), true),
            (a(63), true),
            (a(64), false),
            (format!("{}/{}", a(253), a(63)), true),
            (format!("{}/{}", a(254), a(63)), false),
            (format!("{}.{}.{}.{}/x", a(63), a(63), a(63), a(61)), true),
            (format!("{}.{}.{}.{}/x", a(63), a(63), a(63), a(62)), false),
            ("/a".into(), false),
            ("a/".into(), false),
            ("a/b/c".into(), false),
            ("Example.com/a".into(), false),
            ("example.com/A_b.c".into(), true),
            (String::new(), false),
        ];
        for (value, valid) in &key_cases {
            assert_eq!(
                qualified_name(value).is_empty(),
                *valid,
                "qualified name {value:?}"
            );
        }
    }

    #[test]
    fn messages_read_as_upstreams() {
        assert_eq!(label_value(&a(64))[0], "must be no more than 63 characters");
        assert_eq!(
            dns1123_label("A")[0],
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(qualified_name("/a"), vec!["prefix part must be non-empty"]);
    }

    #[test]
    fn annotations_total_at_most_256_kib() {
        let mut map = Map::new();
        map.insert("k".into(), Value::String(a(TOTAL_ANNOTATION_SIZE - 1)));
        assert!(validate_annotations(&map, "metadata.annotations").is_empty());
        map.insert("k".into(), Value::String(a(TOTAL_ANNOTATION_SIZE)));
        let errs = validate_annotations(&map, "metadata.annotations");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.annotations");
        assert_eq!(errs[0].reason, "FieldValueTooLong");
    }

    #[test]
    fn ids_are_0_to_2_31_minus_1() {
        assert_eq!(id_range(0), None);
        assert_eq!(id_range(i64::from(i32::MAX)), None);
        assert!(id_range(i64::from(i32::MAX) + 1).is_some());
        assert!(id_range(-1).is_some());
    }
}
