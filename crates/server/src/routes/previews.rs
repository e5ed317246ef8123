//! Preview URLs: HTTP and WebSocket traffic for a port a program in a session's
//! sandbox listens on, forwarded by the API server through the sandbox's agent — the
//! sandbox's network is never opened for it.
//!
//! `/v1/sessions/{id}/ports/{port}/...` is the session's owner's (a token that may
//! read it; one that may run it for methods that change things). What reaches the
//! sandbox carries nothing of the caller's: no `Authorization`, no cookie of
//! Steadfast's, no proxy credentials. Pages come back under a `sandbox` content
//! security policy: served from the API's own origin, they get an opaque origin of
//! their own, so their scripts cannot act with anything the API's origin holds.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use steadfast_harness::reach::Reachable;
use steadfast_world::World;

use super::{owned, Shared};
use crate::auth::AuthMode;
use crate::error::ApiError;
use crate::wire;

/// Marks a response that came from a program in a sandbox: it is passed on as it is
/// (its errors are the program's, not the API's, and are not rewritten as JSON).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FromSandbox;

/// The policy a forwarded page is served under: scripts and forms work, in an origin
/// of their own.
const SANDBOX_POLICY: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals \
     allow-downloads allow-pointer-lock allow-presentation";

/// List what listens in a session's sandbox
///
/// The TCP ports programs in the session's sandbox listen on, each with its preview URL
/// and the service that declared it, if any. A session with no running sandbox (between
/// turns) has one started for it, with its services, as the first request to a
/// preview URL does. A sandbox that shares the host's network (`network: open`, or the
/// `local` backend) has no ports of its own: 409 `no_ports`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ports",
    operation_id = "list_ports",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "What listens in the sandbox", body = wire::Ports),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode: previews are not available", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session has ended, or its sandbox has no ports of its own", body = wire::Error),
        (status = 503, description = "The sandbox could not be started here now (another host drives the session, or a worker is picking its turn up)", body = wire::Error),
    )
)]
pub(crate) async fn ports<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Ports>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    no_public(&state)?;
    owned(&state, &id, &owner).await?;
    let reach = reach(&state, &id, None, &owner).await?;
    let listening = reach.ports().await.map_err(sandbox_error)?;
    let services = state.harness.state(&id).await?.services;
    let ports = listening
        .into_iter()
        .map(|port| wire::Port {
            port,
            url: format!("/v1/sessions/{id}/ports/{port}/"),
            service: services
                .iter()
                .find(|s| s.port == Some(port))
                .map(|s| s.name.clone()),
        })
        .collect();
    Ok(Json(wire::Ports { ports }))
}

/// `/v1/sessions/{id}/ports/{port}`: to the same with a slash, so a page's relative
/// links resolve under its prefix.
pub(crate) async fn to_root(Path((id, port)): Path<(String, u16)>) -> Response {
    let to = format!("/v1/sessions/{id}/ports/{port}/");
    (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response()
}

/// `/v1/sessions/{id}/ports/{port}/`: the root of the program's site.
pub(crate) async fn forward_root<W: World + Clone>(
    State(state): State<Shared<W>>,
    Path((id, port)): Path<(String, u16)>,
    request: Request,
) -> Response {
    forward(&state, &id, port, "", request).await
}

/// Reach a program in a session's sandbox (preview URL)
///
/// Any method, and WebSocket upgrades, under `/v1/sessions/{id}/ports/{port}/` are
/// forwarded to `port` on the sandbox's own loopback through its agent (the sandbox's
/// network stays as its policy says) and the program's answer comes back as it is,
/// streamed. The caller's `Authorization` and Steadfast's cookies are never forwarded;
/// `Host` is `localhost:{port}` and `X-Forwarded-Host` the one asked for. Answers carry
/// `Content-Security-Policy: sandbox …`, giving pages an origin of their own. Safe
/// methods need a token that may read the session, others one that may run it. A
/// session with no running sandbox has one started (its services with it) by the first
/// request, which waits for it (`steadfast_preview_wake_seconds`).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ports/{port}/{path}",
    operation_id = "preview",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("port" = u16, Path, description = "The port in the sandbox"),
        ("path" = String, Path, description = "The path on the program's site"),
    ),
    responses(
        (status = 200, description = "The program's answer, whatever its status and type"),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode, or a token without the scope the method needs", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's; or nothing listens on the port (`port_closed`)", body = wire::Error),
        (status = 409, description = "The session has ended, or its sandbox has no ports of its own", body = wire::Error),
        (status = 502, description = "The program on the port did not answer over HTTP", body = wire::Error),
        (status = 503, description = "The sandbox could not be started here now", body = wire::Error),
    )
)]
pub(crate) async fn forward_path<W: World + Clone>(
    State(state): State<Shared<W>>,
    Path((id, port, path)): Path<(String, u16, String)>,
    request: Request,
) -> Response {
    forward(&state, &id, port, &path, request).await
}

/// Forwards `request` to `port` in `id`'s sandbox, as `/{path}`, after checking the
/// caller owns the session.
async fn forward<W: World + Clone>(
    state: &Shared<W>,
    id: &str,
    port: u16,
    path: &str,
    request: Request,
) -> Response {
    let scope = match request.method().is_safe() {
        true => steadfast_world::Scope::Read,
        false => steadfast_world::Scope::Run,
    };
    let headers = request.headers().clone();
    let checked = async {
        let owner = state.owner(&headers, scope).await?;
        no_public(state)?;
        owned(state, id, &owner).await?;
        reach(state, id, Some(port), &owner).await
    };
    pass(checked.await, port, path, request).await
}

/// Relays `request` if the checks before it passed (counted either way).
pub(crate) async fn pass(
    checked: Result<Arc<dyn Reachable>, ApiError>,
    port: u16,
    path: &str,
    request: Request,
) -> Response {
    let kind = match is_upgrade(request.headers()) {
        true => "websocket",
        false => "http",
    };
    let reach = match checked {
        Ok(reach) => reach,
        Err(e) => {
            steadfast_metrics::metrics().preview_request(kind, "refused");
            return e.into_response();
        }
    };
    match relay(reach.as_ref(), port, path, request).await {
        Ok(response) => {
            steadfast_metrics::metrics().preview_request(kind, "forwarded");
            response
        }
        Err(e) => {
            steadfast_metrics::metrics().preview_request(kind, "unreachable");
            e.into_response()
        }
    }
}

/// The session's sandbox, started for the request if it had stopped: a wake is in
/// the session's audit, under `actor` (its owner, or the link used).
pub(crate) async fn reach<W: World + Clone>(
    state: &Shared<W>,
    id: &str,
    port: Option<u16>,
    actor: &str,
) -> Result<Arc<dyn Reachable>, ApiError> {
    let visit = state.harness.reach(id).await?;
    if let Some(took) = visit.woke_in {
        let detail = serde_json::json!({"port": port, "ms": took.as_millis() as u64});
        state.audit(actor, "preview.woke", id, detail).await;
    }
    Ok(visit.sandbox)
}

/// Sends `request` to `port` over a pipe into the sandbox and passes the answer back;
/// a WebSocket (or any upgrade the program accepts) is then joined end to end.
async fn relay(
    reach: &dyn Reachable,
    port: u16,
    path: &str,
    mut request: Request,
) -> Result<Response, ApiError> {
    let pipe = reach.connect(port).await.map_err(sandbox_error)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(pipe))
        .await
        .map_err(|e| bad_gateway(port, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "a preview connection ended");
        }
    });
    let upgrade = is_upgrade(request.headers());
    let from_client = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let target = match parts.uri.query() {
        Some(query) => format!("/{path}?{query}"),
        None => format!("/{path}"),
    };
    let mut upstream = axum::http::Request::builder()
        .method(parts.method)
        .uri(target)
        .body(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    *upstream.headers_mut() = inward_headers(&parts.headers, port, upgrade);
    let mut answer = sender
        .send_request(upstream)
        .await
        .map_err(|e| bad_gateway(port, &e))?;
    if let (Some(from_client), StatusCode::SWITCHING_PROTOCOLS) = (from_client, answer.status()) {
        let from_program = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            let (Ok(client), Ok(program)) = (from_client.await, from_program.await) else {
                tracing::debug!("a preview's upgrade did not complete");
                return;
            };
            let (mut client, mut program) = (TokioIo::new(client), TokioIo::new(program));
            if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut program).await {
                tracing::debug!(error = %e, "a preview's upgraded connection ended");
            }
        });
    }
    let (mut parts, body) = answer.into_parts();
    parts.headers = outward_headers(&parts.headers, parts.status);
    parts.extensions.insert(FromSandbox);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Whether a request asks to switch protocols (a WebSocket).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Headers that describe one hop, not the request: never passed on.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// What a program in the sandbox is sent of the caller's headers: everything but
/// the hop's own and the caller's credentials (the bearer token, Steadfast's
/// cookies), with `Host` its own loopback and where the request came in as
/// `X-Forwarded-*`.
fn inward_headers(from: &HeaderMap, port: u16, upgrade: bool) -> HeaderMap {
    let mut to = HeaderMap::new();
    for (name, value) in from {
        let drop = HOP_BY_HOP.contains(&name.as_str())
            || name == header::AUTHORIZATION
            || name == header::HOST
            || name == header::COOKIE
            || name == header::UPGRADE;
        if !drop {
            to.append(name.clone(), value.clone());
        }
    }
    if let Some(cookies) = their_cookies(from) {
        to.insert(header::COOKIE, cookies);
    }
    if let Some(host) = from.get(header::HOST) {
        to.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
    }
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{port}")) {
        to.insert(header::HOST, host);
    }
    if upgrade {
        to.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(protocol) = from.get(header::UPGRADE) {
            to.insert(header::UPGRADE, protocol.clone());
        }
    }
    to
}

/// The caller's cookies but Steadfast's own (named `steadfast…`), if any remain.
fn their_cookies(from: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<&str> = from
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.to_ascii_lowercase().starts_with("steadfast"))
        .collect();
    match kept.is_empty() {
        true => None,
        false => HeaderValue::from_str(&kept.join("; ")).ok(),
    }
}

/// What the caller is sent of the program's headers: everything but the hop's own
/// and cookies named as Steadfast's, under the sandbox policy (an upgrade keeps its
/// `Connection` and `Upgrade`).
fn outward_headers(from: &HeaderMap, status: StatusCode) -> HeaderMap {
    let upgrade = status == StatusCode::SWITCHING_PROTOCOLS;
    let mut to = HeaderMap::new();
    for (name, value) in from {
        let hop = HOP_BY_HOP.contains(&name.as_str()) && !(upgrade && name == header::CONNECTION);
        let ours = name == header::SET_COOKIE
            && value.to_str().map_or(true, |v| {
                v.trim().to_ascii_lowercase().starts_with("steadfast")
            });
        if !hop && !ours && name != header::CONTENT_SECURITY_POLICY {
            to.append(name.clone(), value.clone());
        }
    }
    to.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX_POLICY),
    );
    to
}

/// Previews are the owner's; public mode has none (its callers share one owner).
pub(crate) fn no_public<W: World + Clone>(state: &Shared<W>) -> Result<(), ApiError> {
    match state.auth.mode {
        AuthMode::Public { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "previews are not available in public mode",
        )),
        _ => Ok(()),
    }
}

/// A failure reaching into the sandbox, as the caller is told it.
fn sandbox_error(e: steadfast_harness::JournalError) -> ApiError {
    match e {
        steadfast_harness::JournalError::Sandbox(steadfast_sandbox::Error::Refused(why))
            if why.contains("host's network") =>
        {
            ApiError::new(StatusCode::CONFLICT, "no_ports", why)
        }
        // The caller named a port nothing listens on: theirs to fix, as a path that
        // leads nowhere is.
        steadfast_harness::JournalError::Sandbox(steadfast_sandbox::Error::Refused(why)) => {
            ApiError::new(StatusCode::NOT_FOUND, "port_closed", format!("port: {why}"))
        }
        steadfast_harness::JournalError::Sandbox(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_unavailable",
            e.to_string(),
        ),
        steadfast_harness::JournalError::World(e) => e.into(),
        other => ApiError::internal(other),
    }
}

/// The program answered with something that is not HTTP, or went away.
fn bad_gateway(port: u16, e: &hyper::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "bad_gateway",
        format!("the program on port {port} in the sandbox did not answer over HTTP: {e}"),
    )
}
