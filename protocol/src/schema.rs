//! OpenAPI schemas (feature `openapi`) for the types whose serde shape the
//! `utoipa::ToSchema` derive cannot read: [`EventBody`], an internally
//! tagged enum with an untagged catch-all variant, and [`ToolsetTool`],
//! whose `Serialize` is written by hand. Every other wire type derives its
//! schema where it is defined.

use crate::agents::ToolsetTool;
use crate::events::*;
use std::borrow::Cow;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

type Schemas = Vec<(String, RefOr<Schema>)>;

/// A `{"type": name}` object, the tag of one variant.
fn tag(name: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([name])),
        )
        .required("type")
}

/// One variant of an internally tagged enum: its payload's fields and its tag.
enum Variant {
    Tagged(
        &'static str,
        fn() -> (Cow<'static, str>, RefOr<Schema>),
        fn(&mut Schemas),
    ),
    Unit(&'static str),
}

impl Variant {
    fn of<T: ToSchema>(name: &'static str) -> Variant {
        Variant::Tagged(name, || (T::name(), T::schema()), T::schemas)
    }

    fn name(&self) -> &'static str {
        match self {
            Variant::Tagged(name, ..) | Variant::Unit(name) => name,
        }
    }

    fn schema(&self) -> RefOr<Schema> {
        match self {
            Variant::Tagged(name, payload, _) => AllOfBuilder::new()
                .item(Ref::from_schema_name(payload().0))
                .item(tag(name))
                .into(),
            Variant::Unit(name) => tag(name).into(),
        }
    }
}

/// [`EventBody`]'s variants with their serde names, in declaration order
/// ([`EventBody::Other`] aside). `every_variant_is_listed` holds it to the enum.
fn event_variants() -> Vec<Variant> {
    use Variant::Unit;
    vec![
        Variant::of::<UserMessage>("user.message"),
        Variant::of::<UserInterrupt>("user.interrupt"),
        Variant::of::<UserToolConfirmation>("user.tool_confirmation"),
        Variant::of::<UserToolResult>("user.tool_result"),
        Variant::of::<UserCustomToolResult>("user.custom_tool_result"),
        Variant::of::<UserDefineOutcome>("user.define_outcome"),
        Variant::of::<SystemMessage>("system.message"),
        Variant::of::<AgentMessage>("agent.message"),
        Unit("agent.thinking"),
        Variant::of::<AgentToolUse>("agent.tool_use"),
        Variant::of::<AgentCustomToolUse>("agent.custom_tool_use"),
        Unit("session.status_running"),
        Variant::of::<SessionStatusIdle>("session.status_idle"),
        Unit("session.status_rescheduled"),
        Unit("session.status_terminated"),
        Unit("session.deleted"),
        Variant::of::<SessionError>("session.error"),
        Variant::of::<ThreadStatusTerminated>("session.thread_status_terminated"),
        Unit("span.model_request_start"),
        Variant::of::<ModelRequestEnd>("span.model_request_end"),
    ]
}

/// `^(?!(?:a|b|…)$)`: any string but these.
fn none_of(names: &[&str]) -> String {
    let alternatives: Vec<String> = names.iter().map(|n| n.replace('.', "\\.")).collect();
    format!("^(?!(?:{})$)", alternatives.join("|"))
}

impl PartialSchema for EventBody {
    /// One of the variants Mango reads and writes, each its payload's fields
    /// plus its `type`; or [`EventBody::Other`]: an object of any other
    /// `type`, kept as it came.
    fn schema() -> RefOr<Schema> {
        let variants = event_variants();
        let known: Vec<&str> = variants.iter().map(Variant::name).collect();
        let other = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "An event of a type Mango neither writes nor reads, kept as it came",
            ))
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(none_of(&known))),
            )
            .required("type");
        let mut one_of =
            OneOfBuilder::new().description(Some("What an event says, by its `type`."));
        for variant in &variants {
            one_of = one_of.item(variant.schema());
        }
        one_of.item(other).into()
    }
}

impl ToSchema for EventBody {
    fn schemas(schemas: &mut Schemas) {
        for variant in event_variants() {
            if let Variant::Tagged(_, payload, nested) = variant {
                let (name, schema) = payload();
                schemas.push((name.into_owned(), schema));
                nested(schemas);
            }
        }
    }
}

/// Its wire form is its name (a custom `Serialize`): a string of [`ToolsetTool::ALL`].
impl PartialSchema for ToolsetTool {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A tool of agent_toolset_20260401"))
            .enum_values(Some(ToolsetTool::ALL.iter().map(|t| t.as_str())))
            .into()
    }
}

impl ToSchema for ToolsetTool {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Each listed name is one the enum reads as a variant of its own (not
    /// as `Other`), and the enum writes no name the list lacks.
    #[test]
    fn every_variant_is_listed() {
        let names: Vec<&str> = event_variants().iter().map(Variant::name).collect();
        for name in &names {
            assert!(
                EVENT_TYPES.contains(name),
                "{name} is not an SDK event type"
            );
        }
        for name in EVENT_TYPES {
            // A body with a required field wrong for every payload falls to
            // Other; a listed name must be one serde routes to a variant.
            let parsed: Result<EventBody, _> = serde_json::from_value(json!({"type": name}));
            let unit_or_defaulted =
                matches!(parsed, Ok(ref b) if !matches!(b, EventBody::Other(_)));
            if unit_or_defaulted {
                assert!(names.contains(name), "{name} is a variant but not listed");
            }
        }
        let schema = serde_json::to_value(EventBody::schema()).unwrap();
        let one_of = schema["oneOf"].as_array().unwrap();
        assert_eq!(one_of.len(), names.len() + 1);
        let pattern = one_of.last().unwrap()["properties"]["type"]["pattern"].clone();
        assert_eq!(
            pattern,
            Value::String(none_of(&names)),
            "the catch-all refuses the listed names"
        );
    }

    /// A `wire_enum!`'s schema lists exactly what serde writes.
    #[test]
    fn wire_enums_are_their_serde_names() {
        fn check<T: crate::work::WireEnum + serde::Serialize + ToSchema>() {
            let schema = serde_json::to_value(T::schema()).unwrap();
            let written: Vec<Value> = T::ALL
                .iter()
                .map(|v| serde_json::to_value(v).unwrap())
                .collect();
            assert_eq!(schema["enum"], Value::Array(written), "{}", T::name());
        }
        check::<crate::WorkState>();
        check::<crate::WorkType>();
        check::<crate::CheckStatus>();
        check::<crate::ReportedStatus>();
        check::<crate::Scope>();
        check::<crate::sessions::SessionStatus>();
    }

    #[test]
    fn toolset_tools_are_their_names() {
        let schema = serde_json::to_value(ToolsetTool::schema()).unwrap();
        let written: Vec<Value> = ToolsetTool::ALL
            .iter()
            .map(|t| serde_json::to_value(t).unwrap())
            .collect();
        assert_eq!(schema["enum"], Value::Array(written));
    }
}
