//! The six workspace tools of `agent_toolset_20260401` that a worker runs:
//! names, descriptions and input parameters, defined once. The agent loop
//! declares them to the model from [`ToolSpec::input_schema`]; the item
//! runner dispatches and parses calls with [`ToolInput::parse`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ToolName {
    Bash,
    Read,
    Write,
    Edit,
    Glob,
    Grep,
}

impl ToolName {
    /// In the SDK's order.
    pub const ALL: [ToolName; 6] = [
        ToolName::Bash,
        ToolName::Read,
        ToolName::Write,
        ToolName::Edit,
        ToolName::Glob,
        ToolName::Grep,
    ];

    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    pub fn parse(name: &str) -> Option<ToolName> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    pub fn spec(self) -> &'static ToolSpec {
        &SPECS[self as usize]
    }
}

/// A parameter's JSON type, as the runner checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    String,
    Boolean,
    /// A non-negative integer; `minimum` is what the model is told.
    Integer {
        minimum: u64,
    },
    /// `[start, end]`.
    IntegerPair,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ParamKind,
    pub required: bool,
    pub description: Option<&'static str>,
}

/// One tool: what the model is told, and what the runner accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// In the order the runner checks them.
    pub params: &'static [Param],
}

const PATH: &str = "Path relative to the workspace, or absolute inside it";

const fn param(name: &'static str, kind: ParamKind, required: bool) -> Param {
    Param {
        name,
        kind,
        required,
        description: None,
    }
}

const fn path_param(name: &'static str) -> Param {
    Param {
        name,
        kind: ParamKind::String,
        required: true,
        description: Some(PATH),
    }
}

/// Indexed by `ToolName as usize`.
static SPECS: [ToolSpec; 6] = [
    ToolSpec {
        name: "bash",
        description: "Run a command in a persistent bash shell in the workspace.",
        params: &[
            param("command", ParamKind::String, false),
            param("restart", ParamKind::Boolean, false),
            param("timeout_ms", ParamKind::Integer { minimum: 1 }, false),
        ],
    },
    ToolSpec {
        name: "read",
        description: "Read a file; view_range is 1-based and inclusive.",
        params: &[
            path_param("file_path"),
            param("view_range", ParamKind::IntegerPair, false),
        ],
    },
    ToolSpec {
        name: "write",
        description: "Write a file, creating parent directories.",
        params: &[
            path_param("file_path"),
            param("content", ParamKind::String, true),
        ],
    },
    ToolSpec {
        name: "edit",
        description: "Replace old_string with new_string in a file.",
        params: &[
            path_param("file_path"),
            param("old_string", ParamKind::String, true),
            param("new_string", ParamKind::String, true),
            param("replace_all", ParamKind::Boolean, false),
        ],
    },
    ToolSpec {
        name: "glob",
        description: "Find files by glob pattern, newest first.",
        params: &[
            param("pattern", ParamKind::String, true),
            param("path", ParamKind::String, false),
        ],
    },
    ToolSpec {
        name: "grep",
        description: "Search file contents with a regular expression.",
        params: &[
            param("pattern", ParamKind::String, true),
            param("path", ParamKind::String, false),
        ],
    },
];

impl ToolSpec {
    /// The JSON Schema of the tool's input, for the model's tool declaration.
    pub fn input_schema(&self) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for p in self.params {
            let mut schema = match p.kind {
                ParamKind::String => json!({"type": "string"}),
                ParamKind::Boolean => json!({"type": "boolean"}),
                ParamKind::Integer { minimum } => json!({"type": "integer", "minimum": minimum}),
                ParamKind::IntegerPair => json!({"type": "array", "items": {"type": "integer"},
                                                 "minItems": 2, "maxItems": 2}),
            };
            if let Some(d) = p.description {
                schema["description"] = json!(d);
            }
            properties.insert(p.name.to_string(), schema);
            if p.required {
                required.push(json!(p.name));
            }
        }
        let mut schema = json!({"type": "object", "properties": properties});
        if !required.is_empty() {
            schema["required"] = Value::Array(required);
        }
        schema
    }

    /// The Messages API tool declaration.
    pub fn declaration(&self) -> Value {
        json!({"name": self.name, "description": self.description, "input_schema": self.input_schema()})
    }

    /// Checks a call's input against the parameters, with the runner's error
    /// texts: not an object, an unknown field (first in sorted order), then
    /// each parameter in order (a `null` counts as absent).
    pub fn check(&self, input: &Value) -> Result<(), String> {
        let tool = self.name;
        let map = input
            .as_object()
            .ok_or_else(|| format!("{tool}: input must be a JSON object"))?;
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        if let Some(k) = keys
            .into_iter()
            .find(|k| !self.params.iter().any(|p| p.name == k.as_str()))
        {
            return Err(format!("{tool}: unknown field \"{k}\""));
        }
        for p in self.params {
            let key = p.name;
            let Some(value) = map.get(key).filter(|v| !v.is_null()) else {
                if p.required {
                    return Err(format!("{tool}: {key} is required"));
                }
                continue;
            };
            let fits = match p.kind {
                ParamKind::String => value.is_string(),
                ParamKind::Boolean => value.is_boolean(),
                ParamKind::Integer { .. } => value.as_u64().is_some(),
                ParamKind::IntegerPair => value
                    .as_array()
                    .is_some_and(|a| a.len() == 2 && a.iter().all(|n| n.as_i64().is_some())),
            };
            if !fits {
                let what = match p.kind {
                    ParamKind::String => "a string",
                    ParamKind::Boolean => "a boolean",
                    ParamKind::Integer { .. } => "a non-negative integer",
                    ParamKind::IntegerPair => "an array of two integers",
                };
                return Err(format!("{tool}: field \"{key}\" must be {what}"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BashInput {
    pub command: Option<String>,
    #[serde(default)]
    pub restart: bool,
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadInput {
    pub file_path: String,
    pub view_range: Option<(i64, i64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteInput {
    pub file_path: String,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EditInput {
    pub file_path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobInput {
    pub pattern: String,
    pub path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrepInput {
    pub pattern: String,
    pub path: Option<String>,
}

/// A parsed call of one of the six tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolInput {
    Bash(BashInput),
    Read(ReadInput),
    Write(WriteInput),
    Edit(EditInput),
    Glob(GlobInput),
    Grep(GrepInput),
}

impl ToolInput {
    /// Checks `input` against `tool`'s parameters ([`ToolSpec::check`]) and
    /// parses it; the error is the text the call's result carries.
    pub fn parse(tool: ToolName, input: &Value) -> Result<ToolInput, String> {
        tool.spec().check(input)?;
        // Nulls count as absent, as the check read them.
        let mut fields = input.as_object().cloned().unwrap_or_default();
        fields.retain(|_, v| !v.is_null());
        let input = Value::Object(fields);
        let parsed = match tool {
            ToolName::Bash => serde_json::from_value(input).map(ToolInput::Bash),
            ToolName::Read => serde_json::from_value(input).map(ToolInput::Read),
            ToolName::Write => serde_json::from_value(input).map(ToolInput::Write),
            ToolName::Edit => serde_json::from_value(input).map(ToolInput::Edit),
            ToolName::Glob => serde_json::from_value(input).map(ToolInput::Glob),
            ToolName::Grep => serde_json::from_value(input).map(ToolInput::Grep),
        };
        parsed.map_err(|err| format!("{}: {err}", tool.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full input for each tool, from its parameters.
    fn sample(spec: &ToolSpec) -> Value {
        let fields: Map<String, Value> = spec
            .params
            .iter()
            .map(|p| {
                let v = match p.kind {
                    ParamKind::String => json!("x"),
                    ParamKind::Boolean => json!(true),
                    ParamKind::Integer { .. } => json!(5),
                    ParamKind::IntegerPair => json!([1, 2]),
                };
                (p.name.to_string(), v)
            })
            .collect();
        Value::Object(fields)
    }

    #[test]
    fn names_round_trip_in_the_sdk_order() {
        let names: Vec<&str> = ToolName::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, ["bash", "read", "write", "edit", "glob", "grep"]);
        for t in ToolName::ALL {
            assert_eq!(ToolName::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
        }
        assert_eq!(ToolName::parse("web_search"), None);
    }

    #[test]
    fn every_declared_parameter_is_a_field_of_the_typed_input() {
        for t in ToolName::ALL {
            let full = sample(t.spec());
            let parsed = ToolInput::parse(t, &full).unwrap_or_else(|e| panic!("{e}"));
            let back = match parsed {
                ToolInput::Bash(i) => serde_json::to_value(i),
                ToolInput::Read(i) => serde_json::to_value(i),
                ToolInput::Write(i) => serde_json::to_value(i),
                ToolInput::Edit(i) => serde_json::to_value(i),
                ToolInput::Glob(i) => serde_json::to_value(i),
                ToolInput::Grep(i) => serde_json::to_value(i),
            }
            .unwrap();
            assert_eq!(back, full, "{} reads every parameter", t.as_str());
        }
    }

    #[test]
    fn schemas_declare_types_and_required_parameters() {
        let read = ToolName::Read.spec().input_schema();
        assert_eq!(read["type"], "object");
        assert_eq!(read["required"], json!(["file_path"]));
        assert_eq!(read["properties"]["view_range"]["maxItems"], 2);
        let bash = ToolName::Bash.spec().input_schema();
        assert!(bash.get("required").is_none());
        assert_eq!(bash["properties"]["timeout_ms"]["minimum"], 1);
        assert_eq!(ToolName::Grep.spec().declaration()["name"], "grep");
    }

    #[test]
    fn checks_give_the_runner_texts_in_order() {
        let err = |t: ToolName, v: Value| ToolInput::parse(t, &v).unwrap_err();
        assert_eq!(
            err(ToolName::Bash, json!({"z": 1, "bogus": 2})),
            r#"bash: unknown field "bogus""#
        );
        assert_eq!(
            err(ToolName::Bash, json!({"command": 1})),
            r#"bash: field "command" must be a string"#
        );
        assert_eq!(
            err(ToolName::Bash, json!({"timeout_ms": -1})),
            r#"bash: field "timeout_ms" must be a non-negative integer"#
        );
        assert_eq!(
            err(ToolName::Read, json!({"file_path": "a", "view_range": [1]})),
            r#"read: field "view_range" must be an array of two integers"#
        );
        assert_eq!(
            err(ToolName::Write, json!({"file_path": "a"})),
            "write: content is required"
        );
        assert_eq!(
            err(ToolName::Write, json!({"file_path": "a", "content": null})),
            "write: content is required"
        );
        assert_eq!(
            err(ToolName::Grep, json!([])),
            "grep: input must be a JSON object"
        );
        assert_eq!(
            ToolInput::parse(ToolName::Bash, &json!({"command": "ls", "restart": null})),
            Ok(ToolInput::Bash(BashInput {
                command: Some("ls".into()),
                restart: false,
                timeout_ms: None
            }))
        );
    }
}
