//! Sending a request on to the provider and streaming the reply back as it arrives
//! while recording it; answering a recorded request from the log.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
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

/// The exchange a live request is recorded as.
pub(crate) struct Call {
    pub(crate) api: Api,
    /// The intent's id.
    pub(crate) call_id: String,
    /// The model the agent asked for (for the metrics).
    pub(crate) model: String,
    /// The exchange's span in the turn's trace, open until the reply is recorded.
    pub(crate) span: tracing::Span,
}

/// A request to pass on to the provider, as the client sent it.
pub(crate) struct Outgoing {
    pub(crate) api: Api,
    pub(crate) upstream: Upstream,
    pub(crate) headers: HeaderMap,
    pub(crate) query: Option<String>,
    pub(crate) body: Bytes,
}

impl Outgoing {
    /// Starts sending the request to the provider under `gate`: all of it but its last
    /// byte goes out while the returned future is polled (alongside the exchange's
    /// intent, see `steadfast_journal::exchange::Exchanges::begin`), the rest once the
    /// gate opens (after the intent is in the log; see `steadfast_model::gate`).
    pub(crate) fn start(&self, http: &reqwest::Client, gate: &steadfast_model::Gate) -> Sending {
        let api = self.api;
        let mut request = http
            .post(upstream_url(api, &self.upstream, self.query.as_deref()))
            .header("content-type", "application/json");
        for name in FORWARDED {
            if let Some(v) = self.headers.get(*name) {
                request = request.header(*name, v);
            }
        }
        request = if matches!(api, Api::AnthropicMessages | Api::AnthropicCountTokens) {
            request.header("x-api-key", &self.upstream.api_key)
        } else {
            request.bearer_auth(&self.upstream.api_key)
        };
        Box::pin(gate.attach(request, &self.body).send())
    }
}

/// A request going to the provider: its answer's head.
pub(crate) type Sending =
    futures_util::future::BoxFuture<'static, reqwest::Result<reqwest::Response>>;

/// A request on its way to the provider, polled by the handler's own task (no task
/// between the provider's answer and the client); dropped, it is abandoned (its gate
/// still shut, the provider never has all of it).
pub(crate) struct Sent {
    request: Sending,
    /// The answer, if it came while the intent was being appended.
    answered: Option<reqwest::Result<reqwest::Response>>,
}

impl Sent {
    /// A request whose intent is in the log, and its answer if it came meanwhile.
    pub(crate) fn new(
        request: Sending,
        answered: Option<reqwest::Result<reqwest::Response>>,
    ) -> Self {
        Sent { request, answered }
    }

    /// The provider's answer (its head; the body streams).
    async fn response(self) -> Result<reqwest::Response, String> {
        match self.answered {
            Some(answer) => answer,
            None => self.request.await,
        }
        .map_err(|e| e.to_string())
    }
}

/// Streams the provider's reply to a request sent (see [`Outgoing::start`]) back
/// while recording it. The reply is read to its end and recorded even if the client
/// goes away meanwhile, so a restarted client gets it from the log instead of paying
/// for it again.
pub(crate) async fn live<W: World + Clone>(
    shared: Arc<Shared<W>>,
    call: Call,
    sent: Sent,
) -> Response {
    let Call {
        api,
        call_id,
        model,
        span,
    } = call;
    let started = std::time::Instant::now();
    let upstream_response = match sent.response().await {
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
    shared.inflight.send_modify(|n| *n += 1);
    let streamed = content_type.starts_with("text/event-stream");
    let recording = Recording {
        writer: streamed.then(|| {
            crate::deltas::DeltaWriter::start(shared.exchanges.live().clone(), call_id.clone())
        }),
        inflight: Some(Inflight(shared.clone())),
        shared,
        api,
        call_id,
        model,
        started,
        span,
        status,
        content_type: content_type.clone(),
        recorded: Vec::new(),
        text: crate::deltas::TextDeltas::default(),
        first: true,
        chunks: Some(Box::pin(upstream_response.bytes_stream())),
        detached: false,
    };
    // The client's connection polls the provider's stream itself (no task or channel
    // between them), so each chunk goes on as it arrives; the body ends only once
    // the reply is recorded.
    let stream = futures_util::stream::unfold(recording, |mut recording| {
        let span = recording.span.clone();
        tracing::Instrument::instrument(
            async move {
                match recording.next_chunk().await {
                    Some(item) => Some((item, recording)),
                    None => {
                        // On a task of its own, so a client that goes away now cannot cut the
                        // recording short.
                        let mut recording = recording;
                        let finish = async move { recording.finish().await };
                        let _ = tokio::spawn(tracing::Instrument::in_current_span(finish)).await;
                        None
                    }
                }
            },
            span,
        )
    });
    response(status, &content_type, Body::from_stream(stream))
}

/// The provider's reply as it is relayed: what it has said so far, recorded as it
/// passes. Dropped before the end (the client went away), it hands the rest of the
/// reply to a task that reads and records it anyway, so a restarted client gets it
/// from the log instead of paying for it again.
struct Recording<W: World + Clone> {
    shared: Arc<Shared<W>>,
    api: Api,
    call_id: String,
    /// The model asked for, and when the request was sent (for the metrics).
    model: String,
    started: std::time::Instant,
    /// The exchange's span: the body is polled outside the handler, so each poll
    /// runs inside it (the recording's tasks inherit it).
    span: tracing::Span,
    status: u16,
    content_type: String,
    recorded: Vec<u8>,
    text: crate::deltas::TextDeltas,
    writer: Option<crate::deltas::DeltaWriter>,
    first: bool,
    /// `None` once the reply is read to its end or broke off.
    chunks: Option<futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>>,
    /// Counts the relay as in flight until the reply is recorded or broke off.
    inflight: Option<Inflight<W>>,
    /// Already handed to a task of its own to finish: dropped unfinished again (that
    /// task cancelled, the runtime shutting down), it is abandoned, as a crash would
    /// leave it, rather than handed on once more.
    detached: bool,
}

impl<W: World + Clone> Recording<W> {
    /// The next chunk, recorded; `None` at the reply's end. A provider that breaks off
    /// records nothing: the intent stays unanswered and the client asks again.
    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let chunks = self.chunks.as_mut()?;
        let mut abandoned = self.shared.abandoned.subscribe();
        let next = tokio::select! {
            next = chunks.next() => next,
            _ = abandoned.wait_for(|a| *a) => {
                tracing::info!("the turn was interrupted: the reply is cut off unrecorded");
                self.chunks = None;
                self.writer = None;
                self.inflight = None;
                return Some(Err(std::io::Error::other("the turn was interrupted")));
            }
        };
        match next {
            Some(Ok(bytes)) => {
                self.recorded.extend_from_slice(&bytes);
                if let Some(writer) = &self.writer {
                    writer.push(self.text.feed(self.api, &bytes));
                }
                if self.first {
                    steadfast_fault::point(steadfast_fault::points::MODEL_MID_STREAM);
                    self.first = false;
                }
                Some(Ok(bytes))
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "provider stream broke off");
                self.chunks = None;
                self.writer = None;
                self.inflight = None;
                Some(Err(std::io::Error::other(e)))
            }
            None => {
                self.chunks = None;
                None
            }
        }
    }

    /// Records the whole reply, read to its end, as the exchange's outcome (after its
    /// text pieces). Once: a reply that broke off or is recorded already is left.
    async fn finish(&mut self) {
        if self.chunks.is_some() || self.inflight.is_none() {
            return;
        }
        if let Some(writer) = self.writer.take() {
            writer.finish().await;
        }
        let body = String::from_utf8_lossy(&std::mem::take(&mut self.recorded)).into_owned();
        let usage = crate::usage::of_reply(self.api, &body);
        let reply = (self.status, self.content_type.clone(), body);
        let recorded = self
            .shared
            .exchanges
            .outcome(std::mem::take(&mut self.call_id), reply, usage)
            .await;
        let cost_micro_usd = match recorded {
            Ok(cost) => cost,
            Err(e) => {
                tracing::error!(error = %e, "recording a gateway reply failed");
                0
            }
        };
        steadfast_metrics::metrics().model_call(steadfast_metrics::ModelCall {
            provider: if self.api.is_anthropic() {
                "anthropic"
            } else {
                "openai"
            },
            model: &self.model,
            ok: self.status < 400,
            usage: usage.as_ref(),
            cost_micro_usd,
            took: self.started.elapsed(),
        });
        steadfast_metrics::trace::record_model_reply(&self.span, usage.as_ref(), None);
        self.inflight = None;
    }
}

impl<W: World + Clone> Drop for Recording<W> {
    fn drop(&mut self) {
        if self.inflight.is_none() || self.detached {
            return;
        }
        // Unfinished: the rest of the reply is read and recorded by a task of its own.
        let mut rest = Recording {
            shared: self.shared.clone(),
            api: self.api,
            call_id: std::mem::take(&mut self.call_id),
            model: std::mem::take(&mut self.model),
            started: self.started,
            span: self.span.clone(),
            status: self.status,
            content_type: std::mem::take(&mut self.content_type),
            recorded: std::mem::take(&mut self.recorded),
            text: std::mem::take(&mut self.text),
            writer: self.writer.take(),
            first: self.first,
            chunks: self.chunks.take(),
            inflight: self.inflight.take(),
            detached: true,
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(tracing::Instrument::in_current_span(async move {
                while rest.next_chunk().await.is_some() {}
                rest.finish().await;
            }));
        }
    }
}
