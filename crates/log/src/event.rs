//! The events a session log is made of.

use serde::{Deserialize, Serialize};

use crate::message::Block;

/// What the model is told when a workspace mutation was cut off and rolled back.
/// Starts with a fixed marker so tools (and the fake provider) can recognise it.
pub const INTERRUPTED_ROLLED_BACK: &str = "[steadfast] interrupted, rolled back: the worker \
running this call died before its result was recorded. The workspace was restored to the \
snapshot taken just before the call, so the call had no effect. Run it again if it is \
still needed.";

/// What the model is told of a cut-off mutating call that ran beside others of its reply
/// (tool calls run in parallel) whose results were recorded after it began: the
/// workspace was put back to the last recorded result, which keeps those calls' work, so
/// what this call changed before then may still be there. Starts as
/// [`INTERRUPTED_ROLLED_BACK`] does, so whoever looks for a rolled-back call finds both.
pub const INTERRUPTED_ROLLED_BACK_BESIDE: &str =
    "[steadfast] interrupted, rolled back: the worker \
running this call died before its result was recorded. The workspace was restored to where the \
last recorded call left it: calls that ran beside this one finished first and their work is \
kept, so changes this call made while they ran may remain. Look before running it again.";

/// What the model is told of a call of its reply that had not begun when the turn was
/// interrupted (followed by who interrupted it).
pub const INTERRUPTED_NOT_BEGUN: &str =
    "[steadfast] not run: the turn was interrupted before this call began; interrupted";

/// What the model is told when an external-effect call was cut off.
pub const INTERRUPTED_OUTCOME_UNKNOWN: &str = "[steadfast] interrupted, outcome unknown: \
this call reaches outside the workspace and the worker running it died before its result \
was recorded. It was NOT run again. It may or may not have taken effect; check before \
retrying.";

/// What a human is told when they deny an approval.
pub const DENIED: &str =
    "[steadfast] denied: a human did not approve this call, so it was not run.";

/// Which model a session talks to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// `anthropic`, `openai` or `fake`.
    pub provider: String,
    /// The provider's model name.
    pub model: String,
}

impl std::fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

/// Tokens a model call consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Prompt tokens billed at the full input price.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    #[schema(required = true)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    #[schema(required = true)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Adds another call's usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// How a tool call may affect the world; decides what happens if it is interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Changes nothing: safe to run again.
    Read,
    /// Changes the workspace: rolled back to its snapshot if interrupted.
    Mutate,
    /// Reaches outside the workspace (network, push, webhook): never re-run blindly.
    External,
    /// Reaches outside the workspace, but running it again changes nothing more (an
    /// MCP tool marked `idempotentHint`): run again after a crash; still an external
    /// effect for the approval policy.
    Idempotent,
}

impl ToolClass {
    /// Whether a call of this class may change the workspace (so it is snapshotted
    /// before and after).
    pub fn touches_workspace(self) -> bool {
        matches!(self, ToolClass::Mutate | ToolClass::External)
    }

    /// Whether a call of this class has effects outside the workspace (what the
    /// approval policy asks a human about).
    pub fn is_external_effect(self) -> bool {
        matches!(self, ToolClass::External | ToolClass::Idempotent)
    }
}

/// A payload too big for the log, kept in the blob store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    /// BLAKE3 of the bytes, hex.
    pub hash: String,
    /// Length of the bytes.
    pub size: u64,
    /// Where the bytes live.
    pub uri: String,
    /// The start of the payload, ANSI codes stripped.
    pub head: String,
    /// The end of the payload, ANSI codes stripped.
    pub tail: String,
}

/// A tool's output: inline when small, a blob reference when over the limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Output {
    /// The whole output.
    Inline {
        /// The text.
        text: String,
    },
    /// A reference to the full output in the blob store.
    Blob(BlobRef),
}

impl Output {
    /// What the model is shown of this output.
    pub fn for_model(&self) -> String {
        match self {
            Output::Inline { text } => text.clone(),
            Output::Blob(b) => format!(
                "{}\n\n[... output truncated: {} bytes in total, stored as blob {} ...]\n\n{}",
                b.head, b.size, b.hash, b.tail
            ),
        }
    }
}

/// How an interrupted tool call was resolved (docs/ARCHITECTURE.md rule 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolResolution {
    /// A read-only call: it will run again.
    Rerun,
    /// A workspace mutation: the workspace was restored to this snapshot.
    RolledBack {
        /// The snapshot restored.
        snapshot: Option<String>,
    },
    /// An external effect: not re-run, the model told the outcome is unknown.
    OutcomeUnknown,
    /// An external effect whose outcome a reconciler probe decided: if it happened,
    /// the call is done and the model is shown the evidence; if not, it runs again.
    Reconciled {
        /// Whether the effect had taken place.
        done: bool,
        /// What the probe saw, for the model and the log's reader.
        evidence: String,
    },
}

/// The hard bounds of a session (docs/ARCHITECTURE.md rule 7). Each is checked as the log
/// grows; hitting one escalates the session until a `resume` signal raises it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Limits {
    /// Money for model calls, millionths of a dollar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_micro_usd: Option<u64>,
    /// Tokens of model calls (input, output and cache, added up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Turns (user messages that open work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Wall-clock time since the session began, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
}

impl Limits {
    /// Whether no bound is set.
    pub fn is_unbounded(&self) -> bool {
        *self == Limits::default()
    }

    /// The bounds a `resume` signal's payload sets (`max_cost_usd`, `max_tokens`,
    /// `max_turns`, `max_duration_s`), and a message for each of those keys whose
    /// value is not a non-negative number (that bound is then left unset). The fold
    /// applies the bounds; the API refuses a payload with any problem.
    pub fn from_resume(payload: &serde_json::Value) -> (Limits, Vec<String>) {
        let mut problems = Vec::new();
        let mut num = |name: &str| match payload.get(name) {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => match v.as_f64().filter(|v| v.is_finite() && *v >= 0.0) {
                Some(v) => Some(v),
                None => {
                    problems.push(format!("{name}: must be a non-negative number"));
                    None
                }
            },
        };
        let limits = Limits {
            max_cost_micro_usd: num("max_cost_usd").map(crate::money::micro_usd),
            max_tokens: num("max_tokens").map(|v| v as u64),
            max_turns: num("max_turns").map(|v| v.min(u32::MAX as f64) as u32),
            max_duration_ms: num("max_duration_s").map(|s| (s * 1000.0) as u64),
        };
        (limits, problems)
    }

    /// Each bound of these limits that passes the same bound of `ceilings`, as
    /// `(field as clients name it, asked, ceiling)` in client units.
    pub fn over(&self, ceilings: &Limits) -> Vec<(&'static str, f64, f64)> {
        let pairs = [
            (
                "max_cost_usd",
                self.max_cost_micro_usd.map(crate::money::usd),
                ceilings.max_cost_micro_usd.map(crate::money::usd),
            ),
            (
                "max_tokens",
                self.max_tokens.map(|v| v as f64),
                ceilings.max_tokens.map(|v| v as f64),
            ),
            (
                "max_turns",
                self.max_turns.map(f64::from),
                ceilings.max_turns.map(f64::from),
            ),
            (
                "max_duration_s",
                self.max_duration_ms.map(|v| v as f64 / 1000.0),
                ceilings.max_duration_ms.map(|v| v as f64 / 1000.0),
            ),
        ];
        pairs
            .into_iter()
            .filter_map(|(name, asked, ceiling)| match (asked, ceiling) {
                (Some(a), Some(c)) if a > c => Some((name, a, c)),
                _ => None,
            })
            .collect()
    }

    /// These limits with each unset bound taken from `ceilings`.
    pub fn or_ceilings(self, ceilings: &Limits) -> Limits {
        ceilings.raised(&self)
    }

    /// These limits with every bound `raise` sets taken from it.
    pub fn raised(self, raise: &Limits) -> Limits {
        Limits {
            max_cost_micro_usd: raise.max_cost_micro_usd.or(self.max_cost_micro_usd),
            max_tokens: raise.max_tokens.or(self.max_tokens),
            max_turns: raise.max_turns.or(self.max_turns),
            max_duration_ms: raise.max_duration_ms.or(self.max_duration_ms),
        }
    }
}

/// Which bound stopped a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Breaker {
    /// The money limit.
    Cost,
    /// The token limit.
    Tokens,
    /// The wall-clock limit.
    Duration,
    /// The turn limit.
    Turns,
    /// Too many model calls in one turn.
    Steps,
    /// The same tool call, same input, three times running with no workspace change.
    Loop,
}

impl std::fmt::Display for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Breaker::Cost => "cost",
            Breaker::Tokens => "tokens",
            Breaker::Duration => "duration",
            Breaker::Turns => "turns",
            Breaker::Steps => "steps",
            Breaker::Loop => "loop",
        })
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// What the signal that brings an explorer's answer to its parent begins with; the
/// whole name is [`explored_signal`]. Its payload is `{"index", "session", "answer"}`.
pub const EXPLORED_SIGNAL: &str = "explored";

/// The signal that brings explorers' answers to the `explore` call `call_id`: one name
/// per call, so no answer can reach another call's wait.
pub fn explored_signal(call_id: &str) -> String {
    format!("{EXPLORED_SIGNAL}.{call_id}")
}

/// A session forked to explore one task of its parent's `explore` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explorer {
    /// The parent session.
    pub parent: String,
    /// The parent's `explore` call (pending at the fork point, in both).
    pub call_id: String,
    /// Which of the call's tasks (from 0).
    pub index: u32,
    /// How many tasks the call had.
    pub of: u32,
    /// The task.
    pub task: String,
    /// The turn the call was made in: the explorer's answer is its answer at that
    /// turn's end.
    pub turn: u32,
    /// The money and tokens spent before the fork (the explorer's answer reports what
    /// it spent after).
    #[serde(default)]
    pub spent_before: (u64, u64),
}

/// What the signal that answers a client tool's call begins with; the whole name is
/// [`tool_result_signal`]. Its payload is `{"call_id", "content", "is_error"}`; the
/// content is the tool's result.
pub const TOOL_RESULT_SIGNAL: &str = "tool_result";

/// The signal that answers client tool call `call_id`: one name per call, so a result
/// sent twice, or late, can answer no other call (no later wait has its name).
pub fn tool_result_signal(call_id: &str) -> String {
    format!("{TOOL_RESULT_SIGNAL}.{call_id}")
}

/// A tool that a session's client runs: the model calls it like any other, and the
/// session waits, durably, until the client posts the result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClientTool {
    /// Its name, as the model calls it.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of its input (an object schema).
    #[schema(value_type = Object)]
    pub input_schema: serde_json::Value,
}

/// A credential the egress proxy adds, as a header, to a session's plain-HTTP requests
/// to one destination of its allow-list: the sandbox sends the request without it and
/// never sees the value, which the harness opens from the owner's vault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressCredential {
    /// The destination, `host:port` or `host` (any port), as in the allow-list.
    pub host: String,
    /// The vault credential's name.
    pub credential: String,
    /// The header (default `Authorization`).
    #[serde(default = "default_header")]
    pub header: String,
    /// What goes before the value (default `Bearer `).
    #[serde(default = "default_prefix")]
    pub prefix: String,
}

/// Where a session's workspace was cloned from, and the credential the harness pushes
/// with: the model asks for a push with the `git_push` tool, the harness does it outside
/// any sandbox, and the sandbox never holds the credential (nor a route to the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitSource {
    /// The repository, `https://` (or `http://` where the server allows it), with no
    /// user or password in it.
    #[schema(example = "https://github.com/acme/widgets.git")]
    pub url: String,
    /// The branch or tag checked out, or a full commit id (checked out detached);
    /// default: the remote's default branch.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The name of the vault credential (a token or password) for clone and push;
    /// none for a public repository (which then cannot be pushed to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// The user name sent with the credential (HTTP basic auth). GitHub takes
    /// `x-access-token` (the default) with a token; GitLab any name; Bitbucket
    /// `x-token-auth`.
    #[serde(default = "default_git_user")]
    #[schema(example = "x-access-token")]
    pub username: String,
}

fn default_git_user() -> String {
    "x-access-token".into()
}

/// One of the user's MCP servers a session uses: its tools are offered to the agent as
/// `<name>__<tool>`, each call journaled like every other and classed by the tool's
/// MCP annotations (`readOnlyHint` read, `idempotentHint` idempotent, otherwise
/// external) unless `classes` says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The name its tools are namespaced by (letters, digits, `-`; at most 24).
    #[schema(example = "tracker")]
    pub name: String,
    /// Its streamable-HTTP endpoint.
    #[schema(example = "https://mcp.example.com/mcp")]
    pub url: String,
    /// A vault credential the harness sends with every request (never to the sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// The header the credential goes in (default `Authorization`).
    #[serde(default = "default_header")]
    pub header: String,
    /// What goes before the credential (default `Bearer `).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Classes by tool name (the server's own name for it), overriding what its
    /// annotations say.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub classes: std::collections::BTreeMap<String, ToolClass>,
}

fn default_header() -> String {
    "Authorization".into()
}

fn default_prefix() -> String {
    "Bearer ".into()
}

/// The inbox signal that asks the native agent to compact its conversation before its
/// next model call, whatever its size. Always queued: it answers no wait.
pub const COMPACT_SIGNAL: &str = "compact";

/// The signal that answers a wait for a person's approval (of an external effect
/// under the approval policy, or of the native agent's `request_approval`): its
/// payload's `approved: false` refuses, with an optional `message` for the agent.
pub const APPROVAL_SIGNAL: &str = "approval";

/// The kind of [`Event::Pruned`] records.
pub const PRUNED_KIND: &str = "pruned";

/// The kind of [`Event::ModelDelta`] records (what retention prunes).
pub const MODEL_DELTA_KIND: &str = "model_delta";

/// The kind of [`Event::Checkpoint`] records (what a world looks the latest one up by).
pub const CHECKPOINT_KIND: &str = "checkpoint";

/// The signal that resumes an escalated session. Its payload may raise limits:
/// `{"max_cost_usd": 2.5, "max_tokens": 10000, "max_turns": 20, "max_duration_s": 3600}`.
pub const RESUME_SIGNAL: &str = "resume";

/// The inbox signal that stops the running turn (`{"by": "<who>"}`); see
/// [`Event::TurnInterrupted`]. Reserved: it is sent by the interrupt route and
/// `steadfast stop`, not as a signal a wait can take.
pub const INTERRUPT_SIGNAL: &str = "interrupt";

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndState {
    /// The work is done.
    Completed,
    /// A terminal error stopped it.
    Failed,
    /// A bound (budget, loop breaker) stopped it for a human to look at.
    Escalated,
    /// A person ended it (`close`), whether or not its work was done.
    Closed,
}

impl std::fmt::Display for EndState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EndState::Completed => "completed",
            EndState::Failed => "failed",
            EndState::Escalated => "escalated",
            EndState::Closed => "closed",
        })
    }
}

/// The fixed path at which a logical workspace appears inside an isolating sandbox,
/// on every host (so what its commands print or its symlinks name stays true
/// wherever the session goes next).
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// Whether a recorded workspace is a logical id (`ws_` and letters, digits or
/// underscores, nothing a path could be): such a workspace belongs to no host.
pub fn is_workspace_id(workspace: &str) -> bool {
    workspace.len() > 3
        && workspace.len() <= 64
        && workspace.starts_with("ws_")
        && workspace[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// One entry of a session log.
// `SessionStarted`, a session's first record and the only large one, is allowed its
// size: boxing its fields would cost every reader of it, for a few hundred bytes per
// event held.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The session exists: its agent, model and workspace.
    SessionStarted {
        /// The agent's name.
        agent: crate::Agent,
        /// The wrapped agent's CLI the session runs, as `package@version`: a session
        /// is only taken up by a host that has this version (another would re-pay the
        /// turn and diverge from its record). None for the native agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_cli: Option<String>,
        /// The model spoken to.
        model: ModelSpec,
        /// The workspace: a logical id (`ws_...`, see [`is_workspace_id`]) that each
        /// host materializes under its own workspace root, or a directory a user
        /// named, which lives on one host.
        workspace: String,
        /// The host a workspace given as a directory lives on (never set for a
        /// logical one, which any host can drive).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        /// The system prompt.
        system: String,
        /// Instructions a wrapped CLI is given on top of its own system prompt (a
        /// named agent's `instructions`): part of what its requests carry, so a
        /// session keeps the ones it started with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
        /// The workspace snapshot when the session began.
        initial_snapshot: Option<String>,
        /// Wall-clock start, milliseconds since the Unix epoch.
        created_at_ms: u64,
        /// The money bound of a log written before sessions had `limits` (millionths
        /// of a dollar), read as `limits.max_cost_micro_usd` when that is unset; new
        /// sessions write `None` and keep their bound in `limits` only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_micro_usd: Option<u64>,
        /// Pause for a human's approval before every external-effect tool call.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        approve_external: bool,
        /// The approval policy's layers: the operator's, the named agent's, the
        /// session's own; the strictest verdict of all stands (see [`crate::approval`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        approval: Vec<crate::ApprovalPolicy>,
        /// Bounds beyond the spend limit (tokens, turns, wall clock).
        #[serde(default, skip_serializing_if = "Limits::is_unbounded")]
        limits: Limits,
        /// The sandbox's network policy for this session, when it differs from the
        /// harness's default (stored as its text: `deny-all`, `open`,
        /// `allow:host,...`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<crate::NetworkPolicy>,
        /// Tools the session's client runs (not the harness): calling one waits for
        /// the client's result (`tool_result` signal).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        client_tools: Vec<ClientTool>,
        /// Credentials the egress proxy adds to the sandbox's requests to a host (by
        /// vault name; the values never enter the log or the sandbox).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        egress_credentials: Vec<EgressCredential>,
        /// The repository the workspace was cloned from, which `git_push` pushes to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        git: Option<Box<GitSource>>,
        /// The user's MCP servers whose tools the agent is offered.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        mcp_servers: Vec<McpServer>,
        /// How many explorers one call of the native agent's `explore` tool may fork
        /// (0: the tool is not offered).
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        explorers: u32,
    },
    /// A user message, which opens a turn.
    UserMessage {
        /// The turn it opens (1-based).
        turn: u32,
        /// The text.
        text: String,
        /// The inbox entry it came from, if it was queued.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inbox_id: Option<u64>,
    },
    /// A user message delivered to the running turn at its next step.
    Steered {
        /// The text.
        text: String,
        /// The inbox entry it came from.
        inbox_id: u64,
    },
    /// A piece of a model reply, journaled as it streams so readers of the log can
    /// follow a reply in progress. The outcome holds the whole reply; the fold ignores
    /// deltas.
    ModelDelta {
        /// The call streaming.
        call_id: String,
        /// The text that arrived.
        text: String,
        /// The connection dropped and the reply starts over: discard this call's
        /// earlier deltas.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        restart: bool,
    },
    /// The session pauses until a named signal arrives (it holds no worker meanwhile).
    WaitStarted {
        /// The signal awaited (e.g. `approval`).
        name: String,
        /// Why, for the human.
        reason: String,
        /// The tool call that asked to wait (its result will be the signal).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// The tool call held until approved (approval policy for external effects).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before_call: Option<String>,
    },
    /// The awaited signal arrived.
    SignalReceived {
        /// The signal.
        name: String,
        /// Its payload.
        payload: serde_json::Value,
        /// The inbox entry it came from.
        inbox_id: u64,
    },
    /// A model call is about to be made.
    ModelCallIntent {
        /// Unique per attempt.
        call_id: String,
        /// The step within the turn (1-based); a re-issued call keeps its step.
        step: u32,
        /// BLAKE3 of the provider-neutral request.
        fingerprint: String,
    },
    /// A model call returned.
    ModelCallOutcome {
        /// The intent answered.
        call_id: String,
        /// The assistant message.
        content: Vec<Block>,
        /// Why the model stopped (`end_turn`, `tool_use`, ...).
        stop_reason: String,
        /// Tokens consumed.
        usage: Usage,
        /// Cost in millionths of a US dollar.
        cost_micro_usd: u64,
    },
    /// Old tool outputs were elided from the conversation the model is sent (they stay
    /// in the log): the first step of compacting a conversation near the model's
    /// context window.
    OutputsElided {
        /// Tool results in messages before this position are elided.
        before: u32,
        /// The request's estimated size before and after, tokens.
        tokens_before: u64,
        /// See `tokens_before`.
        tokens_after: u64,
    },
    /// A model call that summarises the conversation's older messages is being made
    /// (compaction); a crash before its outcome asks it again.
    CompactionIntent {
        /// Names the call, as a model call's id does.
        call_id: String,
        /// The messages before this position are the ones summarised.
        upto: u32,
        /// The request's estimated size before, tokens.
        tokens_before: u64,
        /// The `compact` signal that asked for it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inbox_id: Option<u64>,
    },
    /// The compaction's outcome: the summarised messages are replaced, in what the model
    /// is sent, by the summary (the log keeps them all).
    Compacted {
        /// The intent answered.
        call_id: String,
        /// The summary.
        summary: String,
        /// The request's estimated size after, tokens.
        tokens_after: u64,
        /// What the summarising call used.
        usage: Usage,
        /// What it cost, millionths of a dollar.
        cost_micro_usd: u64,
    },
    /// The session's folded state up to (not including) this record was stored in
    /// the blob store, so waking reads it and only the records after it
    /// ([`crate::fold::Checkpoint`]). Changes nothing in the state.
    Checkpoint {
        /// The stored state.
        blob: BlobRef,
        /// Its format ([`crate::fold::CHECKPOINT_VERSION`] when it was written).
        version: u32,
    },
    /// What a record held was removed by retention once it was redundant (a
    /// streamed piece of a reply, after the turn that made it ended and the reply's
    /// outcome holds the whole). The record keeps its position, and its checksum
    /// covers this body, so the log stays whole and verifiable. Changes nothing in the
    /// state.
    Pruned {
        /// The kind of record it was (e.g. `model_delta`).
        was: String,
        /// The length of its body then, in bytes.
        bytes: u64,
    },
    /// A model call was cut off by a crash and will be issued again.
    ModelCallInterrupted {
        /// The intent resolved.
        call_id: String,
    },
    /// A model call failed for good (a 4xx, retries exhausted).
    ModelCallFailed {
        /// The intent answered.
        call_id: String,
        /// What went wrong.
        error: String,
    },
    /// A tool call is about to run.
    ToolCallIntent {
        /// The model's tool-use id.
        call_id: String,
        /// The tool's name.
        tool: String,
        /// The tool's input.
        input: serde_json::Value,
        /// How the call may affect the world.
        class: ToolClass,
        /// The workspace snapshot just before the call.
        snapshot_before: Option<String>,
    },
    /// A tool call finished (successfully or with a tool error).
    ToolCallOutcome {
        /// The intent answered.
        call_id: String,
        /// Whether the tool reported an error.
        is_error: bool,
        /// A command's exit status, when there is one.
        exit_code: Option<i32>,
        /// What the tool produced.
        output: Output,
        /// The workspace snapshot just after the call.
        snapshot_after: Option<String>,
        /// Bytes of new objects the call's snapshots stored (what its effect on the
        /// workspace costs the drive): with its output's, what the session's history
        /// keeps for it, counted against the history quota.
        #[serde(default, skip_serializing_if = "is_zero")]
        stored_bytes: u64,
    },
    /// A tool call was cut off by a crash; this records how it was resolved.
    ToolCallInterrupted {
        /// The intent resolved.
        call_id: String,
        /// The resolution.
        resolution: ToolResolution,
    },
    /// The model finished the turn.
    TurnEnded {
        /// The turn ended.
        turn: u32,
        /// A wrapped agent's final answer (the native loop's is in its last reply).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply: Option<String>,
    },
    /// Someone stopped the running turn ([`INTERRUPT_SIGNAL`]): a model stream cut
    /// (its partial reply discarded, not asked for again) or a command killed (its
    /// outcome recorded just before, with the snapshot after it), or a wait for a
    /// human abandoned. The session is idle; the model is told on the next turn. One
    /// that arrives after the turn is over stops nothing and is recorded as such.
    TurnInterrupted {
        /// The turn.
        turn: u32,
        /// Who asked (an API owner, or `cli:<user>`).
        by: String,
        /// The inbox entry the interrupt came in.
        inbox_id: u64,
        /// The model or tool call that was cut off, if one was running.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// Whether it stopped anything (false: the turn had already ended).
        stopped: bool,
        /// The native loop's calls of the running reply that had not begun: each is
        /// answered as not run, so the conversation holds a result for every call the
        /// model asked for, and none of them runs later.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        not_begun: Vec<String>,
    },
    /// A bound was hit: the session stops, escalated to a human, until a
    /// [`RESUME_SIGNAL`] arrives (raising the bound, or acknowledging a loop).
    Escalated {
        /// The bound hit.
        breaker: Breaker,
        /// Why, in words.
        reason: String,
        /// The workspace diff since the session began.
        #[serde(default)]
        diff: Vec<String>,
    },
    /// A worker could not drive the session (a provider down, a store unreachable, a
    /// model that cannot be called). A failure retrying may fix says when the next
    /// attempt may begin, and no worker takes the session before then; one it cannot
    /// fix has no next attempt and is followed by `session_ended` (failed).
    DriveFailed {
        /// What went wrong, in words.
        reason: String,
        /// Failures in a row, this one included (a recorded model or tool outcome
        /// starts the count again).
        attempt: u32,
        /// When a worker may try again, ms since the Unix epoch; `None` for a failure
        /// retrying cannot fix.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at_ms: Option<u64>,
    },
    /// A connection out of the sandbox, seen at the egress proxy while tool calls ran:
    /// recorded before the proxy lets its first byte through (or instead, when the
    /// session's approval policy held it back). A call that opened one had an external
    /// effect whatever its command text says: cut off, its outcome is unknown and it is
    /// never run again, and the same call is classed external from then on.
    Egress {
        /// The calls running when it was opened (calls of one reply may run at once and
        /// share the sandbox: each may have opened it).
        call_ids: Vec<String>,
        /// Where to: `host:port`.
        destination: String,
        /// Whether the proxy let it through; `false`: held back by the approval policy,
        /// nothing was sent.
        admitted: bool,
        /// Held back because the approval policy denies it outright (no one is asked);
        /// otherwise a held-back connection waits for a person when made again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        denied: bool,
    },
    /// The sandbox died (killed, out of memory, evicted). If a call was running in it,
    /// the call is resolved next by invariant 4 and a new sandbox is provisioned.
    SandboxLost {
        /// The tool call that was running, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// What was seen.
        reason: String,
    },
    /// The session's sandbox was started again (after an idle stop, a move to another
    /// host, or a sandbox that died) and the services the log says were running were
    /// started again in it; the model is told with the result of the call that needed
    /// the sandbox.
    ServicesRestarted {
        /// The tool call whose sandbox it was, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// Each service and how its start went: `started`, or why not.
        services: Vec<(String, String)>,
    },
    /// A wrapped agent's model request reached the gateway and is about to go to the
    /// provider (a request at an index that was cut off before, asked again, replaces
    /// it).
    ExchangeIntent {
        /// Unique per attempt.
        call_id: String,
        /// Its position among the session's exchanges (from 0).
        index: u32,
        /// Which API.
        api: crate::Api,
        /// BLAKE3 of the normalized request (see the gateway's normalization).
        fingerprint: String,
        /// Whether the reply streams.
        stream: bool,
        /// The workspace snapshot when the request arrived: where a divergence here
        /// restores the workspace to.
        snapshot: Option<String>,
        /// The normalized request itself, by content (what a replay's divergence
        /// report shows): absent in logs written before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<RequestParts>,
    },
    /// The provider's whole reply to an exchange, byte for byte as the client got it
    /// (every streamed event).
    ExchangeOutcome {
        /// The intent answered.
        call_id: String,
        /// The HTTP status.
        status: u16,
        /// The reply's content type.
        content_type: String,
        /// The reply's body.
        body: String,
        /// Tokens the reply reports having consumed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        /// What it cost, millionths of a dollar.
        #[serde(default, skip_serializing_if = "is_zero")]
        cost_micro_usd: u64,
    },
    /// A restarted wrapped agent sent a request that differs from the record at
    /// `index`: the exchanges and tool calls recorded from there on are superseded and
    /// the workspace is back at `snapshot`.
    ReplayDiverged {
        /// The first superseded exchange.
        index: u32,
        /// The snapshot the workspace was restored to.
        snapshot: Option<String>,
    },
    /// A wrapped CLI's conversation as it stood when its run for `turn` stopped (the
    /// turn ended, was interrupted, or waits for a person), kept in the blob store: the
    /// next turn's CLI continues it, on any host, with every message, tool call and
    /// result of the turns before (see the gateway's `history`).
    ConversationKept {
        /// The turn whose run kept it.
        turn: u32,
        /// The blob holding it (JSON: the CLI, the API, the request's items).
        conversation: String,
    },
    /// The user moved a session bound to a directory to another directory, on this
    /// host or another (`steadfast resume --move-here DIR`): the new directory was
    /// brought to the session's last snapshot first, and only this host drives it from
    /// here on. Never recorded for a logical workspace, which is on every host.
    WorkspaceMoved {
        /// The directory the session works in from here on.
        workspace: String,
        /// The host it is on.
        host: String,
        /// The directory it worked in before.
        from_workspace: String,
        /// The host that was on (`None` in logs recorded before hosts were).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_host: Option<String>,
        /// The snapshot the new directory was brought to.
        snapshot: Option<String>,
    },
    /// Between turns, the session's directory was found changed from outside it (a
    /// person, an editor, a build): its snapshot as found and what changed. The session
    /// goes on from it, and the model is told with the next user message; nothing a
    /// person did while the session was down is discarded. Recorded only for a
    /// directory a user named, never a logical workspace (each host's copy of one is
    /// Steadfast's own).
    WorkspaceEdited {
        /// The workspace as found.
        snapshot: String,
        /// What changed since the session's last snapshot, a line per path.
        changes: Vec<String>,
    },
    /// A person's shell in the session's sandbox ended, or had run a while: the
    /// workspace was snapshotted (between turns, so nothing of the agent's is in it)
    /// and what the person changed is recorded, by whom and since when. The session
    /// goes on from those files, and the model is told with the next user message
    /// (invariant 5 holds for people too: nothing reaches the workspace unrecorded).
    HumanShell {
        /// Who attached (the token's owner, or its name).
        by: String,
        /// When the shell was opened, Unix ms.
        since_ms: u64,
        /// Whether the person has left (the last record of this shell); `false` for a
        /// record taken while still attached.
        detached: bool,
        /// The workspace as the person left it.
        snapshot: String,
        /// What changed since the record before, a line per path.
        changes: Vec<String>,
        /// The host the shell ran on (its workspace copy is that host's).
        #[serde(default)]
        host: String,
    },
    /// Its owner moved a wrapped session to another CLI version or named agent,
    /// between turns: from its next turn on, that CLI runs it (`steadfast replay
    /// --agent` shows first what the change would do to its recorded turns).
    AgentChanged {
        /// The agent from here on.
        agent: crate::Agent,
        /// The CLI it stands for, `package@version`.
        cli: String,
        /// The instructions its CLI is given from here on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
    },
    /// The session began as a fork: its records before this one are `parent`'s up to
    /// `at`, shared and not copied, and from here on it is a session of its own, in a
    /// logical workspace of its own that starts at the snapshot recorded at `at`. A
    /// fork of an ended session is open again (idle); a fork inside a turn carries
    /// on from there as a woken session would.
    Forked {
        /// The session forked.
        parent: String,
        /// The parent's last position this session shares.
        at: u64,
        /// This session's own logical workspace.
        workspace: String,
        /// The model this session speaks to from here on, when not the parent's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<ModelSpec>,
        /// The session's bounds from here on, when not the parent's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limits: Option<Limits>,
        /// The agent this session runs from here on, and the CLI it stands for
        /// (`package@version`), when not the parent's: a replay against another CLI.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<(crate::Agent, String)>,
        /// The instructions the wrapped CLI is given from here on, when not the
        /// parent's (`""`: none): a replay against another prompt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
        /// Forked by the parent's `explore` call to work on one of its tasks: the
        /// call answers here with the task, and this session's answer goes back to
        /// the parent as its share of the call's result.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        explorer: Option<Explorer>,
    },
    /// The session was rewound: its log goes on from position `to`, whose state is
    /// its state again; the records after `to` and before this one are set aside (kept
    /// where they are, and readable whole as `branch`, a fork taken at the last of
    /// them). The external effects they record stay facts: `facts` names them, and
    /// the model is told with the next user message.
    Rewound {
        /// The last position the session keeps.
        to: u64,
        /// The fork that holds the records set aside, if one was made.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
        /// The external effects recorded after `to`, in words.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        facts: Vec<String>,
    },
    /// The session is over.
    SessionEnded {
        /// How it ended.
        state: EndState,
        /// Why, in words.
        reason: String,
        /// The workspace diff since the session began, for escalations.
        #[serde(default)]
        diff: Vec<String>,
    },
}

/// A model request kept by content, so the log grows by what is new in each request
/// rather than by the whole conversation each time: the request without its messages
/// (`frame`) and its messages, each a blob named by its BLAKE3 hash, shared by every
/// request and session that has the same one. A request's messages are mostly an
/// earlier request's plus a few: `base` names that request, `kept` how many of its
/// messages come first, and `added` the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestParts {
    /// The blob of the request without its messages (model, system prompt, tools,
    /// parameters).
    pub frame: String,
    /// The exchange (its call id) whose messages this request's begin with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// How many of `base`'s messages come first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept: u64,
    /// The blobs of the messages after those, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
}

impl RequestParts {
    /// The blobs this record names itself (a base's are named by its own record).
    pub fn blobs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.frame.as_str()).chain(self.added.iter().map(String::as_str))
    }
}

impl Event {
    /// Every blob this record needs kept (its payload's, a model request's parts):
    /// what a blob sweep must leave.
    pub fn blob_hashes(&self) -> Vec<&str> {
        if let Event::ExchangeIntent {
            request: Some(parts),
            ..
        } = self
        {
            return parts.blobs().collect();
        }
        if let Event::ConversationKept { conversation, .. } = self {
            return vec![conversation.as_str()];
        }
        self.blob_ref()
            .map(|b| b.hash.as_str())
            .into_iter()
            .collect()
    }

    /// The blob this event's payload lives in, if it was too big for the log.
    pub fn blob_ref(&self) -> Option<&BlobRef> {
        match self {
            Event::ToolCallOutcome {
                output: Output::Blob(b),
                ..
            } => Some(b),
            Event::Checkpoint { blob, .. } => Some(blob),
            _ => None,
        }
    }

    /// Bytes this record keeps in storage beyond the log: what a call's snapshots
    /// stored and its output offloaded to a blob. Summed, a session's history (see
    /// the history quota).
    pub fn kept_bytes(&self) -> u64 {
        match self {
            Event::ToolCallOutcome {
                output,
                stored_bytes,
                ..
            } => {
                let output = match output {
                    Output::Blob(b) => b.size,
                    Output::Inline { .. } => 0,
                };
                stored_bytes.saturating_add(output)
            }
            _ => 0,
        }
    }

    /// The workspace snapshots this record names (a session's first, a call's before
    /// and after, a rollback's target): what must stay stored for the log to be
    /// restorable, and what an integrity check reads.
    pub fn snapshots(&self) -> Vec<&str> {
        let ids = match self {
            Event::SessionStarted {
                initial_snapshot, ..
            } => vec![initial_snapshot.as_deref()],
            Event::ToolCallIntent {
                snapshot_before, ..
            } => vec![snapshot_before.as_deref()],
            Event::ToolCallOutcome { snapshot_after, .. } => vec![snapshot_after.as_deref()],
            Event::WorkspaceEdited { snapshot, .. } | Event::HumanShell { snapshot, .. } => {
                vec![Some(snapshot.as_str())]
            }
            Event::ToolCallInterrupted {
                resolution: ToolResolution::RolledBack { snapshot },
                ..
            } => vec![snapshot.as_deref()],
            _ => vec![],
        };
        ids.into_iter().flatten().collect()
    }

    /// A session's first record with nothing but its agent, model and workspace set
    /// (no system prompt, snapshot, clock or bounds): for tests, benchmarks and tools
    /// that write logs by hand.
    pub fn bare_start(agent: &str, model: ModelSpec, workspace: &str) -> Event {
        Event::SessionStarted {
            agent: agent.into(),
            agent_cli: None,
            model,
            workspace: workspace.into(),
            host: None,
            system: String::new(),
            instructions: None,
            initial_snapshot: None,
            created_at_ms: 0,
            budget_micro_usd: None,
            approve_external: false,
            approval: Vec::new(),
            limits: Limits::default(),
            network: None,
            client_tools: Vec::new(),
            egress_credentials: Vec::new(),
            git: None,
            mcp_servers: Vec::new(),
            explorers: 0,
        }
    }

    /// A short name for the event type, as stored and shown.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionStarted { .. } => "session_started",
            Event::UserMessage { .. } => "user_message",
            Event::Steered { .. } => "steered",
            Event::ModelDelta { .. } => MODEL_DELTA_KIND,
            Event::WaitStarted { .. } => "wait_started",
            Event::SignalReceived { .. } => "signal_received",
            Event::ModelCallIntent { .. } => "model_call_intent",
            Event::ModelCallOutcome { .. } => "model_call_outcome",
            Event::ModelCallInterrupted { .. } => "model_call_interrupted",
            Event::OutputsElided { .. } => "outputs_elided",
            Event::Checkpoint { .. } => CHECKPOINT_KIND,
            Event::Pruned { .. } => PRUNED_KIND,
            Event::CompactionIntent { .. } => "compaction_intent",
            Event::Compacted { .. } => "compacted",
            Event::ModelCallFailed { .. } => "model_call_failed",
            Event::ToolCallIntent { .. } => "tool_call_intent",
            Event::ToolCallOutcome { .. } => "tool_call_outcome",
            Event::ToolCallInterrupted { .. } => "tool_call_interrupted",
            Event::TurnEnded { .. } => "turn_ended",
            Event::TurnInterrupted { .. } => "turn_interrupted",
            Event::Escalated { .. } => "escalated",
            Event::Egress { .. } => "egress",
            Event::SandboxLost { .. } => "sandbox_lost",
            Event::ServicesRestarted { .. } => "services_restarted",
            Event::DriveFailed { .. } => "drive_failed",
            Event::ExchangeIntent { .. } => "exchange_intent",
            Event::ExchangeOutcome { .. } => "exchange_outcome",
            Event::ReplayDiverged { .. } => "replay_diverged",
            Event::ConversationKept { .. } => "conversation_kept",
            Event::WorkspaceMoved { .. } => "workspace_moved",
            Event::WorkspaceEdited { .. } => "workspace_edited",
            Event::HumanShell { .. } => "human_shell",
            Event::AgentChanged { .. } => "agent_changed",
            Event::Forked { .. } => "forked",
            Event::Rewound { .. } => "rewound",
            Event::SessionEnded { .. } => "session_ended",
        }
    }
}
