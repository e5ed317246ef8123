//! The model gateway: how a wrapped agent (Claude Code, Codex, Pi, or any program that
//! speaks the Anthropic or OpenAI APIs) calls a model durably.
//!
//! The gateway answers the Anthropic Messages API (`POST /v1/messages`, with any query
//! string such as `?beta=true`, and `/v1/messages/count_tokens`), the OpenAI Chat
//! Completions API (`POST /v1/chat/completions`), the OpenAI Responses API
//! (`POST /v1/responses`) and `GET /v1/models`, streaming or not. Each request is an
//! [`Event::ExchangeIntent`] in the session's log before it goes to the provider, with
//! the harness's own credentials; the reply streams through to the client as it
//! arrives and, whole, becomes the [`Event::ExchangeOutcome`]. The client authenticates
//! with a session-scoped token that is worth nothing anywhere else.
//!
//! Every record of an exchange — admission against the bounds, intent, outcome, and
//! the replay of a restarted agent's requests from the log, divergence included — is
//! made by the journal ([`steadfast_journal::exchange`]): the gateway authenticates,
//! normalizes, relays and streams. Every request is kept by content
//! ([`steadfast_journal::kept`]), so a replay's report can show what changed.

mod deltas;
pub mod history;
pub mod normalize;
mod output_limit;
mod relay;
mod usage;

use std::sync::{Arc, Mutex as StdMutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path as AxPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};
use steadfast_journal::exchange::{Asked, Begun, Billed, Exchanges, Refusal};
use steadfast_world::World;

/// The largest request body accepted (Claude Code sends about 100 KB; long sessions
/// more).
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;

/// Where a provider is and the key the harness holds for it.
#[derive(Clone)]
pub struct Upstream {
    /// Base URL: `https://api.anthropic.com` for Anthropic (the gateway adds
    /// `/v1/messages`), `https://api.openai.com/v1` for OpenAI (it adds
    /// `/chat/completions`).
    pub base_url: String,
    /// The real API key. Never leaves the harness.
    pub api_key: String,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .finish()
    }
}

/// The providers a gateway may call.
#[derive(Debug, Clone, Default)]
pub struct Upstreams {
    /// For the Anthropic APIs.
    pub anthropic: Option<Upstream>,
    /// For the OpenAI APIs.
    pub openai: Option<Upstream>,
}

/// What a gateway is opened with.
pub struct GatewayConfig<W> {
    /// The journaled exchanges of the run: every request is admitted and recorded (or
    /// answered from the record) by them.
    pub exchanges: Arc<Exchanges<W>>,
    /// The token the wrapped agent must present.
    pub token: String,
    /// The providers.
    pub upstreams: Upstreams,
    /// Model names `GET /v1/models` lists.
    pub models: Vec<String>,
    /// The HTTP client upstream calls go through (the harness's, so each run of the
    /// CLI reuses its warm connections: see [`steadfast_model::provider_http`]).
    pub http: reqwest::Client,
    /// The conversation the turn continues (see [`history`]).
    pub continuing: history::Continuing,
}

pub(crate) struct Shared<W> {
    pub(crate) exchanges: Arc<Exchanges<W>>,
    /// What names the workspace in requests (fingerprints ignore it).
    names: normalize::WorkspaceNames,
    token_hash: blake3::Hash,
    pub(crate) upstreams: Upstreams,
    models: Vec<String>,
    /// Replies still streaming from the provider (and being recorded).
    pub(crate) inflight: tokio::sync::watch::Sender<usize>,
    /// Set when the turn was interrupted: replies still streaming are cut off, not
    /// recorded (nobody will ask for them again).
    pub(crate) abandoned: tokio::sync::watch::Sender<bool>,
    pub(crate) http: reqwest::Client,
    continuing: history::Continuing,
    /// The last conversation request, as sent on.
    seen: StdMutex<Option<history::Seen>>,
}

/// A gateway over one session.
pub struct Gateway<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for Gateway<W> {
    fn clone(&self) -> Self {
        Gateway {
            shared: self.shared.clone(),
        }
    }
}

/// The kinds of request the gateway serves.
pub(crate) use steadfast_log::Api;

/// An error in the wire format of the API asked.
pub(crate) fn api_error(
    api: Option<Api>,
    status: StatusCode,
    kind: &str,
    message: &str,
) -> Response {
    let body = if api.is_some_and(Api::is_anthropic) {
        json!({"type": "error", "error": {"type": kind, "message": message}})
    } else {
        json!({"error": {"message": message, "type": kind, "code": kind}})
    };
    (status, Json(body)).into_response()
}

impl<W: World + Clone> Gateway<W> {
    /// Opens a gateway for a (new) run of the session's wrapped agent over its
    /// journaled exchanges.
    pub fn open(config: GatewayConfig<W>) -> Self {
        let names = config.exchanges.live().with(|s| {
            normalize::WorkspaceNames::new(config.exchanges.workspace(), &s.former_workspaces)
        });
        Gateway {
            shared: Arc::new(Shared {
                exchanges: config.exchanges,
                names,
                token_hash: blake3::hash(config.token.as_bytes()),
                upstreams: config.upstreams,
                models: config.models,
                inflight: tokio::sync::watch::Sender::new(0),
                abandoned: tokio::sync::watch::Sender::new(false),
                http: config.http,
                continuing: config.continuing,
                seen: StdMutex::new(None),
            }),
        }
    }

    /// The run's journaled exchanges (its bounds, its replay's counters and
    /// divergence).
    pub fn exchanges(&self) -> &Arc<Exchanges<W>> {
        &self.shared.exchanges
    }

    /// Waits (at most `limit`) until every reply this gateway started relaying has
    /// been recorded, so a client started again after this one died is answered from
    /// the log instead of asking the provider again.
    pub async fn settle(&self, limit: std::time::Duration) {
        let mut rx = self.shared.inflight.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n == 0)).await;
    }

    /// Cuts off every reply still streaming from the provider, unrecorded (an
    /// interrupted turn: its CLI is gone and no later start asks for the reply, so
    /// reading it to its end would only pay for it). The exchange stays unanswered,
    /// as a reply lost with a crash does.
    pub fn abandon(&self) {
        self.shared.abandoned.send_replace(true);
    }

    /// The last conversation request the CLI made (continued from the turns before),
    /// what a run that stops keeps for the next turn (see [`history`]).
    pub fn seen(&self) -> Option<history::Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the model said in its recorded reply to the last conversation request:
    /// the turn's answer as the model gave it, without what a CLI prints around it
    /// (a notice that the model is retired, say). `None` before that reply is
    /// recorded, or when it holds no text.
    pub fn answer(&self) -> Option<String> {
        let seen = self.seen()?;
        let (status, content_type, body) = self
            .shared
            .exchanges
            .live()
            .with(|s| s.exchanges.get(seen.index).and_then(|e| e.reply.clone()))?;
        let text = history::reply_text(seen.kind, &content_type, &body);
        let text = text.trim();
        (status == 200 && !text.is_empty()).then(|| text.to_string())
    }

    /// The HTTP routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/messages", api_route::<W>(Api::AnthropicMessages))
            .route(
                "/v1/messages/count_tokens",
                api_route::<W>(Api::AnthropicCountTokens),
            )
            .route("/v1/chat/completions", api_route::<W>(Api::OpenAiChat))
            .route("/v1/responses", api_route::<W>(Api::OpenAiResponses))
            .route("/v1/models", get(models::<W>))
            .route("/v1/models/{id}", get(model::<W>))
            .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
            .with_state(self.shared.clone())
    }
}

impl<W: World + Clone> Shared<W> {
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let presented = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .or_else(|| {
                headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
            });
        presented.is_some_and(|t| blake3::hash(t.trim().as_bytes()) == self.token_hash)
    }
}

/// The answer to a request the journal refused, by why: a replay that only checks
/// stops (409); a bound is crossed (429, and the session escalates); another worker
/// drives the session now or it has ended (409: this run of the agent is over, its
/// worker stops it); the store is busy or down (503: the same call may go through
/// later); or something worse (500). Nothing was asked of the provider.
fn refused(api: Api, refusal: &Refusal) -> Response {
    use steadfast_world::Error as E;
    let (status, kind, why) = match refusal {
        Refusal::Stopped => (StatusCode::CONFLICT, "invalid_request_error", None),
        Refusal::Bound(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", None),
        Refusal::Log(
            E::StaleFence { .. } | E::LeaseLost(_) | E::LeaseHeld { .. } | E::Ended(_),
        ) => (
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("this run of the agent no longer drives the session"),
        ),
        Refusal::Log(E::Backend { .. } | E::Blob { .. }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            Some("the session's log is unavailable"),
        ),
        Refusal::Log(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            Some("the session's log failed"),
        ),
        Refusal::Restore(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            Some("the workspace could not be restored"),
        ),
    };
    // The client is a CLI in a sandbox the model steers: a failure of the store is
    // named, and its detail (hosts, paths, the database's own words) stays in the
    // harness's log. A stop or a bound is the client's to know, in full.
    let message = match why {
        Some(why) => {
            tracing::warn!(%refusal, "a model call was refused: {why}");
            format!("steadfast: {why}, so the call was not made")
        }
        None => format!("steadfast: {refusal}"),
    };
    api_error(Some(api), status, kind, &message)
}

/// The common path of every model request.
#[tracing::instrument(level = "debug", skip_all, fields(session = %shared.exchanges.live().lease().session, api = api.name()))]
async fn handle<W: World + Clone>(
    shared: Arc<Shared<W>>,
    api: Api,
    headers: HeaderMap,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !shared.authorized(&headers) {
        return api_error(
            Some(api),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid session token for this gateway",
        );
    }
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            return api_error(
                Some(api),
                rejection.status(),
                "request_too_large",
                &format!("{rejection} (the limit is {MAX_REQUEST_BYTES} bytes)"),
            )
        }
    };
    let mut request: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return api_error(
                Some(api),
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the request body must be a JSON object",
            )
        }
        Err(e) => {
            return api_error(
                Some(api),
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the request body is not JSON: {e}"),
            )
        }
    };
    let upstream = if api.is_anthropic() {
        shared.upstreams.anthropic.clone()
    } else {
        shared.upstreams.openai.clone()
    };
    let Some(upstream) = upstream else {
        return api_error(
            Some(api),
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("this gateway has no provider for {}", api.name()),
        );
    };
    // A conversation request goes on from the turns before (see `history`).
    let opening = history::opening(&request, api, &shared.continuing.task);
    let mut body = body;
    if let (Some(at), Some(before)) = (opening, &shared.continuing.history) {
        if before.api == api {
            history::continued(before, &mut request, api, at);
            body = Bytes::from(request.to_string());
        } else {
            tracing::warn!(kept = %before.api, now = api.name(), "the CLI calls another API than its kept conversation's: not continued");
        }
    }
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let normalized = normalize::normalized(&request, &shared.names);
    let outgoing = relay::Outgoing {
        api,
        upstream,
        headers,
        query,
        body,
    };
    let (opener, gate) = steadfast_model::gate();
    let billed = (api != Api::AnthropicCountTokens).then(|| Billed {
        bytes: outgoing.body.len(),
        max_output: output_limit::asked(api, &request),
    });
    let asked = Asked {
        api,
        fingerprint: normalize::fingerprint_of(api.name(), &normalized),
        request: &normalized,
        stream,
        billed,
    };
    let begun = shared
        .exchanges
        .begin(asked, |lowered| {
            let mut outgoing = outgoing;
            if let Some(tokens) = lowered {
                outgoing.body = output_limit::lowered(api, &request, tokens);
            }
            outgoing.start(&shared.http, &gate)
        })
        .await;
    let begun = match begun {
        Ok(begun) => begun,
        Err(refusal) => return refused(api, &refusal),
    };
    if opening.is_some() {
        let (Begun::Replayed { index, .. } | Begun::Live { index, .. }) = &begun;
        *shared.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(history::Seen {
            kind: api,
            items: history::items(&request, api),
            index: *index,
        });
    }
    match begun {
        Begun::Replayed { reply, .. } => relay::replay(reply),
        Begun::Live {
            call_id,
            sending,
            answered,
            ..
        } => {
            // The intent is in the log: the request's last byte may go.
            opener.open();
            let model = request
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let live = shared.exchanges.live();
            let span = steadfast_metrics::trace::model_call_span(
                &live.lease().session,
                live.with(|s| s.turn),
                if api.is_anthropic() {
                    "anthropic"
                } else {
                    "openai"
                },
                &model,
            );
            let call = relay::Call {
                api,
                call_id,
                model,
                span: span.clone(),
            };
            let sent = relay::Sent::new(sending, answered);
            use tracing::Instrument;
            relay::live(shared, call, sent).instrument(span).await
        }
    }
}

/// The POST route of one model API.
fn api_route<W: World + Clone>(api: Api) -> MethodRouter<Arc<Shared<W>>> {
    post(
        move |State(shared): State<Arc<Shared<W>>>,
              headers: HeaderMap,
              RawQuery(query): RawQuery,
              body: Result<Bytes, BytesRejection>| {
            handle(shared, api, headers, query, body)
        },
    )
}

/// Whether a request is in Anthropic's dialect (by its headers).
fn anthropic_dialect(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version") || headers.contains_key("x-api-key")
}

/// The refusal of a model-listing request without this gateway's token, in the
/// request's dialect (Anthropic's or OpenAI's).
fn refuse_listing<W: World + Clone>(shared: &Shared<W>, headers: &HeaderMap) -> Option<Response> {
    (!shared.authorized(headers)).then(|| {
        api_error(
            anthropic_dialect(headers).then_some(Api::AnthropicMessages),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid session token for this gateway",
        )
    })
}

fn model_entry(anthropic: bool, id: &str) -> Value {
    if anthropic {
        json!({"type": "model", "id": id, "display_name": id, "created_at": "2025-01-01T00:00:00Z"})
    } else {
        json!({"id": id, "object": "model", "created": 1_735_689_600, "owned_by": "steadfast"})
    }
}

/// The models of this session, answered locally (no provider call, same every run).
async fn models<W: World + Clone>(
    State(shared): State<Arc<Shared<W>>>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refuse_listing(&shared, &headers) {
        return refused;
    }
    let anthropic = anthropic_dialect(&headers);
    let data: Vec<Value> = shared
        .models
        .iter()
        .map(|m| model_entry(anthropic, m))
        .collect();
    let body = if anthropic {
        json!({"data": data, "has_more": false,
               "first_id": shared.models.first(), "last_id": shared.models.last()})
    } else {
        json!({"object": "list", "data": data})
    };
    Json(body).into_response()
}

async fn model<W: World + Clone>(
    State(shared): State<Arc<Shared<W>>>,
    headers: HeaderMap,
    AxPath(id): AxPath<String>,
) -> Response {
    if let Some(refused) = refuse_listing(&shared, &headers) {
        return refused;
    }
    let anthropic = anthropic_dialect(&headers);
    let api = anthropic.then_some(Api::AnthropicMessages);
    if shared.models.contains(&id) {
        Json(model_entry(anthropic, &id)).into_response()
    } else {
        api_error(
            api,
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("model {id} is not offered by this gateway"),
        )
    }
}
