//! Messages and steers (answered with the turn's event stream), event streams, signals.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use steadfast_world::{InboundKind, World};
use utoipa::{IntoParams, ToSchema};

use super::{owned, Shared};
use crate::error::ApiError;
use crate::extract::Body;
use crate::stream::{self, Until};
use crate::wire;

/// The most text one message may carry.
const MAX_TEXT: usize = 64 * 1024;

/// A message to a session.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"text": "also update the changelog", "kind": "steer"}))]
pub(crate) struct PostMessage {
    /// What the user says (at most 64 KiB).
    #[schema(max_length = 65536)]
    text: String,
    /// `message` opens a turn (queued behind a running one); `steer` reaches the
    /// running turn at its next step.
    #[serde(default = "default_kind")]
    kind: MessageKind,
}

/// How a message reaches the session.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum MessageKind {
    /// A new turn.
    Message,
    /// Into the running turn.
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

/// Whether a client asks for JSON rather than a stream of server-sent events.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/json") && !a.contains("text/event-stream"))
}

/// Queue a message (a new turn) or steer the running turn; streams the turn
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages",
    params(("id" = String, Path, description = "The session's id")),
    request_body = PostMessage,
    responses(
        (status = 200, description = "The turn's events as server-sent events (see the `events` route), ending with `end` when the turn that takes this message is over", body = wire::StreamFrame, content_type = "text/event-stream"),
        (status = 202, description = "With `Accept: application/json`: queued, without waiting for the turn (read it from the `events` route)", body = wire::MessageQueued),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session has ended", body = wire::Error),
        (status = 413, description = "The body or its text is larger than the limit", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A field's value is refused (the message names it)", body = wire::Error),
        (status = 429, description = "Too many messages a minute to this session", body = wire::Error),
    )
)]
pub(crate) async fn post_message<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<PostMessage>,
) -> Result<Response, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
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
    state.inbox_allowed("messages", &id).await?;
    let kind = match req.kind {
        MessageKind::Message => InboundKind::Message,
        MessageKind::Steer => InboundKind::Steer,
    };
    let world = state.harness.world().clone();
    let inbox_id = world.post(&id, kind, "", &Value::String(req.text)).await?;
    if wants_json(&headers) {
        let queued = wire::MessageQueued {
            id: inbox_id,
            session: id,
            after: summary.last_seq,
        };
        return Ok((StatusCode::ACCEPTED, Json(queued)).into_response());
    }
    Ok(sse(world, id, summary.last_seq, Until::Taken(inbox_id)))
}

/// Where a stream or page starts, and a page's size.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct Cursor {
    /// Continue after this log position (default 0: from the start).
    #[serde(default)]
    cursor: Option<u64>,
    /// The same as `cursor`, for JSON pages.
    #[serde(default)]
    after: Option<u64>,
    /// Events per JSON page (default 100).
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// When a stream ends: `idle` (the default) when nothing runs or is queued, staying
    /// open while the session waits for a signal (an approval, a client tool's result);
    /// `wait` also when it starts waiting; `ended` only when the session ends (a
    /// watcher's stream, open across turns and idle spells).
    #[serde(default)]
    #[param(inline)]
    until: Option<StreamUntil>,
}

/// When an event stream ends (see [`Cursor::until`]).
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StreamUntil {
    /// Nothing runs or is queued; a wait keeps it open.
    Idle,
    /// As `idle`, and also when the session starts waiting for a signal.
    Wait,
    /// Only when the session ends.
    Ended,
}

/// The most events one JSON page holds.
const MAX_PAGE: usize = 1000;

/// A session's events: every one after the cursor exactly once, then the live tail
///
/// Server-sent events: one default (`message`) frame per log record, `id` = its log
/// position, `data` = its public event (schema 1); the stream ends with the named
/// event `end` when nothing runs (`until`: a wait for a signal keeps it open unless
/// `until=wait`). Reconnect with `?cursor=N` or `Last-Event-ID: N` to
/// continue with nothing lost or repeated. With `Accept: application/json`, one page of
/// the same events as JSON.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    params(
        ("id" = String, Path, description = "The session's id"),
        Cursor,
        ("Last-Event-ID" = Option<u64>, Header, description = "What a reconnecting `EventSource` sends: the same as `cursor`"),
    ),
    responses(
        (status = 200, description = "Server-sent events, or with `Accept: application/json` a page", content(
            (wire::StreamFrame = "text/event-stream"),
            (wire::EventPage = "application/json"),
        )),
        (status = 400, description = "A query or `Last-Event-ID` that does not parse, or a page size out of range", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn events<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<Cursor>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("cursor, after, limit, until: {}", e.body_text()),
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
    // Log positions are signed 64-bit in the stores: one past them names no position.
    if cursor > i64::MAX as u64 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!(
                "cursor, after, Last-Event-ID: a log position, at most {}",
                i64::MAX
            ),
        ));
    }
    // `Accept: application/json` pages through the same events as JSON.
    if wants_json(&headers) {
        let limit = query.limit.unwrap_or(100);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("limit: between 1 and {MAX_PAGE}"),
            ));
        }
        let (events, has_more) = stream::page(state.harness.world(), &id, cursor, limit).await?;
        let next_after = events.last().map_or(cursor, |e| e.seq);
        return Ok(Json(wire::EventPage {
            schema: crate::public::SCHEMA,
            events,
            after: cursor,
            next_after,
            has_more,
        })
        .into_response());
    }
    let until = match query.until {
        Some(StreamUntil::Ended) => Until::Ended,
        until => Until::Quiet {
            at_wait: matches!(until, Some(StreamUntil::Wait)),
        },
    };
    Ok(sse(state.harness.world().clone(), id, cursor, until))
}

/// Which wait a signal answers.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SignalQuery {
    /// Queue the signal for a wait that has not begun yet.
    #[serde(default)]
    queue: bool,
    /// The log position of the wait this answers (the session's `waiting_since`, its
    /// `wait_started` event's id): refused with 409 `not_waiting` once that wait is
    /// over.
    wait: Option<u64>,
}

/// Deliver a named signal (e.g. `approval`: `{"approved": true}`)
///
/// A signal is taken only by the wait it answers: one for a session that waits for
/// another signal, or none, is a 409 `not_waiting` unless `?queue=true`; an answer
/// that names its wait (`?wait=N`) is refused once that wait is over; the reply's
/// `answers` is the position of the wait it answers; `interrupt` is reserved (see
/// `/interrupt`). A `resume` signal's bounds (`max_cost_usd`, `max_tokens`,
/// `max_turns`, `max_duration_s`) must be non-negative numbers (422) within the
/// operator's ceilings and the public spend cap (403 `over_ceiling`, naming the field).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/signals/{name}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("name" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$", description = "The signal's name"),
        SignalQuery,
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "The payload: any JSON, or nothing", example = json!({"approved": true})),
    responses(
        (status = 202, description = "Taken", body = wire::SignalAccepted),
        (status = 400, description = "A payload or query that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "A `resume` that would raise a bound past a ceiling (`over_ceiling`)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "No wait for this signal (`not_waiting`), or the session has ended", body = wire::Error),
        (status = 413, description = "The body is larger than the limit", body = wire::Error),
        (status = 422, description = "A name or bound that is refused (the message names it)", body = wire::Error),
        (status = 429, description = "More signals a minute to this session than the server takes (`rate_limited`)", body = wire::Error),
    )
)]
pub(crate) async fn signal<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    query: Result<Query<SignalQuery>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<wire::SignalAccepted>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
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
    // Each signal is an inbox entry the session's driver reads: as bounded as messages.
    state.inbox_allowed("signals", &id).await?;
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
    if name.starts_with(steadfast_log::TOOL_RESULT_SIGNAL) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_signal",
            "name: client tool results are posted to /v1/sessions/{id}/tool_results",
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
        Json(wire::SignalAccepted {
            id: inbox_id,
            signal: name,
            answers,
        }),
    ))
}

/// A client tool's result.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"call_id": "toolu_01A09q90qw90lq917835lq9", "content": "ticket 4521: open, assigned to alice", "is_error": false}))]
pub(crate) struct ToolResult {
    /// The call answered: its `call_id` in the `tool_call_intent` and `wait_started`
    /// events (the session's `waiting_call`).
    call_id: String,
    /// The result, as the model will see it: text, or any JSON (given to the model as
    /// its JSON text).
    content: Value,
    /// Whether the tool failed.
    #[serde(default)]
    is_error: bool,
}

/// Answer a client tool's call
///
/// The session waits, holding no worker or sandbox, from the model's call of a tool
/// its client runs until this answers it; the result goes to the model as the call's
/// result and the turn goes on. A call is answered once: a result for a call the
/// session does not wait for (answered already, or never made) is a 409
/// `not_waiting` and changes nothing.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/tool_results",
    params(("id" = String, Path, description = "The session's id")),
    request_body = ToolResult,
    responses(
        (status = 202, description = "Taken: the turn goes on", body = wire::SignalAccepted),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session does not wait for this call (`not_waiting`)", body = wire::Error),
        (status = 413, description = "The body is larger than the limit", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A field's value is refused (the message names it)", body = wire::Error),
    )
)]
pub(crate) async fn tool_result<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<ToolResult>,
) -> Result<(StatusCode, Json<wire::SignalAccepted>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let session = state.harness.state(&id).await?;
    let awaited = session
        .waiting()
        .filter(|w| w.call_id.as_deref() == Some(req.call_id.as_str()))
        .filter(|w| w.name == steadfast_log::tool_result_signal(&req.call_id));
    let Some(wait) = awaited else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_waiting",
            format!(
                "call_id: session {id} does not wait for the result of `{}` ({})",
                req.call_id,
                match session.waiting() {
                    Some(w) => format!("it waits for `{}`", w.name),
                    None => format!("it is {}", session.status()),
                }
            ),
        ));
    };
    let name = wait.name.clone();
    let payload = serde_json::json!({
        "call_id": req.call_id,
        "content": req.content,
        "is_error": req.is_error,
    });
    let target = steadfast_harness::SignalTarget {
        queue: false,
        wait: Some(wait.seq),
    };
    let (inbox_id, answers) = state.harness.signal(&id, &name, &payload, target).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(wire::SignalAccepted {
            id: inbox_id,
            signal: name,
            answers,
        }),
    ))
}
