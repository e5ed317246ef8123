//! Prometheus metrics of one Steadfast process: what platform teams put on their
//! dashboards and alert on (sessions by status, turns, model calls with tokens and
//! cost, tool calls by class, journal latency, takeovers and recovery, the queue,
//! sandboxes, the gateway, the HTTP API).
//!
//! There is one registry per process ([`metrics`]), because a process is what
//! Prometheus scrapes. Most series are derived from what is appended to the log
//! ([`Metrics::appended`], called by the worlds for every append), so they count
//! exactly what the log says happened; the rest are recorded where the thing happens
//! (a model call, a claim, a sandbox). Label values are bounded: session ids are never
//! labels, and names that come from configuration or clients (models, providers) are
//! kept to the first [`MAX_LABEL_VALUES`] seen, the rest counted as `other`.

mod process;
mod timings;
pub mod trace;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use steadfast_log::{EndState, Event, Record, ToolClass, ToolResolution, Usage};

use crate::timings::Timings;

/// How many distinct values a free-form label (a model, a provider) takes before
/// further ones are counted as `other`, so no client can grow the series without end.
pub const MAX_LABEL_VALUES: usize = 64;

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    provider: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelCallLabels {
    provider: String,
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    provider: String,
    model: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    class: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabel {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PreviewLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShellLabels {
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    check: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

type Seconds<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets from 1 ms to about 9 minutes: journal writes at the bottom, turns at the top.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// Every series this process exports.
pub struct Metrics {
    registry: Registry,
    sessions: Family<StatusLabel, Gauge>,
    queue_depth: Gauge,
    turns_started: Counter,
    turns_ended: Family<OutcomeLabel, Counter>,
    turn_seconds: Histogram,
    step_seconds: Histogram,
    model_calls: Family<ModelCallLabels, Counter>,
    model_tokens: Family<TokenLabels, Counter>,
    model_cost: Family<ModelLabels, Counter<f64, AtomicU64>>,
    model_call_seconds: Seconds<ProviderLabel>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_call_seconds: Seconds<ClassLabel>,
    journal_append_seconds: Seconds<StoreLabel>,
    lease_takeovers: Counter,
    recovery_seconds: Histogram,
    queue_claim_seconds: Histogram,
    sandbox_provision_seconds: Seconds<BackendLabel>,
    sandboxes_live: Family<BackendLabel, Gauge>,
    gateway_exchanges: Family<ModeLabel, Counter>,
    http_requests: Family<HttpLabels, Counter>,
    http_request_seconds: Seconds<RouteLabel>,
    webhook_deliveries: Family<ResultLabel, Counter>,
    webhook_delivery_seconds: Histogram,
    http_refused: Family<ReasonLabel, Counter>,
    hook_deliveries: Family<HookLabels, Counter>,
    preview_requests: Family<PreviewLabels, Counter>,
    preview_wake_seconds: Histogram,
    shells_opened: Family<ShellLabels, Counter>,
    shells_attached: Gauge,
    timings: Mutex<Timings>,
    seen: Mutex<HashMap<&'static str, HashSet<String>>>,
}

impl Metrics {
    fn new() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            sessions: Family::default(),
            queue_depth: Gauge::default(),
            turns_started: Counter::default(),
            turns_ended: Family::default(),
            turn_seconds: seconds(),
            step_seconds: seconds(),
            model_calls: Family::default(),
            model_tokens: Family::default(),
            model_cost: Family::default(),
            model_call_seconds: Family::new_with_constructor(seconds),
            tool_calls: Family::default(),
            tool_call_seconds: Family::new_with_constructor(seconds),
            journal_append_seconds: Family::new_with_constructor(seconds),
            lease_takeovers: Counter::default(),
            recovery_seconds: seconds(),
            queue_claim_seconds: seconds(),
            sandbox_provision_seconds: Family::new_with_constructor(seconds),
            sandboxes_live: Family::default(),
            gateway_exchanges: Family::default(),
            http_requests: Family::default(),
            http_request_seconds: Family::new_with_constructor(seconds),
            webhook_deliveries: Family::default(),
            webhook_delivery_seconds: seconds(),
            http_refused: Family::default(),
            hook_deliveries: Family::default(),
            preview_requests: Family::default(),
            preview_wake_seconds: seconds(),
            shells_opened: Family::default(),
            shells_attached: Gauge::default(),
            timings: Mutex::new(Timings::default()),
            seen: Mutex::new(HashMap::new()),
        };
        m.register()
    }

    fn register(mut self) -> Self {
        // The process's own series under their usual names; Steadfast's under its
        // prefix.
        self.registry
            .register_collector(Box::new(process::ProcessCollector));
        let r = self.registry.sub_registry_with_prefix("steadfast");
        let build = Family::<VersionLabel, Gauge>::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register(
            "build_info",
            "Always 1; its label names the version of this build",
            build,
        );
        r.register(
            "sessions",
            "Sessions by status (as of the scrape)",
            self.sessions.clone(),
        );
        r.register(
            "queue_depth",
            "Sessions with work waiting for a worker (as of the scrape)",
            self.queue_depth.clone(),
        );
        r.register("turns_started", "Turns started", self.turns_started.clone());
        r.register(
            "turns_ended",
            "Turns ended, by outcome (completed, interrupted, failed, escalated)",
            self.turns_ended.clone(),
        );
        r.register(
            "turn_duration_seconds",
            "From a turn's user message to its end",
            self.turn_seconds.clone(),
        );
        r.register("step_duration_seconds", "From a model call's intent to the next one's or to the turn's end (the model call and the tool calls it asked for)", self.step_seconds.clone());
        r.register(
            "model_calls",
            "Model calls answered, by provider, model and outcome (ok, failed)",
            self.model_calls.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens of answered model calls, by kind (input, output, cache_read, cache_write)",
            self.model_tokens.clone(),
        );
        r.register(
            "model_cost_usd",
            "What answered model calls cost, in US dollars",
            self.model_cost.clone(),
        );
        r.register(
            "model_call_duration_seconds",
            "From sending a model request to its whole reply",
            self.model_call_seconds.clone(),
        );
        r.register("tool_calls", "Tool calls finished, by class (read, mutate, external) and result (ok, error, interrupted)", self.tool_calls.clone());
        r.register(
            "tool_call_duration_seconds",
            "From a tool call's intent to its outcome",
            self.tool_call_seconds.clone(),
        );
        r.register(
            "journal_append_duration_seconds",
            "One durable append to the log, by store",
            self.journal_append_seconds.clone(),
        );
        r.register(
            "lease_takeovers",
            "Turns taken up that an earlier driver left in flight (it died, or its lease lapsed)",
            self.lease_takeovers.clone(),
        );
        r.register(
            "recovery_seconds",
            "From the last event of a turn left in flight to the worker that took it up",
            self.recovery_seconds.clone(),
        );
        r.register(
            "queue_claim_duration_seconds",
            "One claim of work from the queue",
            self.queue_claim_seconds.clone(),
        );
        r.register(
            "sandbox_provision_duration_seconds",
            "Provisioning a sandbox, by backend",
            self.sandbox_provision_seconds.clone(),
        );
        r.register(
            "sandboxes_live",
            "Sandboxes provisioned and not yet stopped, by backend",
            self.sandboxes_live.clone(),
        );
        r.register("gateway_exchanges", "Model requests of wrapped agents, by how the gateway answered (live, replayed, diverged)", self.gateway_exchanges.clone());
        r.register(
            "http_requests",
            "API requests, by method, route and status",
            self.http_requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "API requests until their response head, by route",
            self.http_request_seconds.clone(),
        );
        r.register(
            "webhook_deliveries",
            "Webhook delivery attempts, by result (delivered, failed: to be retried, abandoned: given up)",
            self.webhook_deliveries.clone(),
        );
        r.register(
            "webhook_delivery_duration_seconds",
            "One webhook delivery attempt, until the receiver's answer",
            self.webhook_delivery_seconds.clone(),
        );
        r.register(
            "http_refused",
            "Connections and requests the server's edges refused, by reason (connection_cap, \
             connections_per_ip, body_deadline)",
            self.http_refused.clone(),
        );
        r.register(
            "hook_deliveries",
            "Deliveries to inbound hooks, by check (token, github, slack, hmac) and result \
             (delivered, ping, bad_signature, stale, replayed, not_waiting)",
            self.hook_deliveries.clone(),
        );
        r.register(
            "preview_requests",
            "Requests to preview URLs, by kind (http, websocket) and result (forwarded, \
             refused, unreachable)",
            self.preview_requests.clone(),
        );
        r.register(
            "preview_wake_seconds",
            "How long a preview URL's first request waited for a stopped sandbox to be \
             started again, services and all",
            self.preview_wake_seconds.clone(),
        );
        r.register(
            "shells_opened",
            "People's shells opened in sessions' sandboxes, by mode (read-write, read-only)",
            self.shells_opened.clone(),
        );
        r.register(
            "shells_attached",
            "People's shells attached to sessions' sandboxes now",
            self.shells_attached.clone(),
        );
        self
    }

    /// The exposition text (OpenMetrics, which Prometheus reads), as of now.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// `value` if it is among the first [`MAX_LABEL_VALUES`] of its kind, else `other`.
    fn bounded(&self, kind: &'static str, value: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let values = seen.entry(kind).or_default();
        if values.contains(value) {
            return value.to_string();
        }
        if values.len() < MAX_LABEL_VALUES {
            values.insert(value.to_string());
            return value.to_string();
        }
        "other".to_string()
    }

    /// Sets the census gauges: sessions by status, and the queue's depth.
    pub fn census(&self, by_status: &[(String, u64)], queued: u64) {
        self.sessions.clear();
        for (status, n) in by_status {
            let status = self.bounded("status", status);
            self.sessions
                .get_or_create(&StatusLabel { status })
                .set(*n as i64);
        }
        self.queue_depth.set(queued as i64);
    }

    /// Records one append to `session`'s log on `store`: its latency, and what the
    /// records say happened (turns, steps, tool calls, gateway exchanges).
    pub fn appended(&self, store: &'static str, session: &str, records: &[Record], took: Duration) {
        self.journal_append_seconds
            .get_or_create(&StoreLabel { store })
            .observe(took.as_secs_f64());
        let mut timings = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        for record in records {
            let at = record.at_ms;
            match &record.event {
                Event::UserMessage { turn, .. } => {
                    self.turns_started.inc();
                    timings.turn_began(session, *turn, at);
                }
                Event::ModelCallIntent { .. } => self.step(timings.step_began(session, at)),
                Event::ExchangeIntent { .. } => {
                    self.gateway(GatewayAnswer::Live);
                    self.step(timings.step_began(session, at));
                }
                Event::ReplayDiverged { .. } => self.gateway(GatewayAnswer::Diverged),
                Event::ToolCallIntent { call_id, class, .. } => {
                    timings.tool_began(session, call_id, *class, at)
                }
                Event::ToolCallOutcome {
                    call_id, is_error, ..
                } => {
                    let began = timings.tool_ended(session, call_id);
                    let class = began.map(|(class, _)| class);
                    self.tool(class, if *is_error { "error" } else { "ok" }, began, at);
                }
                Event::ToolCallInterrupted {
                    call_id,
                    resolution,
                } => {
                    let began = timings.tool_ended(session, call_id);
                    let class = began
                        .map(|(class, _)| class)
                        .or(Some(resolved_class(resolution)));
                    self.tool(class, "interrupted", None, at);
                }
                Event::TurnEnded { .. } => self.turn_ended(&mut timings, session, "completed", at),
                Event::TurnInterrupted { .. } => {
                    self.turn_ended(&mut timings, session, "interrupted", at)
                }
                Event::SessionEnded { state, .. } => match state {
                    EndState::Failed => self.turn_ended(&mut timings, session, "failed", at),
                    EndState::Escalated => self.turn_ended(&mut timings, session, "escalated", at),
                    EndState::Completed | EndState::Closed => timings.forget(session),
                },
                _ => {}
            }
        }
    }

    fn step(&self, ended: Option<u64>) {
        if let Some(ms) = ended {
            self.step_seconds.observe(ms as f64 / 1000.0);
        }
    }

    fn tool(
        &self,
        class: Option<ToolClass>,
        result: &'static str,
        began: Option<(ToolClass, u64)>,
        at: u64,
    ) {
        let class = class.map_or("unknown", class_name);
        self.tool_calls
            .get_or_create(&ToolLabels { class, result })
            .inc();
        if let Some((_, from)) = began {
            self.tool_call_seconds
                .get_or_create(&ClassLabel { class })
                .observe(at.saturating_sub(from) as f64 / 1000.0);
        }
    }

    fn turn_ended(&self, timings: &mut Timings, session: &str, outcome: &'static str, at: u64) {
        self.turns_ended
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        let (turn, step) = timings.turn_ended(session, at);
        if let Some((from, number)) = turn {
            self.turn_seconds
                .observe(at.saturating_sub(from) as f64 / 1000.0);
            trace::turn_span(session, number, from, at, outcome);
        }
        self.step(step);
    }

    /// Learns when the turn a worker takes up began (its user message, at `at` in the
    /// log), so the turn is timed and traced whole though it began elsewhere.
    pub fn turn_resumed(&self, session: &str, turn: u32, at: u64) {
        let mut timings = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        timings.turn_resumed(session, turn, at);
    }

    /// Records an answered model call: `ok` (a reply, with its usage and cost) or
    /// `failed` (refused, or retries exhausted).
    pub fn model_call(&self, call: ModelCall<'_>) {
        let (provider, model) = (
            self.bounded("provider", call.provider),
            self.bounded("model", call.model),
        );
        let outcome = if call.ok { "ok" } else { "failed" };
        self.model_calls
            .get_or_create(&ModelCallLabels {
                provider: provider.clone(),
                model: model.clone(),
                outcome,
            })
            .inc();
        self.model_call_seconds
            .get_or_create(&ProviderLabel {
                provider: provider.clone(),
            })
            .observe(call.took.as_secs_f64());
        if let Some(usage) = call.usage {
            for (kind, n) in [
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cache_read", usage.cache_read_tokens),
                ("cache_write", usage.cache_write_tokens),
            ] {
                self.model_tokens
                    .get_or_create(&TokenLabels {
                        provider: provider.clone(),
                        model: model.clone(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
        self.model_cost
            .get_or_create(&ModelLabels { provider, model })
            .inc_by(steadfast_log::money::usd(call.cost_micro_usd));
    }

    /// Records a turn taken up that an earlier driver left in flight, `behind` after
    /// the last thing that driver recorded.
    pub fn takeover(&self, behind: Duration) {
        self.lease_takeovers.inc();
        self.recovery_seconds.observe(behind.as_secs_f64());
    }

    /// Records one claim on the queue.
    pub fn claimed(&self, took: Duration) {
        self.queue_claim_seconds.observe(took.as_secs_f64());
    }

    /// Records a sandbox provisioned on `backend`; it counts as live until
    /// [`Metrics::sandbox_stopped`].
    pub fn sandbox_started(&self, backend: &'static str, took: Duration) {
        self.sandbox_provision_seconds
            .get_or_create(&BackendLabel { backend })
            .observe(took.as_secs_f64());
        self.sandboxes_live
            .get_or_create(&BackendLabel { backend })
            .inc();
    }

    /// Records a live sandbox stopped.
    pub fn sandbox_stopped(&self, backend: &'static str) {
        self.sandboxes_live
            .get_or_create(&BackendLabel { backend })
            .dec();
    }

    /// Records how the gateway answered a model request.
    pub fn gateway(&self, answer: GatewayAnswer) {
        let mode = match answer {
            GatewayAnswer::Live => "live",
            GatewayAnswer::Replayed => "replayed",
            GatewayAnswer::Diverged => "diverged",
        };
        self.gateway_exchanges
            .get_or_create(&ModeLabel { mode })
            .inc();
    }

    /// Records a webhook delivery attempt: `delivered`, `failed` (to be retried) or
    /// `abandoned` (given up).
    pub fn webhook_delivery(&self, result: &'static str, took: Duration) {
        self.webhook_deliveries
            .get_or_create(&ResultLabel { result })
            .inc();
        self.webhook_delivery_seconds.observe(took.as_secs_f64());
    }

    /// Counts a delivery to an inbound hook, by its check and `result`: `delivered`,
    /// `ping` (a sender's test), `bad_signature`, `stale`, `replayed`, `not_waiting`.
    pub fn hook_delivery(&self, check: &'static str, result: &'static str) {
        self.hook_deliveries
            .get_or_create(&HookLabels { check, result })
            .inc();
    }

    /// Counts a request to a preview URL, by `kind` (`http`, `websocket`) and `result`.
    pub fn preview_request(&self, kind: &'static str, result: &'static str) {
        self.preview_requests
            .get_or_create(&PreviewLabels { kind, result })
            .inc();
    }

    /// Times a preview request's wait for a stopped sandbox to start again.
    pub fn preview_woke(&self, took: std::time::Duration) {
        self.preview_wake_seconds.observe(took.as_secs_f64());
    }

    /// Counts a person's shell opened in a session's sandbox, by `mode`; attached
    /// until the returned guard drops.
    pub fn shell_opened(&self, mode: &'static str) -> ShellAttached {
        self.shells_opened
            .get_or_create(&ShellLabels { mode })
            .inc();
        self.shells_attached.inc();
        ShellAttached(self.shells_attached.clone())
    }

    /// Counts a connection or request the server's edges refused, by `reason`.
    pub fn http_refused(&self, reason: &'static str) {
        self.http_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Records an API request: `route` is the matched route's pattern (bounded by the
    /// router), never the path itself.
    pub fn http_request(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method: method.to_string(),
                route: route.to_string(),
                status,
            })
            .inc();
        self.http_request_seconds
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

/// An answered model call, for [`Metrics::model_call`].
pub struct ModelCall<'a> {
    /// `anthropic`, `openai`, `fake`.
    pub provider: &'a str,
    /// The model asked for.
    pub model: &'a str,
    /// A reply came (else: refused or given up on).
    pub ok: bool,
    /// The reply's usage.
    pub usage: Option<&'a Usage>,
    /// What it cost, millionths of a US dollar.
    pub cost_micro_usd: u64,
    /// From the request to the whole reply.
    pub took: Duration,
}

/// How the gateway answered a wrapped agent's model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayAnswer {
    /// Sent on to the provider and recorded.
    Live,
    /// Answered from the log.
    Replayed,
    /// The agent asked something other than the record: recorded anew from there.
    Diverged,
}

fn class_name(class: ToolClass) -> &'static str {
    match class {
        ToolClass::Read => "read",
        ToolClass::Mutate => "mutate",
        ToolClass::External => "external",
        ToolClass::Idempotent => "idempotent",
    }
}

/// The class an interrupted call must have had, by how it was resolved (its intent
/// may have been written by another process).
fn resolved_class(resolution: &ToolResolution) -> ToolClass {
    match resolution {
        ToolResolution::Rerun => ToolClass::Read,
        ToolResolution::RolledBack { .. } => ToolClass::Mutate,
        ToolResolution::OutcomeUnknown | ToolResolution::Reconciled { .. } => ToolClass::External,
    }
}

/// A person's shell counted as attached while this lives (see
/// [`Metrics::shell_opened`]).
pub struct ShellAttached(Gauge);

impl Drop for ShellAttached {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, at_ms: u64, event: Event) -> Record {
        Record {
            seq,
            epoch: 1,
            at_ms,
            event,
        }
    }

    /// The value of the series `line` starts (name and labels), as exposed.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn the_process_and_the_build_are_exposed_under_their_usual_names() {
        // Some CPU time to count (a test process may not have used a clock tick yet).
        let busy = std::time::Instant::now();
        let mut spin = 0u64;
        while busy.elapsed() < Duration::from_millis(100) {
            spin = spin.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert_ne!(spin, 1);
        let m = Metrics::new();
        let text = m.encode();
        let series = |name: &str| value(&text, name).unwrap_or_else(|| panic!("{name}: {text}"));
        assert!(series("process_resident_memory_bytes") > 1e6);
        assert!(series("process_cpu_seconds_total") > 0.0);
        assert!(series("process_open_fds") >= 3.0);
        assert!(series("process_max_fds") >= series("process_open_fds"));
        assert!(series("process_threads") >= 1.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as f64;
        let started = series("process_start_time_seconds");
        assert!(started <= now && started > now - 3600.0, "{started}");
        let build = format!(
            "steadfast_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&text, &build), Some(1.0), "{text}");
        // Steadfast's own series keep their prefix.
        assert!(
            text.contains("# TYPE steadfast_queue_depth gauge"),
            "{text}"
        );
    }

    #[test]
    fn the_log_s_records_become_turn_step_and_tool_series() {
        let m = Metrics::new();
        let tool = |id: &str, class| Event::ToolCallIntent {
            call_id: id.into(),
            tool: "bash".into(),
            input: serde_json::json!({}),
            class,
            snapshot_before: None,
        };
        let outcome = |id: &str, is_error| Event::ToolCallOutcome {
            call_id: id.into(),
            is_error,
            exit_code: None,
            output: steadfast_log::Output::Inline {
                text: String::new(),
            },
            snapshot_after: None,
            stored_bytes: 0,
        };
        let records = vec![
            record(
                2,
                1_000,
                Event::UserMessage {
                    turn: 1,
                    text: "go".into(),
                    inbox_id: None,
                },
            ),
            record(
                3,
                1_010,
                Event::ModelCallIntent {
                    call_id: "m1".into(),
                    step: 1,
                    fingerprint: String::new(),
                },
            ),
            record(4, 1_100, tool("t1", ToolClass::Read)),
            record(5, 1_300, outcome("t1", false)),
            record(6, 1_310, tool("t2", ToolClass::Mutate)),
            record(7, 1_320, outcome("t2", true)),
            record(
                8,
                1_400,
                Event::ModelCallIntent {
                    call_id: "m2".into(),
                    step: 2,
                    fingerprint: String::new(),
                },
            ),
            record(
                9,
                1_500,
                Event::ToolCallInterrupted {
                    call_id: "elsewhere".into(),
                    resolution: ToolResolution::OutcomeUnknown,
                },
            ),
            record(
                10,
                2_000,
                Event::TurnEnded {
                    turn: 1,
                    reply: None,
                },
            ),
        ];
        m.appended("sqlite", "s1", &records, Duration::from_micros(700));
        let text = m.encode();
        assert_eq!(value(&text, "steadfast_turns_started_total"), Some(1.0));
        assert_eq!(
            value(&text, "steadfast_turns_ended_total{outcome=\"completed\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "steadfast_turn_duration_seconds_sum"),
            Some(1.0)
        );
        assert_eq!(
            value(&text, "steadfast_step_duration_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            value(&text, "steadfast_step_duration_seconds_sum"),
            Some(0.39 + 0.6)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_tool_calls_total{class=\"read\",result=\"ok\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_tool_calls_total{class=\"mutate\",result=\"error\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_tool_calls_total{class=\"external\",result=\"interrupted\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_tool_call_duration_seconds_sum{class=\"read\"}"
            ),
            Some(0.2)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_journal_append_duration_seconds_count{store=\"sqlite\"}"
            ),
            Some(1.0)
        );
        assert!(!text.contains("s1"), "session ids are never labels");
    }

    #[test]
    fn free_form_label_values_are_bounded() {
        let m = Metrics::new();
        for i in 0..(MAX_LABEL_VALUES + 10) {
            m.model_call(ModelCall {
                provider: "anthropic",
                model: &format!("model-{i}"),
                ok: true,
                usage: Some(&Usage {
                    input_tokens: 10,
                    output_tokens: 2,
                    ..Default::default()
                }),
                cost_micro_usd: 1_500,
                took: Duration::from_millis(3),
            });
        }
        let text = m.encode();
        let series = text
            .lines()
            .filter(|l| l.starts_with("steadfast_model_calls_total{"))
            .count();
        assert_eq!(series, MAX_LABEL_VALUES + 1);
        assert_eq!(
            value(&text, "steadfast_model_calls_total{provider=\"anthropic\",model=\"other\",outcome=\"ok\"}"),
            Some(10.0)
        );
        assert_eq!(
            value(&text, "steadfast_model_tokens_total{provider=\"anthropic\",model=\"model-0\",kind=\"input\"}"),
            Some(10.0)
        );
        assert_eq!(
            value(
                &text,
                "steadfast_model_cost_usd_total{provider=\"anthropic\",model=\"model-0\"}"
            ),
            Some(0.0015)
        );
    }
}
