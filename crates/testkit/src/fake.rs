//! The fake provider's HTTP server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::wire::{self, Format};
use crate::Script;

/// How many request bodies [`FakeState::requests`] keeps (the latest).
const KEPT_BODIES: usize = 1000;

/// The provider's shared state: the script and the counters.
#[derive(Debug, Default)]
pub struct FakeState {
    script: Script,
    counters: Mutex<Counters>,
    /// TCP connections accepted.
    connections: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default, Clone)]
struct Counters {
    calls: u64,
    per_step: Vec<u64>,
    failures_served: Vec<u32>,
    request_hashes: Vec<u64>,
    /// Every request body received, in order.
    requests: Vec<String>,
    /// Requests refused for passing the context window.
    too_long: u64,
    /// Compaction requests answered with a summary.
    summaries: u64,
    /// Where each of them came among all requests answered (1-based).
    summaries_at: Vec<u64>,
    /// The largest request, tokens (a quarter of its bytes).
    largest: u64,
}

impl FakeState {
    /// State playing `script`.
    pub fn new(script: Script) -> Arc<Self> {
        Arc::new(FakeState {
            script,
            counters: Mutex::default(),
            connections: Default::default(),
        })
    }

    /// TCP connections accepted so far (calls on a kept-alive connection share one).
    pub fn connections(&self) -> u64 {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Model calls received (authenticated, well-formed requests).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// How many different request bodies were received: a call repeated with the
    /// same conversation counts once.
    pub fn distinct_requests(&self) -> usize {
        let mut hashes = self.lock().request_hashes.clone();
        hashes.sort_unstable();
        hashes.dedup();
        hashes.len()
    }

    /// The request bodies received, in order (for tests that check what a client
    /// sent): the latest thousand.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// Requests refused for passing the script's context window.
    pub fn too_long(&self) -> u64 {
        self.lock().too_long
    }

    /// Compaction requests (asking for a summary) answered.
    pub fn summaries(&self) -> u64 {
        self.lock().summaries
    }

    /// Where each compaction request came among all the requests answered (scripted
    /// and compactions, 1-based): the provider calls a fault point can name.
    pub fn summaries_at(&self) -> Vec<u64> {
        self.lock().summaries_at.clone()
    }

    /// The largest request received, tokens (a quarter of its bytes).
    pub fn largest_request(&self) -> u64 {
        self.lock().largest
    }

    /// Calls received per script step.
    pub fn calls_per_step(&self) -> Vec<u64> {
        self.lock().per_step.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fake provider's routes: `POST /v1/messages` (Anthropic),
/// `POST /v1/chat/completions` and `POST /chat/completions` (OpenAI), and
/// `GET /_fake/calls` (the counters, as JSON).
pub fn router(state: Arc<FakeState>) -> Router {
    Router::new()
        .route("/v1/messages", post(anthropic))
        .route("/v1/chat/completions", post(openai))
        .route("/chat/completions", post(openai))
        .route("/v1/responses", post(responses))
        .route("/responses", post(responses))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/_fake/calls", get(counters))
        .with_state(state)
}

async fn counters(State(state): State<Arc<FakeState>>) -> Json<Value> {
    let c = state.lock().clone();
    Json(json!({"calls": c.calls, "per_step": c.per_step}))
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"type": "error", "error": {"type": kind, "message": message}})),
    )
        .into_response()
}

async fn anthropic(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if headers.get("x-api-key").is_none() {
        return error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "x-api-key header is required",
        );
    }
    if headers.get("anthropic-version").is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "anthropic-version header is required",
        );
    }
    serve(&state, Format::Anthropic, &body).await
}

async fn openai(State(state): State<Arc<FakeState>>, headers: HeaderMap, body: String) -> Response {
    let authorized = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "));
    if !authorized {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "a bearer token is required",
        );
    }
    serve(&state, Format::OpenAi, &body).await
}

/// The tool names a request offers (Anthropic, Chat Completions and Responses shapes,
/// including tools grouped in namespaces).
fn offered_tools(request: &Value) -> Vec<String> {
    fn collect(tools: &[Value], prefix: &str, out: &mut Vec<String>) {
        for t in tools {
            let name = t
                .get("name")
                .or_else(|| t.get("function").and_then(|f| f.get("name")))
                .and_then(Value::as_str);
            if let Some(inner) = t.get("tools").and_then(Value::as_array) {
                let ns = name.unwrap_or_default();
                collect(inner, &format!("{prefix}{ns}."), out);
            } else if let Some(name) = name {
                out.push(format!("{prefix}{name}"));
            }
        }
    }
    let mut out = Vec::new();
    if let Some(tools) = request.get("tools").and_then(Value::as_array) {
        collect(tools, "", &mut out);
    }
    out
}

/// A scripted tool name as the client offers it: scripts say `bash`, Claude Code
/// offers MCP tools as `mcp__steadfast__bash`, Codex as `steadfast.bash`, OpenCode as
/// `steadfast_bash`.
fn resolve_tool_names(mut step: crate::Step, request: &Value) -> crate::Step {
    let offered = offered_tools(request);
    for call in &mut step.tool_calls {
        if offered.contains(&call.name) {
            continue;
        }
        let suffixes = [
            format!("__{}", call.name),
            format!(".{}", call.name),
            format!("_{}", call.name),
        ];
        if let Some(found) = offered
            .iter()
            .find(|o| suffixes.iter().any(|s| o.ends_with(s.as_str())))
        {
            call.name = found.clone();
        }
    }
    step
}

/// The scripted step `index`, counted as a call; `Err` with the scripted failure's
/// status if it is to fail this time.
fn count_call(state: &FakeState, index: usize, body: &str) -> Result<crate::Step, StatusCode> {
    let step = state
        .script
        .steps
        .get(index)
        .cloned()
        .unwrap_or_else(|| crate::Step {
            text: "(the fake provider's script has no more steps)".into(),
            ..Default::default()
        });
    let mut c = state.lock();
    c.calls += 1;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(body, &mut hasher);
    c.request_hashes.push(std::hash::Hasher::finish(&hasher));
    // The bodies of the latest requests only: a long session's would fill memory.
    if c.requests.len() >= KEPT_BODIES {
        c.requests.remove(0);
    }
    c.requests.push(body.to_string());
    if c.per_step.len() <= index {
        c.per_step.resize(index + 1, 0);
        c.failures_served.resize(index + 1, 0);
    }
    c.per_step[index] += 1;
    if let Some(fail) = &step.fail {
        if c.failures_served[index] < fail.times {
            c.failures_served[index] += 1;
            let status =
                StatusCode::from_u16(fail.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Err(status);
        }
    }
    Ok(step)
}

/// A slow step is slow for clients that do not stream too: the whole reply waits as
/// long as its chunks would have taken.
async fn slow_down(step: &crate::Step, stream: bool) {
    if !stream && step.chunk_delay_ms > 0 {
        let chunks = step.text.chars().count() / 16 + 1;
        tokio::time::sleep(std::time::Duration::from_millis(
            step.chunk_delay_ms * chunks as u64,
        ))
        .await;
    }
}

/// `POST /v1/responses`: the OpenAI Responses API.
async fn responses(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if !headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "))
    {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "a bearer token is required",
        );
    }
    let request: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("body is not JSON: {e}"),
            )
        }
    };
    let Some(input) = request.get("input") else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "input: field required",
        );
    };
    let index = crate::responses::step_index(input);
    let step = match count_call(&state, index, &body) {
        Ok(step) => crate::redo::only_rolled_back(
            resolve_tool_names(step, &request),
            crate::redo::in_responses_input(input),
        ),
        Err(status) => return error(status, "scripted_error", "scripted failure"),
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake");
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    // Ids differ between a step and its redo after a rollback (clients key their
    // transcripts by tool-call id), and are the same for the same request.
    let seed = index * 1000 + input.as_array().map_or(0, Vec::len);
    slow_down(&step, stream).await;
    crate::responses::reply(seed, &step, model, (body.len() / 4) as u64, stream)
}

/// `POST /v1/messages/count_tokens`: an estimate (a quarter of the body's bytes); not
/// a model call, so not counted as one.
async fn count_tokens(headers: HeaderMap, body: String) -> Response {
    if headers.get("x-api-key").is_none() {
        return error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "x-api-key header is required",
        );
    }
    Json(json!({"input_tokens": (body.len() / 4).max(1)})).into_response()
}

async fn serve(state: &FakeState, format: Format, body: &str) -> Response {
    let request: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("body is not JSON: {e}"),
            )
        }
    };
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "messages: field required",
        );
    };
    let tokens = (body.len() / 4) as u64;
    {
        let mut c = state.lock();
        c.largest = c.largest.max(tokens);
        if state.script.context_window.is_some_and(|w| tokens > w) {
            c.too_long += 1;
            drop(c);
            let window = state.script.context_window.unwrap_or_default();
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("prompt is too long: {tokens} tokens > {window} maximum"),
            );
        }
    }
    if asks_for_summary(messages) {
        // Compaction: a summary of what the conversation holds, in no script step.
        // A wrapped CLI keeps only the summary, so it carries the script's place.
        let turns = messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .count();
        let done = wire::step_index(format, &messages[..messages.len() - 1]);
        {
            let mut c = state.lock();
            c.summaries += 1;
            let at = c.calls + c.summaries;
            c.summaries_at.push(at);
        }
        let step = crate::Step {
            text: format!(
                "<summary>{} Summary of {turns} model turns: the user asked for the work; files were read and checked step by step; nothing failed; continue from the next step.</summary>",
                wire::place_marker(done)
            ),
            ..Default::default()
        };
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("fake");
        let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
        return wire::reply(format, messages.len(), &step, model, tokens, stream);
    }
    let index = wire::step_index(format, messages);
    let step = match count_call(state, index, body) {
        Ok(step) => crate::redo::only_rolled_back(
            resolve_tool_names(step, &request),
            crate::redo::in_messages(format, messages),
        ),
        Err(status) => return error(status, "scripted_error", "scripted failure"),
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake")
        .to_string();
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let input_tokens = (body.len() / 4) as u64;
    // Ids differ between a step and its redo after a rollback (clients key their
    // transcripts by tool-call id), and are the same for the same request.
    let seed = index * 1000 + messages.len();
    slow_down(&step, stream).await;
    wire::reply(format, seed, &step, &model, input_tokens, stream)
}

/// What a wrapped CLI's own compaction asks (Claude Code's auto-compact).
const CLI_SUMMARY_PROMPT: &str =
    "Your task is to create a detailed summary of the conversation so far";

/// Whether a request is a compaction asking for a summary (its last message says so):
/// the native agent's, or a wrapped CLI's own.
fn asks_for_summary(messages: &[Value]) -> bool {
    messages.last().is_some_and(|m| {
        let text = wire::text_of(m);
        text.contains(steadfast_log::fold::SUMMARY_PROMPT) || text.contains(CLI_SUMMARY_PROMPT)
    })
}

/// A fake provider running on a loopback port, for tests and the offline demo.
pub struct FakeProvider {
    addr: SocketAddr,
    state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeProvider {
    /// Starts a provider playing `script` on `127.0.0.1` at a free port.
    pub async fn start(script: Script) -> std::io::Result<Self> {
        Self::start_on(script, "127.0.0.1:0").await
    }

    /// Starts a provider playing `script` on `addr`.
    pub async fn start_on(script: Script, addr: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = FakeState::new(script);
        let app = router(state.clone());
        // Streamed replies on a kept-alive connection must not wait for Nagle's
        // algorithm (about 40 ms a response with delayed ACKs).
        let counted = state.clone();
        let listener = axum::serve::ListenerExt::tap_io(listener, move |tcp| {
            let _ = tcp.set_nodelay(true);
            counted
                .connections
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeProvider { addr, state, task })
    }

    /// The base URL, e.g. `http://127.0.0.1:4567`. (OpenAI clients add `/v1`.)
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The provider's counters.
    pub fn state(&self) -> &Arc<FakeState> {
        &self.state
    }

    /// Model calls received so far.
    pub fn calls(&self) -> u64 {
        self.state.calls()
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}
