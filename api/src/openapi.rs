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
        description = "The control plane of Mango: Environments, the Work lease API, Agents and Sessions. \
Every credential is sent as `Authorization: Bearer <credential>`: a Workspace key (`mango_wsk_…`), an \
Environment key (`mango_envk_…`) or a Work item's sessions token (`mango_st_…`); Workspace keys may also \
use `x-api-key`. Which credential an operation takes is in its description; a valid credential outside \
its scope gets 403, an unknown, revoked or expired one 401. Errors use one envelope (`ErrorEnvelope`) \
and every response carries a `request-id` header. See docs/protocol.md."
    ),
    components(schemas(ErrorEnvelope)),
    modifiers(&Security),
    tags(
        (name = "Environments", description = "self_hosted Environments (Workspace key)"),
        (name = "Work", description = "The Work lease API: operators, supervisors and holders"),
        (name = "Agents", description = "Agents and their immutable versions (Workspace key)"),
        (name = "Sessions", description = "Sessions (Workspace key; a Session's sessions token reads it)"),
        (name = "Events", description = "A Session's event log, what clients send, and the live stream"),
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
    /// Heartbeat's precondition.
    PreconditionFailed {
        "412" => "`expected_last_heartbeat` is not the lease's last heartbeat, or the lease ran out (`heartbeat_precondition_failed`, with `details.current_state`)",
    }
}

/// `types[]` of an event list: every event type the SDK knows.
pub struct EventTypeName;

impl utoipa::PartialSchema for EventTypeName {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(EVENT_TYPES.iter().copied()))
            .into()
    }
}

impl utoipa::ToSchema for EventTypeName {}

/// `/healthz` and `/readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}
