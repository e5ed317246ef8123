//! `/metrics`: the process's Prometheus metrics, with the world's census (sessions by
//! status, the queue's depth) taken at each scrape; and the middleware that counts
//! API requests by route.
//!
//! The census is world-wide, so every process that serves metrics shows the same
//! numbers (aggregate it with `max`, not `sum`). Metrics span every owner's sessions,
//! so outside development they are not on the API's listener at all: the operator
//! serves them on a listener of their own ([`metrics_router`], `--metrics-listen`).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use steadfast_world::World;

use crate::error::ApiError;

/// A router serving `/metrics` (and `/healthz`, `/livez`, `/readyz`) for `world` and
/// `blobs`, for a listener of the operator's own: a worker, which serves no API, is
/// probed there (with `sandbox`, the options its sandboxes are made with).
pub fn metrics_router<W: World + Clone>(
    world: W,
    blobs: steadfast_world::Blobs,
    sandbox: Option<steadfast_sandbox::SandboxOptions>,
) -> Router {
    let sandbox = std::sync::Arc::new(sandbox);
    Router::new()
        .route("/metrics", get(scrape::<W>))
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(
                move |State((world, blobs)): State<(W, steadfast_world::Blobs)>| {
                    let sandbox = sandbox.clone();
                    async move {
                        crate::routes::readiness(&world, &blobs, sandbox.as_ref().as_ref()).await
                    }
                },
            ),
        )
        .with_state((world, blobs))
}

/// The exposition, with the census as of now.
async fn scrape<W: World>(
    State((world, _)): State<(W, steadfast_world::Blobs)>,
) -> Result<Response, ApiError> {
    exposition(&world).await
}

/// The exposition of `world`'s process, with its census as of now.
pub(crate) async fn exposition<W: World>(world: &W) -> Result<Response, ApiError> {
    let census = world.census().await?;
    let metrics = steadfast_metrics::metrics();
    metrics.census(&census.by_status, census.queued);
    Ok((
        [(header::CONTENT_TYPE, steadfast_metrics::CONTENT_TYPE)],
        metrics.encode(),
    )
        .into_response())
}

/// Observes each API request: counted by method, matched route (never the raw path,
/// so ids do not become labels) and status, timed to its response head, and written to
/// the access log (target `steadfast::access`, with the path).
pub(crate) async fn observe_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let response = next.run(request).await;
    let (status, took) = (response.status().as_u16(), started.elapsed());
    steadfast_metrics::metrics().http_request(&method, &route, status, took);
    tracing::info!(
        target: "steadfast::access",
        %method, %path, %route, status,
        duration_ms = took.as_secs_f64() * 1000.0,
        "request"
    );
    response
}
