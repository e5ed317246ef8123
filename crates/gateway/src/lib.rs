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
//! **Replay.** A gateway opened over a session whose open turn already has exchanges (a
//! wrapped agent restarted after a crash) answers each request that matches the record
//! from the log — the same bytes, so the same events and ids — without calling the
//! provider. A request matches the recorded exchange at the replay cursor, or one of
//! the next few still unanswered ones (a client may send side requests concurrently,
//! in any order), when the [`normalize::fingerprint`]s agree. A request that matches
//! nothing while recorded exchanges remain is a **divergence**: an
//! [`Event::ReplayDiverged`] supersedes the record from the cursor on, the workspace is
//! restored to the snapshot recorded with that exchange, and the request goes to the
//! provider. A recorded request whose reply was cut off by a crash is asked again.
//!
//! **Replay against something new.** Opened with [`Mismatch::Stop`], a gateway checks
//! a run of another CLI (or model) against the record: the first request that matches
//! nothing is noted ([`Gateway::divergence`]) and refused, and nothing is asked of the
//! provider. Every request is kept by content ([`kept`]), so the report can show what
//! changed.

mod deltas;
pub mod history;
pub mod kept;
pub mod normalize;
mod relay;
mod usage;

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path as AxPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};
use steadfast_drive::Drive;
use steadfast_log::{Breaker, Event};
use steadfast_world::{LiveSession, World};
use tokio::sync::Mutex;

/// The largest request body accepted (Claude Code sends about 100 KB; long sessions
/// more).
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;

/// How many recorded exchanges past the cursor a request may match (concurrent side
/// requests arrive in any order).
const REPLAY_WINDOW: usize = 4;

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

/// Failures opening a gateway.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The world failed.
    #[error(transparent)]
    World(#[from] steadfast_world::Error),
    /// A kept request could not be read back.
    #[error("kept request: {0}")]
    Kept(String),
}

/// What a gateway does with a request the record does not have while recorded
/// exchanges remain (or, replaying against something new, past the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mismatch {
    /// Supersede the record from there and ask the provider: a restarted agent that
    /// went another way.
    #[default]
    Diverge,
    /// Note it ([`Gateway::divergence`]), then as [`Mismatch::Diverge`]: a replay that
    /// goes on live from where it diverged.
    NoteAndDiverge,
    /// Note it and refuse the request: nothing is asked of the provider or recorded,
    /// and [`Gateway::stopped`] resolves. A replay that only checks.
    Stop,
}

/// The first request of a replay that the record did not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The recorded exchange it was expected to be (the replay's cursor): `None` when
    /// the record had no more.
    pub expected: Option<String>,
    /// How many of the turn's recorded requests this run was answered from before it.
    pub index: usize,
    /// The API it was sent to.
    pub api: String,
    /// The request, normalized as fingerprints see it.
    pub request: Value,
}

/// What a gateway is opened with.
pub struct GatewayConfig<W> {
    /// The session's log under the wrapped agent's driver's lease: every exchange is
    /// appended through it, and the bounds and the replay read its state.
    pub live: Arc<LiveSession<W>>,
    /// The drive, for restoring the workspace on a divergence.
    pub drive: Drive,
    /// The session's workspace.
    pub workspace: PathBuf,
    /// The token the wrapped agent must present.
    pub token: String,
    /// The providers.
    pub upstreams: Upstreams,
    /// Model names `GET /v1/models` lists.
    pub models: Vec<String>,
    /// Where the workspace is now (it moves as a replay answers recorded tool calls),
    /// shared with whatever records tool calls, so each exchange notes where its
    /// divergence would restore to.
    pub last_snapshot: Arc<StdMutex<Option<String>>>,
    /// The most exchanges the session's turn may have: past it, or past any of the
    /// session's bounds (money, tokens, turns, wall clock), requests are refused
    /// (HTTP 429) and [`Gateway::escalation`] says why, for the driver to escalate.
    pub max_exchanges: Option<usize>,
    /// Model prices overriding the built-in table (what the cost bound counts).
    pub prices: steadfast_model::pricing::PriceTable,
    /// A further bound checked before each model call (a wrapped agent's loop breaker,
    /// counted by its tool journal).
    pub extra_bound: Option<BoundCheck>,
    /// The HTTP client upstream calls go through (the harness's, so each run of the
    /// CLI reuses its warm connections: see [`steadfast_model::provider_http`]).
    pub http: reqwest::Client,
    /// Where requests are kept by content.
    pub blobs: steadfast_world::Blobs,
    /// What a request the record does not have does.
    pub mismatch: Mismatch,
    /// The conversation the turn continues (see [`history`]).
    pub continuing: history::Continuing,
}

/// A bound check: the breaker and reason if the session must stop.
pub type BoundCheck = Arc<dyn Fn() -> Option<(Breaker, String)> + Send + Sync>;

/// The replay pass of one run of the wrapped agent: which of the open turn's recorded
/// exchanges this run has been answered from (or has re-asked, or made itself).
#[derive(Default)]
struct Replay {
    consumed: std::collections::HashSet<String>,
    /// The requests this gateway kept.
    keeper: kept::Keeper,
    /// The first request the record did not have (noted replaying against something
    /// new).
    divergence: Option<Divergence>,
}

/// Where one request goes, as the record says.
enum Plan {
    /// Answered from the record at this index.
    Replay(usize, (u16, String, String)),
    /// Recorded at this index but cut off before its reply: asked again in its place.
    Reask(usize),
    /// Nothing recorded matches while recorded exchanges remain from this index, whose
    /// snapshot the workspace goes back to.
    Diverge(usize, Option<String>),
    /// Past the record: a new exchange at this index.
    New(usize),
}

pub(crate) struct Shared<W> {
    pub(crate) live: Arc<LiveSession<W>>,
    drive: Drive,
    workspace: PathBuf,
    /// What names the workspace in requests (fingerprints ignore it).
    names: normalize::WorkspaceNames,
    token_hash: blake3::Hash,
    pub(crate) upstreams: Upstreams,
    models: Vec<String>,
    last_snapshot: Arc<StdMutex<Option<String>>>,
    max_exchanges: Option<usize>,
    pub(crate) prices: steadfast_model::pricing::PriceTable,
    extra_bound: Option<BoundCheck>,
    escalation: StdMutex<Option<(Breaker, String)>>,
    escalated: tokio::sync::watch::Sender<bool>,
    /// Replies still streaming from the provider (and being recorded).
    pub(crate) inflight: tokio::sync::watch::Sender<usize>,
    /// Set when the turn was interrupted: replies still streaming are cut off, not
    /// recorded (nobody will ask for them again).
    pub(crate) abandoned: tokio::sync::watch::Sender<bool>,
    replay: Mutex<Replay>,
    pub(crate) http: reqwest::Client,
    blobs: steadfast_world::Blobs,
    mismatch: Mismatch,
    stopped: tokio::sync::watch::Sender<bool>,
    /// Exchanges this gateway answered from the log / sent to the provider.
    pub(crate) counters: StdMutex<Counters>,
    continuing: history::Continuing,
    /// The last conversation request, as sent on.
    seen: StdMutex<Option<history::Seen>>,
}

/// What a gateway did, for tests and progress displays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests answered from the log.
    pub replayed: u64,
    /// Requests sent to the provider.
    pub live: u64,
    /// Divergences declared.
    pub diverged: u64,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    AnthropicMessages,
    AnthropicCountTokens,
    OpenAiChat,
    OpenAiResponses,
}

impl Api {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::AnthropicMessages => "anthropic.messages",
            Api::AnthropicCountTokens => "anthropic.count_tokens",
            Api::OpenAiChat => "openai.chat",
            Api::OpenAiResponses => "openai.responses",
        }
    }

    fn is_anthropic(self) -> bool {
        matches!(self, Api::AnthropicMessages | Api::AnthropicCountTokens)
    }
}

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
    /// Opens a gateway for a (new) run of the session's wrapped agent: its replay pass
    /// starts at the open turn's first recorded exchange (a restarted CLI starts its
    /// turn over; earlier turns' exchanges are history it never asks for again).
    pub async fn open(config: GatewayConfig<W>) -> Result<Self, Error> {
        let http = config.http.clone();
        let names = config
            .live
            .with(|s| normalize::WorkspaceNames::new(&config.workspace, &s.former_workspaces));
        Ok(Gateway {
            shared: Arc::new(Shared {
                live: config.live,
                drive: config.drive,
                names,
                workspace: config.workspace,
                token_hash: blake3::hash(config.token.as_bytes()),
                upstreams: config.upstreams,
                models: config.models,
                last_snapshot: config.last_snapshot,
                max_exchanges: config.max_exchanges,
                prices: config.prices,
                extra_bound: config.extra_bound,
                escalation: StdMutex::new(None),
                escalated: tokio::sync::watch::Sender::new(false),
                inflight: tokio::sync::watch::Sender::new(0),
                abandoned: tokio::sync::watch::Sender::new(false),
                replay: Mutex::new(Replay::default()),
                http,
                blobs: config.blobs,
                mismatch: config.mismatch,
                stopped: tokio::sync::watch::Sender::new(false),
                counters: StdMutex::default(),
                continuing: config.continuing,
                seen: StdMutex::new(None),
            }),
        })
    }

    /// Resolves once a request has been refused for crossing a bound (the driver then
    /// stops the CLI rather than let it retry).
    pub async fn escalated(&self) {
        let mut rx = self.shared.escalated.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Resolves once a replay opened with [`Mismatch::Stop`] has refused a request the
    /// record did not have (the driver then stops the CLI).
    pub async fn stopped(&self) {
        let mut rx = self.shared.stopped.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// The first request the record did not have, when the gateway was opened to note
    /// it ([`Mismatch::NoteAndDiverge`], [`Mismatch::Stop`]).
    pub async fn divergence(&self) -> Option<Divergence> {
        self.shared.replay.lock().await.divergence.clone()
    }

    /// How many of the open turn's recorded exchanges this run has not been answered
    /// from (a replay that ended with some left went another way).
    pub async fn unanswered(&self) -> usize {
        let replay = self.shared.replay.lock().await;
        self.shared.live.with(|s| {
            let from = (s.turn_start.exchanges as usize).min(s.exchanges.len());
            s.exchanges[from..]
                .iter()
                .filter(|e| !replay.consumed.contains(&e.call_id))
                .count()
        })
    }

    /// The bound a refused request hit, if one was: the session must escalate.
    pub fn escalation(&self) -> Option<(Breaker, String)> {
        self.shared
            .escalation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// What this gateway has done so far.
    pub fn counters(&self) -> Counters {
        *self
            .shared
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
            .live
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

    /// Counts an event of this gateway.
    pub(crate) fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// What the record says of a request with `fingerprint`.
    fn plan(&self, replay: &Replay, fingerprint: &str) -> Plan {
        self.live.with(|s| {
            let from = (s.turn_start.exchanges as usize).min(s.exchanges.len());
            let open = |i: &usize| !replay.consumed.contains(&s.exchanges[*i].call_id);
            let Some(cursor) = (from..s.exchanges.len()).find(open) else {
                return Plan::New(s.exchanges.len());
            };
            let end = (cursor + REPLAY_WINDOW).min(s.exchanges.len());
            match (cursor..end)
                .filter(open)
                .find(|&i| s.exchanges[i].fingerprint == fingerprint)
            {
                Some(i) => match &s.exchanges[i].reply {
                    Some(reply) => Plan::Replay(i, reply.clone()),
                    None => Plan::Reask(i),
                },
                None => Plan::Diverge(cursor, s.exchanges[cursor].snapshot.clone()),
            }
        })
    }

    /// Matches a request against the record: where it goes, and its exchange's index.
    async fn route(
        &self,
        outgoing: &relay::Outgoing,
        request: &Value,
        stream: bool,
    ) -> Result<(usize, Routed), Response> {
        let api = outgoing.api;
        let fingerprint = &normalize::fingerprint_of(api.name(), request);
        let mut replay = self.replay.lock().await;
        let plan = self.plan(&replay, fingerprint);
        if self.mismatch != Mismatch::Diverge && replay.divergence.is_none() {
            let expected = match &plan {
                Plan::Diverge(at, _) => Some(Some(*at)),
                Plan::New(_) => Some(None),
                _ => None,
            };
            if let Some(expected) = expected {
                replay.divergence = Some(Divergence {
                    expected: expected.map(|i| self.live.with(|s| s.exchanges[i].call_id.clone())),
                    index: replay.consumed.len(),
                    api: api.name().to_string(),
                    request: request.clone(),
                });
            }
        }
        if self.mismatch == Mismatch::Stop && matches!(plan, Plan::Diverge(..) | Plan::New(_)) {
            self.stopped.send_replace(true);
            return Err(api_error(
                Some(api),
                StatusCode::CONFLICT,
                "invalid_request_error",
                "steadfast: this replay stops here: the recorded session made no such request",
            ));
        }
        let index = match plan {
            Plan::Replay(i, reply) => {
                let call_id = self.live.with(|s| s.exchanges[i].call_id.clone());
                replay.consumed.insert(call_id);
                self.count(|c| c.replayed += 1);
                steadfast_metrics::metrics().gateway(steadfast_metrics::GatewayAnswer::Replayed);
                return Ok((i, Routed::Replay(reply)));
            }
            // Recorded but cut off before its reply: ask again, in its place.
            Plan::Reask(i) => {
                return self
                    .record_intent(&mut replay, i, outgoing, request, stream)
                    .await
                    .map(|routed| (i, routed))
            }
            Plan::Diverge(at, snapshot) => {
                self.diverge(api, at, snapshot).await?;
                at
            }
            Plan::New(index) => index,
        };
        if let Some(hit) = self.bound_hit(index) {
            let message = format!("steadfast: {}; the session is escalated", hit.1);
            *self.escalation.lock().unwrap_or_else(|e| e.into_inner()) = Some(hit);
            self.escalated.send_replace(true);
            return Err(api_error(
                Some(api),
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                &message,
            ));
        }
        self.record_intent(&mut replay, index, outgoing, request, stream)
            .await
            .map(|routed| (index, routed))
    }

    async fn diverge(&self, api: Api, at: usize, snapshot: Option<String>) -> Result<(), Response> {
        tracing::warn!(
            index = at,
            "replay diverged: superseding the record from here"
        );
        if let Some(snap) = &snapshot {
            self.drive
                .restore_async(&self.workspace, snap)
                .await
                .map_err(|e| internal(Some(api), &e.to_string()))?;
        }
        self.live
            .append(&[Event::ReplayDiverged {
                index: at as u32,
                snapshot: snapshot.clone(),
            }])
            .await
            .map_err(|e| log_refused(api, &e))?;
        *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
        self.count(|c| c.diverged += 1);
        Ok(())
    }

    /// Records a live exchange's intent, the request already on its way to the
    /// provider but for its last byte, which follows once the intent is in the log.
    async fn record_intent(
        &self,
        replay: &mut Replay,
        index: usize,
        outgoing: &relay::Outgoing,
        request: &Value,
        stream: bool,
    ) -> Result<Routed, Response> {
        let api = outgoing.api;
        let fingerprint = normalize::fingerprint_of(api.name(), request);
        let split = kept::split(request);
        let (parts, unwritten) = replay.keeper.parts(&split);
        let call_id = format!("gx_{}", uuid::Uuid::now_v7().simple());
        let (opener, gate) = steadfast_model::gate();
        let mut sent = outgoing.start(&self.http, &gate);
        let snapshot = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let intent = [Event::ExchangeIntent {
            call_id: call_id.clone(),
            index: index as u32,
            api: api.name().to_string(),
            fingerprint,
            stream,
            snapshot,
            request: Some(parts),
        }];
        // The request's new parts are stored before the record that names them.
        let kept_and_recorded = async {
            kept::write(&self.blobs, &unwritten)
                .await
                .map_err(|e| match e {
                    Error::World(e) => e,
                    Error::Kept(e) => steadfast_world::Error::Blob(e),
                })?;
            self.live.append(&intent).await
        };
        sent.while_appending(kept_and_recorded)
            .await
            .map_err(|e| log_refused(api, &e))?;
        replay.keeper.kept(&call_id, &split);
        replay.consumed.insert(call_id.clone());
        steadfast_fault::point(steadfast_fault::points::MODEL_INTENT);
        opener.open();
        self.count(|c| c.live += 1);
        Ok(Routed::Live { call_id, sent })
    }

    /// The bound a new model call at exchange `index` would cross, if any.
    fn bound_hit(&self, index: usize) -> Option<(Breaker, String)> {
        let (hit, used, turn) = self.live.with(|s| {
            (
                s.bound_hit(steadfast_world::now_ms()),
                index.saturating_sub(s.exchanges_from as usize),
                s.turn,
            )
        });
        if let Some(hit) = hit {
            return Some(hit);
        }
        if let Some(hit) = self.extra_bound.as_ref().and_then(|check| check()) {
            return Some(hit);
        }
        let max = self.max_exchanges?;
        (used >= max).then(|| {
            (
                Breaker::Steps,
                format!("step budget exhausted: {used} model calls in turn {turn}"),
            )
        })
    }
}

pub(crate) fn internal(api: Option<Api>, message: &str) -> Response {
    api_error(api, StatusCode::INTERNAL_SERVER_ERROR, "api_error", message)
}

/// The answer to a call whose record the log would not take (so the call was never
/// made), by why: another worker drives the session now or it has ended (409: this
/// run of the agent is over, its worker stops it), the store is busy or down (503:
/// the same call may go through later), or something worse (500).
fn log_refused(api: Api, error: &steadfast_world::Error) -> Response {
    use steadfast_world::Error as E;
    let (status, kind, why) = match error {
        E::StaleFence { .. } | E::LeaseHeld { .. } | E::Ended(_) => (
            StatusCode::CONFLICT,
            "invalid_request_error",
            "this run of the agent no longer drives the session",
        ),
        E::Backend(_) | E::Blob(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "the session's log is unavailable",
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "the session's log failed",
        ),
    };
    let message = format!("steadfast: {why}, so the call was not made ({error})");
    api_error(Some(api), status, kind, &message)
}

/// Where a request goes.
pub(crate) enum Routed {
    /// Answered from the log: status, content type, body.
    Replay((u16, String, String)),
    /// Sent to the provider, recorded under this id.
    Live { call_id: String, sent: relay::Sent },
}

/// The common path of every model request.
#[tracing::instrument(level = "debug", skip_all, fields(session = %shared.live.lease().session, api = api.name()))]
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
        if before.api == api.name() {
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
    let routed = shared.route(&outgoing, &normalized, stream).await;
    if let (Some(_), Ok((index, _))) = (opening, &routed) {
        *shared.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(history::Seen {
            kind: api,
            items: history::items(&request, api),
            index: *index,
        });
    }
    match routed {
        Err(response) => response,
        Ok((_, Routed::Replay(reply))) => relay::replay(reply),
        Ok((_, Routed::Live { call_id, sent })) => {
            let model = request
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let span = steadfast_metrics::trace::model_call_span(
                &shared.live.lease().session,
                shared.live.with(|s| s.turn),
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
