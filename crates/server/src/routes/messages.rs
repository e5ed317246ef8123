//! Messages and steers (answered with the turn's event stream), event streams, signals.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use steadfast_world::{InboundKind, World};

use super::{owned, Shared};
use crate::error::ApiError;
use crate::extract::Body;
use crate::stream::{self, Until};

/// The most text one message may carry.
const MAX_TEXT: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostMessage {
    text: String,
    #[serde(default = "default_kind")]
    kind: MessageKind,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum MessageKind {
    Message,
    Steer,
}

fn default_kind() -> MessageKind {
    MessageKind::Message
}

fn sse<W: World + Clone>(world: W, id: String, cursor: u64, until: Until) -> Response {
    Sse::new(stream::events(world, id, cursor, until))
        .keep_alive(KeepAlive::default())
        .into_response()
}

pub(crate) async fn post_message<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<PostMessage>,
) -> Result<Response, ApiError> {
    let owner = state.auth.owner(&headers)?;
    let summary = owned(&state, &id, &owner).await?;
    if req.text.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "text: must not be empty",
        ));
    }
    if req.text.len() > MAX_TEXT {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("text: longer than {MAX_TEXT} bytes"),
        ));
    }
    if !state.limiter.allow(&id, state.messages_per_minute) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {} messages a minute to this session; slow down",
                state.messages_per_minute
            ),
        ));
    }
    let kind = match req.kind {
        MessageKind::Message => InboundKind::Message,
        MessageKind::Steer => InboundKind::Steer,
    };
    let world = state.harness.world().clone();
    let inbox_id = world.post(&id, kind, "", &Value::String(req.text)).await?;
    Ok(sse(world, id, summary.last_seq, Until::Taken(inbox_id)))
}

#[derive(Debug, Deserialize)]
pub(crate) struct Cursor {
    #[serde(default)]
    cursor: Option<u64>,
    /// The same as `cursor`, for JSON pages.
    #[serde(default)]
    after: Option<u64>,
    /// Events per JSON page (default 100, at most 1000).
    #[serde(default)]
    limit: Option<usize>,
}

/// The most events one JSON page holds.
const MAX_PAGE: usize = 1000;

pub(crate) async fn events<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<Cursor>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("cursor, after, limit: {}", e.body_text()),
        )
    })?;
    let from_header = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_last_event_id",
                        "Last-Event-ID must be a log position",
                    )
                })?,
        ),
        None => None,
    };
    let cursor = query.cursor.or(query.after).or(from_header).unwrap_or(0);
    // `Accept: application/json` pages through the same events as JSON.
    let wants_json = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/json") && !a.contains("text/event-stream"));
    if wants_json {
        let limit = query.limit.unwrap_or(100);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("limit: between 1 and {MAX_PAGE}"),
            ));
        }
        let (events, has_more) = stream::page(state.harness.world(), &id, cursor, limit).await?;
        let next_after = events
            .last()
            .and_then(|e| e["seq"].as_u64())
            .unwrap_or(cursor);
        return Ok(Json(json!({
            "schema": crate::public::SCHEMA,
            "events": events,
            "after": cursor,
            "next_after": next_after,
            "has_more": has_more,
        }))
        .into_response());
    }
    Ok(sse(state.harness.world().clone(), id, cursor, Until::Quiet))
}

#[derive(Debug, Deserialize)]
pub(crate) struct SignalQuery {
    /// Queue the signal for a wait that has not begun yet.
    #[serde(default)]
    queue: bool,
    /// The log position of the wait this answers (its `wait_started` record): a
    /// wait that has ended, or another one, refuses the answer.
    wait: Option<u64>,
}

pub(crate) async fn signal<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    query: Result<Query<SignalQuery>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("queue, wait: {}", e.body_text()),
        )
    })?;
    if name.is_empty()
        || name.len() > 128
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_signal",
            "name: letters, digits, - _ . only, at most 128",
        ));
    }
    let payload = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the signal payload is not JSON: {e}"),
            )
        })?
    };
    if name == steadfast_log::INTERRUPT_SIGNAL {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_signal",
            "name: `interrupt` is reserved; POST /v1/sessions/{id}/interrupt stops a turn",
        ));
    }
    if name == steadfast_log::RESUME_SIGNAL {
        crate::bounds::check_resume(&payload, &state.ceilings())?;
    }
    // A signal answers the wait in progress. One sent while nothing waits for it would
    // sit in the inbox and answer some later wait no one has seen (a stale approval
    // approving a call nobody was asked about), so it is refused unless asked to queue.
    let target = steadfast_harness::SignalTarget {
        queue: query.queue,
        wait: query.wait,
    };
    let (inbox_id, answers) = state.harness.signal(&id, &name, &payload, target).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": inbox_id, "signal": name, "answers": answers})),
    ))
}
