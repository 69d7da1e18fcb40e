//! The OpenAPI 3.1 document of the HTTP API (spec §10). Nothing in it is
//! written by hand: the operations come from each handler's
//! `#[utoipa::path]` (collected by the router that serves them, so a route
//! cannot go undocumented), the schemas from the protocol types'
//! `utoipa::ToSchema` (`mango-protocol`'s `openapi` feature). This module
//! holds what the handlers share: the base document, the security schemes
//! and the error answers.
//!
//! Served at `GET /openapi.json`; checked in as `docs/openapi.json`
//! (`cargo run -p mango-api --bin mango -- openapi > docs/openapi.json`).

use mango_protocol::events::EVENT_TYPES;
use mango_protocol::ErrorEnvelope;
use std::collections::BTreeMap;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// The security scheme names the operations refer to.
pub const BEARER: &str = "bearer";
pub const X_API_KEY: &str = "x_api_key";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Mango Environment Work API",
        description = "The control plane of Mango: Environments, the Work lease API, Agents, Sessions and Skills. \
Every credential is sent as `Authorization: Bearer <credential>`: a Workspace key (`mango_wsk_…`), an \
Environment key (`mango_envk_…`) or a Work item's sessions token (`mango_st_…`); Workspace keys may also \
use `x-api-key`. Which credential an operation takes is in its description; a valid credential outside \
its scope gets 403, an unknown, revoked or expired one 401. Errors use one envelope (`ErrorEnvelope`) \
and every response carries a `request-id` header. See docs/protocol.md."
    ),
    components(schemas(ErrorEnvelope, EventTypeName, StreamFrame)),
    modifiers(&Security),
    tags(
        (name = "Environments", description = "self_hosted Environments (Workspace key)"),
        (name = "Work", description = "The Work lease API: operators, supervisors and holders"),
        (name = "Agents", description = "Agents and their immutable versions (Workspace key)"),
        (name = "Memory Stores", description = "Memory Stores, their memories and memory versions (Workspace key; a Session's sessions token reads the stores its Session attaches and writes its `read_write` ones)"),
        (name = "Sessions", description = "Sessions (Workspace key; a Session's sessions token reads it)"),
        (name = "Events", description = "A Session's event log, what clients send, and the live stream"),
        (name = "Skills", description = "Custom Skills and their immutable versions (Workspace key; a sessions token reads and downloads its Session's pinned versions)"),
        (name = "Operations", description = "Health, readiness, metrics and this document (no credential)"),
    )
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A Workspace key, an Environment key or a sessions token, by operation",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            X_API_KEY,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-api-key",
                "A Workspace key (other credentials are refused here)",
            ))),
        );
    }
}

/// Request bodies are parsed strictly (`mango_protocol::strict`): a field
/// the type lacks is refused unless its value is `null`. Said here of the
/// body types that are not a tagged variant's payload (an `allOf` with the
/// tag, where `additionalProperties` would refuse the tag itself).
pub const STRICT_BODIES: &[&str] = &[
    "AgentVersionRef",
    "CreateAgent",
    "CreateEnvironment",
    "CreateMemory",
    "CreateMemoryStore",
    "CreateSession",
    "CreateWork",
    "FailReason",
    "FailWork",
    "HeartbeatParams",
    "McpToolConfigParam",
    "MemoryPrecondition",
    "ModelConfigParam",
    "SendEvents",
    "SkillParam",
    "StopWork",
    "ToolDefaultsParam",
    "ToolsetConfigParam",
    "UpdateAgent",
    "UpdateEnvironment",
    "UpdateMemory",
    "UpdateMemoryStore",
    "UpdateWork",
    "WorkResult",
];

/// Completes the document once every operation has added its schemas.
pub fn finish(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    strict_bodies(&mut doc);
    optional_bodies(&mut doc);
    doc
}

/// A handler that reads its body with `extract::optional_body` takes no
/// body (or an empty one) as `{}`; `request_body = Option<T>` says so by not
/// requiring it, but utoipa also writes the type as `T` or `null`, and a
/// `null` body is refused (a body must be a JSON object). Here it becomes `T`.
fn optional_bodies(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        for op in [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
        {
            let Some(body) = op.request_body.as_mut() else {
                continue;
            };
            if body.required.is_some() {
                continue;
            }
            for content in body.content.values_mut() {
                if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                    let is_null = |s: &RefOr<Schema>| matches!(s, RefOr::T(Schema::Object(o)) if o.schema_type == Type::Null.into());
                    if let [a, b] = &one_of.items[..] {
                        match (is_null(a), is_null(b)) {
                            (true, false) => content.schema = Some(b.clone()),
                            (false, true) => content.schema = Some(a.clone()),
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}

fn strict_bodies(doc: &mut utoipa::openapi::OpenApi) {
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    for name in STRICT_BODIES {
        match components.schemas.get_mut(*name) {
            Some(RefOr::T(Schema::Object(object))) => {
                let only_null = ObjectBuilder::new().schema_type(Type::Null).build();
                object.additional_properties = Some(Box::new(AdditionalProperties::RefOr(
                    RefOr::T(Schema::Object(only_null)),
                )));
            }
            _ => panic!("{name} is not an object schema of the document"),
        }
    }
}

/// The document as served and checked in: pretty-printed, keys in a stable order.
pub fn to_json(doc: &utoipa::openapi::OpenApi) -> String {
    // Through `Value` so every object's keys come out sorted (serde_json's
    // default map), whatever order utoipa builds them in.
    let value = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    let mut out = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
    out.push('\n');
    out
}

fn error(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorEnvelope")))
                .build(),
        )
        .into()
}

/// A group of error answers, each with the error envelope as its body.
macro_rules! error_answers {
    ($($(#[doc = $doc:literal])* $name:ident { $($status:literal => $description:literal,)* })*) => {
        $(
            $(#[doc = $doc])*
            pub struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    [$(($status, $description),)*]
                        .into_iter()
                        .map(|(status, description)| (status.to_string(), error(description)))
                        .collect()
                }
            }
        )*
    };
}

error_answers! {
    /// What any operation that takes a credential may answer.
    Refusals {
        "400" => "A query parameter, header or body field is invalid (`invalid_request_error`; `details.error_code` names the rule)",
        "401" => "Missing, unknown, revoked or expired credential (`authentication_error`)",
        "403" => "A valid credential outside its scope (`permission_error`)",
        "500" => "An internal error; the request changed nothing (`api_error`)",
        "503" => "The database is busy or unreachable; retry shortly (`overloaded_error`)",
    }
    /// A named object (or one the body names) does not exist.
    Missing {
        "404" => "Not found in the caller's workspace (`not_found_error`)",
    }
    /// A write that the current state refuses.
    Conflicts {
        "409" => "The current state refuses this write (`conflict_error`; `x-should-retry: false` when a retry cannot help)",
    }
    /// An operation that reads a request body.
    TooLarge {
        "413" => "The request body is larger than 1 MiB (`request_too_large`)",
    }
    /// A memory write that could grow its store.
    MemoryWriteLimits {
        "413" => "The request body is larger than 1 MiB (`request_too_large`), or the write would take the store past its content bytes or its count of memories (`request_too_large`, `memory_store_full`, with `details.quota`, `limit`, `current` and `requested`; `x-should-retry: false`); nothing was written",
        "429" => "A sessions token wrote memories faster than its allowance (`rate_limit_error`, `memory_write_rate_limited`); `retry-after` gives the seconds until it may write again; nothing was written",
    }
    /// A memory write that cannot grow its store.
    RateLimited {
        "429" => "A sessions token wrote memories faster than its allowance (`rate_limit_error`, `memory_write_rate_limited`); `retry-after` gives the seconds until it may write again; nothing was written",
    }
    /// A memory write whose precondition or path lost.
    MemoryConflicts {
        "409" => "`memory_precondition_failed_error`: the memory's `content_sha256` is not the expected one (`details.current_content_sha256`); `memory_path_conflict_error`: another memory has the path (`details.memory_id`); or `conflict_error`. Sent with `x-should-retry: false`; nothing was written",
    }
    /// A Skill upload.
    UploadTooLarge {
        "413" => "The upload is larger than 8 MiB, or its files pass a limit of Skills (`request_too_large`; the message names it)",
    }
    /// Heartbeat's precondition.
    PreconditionFailed {
        "412" => "`expected_last_heartbeat` is not the lease's last heartbeat, or the lease ran out (`heartbeat_precondition_failed`, with `details.current_state`)",
    }
}

/// `types[]` of an event list: every event type the SDK knows.
pub struct EventTypeName;

impl utoipa::PartialSchema for EventTypeName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(EVENT_TYPES.iter().copied()))
            .into()
    }
}

impl utoipa::ToSchema for EventTypeName {}

/// A Skill version's archive: the raw bytes of a zip file.
pub struct SkillArchive;

impl utoipa::PartialSchema for SkillArchive {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Binary,
            )))
            .into()
    }
}

impl utoipa::ToSchema for SkillArchive {}

/// `/healthz` and `/readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}

/// One frame of `…/events/stream`, as an SSE reader parses it (`event`,
/// `data`): an event of the log, its `type` as the frame's `event` and the
/// event as JSON in `data`; or a keep-alive `ping` whose data is `{}`.
pub struct StreamFrame;

/// A frame whose `data` is JSON matching `content` (JSON Schema's
/// `contentMediaType` and `contentSchema`, which OpenAPI 3.1 and 3.2 use to
/// describe server-sent events).
fn frame(event: ObjectBuilder, content: RefOr<Schema>) -> ObjectBuilder {
    // utoipa has no `contentSchema`; an extension entry writes the keyword
    // into the schema object as it is.
    let content = serde_json::to_value(content).expect("a schema serializes");
    let data = ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/json")
        .extensions(Some(Extensions::from_iter([("contentSchema", content)])));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("event", event)
        .property("data", data)
        .required("event")
        .required("data")
}

impl utoipa::PartialSchema for StreamFrame {
    fn schema() -> RefOr<Schema> {
        let ping = frame(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["ping"])),
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .max_properties(Some(0))
                .into(),
        )
        .description(Some("Keep-alive"));
        let event = frame(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^(?!ping$)")),
            Ref::from_schema_name("Event").into(),
        )
        .description(Some("An event of the log; `event` is its `type`"));
        OneOfBuilder::new().item(event).item(ping).into()
    }
}

impl utoipa::ToSchema for StreamFrame {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const REGENERATE: &str = "cargo run -q -p mango-api --bin mango -- openapi > docs/openapi.json";

    fn document() -> Value {
        serde_json::from_str(&to_json(&crate::routes::openapi())).unwrap()
    }

    /// `docs/openapi.json` is what the api serves: regenerate it after
    /// changing a handler's annotation or a protocol type.
    #[test]
    fn the_checked_in_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        let generated = to_json(&crate::routes::openapi());
        if checked_in != generated {
            let line = checked_in
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
            panic!(
                "docs/openapi.json is stale (first difference at line {}): regenerate it with `{REGENERATE}`",
                line + 1
            );
        }
    }

    /// Every operation has its own id; every one but the health, metrics and
    /// document endpoints names its credentials and the refusals they bring.
    #[test]
    fn operations_are_named_secured_and_answer_errors_in_the_envelope() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap();
                assert!(ids.insert(id.to_string()), "{id} twice");
                let responses = op["responses"].as_object().unwrap();
                if op["tags"][0] == "Operations" {
                    assert!(op.get("security").is_none(), "{method} {path}");
                    continue;
                }
                let schemes: Vec<&str> = op["security"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{method} {path} has no security"))
                    .iter()
                    .flat_map(|s| s.as_object().unwrap().keys().map(String::as_str))
                    .collect();
                assert!(schemes.contains(&BEARER), "{method} {path}");
                for status in ["400", "401", "403", "500", "503"] {
                    let schema = &responses[status]["content"]["application/json"]["schema"];
                    assert_eq!(
                        schema["$ref"], "#/components/schemas/ErrorEnvelope",
                        "{method} {path} {status}"
                    );
                }
                assert!(
                    responses.keys().any(|s| s.starts_with('2')),
                    "{method} {path} documents no success"
                );
            }
        }
        assert!(ids.len() >= 34, "{} operations", ids.len());
    }

    /// The strict bodies are objects of the document, and their extra
    /// fields may only be null (as `mango_protocol::strict` reads them).
    #[test]
    fn strict_bodies_take_only_null_extra_fields() {
        let doc = document();
        for name in STRICT_BODIES {
            assert_eq!(
                doc["components"]["schemas"][name]["additionalProperties"],
                serde_json::json!({"type": "null"}),
                "{name}"
            );
        }
    }
}
