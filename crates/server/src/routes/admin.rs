//! Operators' routes (`admin` scope): tokens issued, listed and revoked through the
//! API, and the audit log.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use steadfast_world::{Scope, ServiceToken, World};
use utoipa::{IntoParams, ToSchema};

use super::Shared;
use crate::error::ApiError;
use crate::extract::Body;
use crate::wire;

use crate::auth::TOKEN_PREFIX;
/// The longest token name.
const MAX_NAME: usize = 100;

/// A token to issue (`POST /v1/admin/tokens`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "ci pipeline", "owner": "ci-bot", "scopes": ["read", "run"], "expires_in_s": 2592000}))]
pub(crate) struct IssueToken {
    /// What it is for (listed; at most 100 characters).
    name: String,
    /// Who it acts as: whose sessions and vault it reaches.
    owner: String,
    /// What it allows: `read`, `run` (which includes reading), `admin`.
    scopes: Vec<Scope>,
    /// Seconds until it stops working (none: until revoked).
    #[serde(default)]
    #[schema(minimum = 1)]
    expires_in_s: Option<u64>,
}

/// Issue a token
///
/// The token itself is in this answer and nowhere else: the server keeps its hash.
#[utoipa::path(
    post,
    path = "/v1/admin/tokens",
    operation_id = "issue_token",
    request_body = IssueToken,
    responses(
        (status = 201, description = "Issued; `token` is shown this once", body = wire::IssuedToken),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token", body = wire::Error),
        (status = 403, description = "The caller's token does not have the `admin` scope", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A field's value is refused (the message names it)", body = wire::Error),
    )
)]
pub(crate) async fn issue<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Body(req): Body<IssueToken>,
) -> Result<(StatusCode, Json<wire::IssuedToken>), ApiError> {
    let admin = state.owner(&headers, Scope::Admin).await?;
    let invalid = |m: &str| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    if req.name.trim().is_empty() || req.name.chars().count() > MAX_NAME {
        return Err(invalid("name: 1 to 100 characters"));
    }
    if req.owner.trim().is_empty()
        || req.owner.len() > 256
        || req.owner.chars().any(char::is_control)
    {
        return Err(invalid("owner: 1 to 256 bytes without control characters"));
    }
    if req.scopes.is_empty() {
        return Err(invalid("scopes: at least one of read, run, admin"));
    }
    if req.expires_in_s == Some(0) {
        return Err(invalid("expires_in_s: at least 1"));
    }
    let mut scopes = req.scopes;
    scopes.sort();
    scopes.dedup();
    let secret = format!(
        "{TOKEN_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let now = steadfast_world::now_ms();
    let token = ServiceToken {
        id: format!("tok_{}", uuid::Uuid::now_v7().simple()),
        name: req.name,
        owner: req.owner,
        scopes,
        hash: crate::hash_token(&secret),
        created_at_ms: now,
        created_by: admin.clone(),
        expires_at_ms: req
            .expires_in_s
            .map(|s| now.saturating_add(s.saturating_mul(1000))),
        revoked_at_ms: None,
    };
    state.harness.world().token_issue(&token).await?;
    state
        .audit(
            &admin,
            "token.issued",
            &token.id,
            serde_json::json!({"name": token.name, "owner": token.owner, "scopes": token.scopes, "expires_at_ms": token.expires_at_ms}),
        )
        .await;
    Ok((
        StatusCode::CREATED,
        Json(wire::IssuedToken {
            token: secret,
            issued: token.into(),
        }),
    ))
}

/// List issued tokens
///
/// By name, owner and scopes, revoked ones too; never a token itself.
#[utoipa::path(
    get,
    path = "/v1/admin/tokens",
    operation_id = "list_tokens",
    responses(
        (status = 200, description = "Every issued token, newest first", body = wire::TokenList),
        (status = 401, description = "No valid bearer token", body = wire::Error),
        (status = 403, description = "The caller's token does not have the `admin` scope", body = wire::Error),
    )
)]
pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Result<Json<wire::TokenList>, ApiError> {
    state.owner(&headers, Scope::Admin).await?;
    let tokens = state.harness.world().tokens().await?;
    Ok(Json(wire::TokenList {
        tokens: tokens.into_iter().map(Into::into).collect(),
    }))
}

/// Revoke a token
///
/// It stops working at once on every server of this world; it stays listed as revoked.
#[utoipa::path(
    delete,
    path = "/v1/admin/tokens/{id}",
    operation_id = "revoke_token",
    params(("id" = String, Path, description = "The token's id (`tok_...`)")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "No valid bearer token", body = wire::Error),
        (status = 403, description = "The caller's token does not have the `admin` scope", body = wire::Error),
        (status = 404, description = "No live token with this id", body = wire::Error),
    )
)]
pub(crate) async fn revoke<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let admin = state.owner(&headers, Scope::Admin).await?;
    if !state
        .harness
        .world()
        .token_revoke(&id, steadfast_world::now_ms())
        .await?
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "token_not_found",
            format!("no live token {id}"),
        ));
    }
    state
        .audit(&admin, "token.revoked", &id, serde_json::json!({}))
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// A page of the audit log.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Entries after this id (the previous page's `next_after`; default 0).
    #[serde(default)]
    after: u64,
    /// Entries per page: 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// Read the audit log
///
/// Who issued or revoked tokens, wrote or deleted vault entries, set ceilings, and
/// created, changed, closed or deleted sessions; oldest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    operation_id = "audit_log",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of entries", body = wire::AuditPage),
        (status = 400, description = "A query parameter that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token", body = wire::Error),
        (status = 403, description = "The caller's token does not have the `admin` scope", body = wire::Error),
    )
)]
pub(crate) async fn audit<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::AuditPage>, ApiError> {
    state.owner(&headers, Scope::Admin).await?;
    audit_page(&state, query, None).await
}

/// Read a session's audit entries
///
/// What was done to the session and through its hooks — created, changed, forked,
/// rewound, closed; hooks made, revoked and delivered to — by whom, oldest first: the
/// part of the audit log that is its owner's to read.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/audit",
    operation_id = "session_audit_log",
    params(("id" = String, Path, description = "The session's id"), AuditQuery),
    responses(
        (status = 200, description = "A page of entries", body = wire::AuditPage),
        (status = 400, description = "A query parameter that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn session_audit<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::AuditPage>, ApiError> {
    let owner = state.owner(&headers, Scope::Read).await?;
    super::owned(&state, &id, &owner).await?;
    audit_page(&state, query, Some(&id)).await
}

/// One page of the audit log (of the entries about session `about`, with one).
async fn audit_page<W: World + Clone>(
    state: &crate::ServerState<W>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
    about: Option<&str>,
) -> Result<Json<wire::AuditPage>, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m);
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(bad("limit: 1 to 1000 a page".into()));
    }
    let entries = state
        .harness
        .world()
        .audit_log(q.after, limit, about)
        .await?;
    Ok(Json(wire::AuditPage {
        next_after: entries.last().map_or(q.after, |e| e.id),
        entries: entries.into_iter().map(Into::into).collect(),
    }))
}
