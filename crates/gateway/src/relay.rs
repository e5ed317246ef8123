//! Sending a request on to the provider and streaming the reply back as it arrives
//! while recording it; answering a recorded request from the log.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use steadfast_log::Event;
use steadfast_world::World;

use crate::{api_error, Api, Shared, Upstream};

/// Request headers passed on to the provider (everything else, the client's
/// credentials above all, stays here).
const FORWARDED: &[&str] = &["anthropic-version", "anthropic-beta", "openai-beta"];

fn upstream_url(api: Api, upstream: &Upstream, query: Option<&str>) -> String {
    let base = upstream.base_url.trim_end_matches('/');
    let path = match api {
        Api::AnthropicMessages => "/v1/messages",
        Api::AnthropicCountTokens => "/v1/messages/count_tokens",
        Api::OpenAiChat => "/chat/completions",
        Api::OpenAiResponses => "/responses",
    };
    match query {
        Some(q) if !q.is_empty() => format!("{base}{path}?{q}"),
        _ => format!("{base}{path}"),
    }
}

fn response(status: u16, content_type: &str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Ok(ct) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert("content-type", ct);
    }
    if content_type.starts_with("text/event-stream") {
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
    }
    response
}

/// Counts a relay as finished when dropped (however it ends).
struct Inflight<W>(Arc<Shared<W>>);

impl<W> Drop for Inflight<W> {
    fn drop(&mut self) {
        self.0.inflight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Answers from the log: the recorded bytes, a streamed reply event by event.
pub(crate) fn replay((status, content_type, body): (u16, String, String)) -> Response {
    if content_type.starts_with("text/event-stream") {
        let events: Vec<Result<Bytes, std::io::Error>> = body
            .split_inclusive("\n\n")
            .map(|e| Ok(Bytes::from(e.to_string())))
            .collect();
        response(
            status,
            &content_type,
            Body::from_stream(futures_util::stream::iter(events)),
        )
    } else {
        response(status, &content_type, Body::from(body))
    }
}

/// Sends the request to the provider and streams the reply back while recording it.
/// The reply is read to its end and recorded even if the client goes away meanwhile,
/// so a restarted client gets it from the log instead of paying for it again.
pub(crate) async fn live<W: World + Clone>(
    shared: Arc<Shared<W>>,
    api: Api,
    upstream: Upstream,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
    call_id: String,
) -> Response {
    let mut request = shared
        .http
        .post(upstream_url(api, &upstream, query.as_deref()))
        .header("content-type", "application/json")
        .body(body);
    for name in FORWARDED {
        if let Some(v) = headers.get(*name) {
            request = request.header(*name, v);
        }
    }
    request = if matches!(api, Api::AnthropicMessages | Api::AnthropicCountTokens) {
        request.header("x-api-key", &upstream.api_key)
    } else {
        request.bearer_auth(&upstream.api_key)
    };
    let upstream_response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            // Nothing came back: the intent stays unanswered, so asking again is right.
            return api_error(
                Some(api),
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!("the provider could not be reached: {e}"),
            );
        }
    };
    let status = upstream_response.status().as_u16();
    let content_type = upstream_response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let ct = content_type.clone();
    shared.inflight.send_modify(|n| *n += 1);
    tokio::spawn(async move {
        let _done = Inflight(shared.clone());
        let mut recorded = Vec::new();
        let mut chunks = upstream_response.bytes_stream();
        let mut first = true;
        let streamed = ct.starts_with("text/event-stream");
        let mut text = crate::deltas::TextDeltas::default();
        let writer = streamed
            .then(|| crate::deltas::DeltaWriter::start(shared.live.clone(), call_id.clone()));
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(bytes) => {
                    recorded.extend_from_slice(&bytes);
                    let piece = writer.as_ref().map(|_| text.feed(api, &bytes));
                    // A client that went away does not stop the recording.
                    let _ = tx.send(Ok(bytes)).await;
                    if let (Some(w), Some(piece)) = (&writer, piece) {
                        w.push(piece);
                    }
                    if first {
                        steadfast_fault::point(steadfast_fault::points::MODEL_MID_STREAM);
                        first = false;
                    }
                }
                Err(e) => {
                    // The provider broke off: nothing is recorded, the client asks again.
                    tracing::warn!(error = %e, "provider stream broke off");
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
            }
        }
        if let Some(w) = writer {
            w.finish().await;
        }
        steadfast_fault::point(steadfast_fault::points::MODEL_EFFECT);
        let body = String::from_utf8_lossy(&recorded).into_owned();
        let usage = crate::usage::of_reply(api, &body);
        let model = shared.live.with(|s| s.model.model.clone());
        let cost_micro_usd = usage.map_or(0, |u| {
            steadfast_model::pricing::cost_with(&shared.prices, &model, &u)
        });
        // The fold counts the spend as the outcome is applied: the bounds see it next.
        let event = Event::ExchangeOutcome {
            call_id: call_id.clone(),
            status,
            content_type: ct.clone(),
            body,
            usage,
            cost_micro_usd,
        };
        match shared.live.append(&[event]).await {
            Ok(_) => steadfast_fault::point(steadfast_fault::points::MODEL_OUTCOME),
            Err(e) => tracing::error!(error = %e, "recording a gateway reply failed"),
        }
        drop(tx);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    response(status, &content_type, Body::from_stream(stream))
}
