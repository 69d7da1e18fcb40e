//! Strict parsing of request input: the wire types are lenient (a reader
//! ignores fields it does not know, so a newer peer never breaks it), and
//! what a client sends is held to them exactly. [`from_value`] refuses wrong
//! types and unknown fields, and says where: `content[0].text`.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;

/// A field a client got wrong, with its path from the parsed value's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `content[0].text`; empty for the value itself.
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same error seen from a parent: `events[2]` + `content[0]` → `events[2].content[0]`.
    pub fn within(mut self, parent: &str) -> Self {
        self.path = join(parent, &self.path);
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for FieldError {}

/// Joins two paths: `a` + `b` → `a.b`, `a` + `[0]` → `a[0]`.
pub fn join(parent: &str, child: &str) -> String {
    match (parent.is_empty(), child.is_empty()) {
        (true, _) => child.to_string(),
        (_, true) => parent.to_string(),
        _ if child.starts_with('[') => format!("{parent}{child}"),
        _ => format!("{parent}.{child}"),
    }
}

/// Parses `value` as `T`, refusing wrong types and any field `T` does not
/// have. Unknown fields are found by comparing the input with `T` written
/// back out, so `T` must write every field it read (a field it skips when
/// `None` may be sent as `null`).
pub fn from_value<T: DeserializeOwned + Serialize>(value: Value) -> Result<T, FieldError> {
    let parsed: T = serde_path_to_error::deserialize(&value).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        FieldError::new(path, err.into_inner().to_string())
    })?;
    let written = serde_json::to_value(&parsed)
        .map_err(|err| FieldError::new("", format!("cannot be represented: {err}")))?;
    match first_unknown(&value, &written, String::new()) {
        Some(path) => Err(FieldError::new(path, "unknown field")),
        None => Ok(parsed),
    }
}

/// The path of the first field of `input` that `known` lacks, depth first.
fn first_unknown(input: &Value, known: &Value, path: String) -> Option<String> {
    match (input, known) {
        (Value::Object(given), Value::Object(kept)) => given.iter().find_map(|(key, value)| {
            let here = join(&path, key);
            match kept.get(key) {
                None if value.is_null() => None,
                None => Some(here),
                Some(kept) => first_unknown(value, kept, here),
            }
        }),
        (Value::Array(given), Value::Array(kept)) => given
            .iter()
            .zip(kept)
            .enumerate()
            .find_map(|(i, (value, kept))| first_unknown(value, kept, format!("{path}[{i}]"))),
        _ => None,
    }
}

/// A string or an object, each parsed with its own errors (an untagged
/// enum would only say that neither fit).
pub(crate) fn string_or_object<'de, D, S, O, T>(
    d: D,
    expected: &str,
    string: impl FnOnce(S) -> T,
    object: impl FnOnce(O) -> T,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    S: serde::de::DeserializeOwned,
    O: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    match <Value as serde::Deserialize>::deserialize(d)? {
        v @ Value::String(_) => serde_json::from_value(v)
            .map(string)
            .map_err(D::Error::custom),
        v @ Value::Object(_) => serde_json::from_value(v)
            .map(object)
            .map_err(D::Error::custom),
        _ => Err(D::Error::custom(format!("must be {expected}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Outer {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        items: Vec<Item>,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Item {
        Text { text: String },
        Flag,
    }

    #[test]
    fn accepts_exact_input_and_nulls_for_omitted_options() {
        let v = json!({"name": "a", "note": null, "items": [{"type": "text", "text": "t"}, {"type": "flag"}]});
        let parsed: Outer = from_value(v).unwrap();
        assert_eq!(parsed.items.len(), 2);
        assert_eq!(parsed.note, None);
    }

    #[test]
    fn unknown_fields_are_refused_at_any_depth_with_their_path() {
        let err = from_value::<Outer>(json!({"name": "a", "items": [], "extra": 1})).unwrap_err();
        assert_eq!(err.to_string(), "extra: unknown field");
        let err = from_value::<Outer>(
            json!({"name": "a", "items": [{"type": "flag"}, {"type": "text", "text": "t", "x": 2}]}),
        )
        .unwrap_err();
        assert_eq!(err.path, "items[1].x");
    }

    #[test]
    fn wrong_types_name_their_field() {
        let err = from_value::<Outer>(json!({"name": 5, "items": []})).unwrap_err();
        assert_eq!(err.path, "name");
        assert!(err.message.contains("expected a string"), "{err}");
        let err = from_value::<Outer>(json!({"items": []})).unwrap_err();
        assert!(err.message.contains("missing field `name`"), "{err}");
        assert_eq!(err.within("body").path, "body");
    }

    #[test]
    fn paths_join_like_a_reader_writes_them() {
        assert_eq!(
            join("events[2]", "content[0].text"),
            "events[2].content[0].text"
        );
        assert_eq!(join("events", "[2]"), "events[2]");
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", ""), "a");
    }
}
