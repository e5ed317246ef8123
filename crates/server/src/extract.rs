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
        match axum::Json::<T>::from_request(req, state).await {
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
                _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the body is larger than {} bytes", crate::MAX_BODY),
                ),
                _ => ApiError::new(rejection.status(), "bad_body", rejection.body_text()),
            }),
        }
    }
}
