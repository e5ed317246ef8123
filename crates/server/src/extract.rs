//! A JSON body extractor whose rejections are API errors naming the problem.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// `axum::Json`, but malformed, invalid or oversized bodies become JSON errors:
/// 400 (not JSON), 422 (wrong shape, naming the field), 413 (too large), 415.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The bytes once (within the body limit), then the JSON from them.
        let (parts, body) = req.into_parts();
        let bytes =
            match axum::body::Bytes::from_request(Request::from_parts(parts.clone(), body), state)
                .await
            {
                Ok(bytes) => bytes,
                Err(rejection) => {
                    return Err(too_large_or(rejection.status(), rejection.body_text()))
                }
            };
        let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        match axum::Json::<T>::from_request(req, state).await {
            // Every body is an object: an array would fill a struct's fields by
            // position (`[null, null]` made a session).
            Ok(_) if !object => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
                "the body must be a JSON object",
            )),
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(rejection) => Err(match &rejection {
                JsonRejection::JsonDataError(_) => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_body",
                    rejection.body_text(),
                ),
                JsonRejection::JsonSyntaxError(_) => ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "malformed_json",
                    rejection.body_text(),
                ),
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send the body as JSON with content-type: application/json",
                ),
                _ => too_large_or(rejection.status(), rejection.body_text()),
            }),
        }
    }
}

/// A rejection with `status`: "too large" in words when it is a 413.
fn too_large_or(status: StatusCode, text: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than {} bytes", crate::MAX_BODY),
        )
    } else {
        ApiError::new(status, "bad_body", text)
    }
}

/// A raw body read whole, at most `limit` bytes: one whose `Content-Length` is over it
/// is refused (413) before any of it is read, so a client still sending reads the
/// answer instead of a cut connection; one that only turns out too large is read up to
/// the limit. `what` names the limit in the error.
pub(crate) async fn bounded(
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
    limit: usize,
    what: &str,
) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than {what} ({limit} bytes)"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let cause = e.into_inner();
        if cause.is::<http_body_util::LengthLimitError>() {
            too_large()
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_body", cause.to_string())
        }
    })
}
