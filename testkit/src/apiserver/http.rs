//! Routing and the REST verbs, in the order the apiserver's handlers
//! (apiserver/pkg/endpoints/handlers: create.go, update.go, patch.go,
//! delete.go, get.go) and the generic registry (registry/generic/registry/
//! store.go) take their steps: decode, admit, validate, precondition,
//! record field managers, store.

use super::errors::{ApiError, FieldError};
use super::fields::{self, Scope, Writer};
use super::patch::{self, PatchType};
use super::resources::{self, ResourceType};
use super::selector::{FieldSelector, Selector};
use super::{
    attach, discovery, kinds, lifecycle, now_rfc3339, objectmeta, pods, schema, store, watch,
};
use super::{Shared, State};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The apiserver's request body limit (`MaxRequestBodyBytes`, 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

pub fn router(shared: Shared) -> Router {
    Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn_with_state(shared.clone(), record))
        .with_state(shared)
}

async fn record(
    axum::extract::State(shared): axum::extract::State<Shared>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let line = (request.method().clone(), request.uri().to_string());
    let outage = {
        let mut state = shared.lock();
        state.requests.push(line);
        state.outage_for(request.method(), request.uri().path())
    };
    match outage {
        Some(how) => how.error().into_response(),
        None => next.run(request).await,
    }
}

/// Where a path leads.
pub enum Route {
    Discovery(Vec<String>),
    Collection {
        rt: ResourceType,
        namespace: Option<String>,
    },
    Item {
        rt: ResourceType,
        namespace: String,
        name: String,
        sub: Option<String>,
    },
    Nowhere,
}

pub fn route(path: &str) -> Route {
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| p.to_string())
        .collect();
    let p: Vec<&str> = parts.iter().map(String::as_str).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match p.as_slice() {
        ["version"] | ["api"] | ["api", _] | ["apis"] | ["apis", _] | ["apis", _, _] => {
            return Route::Discovery(parts.clone())
        }
        ["api", version, rest @ ..] => ("", version, rest),
        ["apis", group, version, rest @ ..] => (group, version, rest),
        _ => return Route::Nowhere,
    };
    let namespaced_rt =
        |plural: &str| resources::find(group, version, plural).filter(|r| r.namespaced);
    match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced_rt(plural).is_some() => {
            let rt = namespaced_rt(plural).expect("a resource");
            match tail {
                [] => Route::Collection {
                    rt,
                    namespace: Some(ns.to_string()),
                },
                [name] => item(rt, ns, name, None),
                [name, sub] => item(rt, ns, name, Some(sub)),
                _ => Route::Nowhere,
            }
        }
        [plural, tail @ ..] => match resources::find(group, version, plural) {
            Some(rt) if !rt.namespaced => match tail {
                [] => Route::Collection {
                    rt,
                    namespace: None,
                },
                [name] => item(rt, "", name, None),
                [name, sub] => item(rt, "", name, Some(sub)),
                _ => Route::Nowhere,
            },
            // Every namespace's objects: lists and watches only.
            Some(rt) if tail.is_empty() => Route::Collection {
                rt,
                namespace: None,
            },
            _ => Route::Nowhere,
        },
        _ => Route::Nowhere,
    }
}

fn item(rt: ResourceType, ns: &str, name: &str, sub: Option<&str>) -> Route {
    Route::Item {
        rt,
        namespace: ns.to_string(),
        name: name.to_string(),
        sub: sub.map(str::to_string),
    }
}

fn query_map(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn truthy(query: &HashMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| v == "true" || v == "1")
}

async fn handle(
    axum::extract::State(shared): axum::extract::State<Shared>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let query = query_map(parts.uri.query());
    match route(parts.uri.path()) {
        Route::Discovery(path) => discovery::answer(&shared, &path),
        Route::Nowhere => ApiError::no_route().into_response(),
        Route::Collection { rt, namespace } => {
            if parts.method == Method::GET {
                if truthy(&query, "watch") {
                    return watch::serve(shared, rt, namespace, query).await;
                }
                return answer(
                    list(&shared, &rt, namespace.as_deref(), &query),
                    StatusCode::OK,
                );
            }
            let Some(namespace) = namespace.or_else(|| (!rt.namespaced).then(String::new)) else {
                return ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                )
                .into_response();
            };
            let bytes = match read_body(body).await {
                Ok(b) => b,
                Err(e) => return e.into_response(),
            };
            match parts.method {
                Method::POST => {
                    let result = decode(&bytes).and_then(|object| {
                        create_object(
                            &shared,
                            &rt,
                            &namespace,
                            object,
                            &manager(&parts.headers, &query),
                            dry_run(&query),
                        )
                    });
                    shared.notify();
                    answer(result, StatusCode::CREATED)
                }
                Method::DELETE => {
                    let result = delete_collection(&shared, &rt, &namespace, &query);
                    shared.notify();
                    answer(result, StatusCode::OK)
                }
                _ => ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                )
                .into_response(),
            }
        }
        Route::Item {
            rt,
            namespace,
            name,
            sub,
        } => {
            match sub.as_deref() {
                None => {}
                Some("status") if rt.status => {}
                Some("attach") if rt.plural == "pods" => {
                    return attach::serve(shared, &mut parts, namespace, name, query).await;
                }
                Some(_) => return ApiError::no_route().into_response(),
            }
            let status_sub = sub.is_some();
            let bytes = match read_body(body).await {
                Ok(b) => b,
                Err(e) => return e.into_response(),
            };
            let result = match parts.method {
                Method::GET => get(&shared, &rt, &namespace, &name),
                Method::PUT => decode(&bytes).and_then(|object| {
                    replace(
                        &shared,
                        &rt,
                        &namespace,
                        &name,
                        object,
                        status_sub,
                        &manager(&parts.headers, &query),
                        dry_run(&query),
                    )
                }),
                Method::PATCH => {
                    let content_type = parts
                        .headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    patch_object(
                        &shared,
                        &rt,
                        &namespace,
                        &name,
                        status_sub,
                        &content_type,
                        &bytes,
                        &parts.headers,
                        &query,
                    )
                }
                Method::DELETE if !status_sub => {
                    delete_object(&shared, &rt, &namespace, &name, &bytes, &query)
                }
                _ => Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                )),
            };
            shared.notify();
            answer(result, StatusCode::OK)
        }
    }
}

fn answer(result: Result<Value, ApiError>, code: StatusCode) -> Response {
    match result {
        Ok(value) => (code, Json(value)).into_response(),
        Err(err) => err.into_response(),
    }
}

async fn read_body(body: Body) -> Result<Vec<u8>, ApiError> {
    match axum::body::to_bytes(body, MAX_BODY + 1).await {
        Ok(bytes) if bytes.len() <= MAX_BODY => Ok(bytes.to_vec()),
        _ => Err(ApiError {
            code: 413,
            reason: "RequestEntityTooLarge",
            message: format!("Request entity too large: limit is {MAX_BODY}"),
            details: None,
        }),
    }
}

fn decode(bytes: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: not an object",
        ));
    }
    Ok(value)
}

fn dry_run(query: &HashMap<String, String>) -> bool {
    query.get("dryRun").is_some_and(|v| v == "All")
}

/// `fieldManager`, else the client's User-Agent up to its first '/'
/// (`prefixFromUserAgent`).
fn manager(headers: &HeaderMap, query: &HashMap<String, String>) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|m| !m.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

fn get(shared: &Shared, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
    shared
        .lock()
        .store
        .get(store::table(rt), namespace, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))
}

/// `resourceVersion` of a read: a number the server has reached.
fn check_read_version(state: &State, query: &HashMap<String, String>) -> Result<(), ApiError> {
    let Some(asked) = query.get("resourceVersion").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let asked: u64 = asked
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {asked}")))?;
    let current = state.store.revision();
    if asked > current {
        return Err(ApiError::too_large_resource_version(asked, current));
    }
    Ok(())
}

pub fn selectors(
    rt: &ResourceType,
    query: &HashMap<String, String>,
) -> Result<(Selector, FieldSelector), ApiError> {
    let labels = Selector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map_or("", String::as_str),
        rt.kind,
    )
    .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn list(
    shared: &Shared,
    rt: &ResourceType,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(rt, query)?;
    let state = shared.lock();
    check_read_version(&state, query)?;
    let mut items: Vec<Value> = state
        .store
        .list(store::table(rt), namespace)
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    // Paging: `continue` names where the last page stopped.
    let start = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    ApiError::bad_request("continue key is not valid: illegal base64 data")
                })?;
            Some(decoded)
        }
        None => None,
    };
    if let Some(after) = &start {
        items.retain(|o| key_of(o).as_str() > after.as_str());
    }
    let mut metadata = json!({"resourceVersion": state.store.revision().to_string()});
    if let Some(limit) = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
    {
        if items.len() > limit {
            items.truncate(limit);
            let last = key_of(items.last().expect("a page"));
            metadata["continue"] = json!(base64::engine::general_purpose::STANDARD.encode(last));
            metadata["remainingItemCount"] = json!(0);
        }
    }
    Ok(
        json!({"apiVersion": rt.api_version(), "kind": rt.list_kind(), "metadata": metadata, "items": items}),
    )
}

fn key_of(object: &Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn check_type(rt: &ResourceType, object: &mut Value) -> Result<(), ApiError> {
    let api_version = rt.api_version();
    match object["apiVersion"].as_str() {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
        _ => object["apiVersion"] = json!(api_version),
    }
    match object["kind"].as_str() {
        Some(k) if k != rt.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )))
        }
        _ => object["kind"] = json!(rt.kind),
    }
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    Ok(())
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let nanos = jiff::Timestamp::now().as_nanosecond() as u128;
    (0..5)
        .map(|i| CHARS[((nanos >> (i * 5)) % CHARS.len() as u128) as usize] as char)
        .collect()
}

/// Decode errors (400) and defaults a kind has before validation.
fn prepare_kind(
    state: &State,
    rt: &ResourceType,
    object: &mut Value,
    creating: bool,
) -> Result<(), ApiError> {
    let decode_error = match rt.plural {
        "pods" => pods::decode_error(object),
        "persistentvolumeclaims" => kinds::pvc_decode_error(object),
        "leases" => kinds::lease_decode_error(object),
        "events" => kinds::event_decode_error(object),
        "secrets" => kinds::prepare_secret(object).err(),
        _ => None,
    };
    if let Some(message) = decode_error {
        return Err(ApiError::bad_request(message));
    }
    if creating {
        match rt.plural {
            "pods" => pods::prepare_create(object, &state.gates),
            "persistentvolumeclaims" => kinds::prepare_pvc(object),
            "namespaces" => {
                let name = object["metadata"]["name"].clone();
                object["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
                object["spec"] = json!({"finalizers": ["kubernetes"]});
                object["status"] = json!({"phase": "Active"});
            }
            _ => {}
        }
    }
    if let Some(schema) = state.schemas.of(rt.kind) {
        schema::prune(object, schema);
    }
    Ok(())
}

fn validate_kind(
    state: &State,
    rt: &ResourceType,
    object: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    let mut errs = objectmeta::validate(rt, object);
    if let Some(old) = old {
        errs.extend(objectmeta::validate_update(old, object));
    }
    errs.extend(match rt.plural {
        "pods" => pods::validate(object),
        "persistentvolumeclaims" => kinds::validate_pvc(object),
        "secrets" => kinds::validate_secret(object),
        "leases" => kinds::validate_lease(object),
        "events" => kinds::validate_event(object),
        _ => Vec::new(),
    });
    if let Some(old) = old {
        errs.extend(match rt.plural {
            "pods" => pods::validate_update(old, object),
            "persistentvolumeclaims" => kinds::validate_pvc_update(old, object),
            "secrets" => kinds::validate_secret_update(old, object),
            "events" => kinds::validate_event_update(old, object),
            _ => Vec::new(),
        });
    }
    if let Some(schema) = state.schemas.of(rt.kind) {
        errs.extend(schema::validate(object, schema));
    }
    errs
}

fn invalid(rt: &ResourceType, object: &Value, errs: &[FieldError]) -> ApiError {
    ApiError::invalid(
        rt.group,
        rt.kind,
        object["metadata"]["name"].as_str().unwrap_or_default(),
        errs,
    )
}

fn scope(rt: &ResourceType, status_sub: bool) -> Scope {
    if status_sub {
        Scope::Status
    } else {
        Scope::Main {
            status_apart: rt.status,
        }
    }
}

/// NamespaceLifecycle admission: the namespace exists and is not going.
fn namespace_admits(
    state: &State,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    match state.store.get(store::table(&resources::NAMESPACES), "", namespace) {
        None => Err(ApiError::not_found("", "namespaces", namespace)),
        Some(ns) if !ns["metadata"]["deletionTimestamp"].is_null() => Err(ApiError::forbidden(
            rt.group,
            rt.plural,
            name,
            &format!("unable to create new content in namespace {namespace} because it is being terminated"),
        )),
        Some(_) => Ok(()),
    }
}

pub fn create_object(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    mut object: Value,
    manager: &str,
    dry: bool,
) -> Result<Value, ApiError> {
    check_type(rt, &mut object)?;
    let mut state = shared.lock();
    let meta = object["metadata"].as_object_mut().expect("metadata");
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && rt.namespaced && ns != namespace => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => {}
    }
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| !v.is_empty())
    {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if rt.namespaced {
        meta.insert("namespace".into(), json!(namespace));
    } else {
        meta.remove("namespace");
    }
    if meta
        .get("name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        if let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
            let generated = format!("{prefix}{}", random_suffix());
            meta.insert("name".into(), json!(generated));
        }
    }
    for server_field in [
        "uid",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "generation",
    ] {
        meta.remove(server_field);
    }
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if rt.status && rt.plural != "pods" && !rt.builtin {
        // A custom resource's status is written through /status only.
        object.as_object_mut().expect("object").remove("status");
    }
    prepare_kind(&state, rt, &mut object, true)?;
    let errs = validate_kind(&state, rt, &object, None);
    if !errs.is_empty() {
        return Err(invalid(rt, &object, &errs));
    }
    namespace_admits(&state, rt, namespace, &name)?;
    let table = store::table(rt);
    if state.store.get(table, namespace, &name).is_some() {
        return Err(ApiError::already_exists(rt.group, rt.plural, &name));
    }
    let uid = state.store.new_uid();
    object["metadata"]["uid"] = json!(uid);
    object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    if !rt.builtin {
        object["metadata"]["generation"] = json!(1);
    }
    let now = now_rfc3339();
    let api_version = rt.api_version();
    fields::record_update(
        None,
        &mut object,
        &Writer {
            manager,
            api_version: &api_version,
            subresource: None,
            scope: scope(rt, false),
            now: &now,
        },
    );
    if dry {
        return Ok(object);
    }
    let stored = state.store.put(table, namespace, &name, object);
    lifecycle::settle(&mut state);
    Ok(stored)
}

/// Everything but status (or only status) comes from the request; the
/// server's own metadata from the stored object.
fn scoped_update(rt: &ResourceType, old: &Value, mut new: Value, status_sub: bool) -> Value {
    if status_sub {
        let mut kept = old.clone();
        kept["status"] = new["status"].take();
        if let Some(rv) = new["metadata"]["resourceVersion"].as_str() {
            kept["metadata"]["resourceVersion"] = json!(rv);
        }
        return kept;
    }
    if rt.status {
        match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(map) = new.as_object_mut() {
                    map.remove("status");
                }
            }
        }
    }
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
    ] {
        match old["metadata"].get(field) {
            Some(v) => new["metadata"][field] = v.clone(),
            None => {
                if let Some(meta) = new["metadata"].as_object_mut() {
                    meta.remove(field);
                }
            }
        }
    }
    new
}

fn without_volatile(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    object
}

/// The update path shared by PUT, patches and applies to an existing object.
#[allow(clippy::too_many_arguments)]
fn update_object(
    state: &mut State,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    old: &Value,
    mut new: Value,
    status_sub: bool,
    writer_manager: &str,
    dry: bool,
    managed: Option<Value>,
) -> Result<Value, ApiError> {
    check_type(rt, &mut new)?;
    match new["metadata"]["name"].as_str() {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => new["metadata"]["name"] = json!(name),
    }
    if rt.namespaced {
        match new["metadata"]["namespace"].as_str() {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => new["metadata"]["namespace"] = json!(namespace),
        }
    }
    // A resourceVersion in the request is a precondition.
    if let Some(rv) = new["metadata"]["resourceVersion"]
        .as_str()
        .filter(|v| !v.is_empty())
    {
        if Some(rv) != old["metadata"]["resourceVersion"].as_str() {
            return Err(ApiError::stale(rt.group, rt.plural, name));
        }
    }
    let mut new = scoped_update(rt, old, new, status_sub);
    if rt.plural == "pods" {
        pods::drop_disabled_fields(&mut new, Some(old), &state.gates);
    }
    prepare_kind(state, rt, &mut new, false)?;
    if !rt.builtin && !status_sub && old["spec"] != new["spec"] {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    let errs = validate_kind(state, rt, &new, Some(old));
    if !errs.is_empty() {
        return Err(invalid(rt, &new, &errs));
    }
    let now = now_rfc3339();
    let api_version = rt.api_version();
    match managed {
        // An apply computed its own managed fields.
        Some(managed) => new["metadata"]["managedFields"] = managed,
        None => fields::record_update(
            Some(old),
            &mut new,
            &Writer {
                manager: writer_manager,
                api_version: &api_version,
                subresource: status_sub.then_some("status"),
                scope: scope(rt, status_sub),
                now: &now,
            },
        ),
    }
    if new["metadata"]["managedFields"].is_null() {
        if let Some(meta) = new["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
    }
    // An update that changes nothing writes nothing.
    if without_volatile(&new) == without_volatile(old) {
        return Ok(old.clone());
    }
    if dry {
        return Ok(new);
    }
    let stored = state.store.put(store::table(rt), namespace, name, new);
    lifecycle::settle(state);
    Ok(stored)
}

#[allow(clippy::too_many_arguments)]
fn replace(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    object: Value,
    status_sub: bool,
    manager: &str,
    dry: bool,
) -> Result<Value, ApiError> {
    let mut state = shared.lock();
    let old = state
        .store
        .get(store::table(rt), namespace, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
    update_object(
        &mut state, rt, namespace, name, &old, object, status_sub, manager, dry, None,
    )
}

/// `ValidatePatchOptions`: 422 on PatchOptions.
fn patch_options(patch_type: PatchType, query: &HashMap<String, String>) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    let manager = query.get("fieldManager").map_or("", String::as_str);
    if patch_type == PatchType::Apply {
        if manager.is_empty() {
            errs.push(FieldError::required(
                "fieldManager",
                "is required for apply patch",
            ));
        }
        if let Some(force) = query.get("force") {
            if force != "true" && force != "false" {
                errs.push(FieldError::invalid(
                    "force",
                    json!(force),
                    "must be true or false".into(),
                ));
            }
        }
    } else if query.contains_key("force") {
        errs.push(FieldError::forbidden(
            "force",
            "may not be specified for non-apply patch",
        ));
    }
    if manager.len() > 128 {
        errs.push(FieldError::too_long("fieldManager", 128, "bytes"));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("meta.k8s.io", "PatchOptions", "", &errs))
    }
}

#[allow(clippy::too_many_arguments)]
fn patch_object(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    status_sub: bool,
    content_type: &str,
    body: &[u8],
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let accepted = if rt.builtin {
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
    } else {
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    };
    let unsupported = || {
        ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: {accepted}"
        ))
    };
    let patch_type = PatchType::of(content_type).ok_or_else(unsupported)?;
    if patch_type == PatchType::Strategic && !rt.builtin {
        return Err(unsupported());
    }
    patch_options(patch_type, query)?;
    let manager = manager(headers, query);
    let dry = dry_run(query);
    if patch_type == PatchType::Apply {
        return apply(
            shared,
            rt,
            namespace,
            name,
            status_sub,
            body,
            &manager,
            truthy(query, "force"),
            dry,
        );
    }
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut state = shared.lock();
    let old = state
        .store
        .get(store::table(rt), namespace, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
    let mut new = old.clone();
    // The stored resourceVersion is not the patch's precondition.
    new["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    match patch_type {
        PatchType::Merge => patch::merge(&mut new, &patch),
        PatchType::Strategic => {
            patch::strategic(&mut new, &patch).map_err(ApiError::bad_request)?
        }
        PatchType::Json => patch::json_patch(&mut new, &patch).map_err(|e| {
            ApiError::invalid(
                rt.group,
                rt.kind,
                name,
                &[FieldError::invalid("", json!(""), e)],
            )
        })?,
        PatchType::Apply => unreachable!("handled above"),
    }
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the patch made the object not an object",
        ));
    }
    update_object(
        &mut state, rt, namespace, name, &old, new, status_sub, &manager, dry, None,
    )
}

#[allow(clippy::too_many_arguments)]
fn apply(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    status_sub: bool,
    body: &[u8],
    manager: &str,
    force: bool,
    dry: bool,
) -> Result<Value, ApiError> {
    let text = String::from_utf8_lossy(body);
    let mut applied: Value = serde_json::from_str(&text)
        .or_else(|_| serde_yaml::from_str::<Value>(&text))
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !applied.is_object() {
        return Err(ApiError::bad_request("error decoding YAML: not an object"));
    }
    for field in ["apiVersion", "kind"] {
        if applied[field].as_str().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(format!("{field} must be set")));
        }
    }
    check_type(rt, &mut applied)?;
    if let Some(n) = applied["metadata"]["name"].as_str() {
        if n != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    let mut state = shared.lock();
    let old = state.store.get(store::table(rt), namespace, name).cloned();
    if let Some(rv) = applied["metadata"]["resourceVersion"]
        .as_str()
        .filter(|v| !v.is_empty())
    {
        if old
            .as_ref()
            .and_then(|o| o["metadata"]["resourceVersion"].as_str())
            != Some(rv)
        {
            return Err(ApiError::stale(rt.group, rt.plural, name));
        }
    }
    let now = now_rfc3339();
    let api_version = rt.api_version();
    let writer = Writer {
        manager,
        api_version: &api_version,
        subresource: status_sub.then_some("status"),
        scope: scope(rt, status_sub),
        now: &now,
    };
    let Some(old) = old else {
        if status_sub {
            return Err(ApiError::not_found(rt.group, rt.plural, name));
        }
        // An apply to nothing creates.
        let mut created = fields::apply(None, &applied, &writer, force)
            .map_err(|c| ApiError::apply_conflicts(&c))?;
        created["metadata"]["name"] = json!(name);
        let managed = created["metadata"]["managedFields"].clone();
        drop(state);
        let mut stored = create_object(shared, rt, namespace, created, manager, dry)?;
        if !dry {
            // The create recorded an Update; an apply owns its fields as Apply.
            let mut state = shared.lock();
            stored["metadata"]["managedFields"] = managed;
            stored = state.store.put(store::table(rt), namespace, name, stored);
        }
        return Ok(stored);
    };
    let merged = fields::apply(Some(&old), &applied, &writer, force)
        .map_err(|c| ApiError::apply_conflicts(&c))?;
    let managed = merged["metadata"]["managedFields"].clone();
    let mut merged = merged;
    merged["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    update_object(
        &mut state,
        rt,
        namespace,
        name,
        &old,
        merged,
        status_sub,
        manager,
        dry,
        Some(managed),
    )
}

/// DeleteOptions from the body, with query parameters as a fallback.
fn delete_object(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    body: &[u8],
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let grace = options["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
    let propagation = options["propagationPolicy"]
        .as_str()
        .map(str::to_string)
        .or_else(|| query.get("propagationPolicy").cloned());
    let finalizer = match propagation.as_deref() {
        None | Some("Background") => None,
        Some("Orphan") => Some("orphan"),
        Some("Foreground") => Some("foregroundDeletion"),
        Some(other) => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "DeleteOptions",
                "",
                &[FieldError::not_supported(
                    "propagationPolicy",
                    json!(other),
                    &["Foreground", "Background", "Orphan"],
                )],
            ))
        }
    };
    let mut state = shared.lock();
    let table = store::table(rt);
    let object = state
        .store
        .get(table, namespace, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
    let preconditions = &options["preconditions"];
    if let Some(uid) = preconditions["uid"].as_str() {
        let have = object["metadata"]["uid"].as_str().unwrap_or_default();
        if uid != have {
            return Err(ApiError::conflict(
                rt.group,
                rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
    }
    if let Some(rv) = preconditions["resourceVersion"].as_str() {
        let have = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        if rv != have {
            return Err(ApiError::conflict(
                rt.group,
                rt.plural,
                name,
                &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"),
            ));
        }
    }
    if dry_run(query) {
        return Ok(object);
    }
    lifecycle::delete(&mut state, rt, namespace, name, grace, finalizer);
    lifecycle::settle(&mut state);
    match state.store.get(table, namespace, name) {
        // Still there: terminating, held by its grace or finalizers.
        Some(object) => Ok(object.clone()),
        None if matches!(rt.plural, "pods" | "persistentvolumeclaims") => Ok(object),
        None => Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": rt.group, "kind": rt.plural,
                        "uid": object["metadata"]["uid"]}}),
        ),
    }
}

fn delete_collection(
    shared: &Shared,
    rt: &ResourceType,
    namespace: &str,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(rt, query)?;
    let mut state = shared.lock();
    let table = store::table(rt);
    let doomed: Vec<Value> = state
        .store
        .list(table, Some(namespace))
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    for object in &doomed {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        lifecycle::delete(&mut state, rt, namespace, &name, None, None);
    }
    lifecycle::settle(&mut state);
    Ok(
        json!({"apiVersion": rt.api_version(), "kind": rt.list_kind(),
              "metadata": {"resourceVersion": state.store.revision().to_string()}, "items": doomed}),
    )
}
