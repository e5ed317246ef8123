//! Uploads: a workspace as a tar archive (plain or gzip, binary-safe, up to the
//! operator's limit), stored in the blob store for a session to start from
//! (`{"workspace": {"kind": "upload", "upload": "upl_..."}}`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use steadfast_world::World;

use super::Shared;
use crate::error::ApiError;
use crate::wire;

/// The prefix of an upload's id (the rest is its content's BLAKE3).
pub(crate) const UPLOAD_PREFIX: &str = "upl_";

/// Upload a workspace archive
///
/// The body is a tar archive, plain or gzip-compressed (`tar czf`), at most the
/// server's upload limit (`[server] max-upload-mb`, default 64). It is stored as is,
/// named by its content's hash; a session starts from it with `{"workspace": {"kind":
/// "upload", "upload": "<id>"}}`, which unpacks it (and refuses an entry that leaves
/// the workspace or a device node). An upload no session used is removed by `steadfast
/// gc` after its grace period; until then it counts against its caller's upload
/// bytes an hour (`[server] upload-mb-per-hour`, default 1024; 256 shared by every
/// anonymous caller of a public server).
#[utoipa::path(
    post,
    path = "/v1/uploads",
    operation_id = "create_upload",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A tar archive, or a gzip-compressed one, sent as `application/octet-stream`, `application/x-tar` or `application/gzip`"),
    responses(
        (status = 201, description = "Stored", body = wire::Upload),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 413, description = "The body is larger than the upload limit", body = wire::Error),
        (status = 415, description = "The body is not `application/x-tar`, `application/gzip` or `application/octet-stream`", body = wire::Error),
        (status = 422, description = "An empty body", body = wire::Error),
        (status = 429, description = "More sessions and uploads a minute from this caller than the server takes, or more upload bytes an hour (`rate_limited`)", body = wire::Error),
    )
)]
pub(crate) async fn create<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<wire::Upload>), ApiError> {
    // Nothing of the body is read before the caller is known and the request is one
    // this route takes: an anonymous caller cannot make the server hold uploads.
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    state.creation_allowed(&owner).await?;
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let accepted = [
        "application/x-tar",
        "application/gzip",
        "application/x-gzip",
        "application/octet-stream",
    ];
    if !accepted.contains(&content_type.as_str()) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the body must be one of {}", accepted.join(", ")),
        ));
    }
    let body =
        crate::extract::bounded(&headers, body, state.max_upload, "the upload limit").await?;
    if body.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "the body is empty: send a tar archive",
        ));
    }
    state.upload_allowed(&owner, body.len() as u64).await?;
    let blob = state.harness.blobs().put(&body).await?;
    Ok((
        StatusCode::CREATED,
        Json(wire::Upload {
            id: format!("{UPLOAD_PREFIX}{}", blob.hash),
            bytes: blob.size,
        }),
    ))
}
