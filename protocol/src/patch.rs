//! A field of an update body, where absent, `null` and a value mean three
//! different things: keep, clear, set.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Patch<T> {
    /// Not in the body: keep the current value.
    #[default]
    Absent,
    /// `null`: clear it (where clearing is allowed).
    Null,
    Set(T),
}

impl<T> Patch<T> {
    pub fn is_absent(&self) -> bool {
        matches!(self, Patch::Absent)
    }

    /// `None` when absent; `Some(None)` for null.
    pub fn into_option(self) -> Option<Option<T>> {
        match self {
            Patch::Absent => None,
            Patch::Null => Some(None),
            Patch::Set(v) => Some(Some(v)),
        }
    }

    pub fn as_ref(&self) -> Patch<&T> {
        match self {
            Patch::Absent => Patch::Absent,
            Patch::Null => Patch::Null,
            Patch::Set(v) => Patch::Set(v),
        }
    }
}

/// Use with `#[serde(default, skip_serializing_if = "Patch::is_absent")]`.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(d)? {
            None => Patch::Null,
            Some(v) => Patch::Set(v),
        })
    }
}

impl<T: Serialize> Serialize for Patch<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Patch::Absent | Patch::Null => s.serialize_none(),
            Patch::Set(v) => v.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Body {
        #[serde(default, skip_serializing_if = "Patch::is_absent")]
        title: Patch<String>,
    }

    #[test]
    fn absent_null_and_set_are_told_apart_and_written_back() {
        for (v, want) in [
            (json!({}), Patch::Absent),
            (json!({"title": null}), Patch::Null),
            (json!({"title": "t"}), Patch::Set("t".to_string())),
        ] {
            let body: Body = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(body.title, want);
            assert_eq!(serde_json::to_value(&body).unwrap(), v);
        }
    }
}
