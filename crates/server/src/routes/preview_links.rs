//! Share links: a signed, expiring, revocable URL that lets anyone who holds it read
//! one thing of one session, and change nothing.
//!
//! - A link to a **port** opens what the program on that port of the session's
//!   sandbox serves — `GET` and `HEAD` (WebSockets too, which open with a `GET`) —
//!   at `/v1/previews/{secret}/`, and nothing else of the session.
//! - A link to the session's **view** opens the console's read-only page of the
//!   session at `/ui/share/{secret}`; the page reads the session's events, diffs and
//!   files with the link as its bearer token, which
//!   [`crate::console::credentials`] holds to those read routes of that one session.
//!
//! A link is an issued credential like an API token, and kept as one (its hash, its
//! expiry, its revocation, in the world's token store, so every API host honours a
//! revocation at once, and an operator sees it among the issued tokens). Its secret
//! begins `sfl_`, never `sft_`; its name says which session (and port) it opens.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use steadfast_world::{Scope, ServiceToken, World};
use utoipa::ToSchema;

use super::previews::{no_public, pass, reach};
use super::{owned, Shared};
use crate::auth::LINK_PREFIX;
use crate::error::ApiError;
use crate::extract::Body;
use crate::wire;

/// What a port link's stored name begins with; the session and port follow.
const PORT_LINK: &str = "preview:";
/// What a view link's stored name begins with; the session follows.
const VIEW_LINK: &str = "view:";
/// A link's life unless asked otherwise: an hour.
const DEFAULT_LIFE_S: u64 = 3600;
/// The longest life a link may have: 30 days.
const MAX_LIFE_S: u64 = 30 * 24 * 3600;

/// What a new link is to be.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateLink {
    /// The port in the session's sandbox it opens; omitted, the link opens the
    /// session's read-only view in the console instead.
    #[serde(default)]
    port: Option<u16>,
    /// How long it works, in seconds (default 3600, at most 30 days).
    #[serde(default)]
    expires_in_s: Option<u64>,
}

/// The stored name of a link to `port` of `session`, or to its view.
fn link_name(session: &str, port: Option<u16>) -> String {
    match port {
        Some(port) => format!("{PORT_LINK}{session}:{port}"),
        None => format!("{VIEW_LINK}{session}"),
    }
}

/// The session a link's stored name opens and the port (`None`: its view), if it is
/// a link's.
pub(crate) fn opens(name: &str) -> Option<(&str, Option<u16>)> {
    if let Some(session) = name.strip_prefix(VIEW_LINK) {
        return Some((session, None));
    }
    let rest = name.strip_prefix(PORT_LINK)?;
    let (session, port) = rest.rsplit_once(':')?;
    Some((session, Some(port.parse().ok()?)))
}

/// The live link whose secret is `secret`, if there is one.
pub(crate) async fn live_link<W: World + Clone>(
    state: &Shared<W>,
    secret: &str,
) -> Result<Option<ServiceToken>, ApiError> {
    if !secret.starts_with(LINK_PREFIX) {
        return Ok(None);
    }
    let hash = crate::hash_token(secret);
    Ok(state
        .harness
        .world()
        .token_by_hash(&hash)
        .await?
        .filter(|l| l.is_live(steadfast_world::now_ms())))
}

/// Share a session's view, or one of its ports
///
/// Makes a link anyone can open, without a token, until it expires or is revoked. With
/// `port`, it reads what the program on that port in the session's sandbox serves
/// (`GET`, `HEAD` and WebSockets; other methods are refused) at
/// `/v1/previews/{secret}/`. Without, it opens the session's read-only page in the
/// console at `/ui/share/{secret}`: its events, diffs and files, nothing that changes
/// anything and nothing of another session. The URL is shown once; the server keeps
/// only its hash. Links are listed at `GET /v1/sessions/{id}/links` and revoked
/// with `DELETE /v1/sessions/{id}/links/{link}`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/links",
    operation_id = "create_link",
    params(("id" = String, Path, description = "The session's id")),
    request_body = CreateLink,
    responses(
        (status = 201, description = "The link, its URL shown this once", body = wire::PreviewLinkCreated),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode, or a token that may not run the session", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 413, description = "The body is too large", body = wire::Error),
        (status = 415, description = "The body is not JSON", body = wire::Error),
        (status = 422, description = "A field is out of range (`expires_in_s`, `port`)", body = wire::Error),
        (status = 429, description = "Too many creations this minute", body = wire::Error),
    )
)]
pub(crate) async fn create<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<CreateLink>,
) -> Result<(StatusCode, Json<wire::PreviewLinkCreated>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    no_public(&state)?;
    owned(&state, &id, &owner).await?;
    let invalid = |m: &str| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let port = req.port;
    if port == Some(0) {
        return Err(invalid("port: 1 to 65535"));
    }
    let life = req.expires_in_s.unwrap_or(DEFAULT_LIFE_S);
    if life == 0 || life > MAX_LIFE_S {
        return Err(invalid("expires_in_s: 1 to 2592000 (30 days)"));
    }
    state.creation_allowed(&owner).await?;
    let secret = format!(
        "{LINK_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let now = steadfast_world::now_ms();
    let link = ServiceToken {
        id: format!("pl_{}", uuid::Uuid::now_v7().simple()),
        name: link_name(&id, port),
        owner: owner.clone(),
        // A view link reads through the API (held to its session's read routes); a
        // port link never authenticates an API call.
        scopes: match port {
            Some(_) => Vec::new(),
            None => vec![Scope::Read],
        },
        hash: crate::hash_token(&secret),
        created_at_ms: now,
        created_by: owner.clone(),
        expires_at_ms: Some(now.saturating_add(life.saturating_mul(1000))),
        revoked_at_ms: None,
    };
    state.harness.world().token_issue(&link).await?;
    let detail =
        serde_json::json!({"link": link.id, "port": port, "expires_at_ms": link.expires_at_ms});
    let (action, url) = match port {
        Some(_) => ("preview.link_created", format!("/v1/previews/{secret}/")),
        None => ("view.link_created", format!("/ui/share/{secret}")),
    };
    state.audit(&owner, action, &id, detail).await;
    Ok((
        StatusCode::CREATED,
        Json(wire::PreviewLinkCreated {
            url,
            link: wire::PreviewLink::of(&link, port),
        }),
    ))
}

/// List a session's share links
///
/// Every link made for the session's ports, live or not (never their secrets).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/links",
    operation_id = "list_links",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session's links", body = wire::PreviewLinks),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::PreviewLinks>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let links = session_links(&state, &id).await?;
    Ok(Json(wire::PreviewLinks {
        links: links
            .iter()
            .map(|(link, port)| wire::PreviewLink::of(link, *port))
            .collect(),
    }))
}

/// Revoke a share link
///
/// The link stops working at once, on every API host; a connection it opened before
/// (a WebSocket) runs on until it closes.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/links/{link}",
    operation_id = "revoke_link",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("link" = String, Path, description = "The link's id (`pl_...`)"),
    ),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "A token that may not run the session", body = wire::Error),
        (status = 404, description = "No such session or link, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn revoke<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, link)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let ours = session_links(&state, &id)
        .await?
        .into_iter()
        .find(|(l, _)| l.id == link && l.revoked_at_ms.is_none());
    let Some((_, port)) = ours else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "link_not_found",
            format!("link: session {id} has no live link {link}"),
        ));
    };
    let world = state.harness.world();
    world.token_revoke(&link, steadfast_world::now_ms()).await?;
    state
        .audit(
            &owner,
            match port {
                Some(_) => "preview.link_revoked",
                None => "view.link_revoked",
            },
            &id,
            serde_json::json!({"link": link}),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// The links made for `session`, oldest first, with the port each opens (`None`:
/// its view).
async fn session_links<W: World + Clone>(
    state: &Shared<W>,
    session: &str,
) -> Result<Vec<(ServiceToken, Option<u16>)>, ApiError> {
    let all = state.harness.world().tokens().await?;
    let mut links: Vec<(ServiceToken, Option<u16>)> = all
        .into_iter()
        .filter_map(|t| {
            let (of, port) = opens(&t.name)?;
            (of == session).then_some((t.clone(), port))
        })
        .collect();
    links.sort_by_key(|(link, _)| link.created_at_ms);
    Ok(links)
}

/// `/v1/previews/{secret}/`: the root of the shared site.
pub(crate) async fn open_root<W: World + Clone>(
    State(state): State<Shared<W>>,
    Path(secret): Path<String>,
    request: Request,
) -> Response {
    open(&state, &secret, "", request).await
}

/// Open a share link
///
/// What the program on the link's port serves at `path`, as the owner's preview URL
/// would answer it, for `GET` and `HEAD` (and WebSockets) only, without a token. An
/// unknown, expired or revoked link is a 404 `link_not_found`; another method a 403
/// `read_only`.
#[utoipa::path(
    get,
    path = "/v1/previews/{secret}/{path}",
    operation_id = "open_link",
    security(()),
    params(
        ("secret" = String, Path, description = "The link's secret, from its URL"),
        ("path" = String, Path, description = "The path on the program's site"),
    ),
    responses(
        (status = 200, description = "The program's answer, whatever its status and type"),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 403, description = "A method that could change something (links are read-only), or public mode", body = wire::Error),
        (status = 404, description = "No such link (unknown, expired or revoked), or nothing listens on its port", body = wire::Error),
        (status = 409, description = "The session has ended", body = wire::Error),
        (status = 502, description = "The program on the port did not answer over HTTP", body = wire::Error),
        (status = 503, description = "The sandbox could not be started here now", body = wire::Error),
    )
)]
pub(crate) async fn open_path<W: World + Clone>(
    State(state): State<Shared<W>>,
    Path((secret, path)): Path<(String, String)>,
    request: Request,
) -> Response {
    open(&state, &secret, &path, request).await
}

/// Forwards a link holder's request to the link's port, if the link is live and the
/// request only reads.
async fn open<W: World + Clone>(
    state: &Shared<W>,
    secret: &str,
    path: &str,
    request: Request,
) -> Response {
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let checked = async {
        let gone = || {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "link_not_found",
                "no such link: unknown, expired or revoked",
            )
        };
        let link = live_link(state, secret).await?.ok_or_else(gone)?;
        // A view link opens no port.
        let (session, Some(port)) = opens(&link.name).ok_or_else(gone)? else {
            return Err(gone());
        };
        if !safe {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "read_only",
                "a share link only reads: GET and HEAD (and WebSockets)",
            ));
        }
        no_public(state)?;
        let summary = owned(state, session, &link.owner).await?;
        let actor = format!("link:{}", link.id);
        let reach = reach(state, &summary.id, Some(port), &actor).await?;
        Ok((reach, port))
    };
    match checked.await {
        Ok((reach, port)) => pass(Ok(reach), port, path, request).await,
        Err(e) => pass(Err(e), 0, path, request).await,
    }
}
