//! Vaults: each owner's named credentials, written and listed, never read back.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use steadfast_world::World;
use utoipa::ToSchema;

use super::Shared;
use crate::auth::AuthMode;
use crate::error::ApiError;
use crate::extract::Body;
use crate::wire;

/// The longest value a credential may have.
const MAX_VALUE: usize = 64 * 1024;

/// The most credentials one owner keeps: a vault is for a team's tokens, not storage.
const MAX_CREDENTIALS: usize = 1000;

/// A credential's value, written once and never returned.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "ghp_0123456789abcdef"}))]
pub(crate) struct PutCredential {
    /// The secret (at most 64 KiB).
    value: String,
}

/// The owner a vault request acts as, and the keys that seal for this server.
async fn vault_of<W: World + Clone>(
    state: &crate::ServerState<W>,
    headers: &HeaderMap,
    scope: steadfast_world::Scope,
) -> Result<(String, std::sync::Arc<steadfast_world::VaultKeys>), ApiError> {
    let owner = state.owner(headers, scope).await?;
    if matches!(state.auth.mode, AuthMode::Public { .. }) {
        // Anonymous callers share one owner: a vault would be everyone's.
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "vaults are not available in public mode",
        ));
    }
    // Like metrics outside development, a feature this server does not serve is not
    // found here, with a code that says why.
    let keys = state.vault.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "vault_unavailable",
            format!(
                "this server has no vault key: the operator sets {}",
                steadfast_world::vault::KEY_ENV
            ),
        )
    })?;
    Ok((owner, keys))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if valid {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_name",
            "name: letters, digits, - _ . only, at most 128",
        ))
    }
}

/// Store a credential
///
/// Sealed with the operator's key before it is stored; replaces one of the same name.
/// The value is never returned, logged, or written to a session's log or a blob.
#[utoipa::path(
    put,
    path = "/v1/vaults/{name}",
    operation_id = "put_credential",
    params(("name" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$", description = "The credential's name")),
    request_body = PutCredential,
    responses(
        (status = 204, description = "Stored"),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode has no vaults", body = wire::Error),
        (status = 413, description = "The body is larger than the limit", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A name or value that is refused, or a new name past the 1,000 credentials one owner may keep (the message names it)", body = wire::Error),
        (status = 429, description = "More sessions, uploads and credentials a minute from this caller than the server takes (`rate_limited`)", body = wire::Error),
        (status = 404, description = "The server keeps no credentials: it has no vault key (`vault_unavailable`)", body = wire::Error),
    )
)]
pub(crate) async fn put<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Body(req): Body<PutCredential>,
) -> Result<StatusCode, ApiError> {
    let (owner, keys) = vault_of(&state, &headers, steadfast_world::Scope::Run).await?;
    check_name(&name)?;
    if req.value.is_empty() || req.value.len() > MAX_VALUE {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("value: between 1 byte and {MAX_VALUE}"),
        ));
    }
    state.creation_allowed(&owner).await?;
    let held = state.harness.world().vault_list(Some(&owner)).await?;
    if held.len() >= MAX_CREDENTIALS && !held.iter().any(|e| e.name == name) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("name: you keep {MAX_CREDENTIALS} credentials, the most there may be; delete one first"),
        ));
    }
    let sealed = keys.seal(&owner, &name, req.value.as_bytes());
    state
        .harness
        .world()
        .vault_put(&owner, &name, &sealed)
        .await?;
    // The name only: a credential's value is never recorded anywhere.
    state
        .audit(&owner, "vault.put", &name, serde_json::json!({}))
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's credentials, by name (never their values)
#[utoipa::path(
    get,
    path = "/v1/vaults",
    operation_id = "list_credentials",
    responses(
        (status = 200, description = "The caller's credentials", body = wire::CredentialList),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode has no vaults", body = wire::Error),
        (status = 404, description = "The server keeps no credentials: it has no vault key (`vault_unavailable`)", body = wire::Error),
    )
)]
pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Result<Json<wire::CredentialList>, ApiError> {
    let (owner, _) = vault_of(&state, &headers, steadfast_world::Scope::Read).await?;
    let entries = state.harness.world().vault_list(Some(&owner)).await?;
    Ok(Json(wire::CredentialList {
        credentials: entries
            .into_iter()
            .map(|e| wire::Credential {
                name: e.name,
                updated_at_ms: e.updated_at_ms,
            })
            .collect(),
    }))
}

/// Forget a credential
#[utoipa::path(
    delete,
    path = "/v1/vaults/{name}",
    operation_id = "delete_credential",
    params(("name" = String, Path, description = "The credential's name")),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode has no vaults", body = wire::Error),
        (status = 404, description = "No such credential (`no_credential`), or the server keeps none (`vault_unavailable`: it has no vault key)", body = wire::Error),
    )
)]
pub(crate) async fn delete<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (owner, _) = vault_of(&state, &headers, steadfast_world::Scope::Run).await?;
    if state.harness.world().vault_delete(&owner, &name).await? {
        state
            .audit(&owner, "vault.deleted", &name, serde_json::json!({}))
            .await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_credential",
            format!("no credential {name:?}"),
        ))
    }
}
