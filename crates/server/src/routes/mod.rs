//! Routes: `/v1/sessions...`, `/openapi.json`, `/healthz`, and a JSON 404 for the rest.

mod messages;
mod sessions;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use steadfast_world::World;

use crate::error::ApiError;
use crate::{ServerState, MAX_BODY, OPENAPI};

pub(crate) type Shared<W> = Arc<ServerState<W>>;

pub(crate) fn router<W: World + Clone>(state: Shared<W>) -> Router {
    Router::new()
        .route(
            "/v1/sessions",
            post(sessions::create::<W>).get(sessions::list::<W>),
        )
        .route(
            "/v1/sessions/{id}",
            get(sessions::show::<W>).delete(sessions::delete::<W>),
        )
        .route("/v1/sessions/{id}/close", post(sessions::close::<W>))
        .route("/v1/sessions/{id}/integrity", get(sessions::integrity::<W>))
        .route(
            "/v1/sessions/{id}/messages",
            post(messages::post_message::<W>),
        )
        .route("/v1/sessions/{id}/events", get(messages::events::<W>))
        .route(
            "/v1/sessions/{id}/signals/{name}",
            post(messages::signal::<W>),
        )
        .route("/v1/agents", get(sessions::agents::<W>))
        .route("/openapi.json", get(openapi))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
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
