//! Routes: `/v1/sessions...`, `/openapi.json`, `/healthz`, and a JSON 404 for the rest.

pub(crate) mod admin;
pub(crate) mod forks;
pub(crate) mod hooks;
pub(crate) mod messages;
pub(crate) mod preview_links;
pub(crate) mod previews;
pub(crate) mod sessions;
pub(crate) mod shell;
pub(crate) mod uploads;
pub(crate) mod vaults;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, delete, get, post, put};
use axum::Router;
use steadfast_world::World;

use crate::error::ApiError;
use crate::{ServerState, MAX_BODY};

pub(crate) type Shared<W> = Arc<ServerState<W>>;

/// The API's routes, with their body limits, JSON errors and request metrics.
pub(crate) fn router<W: World + Clone>(state: Shared<W>) -> Router {
    Router::new()
        .route(
            "/v1/sessions",
            post(sessions::create::<W>).get(sessions::list::<W>),
        )
        .route(
            "/v1/sessions/{id}",
            get(sessions::show::<W>)
                .patch(sessions::update::<W>)
                .delete(sessions::delete::<W>),
        )
        .route("/v1/sessions/{id}/close", post(sessions::close::<W>))
        .route("/v1/sessions/{id}/fork", post(forks::fork::<W>))
        .route("/v1/sessions/{id}/rewind", post(forks::rewind::<W>))
        .route("/v1/sessions/{id}/agent", post(forks::change_agent::<W>))
        .route(
            "/v1/sessions/{id}/interrupt",
            post(sessions::interrupt::<W>),
        )
        .route("/v1/sessions/{id}/integrity", get(sessions::integrity::<W>))
        .route("/v1/sessions/{id}/services", get(sessions::services::<W>))
        .route("/v1/sessions/{id}/ports", get(previews::ports::<W>))
        .route("/v1/sessions/{id}/shell", get(shell::attach::<W>))
        .route(
            "/v1/sessions/{id}/links",
            post(preview_links::create::<W>).get(preview_links::list::<W>),
        )
        .route(
            "/v1/sessions/{id}/links/{link}",
            delete(preview_links::revoke::<W>),
        )
        .route(
            "/v1/previews/{secret}/",
            any(preview_links::open_root::<W>).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/previews/{secret}/{*path}",
            any(preview_links::open_path::<W>).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/sessions/{id}/ports/{port}", any(previews::to_root))
        .route(
            "/v1/sessions/{id}/ports/{port}/",
            any(previews::forward_root::<W>).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/sessions/{id}/ports/{port}/{*path}",
            any(previews::forward_path::<W>).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/sessions/{id}/diff", get(sessions::diff::<W>))
        .route("/v1/sessions/{id}/files", get(sessions::files::<W>))
        .route("/v1/sessions/{id}/archive", get(sessions::archive::<W>))
        .route("/v1/sessions/{id}/files/{*path}", get(sessions::file::<W>))
        .route(
            "/v1/sessions/{id}/outputs/{seq}",
            get(sessions::output::<W>),
        )
        .route(
            "/v1/sessions/{id}/messages",
            post(messages::post_message::<W>),
        )
        .route("/v1/sessions/{id}/events", get(messages::events::<W>))
        .route(
            "/v1/sessions/{id}/tool_results",
            post(messages::tool_result::<W>),
        )
        .route(
            "/v1/sessions/{id}/signals/{name}",
            post(messages::signal::<W>),
        )
        .route(
            "/v1/sessions/{id}/hooks",
            post(hooks::create::<W>).get(hooks::list::<W>),
        )
        .route("/v1/sessions/{id}/hooks/{name}", delete(hooks::delete::<W>))
        .route("/v1/sessions/{id}/audit", get(admin::session_audit::<W>))
        .route("/v1/hooks/{session}/{name}", post(hooks::deliver::<W>))
        .route(
            "/v1/uploads",
            post(uploads::create::<W>).layer(DefaultBodyLimit::max(state.max_upload)),
        )
        .route("/v1/agents", get(sessions::agents::<W>))
        .route(
            "/v1/admin/tokens",
            post(admin::issue::<W>).get(admin::list::<W>),
        )
        .route("/v1/admin/tokens/{id}", delete(admin::revoke::<W>))
        .route("/v1/audit", get(admin::audit::<W>))
        .route("/v1/vaults", get(vaults::list::<W>))
        .route(
            "/v1/vaults/{name}",
            put(vaults::put::<W>).delete(vaults::delete::<W>),
        )
        .route("/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz::<W>))
        .route("/metrics", get(metrics::<W>))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn(crate::metrics::observe_requests))
        .with_state(state)
}

/// Lets pages from `origins` call the API from a browser: preflights are answered,
/// and every response (errors included) names the origin. Browsers send the token in
/// `Authorization` (no cookies), and a reconnecting `EventSource` its `Last-Event-ID`.
pub(crate) fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| o.parse().ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                axum::http::Method::GET,
                axum::http::Method::POST,
                axum::http::Method::PUT,
                axum::http::Method::DELETE,
            ])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("last-event-id"),
            ])
            .max_age(std::time::Duration::from_secs(3600)),
    )
}

/// Makes every error response JSON (`{"error": {"code", "message"}}`), including the
/// ones the framework writes as plain text: 405, 413 from the body limit, 408 from
/// the body timeout, 400 from a bad path.
async fn json_errors(response: axum::response::Response) -> axum::response::Response {
    if response
        .extensions()
        .get::<previews::FromSandbox>()
        .is_some()
    {
        return response;
    }
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let message = match (status, text.is_empty()) {
        (StatusCode::METHOD_NOT_ALLOWED, _) => {
            let allowed = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("another method");
            format!("this route takes {allowed}; see /openapi.json")
        }
        (StatusCode::PAYLOAD_TOO_LARGE, _) => format!(
            "the body is larger than this route takes ({MAX_BODY} bytes; uploads: the server's upload limit)"
        ),
        (_, false) => text,
        (_, true) => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string(),
    };
    let mut out = ApiError::new(status, code, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// This document
#[utoipa::path(
    get,
    path = "/openapi.json",
    security(()),
    responses((status = 200, description = "The OpenAPI document (3.1) of this API", body = Object))
)]
pub(crate) async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::document(),
    )
}

/// Liveness
///
/// The process serves HTTP. `/livez` answers the same; neither looks at the stores
/// (see `/readyz`), so a database outage never gets a healthy server restarted.
#[utoipa::path(
    get,
    path = "/healthz",
    security(()),
    responses((status = 200, description = "The process serves", body = String, example = "ok"))
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Liveness (the same as `/healthz`)
#[utoipa::path(
    get,
    path = "/livez",
    security(()),
    responses((status = 200, description = "The process serves", body = String, example = "ok"))
)]
pub(crate) async fn livez() -> &'static str {
    "ok"
}

/// Readiness
///
/// Whether this server can do its work now: the world (the database) answers a read
/// and the blob store a listing, each within 5 s, and, where this process runs
/// sessions' commands (it has workers), their sandbox backend can be started. A 503
/// `not_ready` while one cannot, naming which; the cause goes to the server's log,
/// not to the caller (the route needs no token).
#[utoipa::path(
    get,
    path = "/readyz",
    security(()),
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "A store does not answer (`not_ready`, naming which)", body = crate::wire::Error)
    )
)]
pub(crate) async fn readyz<W: World + Clone>(
    axum::extract::State(state): axum::extract::State<Shared<W>>,
) -> impl IntoResponse {
    let sandbox = state
        .runs_commands
        .then(|| &state.harness.options().sandbox);
    readiness(state.harness.world(), state.harness.blobs(), sandbox).await
}

/// `/readyz` for `world` and `blobs` (the API's listener and the metrics listener of a
/// worker answer it alike).
pub(crate) async fn readiness<W: World>(
    world: &W,
    blobs: &steadfast_world::Blobs,
    sandbox: Option<&steadfast_sandbox::SandboxOptions>,
) -> Result<axum::Json<Readiness>, ApiError> {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
    let answered =
        |name: &'static str, checked: Result<steadfast_world::Result<()>, _>| match checked {
            Ok(Ok(())) => "ok",
            Ok(Err(e)) => {
                tracing::warn!(store = name, error = %e, "not ready");
                "unavailable"
            }
            Err(tokio::time::error::Elapsed { .. }) => {
                tracing::warn!(store = name, "not ready: no answer within 5 s");
                "unavailable"
            }
        };
    let (world, blobs) = tokio::join!(
        tokio::time::timeout(WITHIN, world.ping()),
        tokio::time::timeout(WITHIN, blobs.ping()),
    );
    let sandbox = match sandbox.map(steadfast_sandbox::ready) {
        None => "not_used",
        Some(Ok(())) => "ok",
        Some(Err(why)) => {
            tracing::warn!(store = "sandbox", error = %why, "not ready");
            "unavailable"
        }
    };
    let readiness = Readiness {
        world: answered("world", world),
        blobs: answered("blobs", blobs),
        sandbox,
    };
    let down: Vec<&str> = [
        ("world", readiness.world),
        ("blobs", readiness.blobs),
        ("sandbox", readiness.sandbox),
    ]
    .into_iter()
    .filter(|(_, state)| *state == "unavailable")
    .map(|(name, _)| name)
    .collect();
    if down.is_empty() {
        Ok(axum::Json(readiness))
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("not ready: {} unavailable", down.join(" and ")),
        ))
    }
}

/// What `/readyz` found of each store.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Readiness {
    /// `ok` or `unavailable`.
    world: &'static str,
    /// `ok` or `unavailable`.
    blobs: &'static str,
    /// `ok`, `unavailable` (the configured backend cannot start a sandbox here), or
    /// `not_used` (this process runs no commands: an API-only server).
    sandbox: &'static str,
}

/// Prometheus metrics (on this listener in development only)
///
/// The process's metrics in the OpenMetrics text format, with the world's census
/// (sessions by status, queue depth) taken at the scrape. They span every owner's
/// sessions, so outside development this route answers 404 and the operator serves
/// them on a listener of their own (`--metrics-listen`). The series are listed in
/// the README.
#[utoipa::path(
    get,
    path = "/metrics",
    security(()),
    responses(
        (status = 200, description = "The exposition", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 404, description = "Not served on this listener outside development", body = crate::wire::Error),
    )
)]
pub(crate) async fn metrics<W: World + Clone>(
    axum::extract::State(state): axum::extract::State<Shared<W>>,
) -> Result<axum::response::Response, ApiError> {
    if !matches!(state.auth.mode, crate::AuthMode::Development) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not served on the API's listener outside development; the operator serves them with --metrics-listen",
        ));
    }
    crate::metrics::exposition(state.harness.world()).await
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route; see /openapi.json",
    )
}

/// The session's summary if `owner` may see it; 404 otherwise.
pub(crate) async fn owned<W: World + Clone>(
    state: &ServerState<W>,
    id: &str,
    owner: &str,
) -> Result<steadfast_world::SessionSummary, ApiError> {
    let summary = state.harness.world().session(id).await?;
    if summary.owner != owner {
        return Err(ApiError::no_session(id));
    }
    Ok(summary)
}
