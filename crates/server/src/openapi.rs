//! The OpenAPI document, generated from the routes' annotations and the types they
//! answer with ([`crate::wire`], and the public events of [`crate::public`]), so it
//! says what the handlers do. It is served at `/openapi.json`; `openapi.json` beside
//! this crate is a copy for clients to generate code from, and a test fails when the
//! copy is stale (`STEADFAST_UPDATE_OPENAPI=1 cargo test -p steadfast-server --test
//! openapi` rewrites it; `steadfast openapi` prints it).

use std::sync::OnceLock;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::routes::{self, admin, messages, sessions};

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
        admin::issue,
        admin::list,
        admin::revoke,
        admin::audit,
        sessions::delete,
        sessions::close,
        sessions::interrupt,
        sessions::integrity,
        sessions::diff,
        sessions::files,
        sessions::file,
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
        routes::openapi,
        routes::healthz,
        routes::livez,
        routes::readyz,
        routes::metrics,
    ),
    components(schemas(crate::public::PublicEvent, crate::wire::SessionStatus)),
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
        let mut text = ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI document serializes");
        text.push('\n');
        text
    })
}
