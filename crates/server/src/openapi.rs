//! The OpenAPI document, generated from the routes' annotations and the types they
//! answer with ([`crate::wire`], and the public events of [`crate::public`]), so it
//! says what the handlers do. It is served at `/openapi.json`; `openapi.json` beside
//! this crate is a copy for clients to generate code from, and a test fails when the
//! copy is stale (`STEADFAST_UPDATE_OPENAPI=1 cargo test -p steadfast-server --test
//! openapi` rewrites it; `steadfast openapi` prints it).

use std::sync::OnceLock;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::routes::{self, admin, forks, messages, sessions};

const DESCRIPTION: &str = "Durable coding-agent sessions. Every error is \
`{\"error\": {\"code\", \"message\"}}`. Authenticate with `Authorization: Bearer <token>` \
when the server has tokens configured. Event streams are server-sent events whose ids \
are log positions; reconnect with `?cursor=N` or `Last-Event-ID` to continue with \
nothing lost or repeated. Their data, and the JSON pages of the same events, are public \
events (schema 1): `PublicEvent`, one type per kind of log record.";

#[derive(OpenApi)]
#[openapi(
    info(title = "Steadfast API", description = DESCRIPTION),
    paths(
        sessions::create,
        sessions::list,
        sessions::show,
        sessions::update,
        forks::fork,
        forks::rewind,
        forks::change_agent,
        admin::issue,
        admin::list,
        admin::revoke,
        admin::audit,
        sessions::delete,
        sessions::close,
        sessions::interrupt,
        sessions::integrity,
        sessions::services,
        routes::previews::ports,
        routes::previews::forward_path,
        routes::shell::attach,
        routes::preview_links::create,
        routes::preview_links::list,
        routes::preview_links::revoke,
        routes::preview_links::open_path,
        sessions::diff,
        sessions::files,
        sessions::file,
        sessions::output,
        sessions::archive,
        sessions::agents,
        messages::post_message,
        messages::events,
        messages::signal,
        messages::tool_result,
        routes::uploads::create,
        routes::vaults::put,
        routes::vaults::list,
        routes::vaults::delete,
        routes::hooks::create,
        routes::admin::session_audit,
        routes::hooks::list,
        routes::hooks::delete,
        routes::hooks::deliver,
        routes::openapi,
        routes::healthz,
        routes::livez,
        routes::readyz,
        routes::metrics,
    ),
    components(schemas(crate::public::PublicEvent, steadfast_log::Status)),
    modifiers(&Bearer),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// Declares the bearer-token scheme every operation names.
struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document, as pretty-printed JSON (built once).
pub fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut doc =
            serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
        flatten_unions(&mut doc);
        let mut text = serde_json::to_string_pretty(&doc).expect("JSON serializes");
        text.push('\n');
        text
    })
}

/// Rewrites what `#[serde(flatten)]` of a tagged union and newtype variants of one
/// produce (`allOf` of a union and an object, or of a referenced object and an
/// object) into plain objects: a union of objects each holding every field, which
/// code generators take (openapi-python-client refuses an `allOf` over a `oneOf`, and
/// one inside a union). What a value may be is unchanged.
fn flatten_unions(doc: &mut serde_json::Value) {
    let schemas = doc["components"]["schemas"].clone();
    if let Some(all) = doc["components"]["schemas"].as_object_mut() {
        for schema in all.values_mut() {
            rewrite(schema, &schemas);
            if let Some(variants) = schema.get_mut("oneOf").and_then(|v| v.as_array_mut()) {
                for variant in variants {
                    rewrite(variant, &schemas);
                }
            }
        }
    }
}

/// `schema` with an `allOf` of two or more parts merged, when every part is an object
/// or one of them a union of objects.
fn rewrite(schema: &mut serde_json::Value, schemas: &serde_json::Value) {
    use serde_json::Value;
    let Some(parts) = schema.get("allOf").and_then(Value::as_array).cloned() else {
        return;
    };
    if parts.len() < 2 {
        return;
    }
    let resolved: Vec<Value> = parts.iter().map(|p| resolve(p, schemas)).collect();
    let unions: Vec<usize> = (0..resolved.len())
        .filter(|&i| resolved[i].get("oneOf").is_some())
        .collect();
    let merged = match unions.as_slice() {
        [] => match merge(&resolved) {
            Some(object) => object,
            None => return,
        },
        [u] => {
            let rest: Vec<Value> = (0..resolved.len())
                .filter(|i| i != u)
                .map(|i| resolved[i].clone())
                .collect();
            let mut variants = Vec::new();
            for variant in resolved[*u]["oneOf"].as_array().into_iter().flatten() {
                let mut all = vec![resolve(variant, schemas)];
                all.extend(rest.iter().cloned());
                match merge(&all) {
                    Some(object) => variants.push(object),
                    None => return,
                }
            }
            let mut union = serde_json::json!({ "oneOf": variants });
            if let Some(d) = resolved[*u].get("discriminator") {
                union["discriminator"] = d.clone();
            }
            union
        }
        _ => return,
    };
    let description = schema.get("description").cloned();
    *schema = merged;
    if let Some(d) = description {
        schema["description"] = d;
    }
}

/// A part as its schema: a reference followed to the component it names.
fn resolve(part: &serde_json::Value, schemas: &serde_json::Value) -> serde_json::Value {
    match part.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => r
            .strip_prefix("#/components/schemas/")
            .and_then(|name| schemas.get(name))
            .cloned()
            .unwrap_or_else(|| part.clone()),
        None => part.clone(),
    }
}

/// Objects merged into one: every property, every required name; `None` if a part is
/// not an object.
fn merge(parts: &[serde_json::Value]) -> Option<serde_json::Value> {
    let mut properties = serde_json::Map::new();
    let mut required: Vec<serde_json::Value> = Vec::new();
    let mut description = None;
    for part in parts {
        if part.get("type").and_then(|t| t.as_str()) != Some("object") {
            return None;
        }
        for (name, property) in part["properties"].as_object().into_iter().flatten() {
            properties.insert(name.clone(), property.clone());
        }
        for name in part["required"].as_array().into_iter().flatten() {
            if !required.contains(name) {
                required.push(name.clone());
            }
        }
        if description.is_none() {
            description = part.get("description").cloned();
        }
    }
    let mut object =
        serde_json::json!({"type": "object", "properties": properties, "required": required});
    if let Some(d) = description {
        object["description"] = d;
    }
    Some(object)
}
