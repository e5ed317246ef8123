//! `fold(records) -> SessionState`: the whole state a harness needs, from the log alone.
//!
//! Folding is pure: no I/O, no clock, no randomness. The state says what happened
//! (conversation, spend, last workspace snapshot) and what comes next ([`SessionState::next`]),
//! including calls whose intent is in the log without an outcome, which the harness must
//! resolve by docs/ARCHITECTURE.md rule 4 before doing anything else.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{
    Breaker, EndState, Event, Limits, ModelSpec, ToolClass, Usage, INTERRUPTED_OUTCOME_UNKNOWN,
};
use crate::message::{Block, Message, Role, ToolUse};
use crate::record::Record;

mod lifecycle;
mod model;
mod signals;
mod tools;
mod turns;
mod workspace;
mod wrapped;

pub use crate::status::Status;

/// What folding one record into the state makes of it: `Err` says why the record
/// cannot follow the ones before it.
type Folded = Result<(), &'static str>;

/// Where a session is in its life, with what only that part of its life has: the
/// session's status is read from it ([`SessionState::status`]), so no other field can
/// say otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Between turns, waiting for a user message.
    Idle {
        /// Who interrupted the last turn, if it was interrupted.
        interrupted_by: Option<String>,
    },
    /// A turn is open.
    Running {
        /// While a compaction call is pending: the position it summarises up to.
        compacting: Option<u32>,
    },
    /// Paused until a named signal arrives.
    Waiting(Wait),
    /// Stopped by a bound: waits for a person's `resume` signal.
    Escalated {
        /// The bound.
        breaker: Breaker,
        /// The wait for `resume`.
        wait: Wait,
    },
    /// Over for good.
    Ended {
        /// How it ended.
        state: EndState,
        /// Why.
        reason: String,
    },
}

impl Phase {
    /// The status this phase is.
    pub fn status(&self) -> Status {
        match self {
            Phase::Idle { .. } => Status::Idle,
            Phase::Running { .. } => Status::Running,
            Phase::Waiting(_) => Status::Waiting,
            Phase::Escalated { .. } => Status::Escalated,
            Phase::Ended { state, .. } => Status::ended(*state),
        }
    }
}

/// A model call whose intent is logged without an outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingModel {
    /// The attempt's id.
    pub call_id: String,
    /// Its step in the turn.
    pub step: u32,
}

/// A tool call whose intent is logged without an outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingTool {
    /// The model's tool-use id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its input.
    pub input: Value,
    /// How it may affect the world.
    pub class: ToolClass,
    /// The snapshot taken before it ran.
    pub snapshot_before: Option<String>,
    /// Where it connected out of the sandbox so far (see [`Event::Egress`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
}

/// A connection the approval policy held back for a person, and the call that tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldConnection {
    /// The call's tool.
    pub tool: String,
    /// The call's input.
    pub input: Value,
    /// Where it tried to connect (`host:port`).
    pub destination: String,
}

impl PendingTool {
    /// How it may have affected the world: as classed when it began, or external once
    /// it was seen sending out of the sandbox.
    pub fn effective_class(&self) -> ToolClass {
        effective_class(self.class, &self.egress)
    }
}

/// A call's class, made more careful by what it was seen doing: one that connected out
/// of the sandbox is external, whatever its command text let the classifier guess.
fn effective_class(class: ToolClass, egress: &[String]) -> ToolClass {
    if egress.is_empty() {
        class
    } else {
        ToolClass::External
    }
}

/// A pause until a named signal arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    /// The log position where the wait began: an answer may name it, so that it
    /// answers this wait and no later one.
    pub seq: u64,
    /// The signal awaited.
    pub name: String,
    /// Why.
    pub reason: String,
    /// The tool call whose result the signal will be.
    pub call_id: Option<String>,
    /// The tool call held until approved.
    pub before_call: Option<String>,
}

/// A retry a worker scheduled after a failure retrying may fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    /// Failures in a row.
    pub attempt: u32,
    /// The last failure, in words.
    pub reason: String,
    /// When a worker may try again, ms since the Unix epoch.
    pub at_ms: u64,
}

/// One model request of a wrapped agent, as recorded by the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// The attempt's id.
    pub call_id: String,
    /// Which API.
    pub api: crate::Api,
    /// The normalized request's hash.
    pub fingerprint: String,
    /// Whether the reply streams.
    pub stream: bool,
    /// The workspace snapshot when the request arrived.
    pub snapshot: Option<String>,
    /// The reply, once recorded: status, content type, body.
    pub reply: Option<(u16, String, String)>,
}

/// A tool call of a wrapped agent (through the MCP server), as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WrappedTool {
    /// The call's id (the harness's; MCP calls carry none of the model's).
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its input.
    pub input: Value,
    /// How it may affect the world.
    pub class: ToolClass,
    /// The snapshot taken before it ran.
    pub snapshot_before: Option<String>,
    /// How many exchanges were recorded when it was called (a divergence at an
    /// earlier exchange supersedes it).
    pub after_exchanges: u32,
    /// Its result, once recorded (or resolved after a crash): text and error flag.
    pub result: Option<(String, bool)>,
    /// The workspace snapshot after it (recorded, or the one a crash resolution left
    /// the workspace at): where a replay that answers it from the record puts the
    /// workspace, so the restarted agent sees what it saw the first time.
    pub snapshot_after: Option<String>,
    /// Whether it ran to a recorded outcome (not resolved after a crash).
    pub done: bool,
    /// When its result was recorded among the session's wrapped calls (1 for the first
    /// result, 2 for the next, ...; 0 while it has none, and in states folded before
    /// this was kept). Calls of one reply may run in parallel and finish in any order:
    /// a replay moves the workspace on in this order, never back.
    #[serde(default)]
    pub result_order: u32,
    /// Where it connected out of the sandbox (see [`Event::Egress`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
}

impl WrappedTool {
    /// Whether this call is an external effect that may have happened: completed, or
    /// cut off with its outcome unknown. Either is a fact about the world that no
    /// replay, diverged or not, may bring about again; the same call is answered from
    /// this record instead (for an unknown one: that its outcome is unknown).
    pub fn is_external_fact(&self) -> bool {
        let unknown = self
            .result
            .as_ref()
            .is_some_and(|(text, _)| text == INTERRUPTED_OUTCOME_UNKNOWN);
        self.effective_class() == ToolClass::External && (self.done || unknown)
    }

    /// How it may have affected the world: as classed when it began, or external once
    /// it was seen sending out of the sandbox.
    pub fn effective_class(&self) -> ToolClass {
        effective_class(self.class, &self.egress)
    }
}

/// A person's shell in the session's sandbox, opened and not yet left.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpenShell {
    /// Who opened it.
    pub by: String,
    /// When, Unix ms.
    pub since_ms: u64,
    /// The host it runs on.
    pub host: String,
}

/// Where the open turn of a wrapped agent began: what a CLI started again to replay
/// it must be shown first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The first of the turn's exchanges.
    pub exchanges: u32,
    /// The first of the turn's wrapped tool calls.
    pub tools: usize,
    /// The workspace when the turn began.
    pub snapshot: Option<String>,
    /// The message that opened the turn, as sent (steers taken later not included).
    pub task: String,
    /// The blob of the wrapped CLI's conversation this turn continues (kept by the
    /// turns before: [`Event::ConversationKept`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

/// What the harness must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing until a user message arrives.
    WaitForMessage,
    /// Nothing until this signal arrives.
    WaitForSignal(Wait),
    /// Resolve a model call cut off by a crash.
    ResolveModel(PendingModel),
    /// Resolve a tool call cut off by a crash.
    ResolveTool(PendingTool),
    /// Run this tool call the model asked for.
    RunTool(ToolUse),
    /// Call the model (this step of the turn).
    CallModel {
        /// The step the call will be.
        step: u32,
    },
    /// The model's last reply asked for no tools: the turn is done.
    EndTurn,
    /// The session has ended.
    Ended(Status),
}

/// The format of stored checkpoints. Bump it with any change to [`SessionState`] or to
/// what folding a record does: a checkpoint of another version is ignored and the log
/// folded in full.
pub const CHECKPOINT_VERSION: u32 = 4;

/// A session's folded state as stored in the blob store (named by its hash, so it
/// comes back checked) by an [`Event::Checkpoint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// [`CHECKPOINT_VERSION`] when it was written.
    pub version: u32,
    /// The state after every record before the checkpoint's.
    pub state: SessionState,
}

impl Checkpoint {
    /// The state from a stored checkpoint and the records from the checkpoint's own on
    /// (`records[0]` is it); `None` when the bytes are not a checkpoint of this
    /// version or do not line up with the records (the caller folds in full).
    pub fn resume(bytes: &[u8], records: &[Record]) -> Option<Result<SessionState, FoldError>> {
        let checkpoint: Checkpoint = serde_json::from_slice(bytes).ok()?;
        let first = records.first()?;
        if checkpoint.version != CHECKPOINT_VERSION
            || first.seq != checkpoint.state.last_seq + 1
            || !matches!(first.event, Event::Checkpoint { .. })
        {
            return None;
        }
        let mut state = checkpoint.state;
        Some(
            records
                .iter()
                .try_for_each(|r| state.apply(r))
                .map(|()| state),
        )
    }
}

/// Tool outputs longer than this are elided by [`Event::OutputsElided`].
pub const ELIDE_OVER: usize = 256;

/// Whether [`Event::OutputsElided`] elides a tool output of this content.
fn elides(content: &str) -> bool {
    content.len() > ELIDE_OVER
}

/// The positions of the messages of `conversation` that [`Event::OutputsElided`] with
/// `before` changes, for whoever keeps things derived from each message (a request
/// builder) and need only redo those.
pub fn elided_messages(conversation: &[Message], before: u32) -> impl Iterator<Item = usize> + '_ {
    let before = (before as usize).min(conversation.len());
    conversation[..before]
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.content
                .iter()
                .any(|b| matches!(b, Block::ToolResult { content, .. } if elides(content)))
        })
        .map(|(i, _)| i)
}

/// What an elided tool output of `len` bytes becomes.
fn elided(len: usize, call_id: &str) -> String {
    format!(
        "[steadfast: this output ({len} bytes) was elided to keep the conversation within the model's context; the session's log keeps it, at the outcome of call {call_id}]"
    )
}

/// What compaction's summarising call is asked, after the messages it summarises.
pub const SUMMARY_PROMPT: &str = "[steadfast] The conversation so far is about to be compacted to fit your context window. \
Write a summary that will replace every message above: the user's requests, what you have done and found, \
the state of the work (files changed, commands that pass or fail, decisions taken) and what remains to do. \
Be specific (paths, names, numbers); leave out what no longer matters. Reply with the summary only, and call no tools.";

/// The first line of a compaction summary, as the model is sent it: how many model
/// turns it stands for (what a scripted model counts its place by).
pub fn compaction_header(turns: u32) -> String {
    format!("[steadfast: compacted summary of the {turns} earlier model turns]\n\n")
}

/// The model turns a compaction summary (a message's text) says it stands for.
pub fn compacted_turns(text: &str) -> Option<u32> {
    let rest = text.strip_prefix("[steadfast: compacted summary of the ")?;
    rest.split(' ').next()?.parse().ok()
}

/// The name a wrapped agent's tool call is approved or refused by: the call itself
/// (tool and input), since a CLI started again after the wait asks for it again under a
/// new id.
pub fn approval_key(tool: &str, input: &Value) -> String {
    let call = serde_json::json!([tool, input]).to_string();
    format!(
        "ask_{}",
        blake3::hash(call.as_bytes())
            .to_hex()
            .as_str()
            .get(..32)
            .unwrap_or("")
    )
}

/// A service the log says runs: started by the `service` tool and not stopped since.
/// It is started again whenever the session's sandbox is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// Its name.
    pub name: String,
    /// The command that starts it.
    pub command: String,
    /// The port it was said to listen on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Times it was started again with a new sandbox.
    #[serde(default)]
    pub restarts: u32,
}

/// Everything the log says about a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    /// The agent's name.
    pub agent: crate::Agent,
    /// The wrapped agent's CLI the session runs, `package@version` (see
    /// [`Event::SessionStarted`]).
    #[serde(default)]
    pub agent_cli: Option<String>,
    /// The model.
    pub model: ModelSpec,
    /// The workspace: a logical id or a directory on [`Self::workspace_host`].
    pub workspace: String,
    /// The host a directory workspace lives on (`None`: logical, or recorded before
    /// hosts were).
    pub workspace_host: Option<String>,
    /// The directories the session worked in before it was moved (oldest first): a
    /// replayed record that names one names the workspace.
    pub former_workspaces: Vec<String>,
    /// What the model is to be told with the next user message: a rewind set aside
    /// work whose external effects still stand, or the workspace was changed from
    /// outside the session between turns.
    #[serde(default)]
    pub rewind_note: Option<String>,
    /// A person's writable shell recorded as opened and not yet as left: if its holder
    /// died with it, the next to wake the session records what it changed (see
    /// [`Event::HumanShell`]).
    #[serde(default)]
    pub open_shell: Option<OpenShell>,
    /// A rewind put the workspace back to its last snapshot and no turn has begun
    /// since. A waking driver restores a directory it would otherwise leave as it is
    /// (a wrapped CLI's): the rewind's own restore, made after its record, may have
    /// been cut off by a crash.
    #[serde(default)]
    pub rewound_workspace: bool,
    /// The system prompt.
    pub system: String,
    /// Instructions a wrapped CLI is given on top of its own system prompt.
    #[serde(default)]
    pub instructions: Option<String>,
    /// The workspace snapshot the session began with.
    pub initial_snapshot: Option<String>,
    /// When the session began, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// The conversation so far, as the model will see it.
    pub conversation: Vec<Message>,
    /// Where the session is in its life, with what only that phase has.
    pub phase: Phase,
    /// The current (or last) turn, from 1.
    pub turn: u32,
    /// The last model step of the current turn with a recorded outcome.
    pub step: u32,
    /// A model call cut off, if any.
    pub pending_model: Option<PendingModel>,
    /// The tool calls of the last reply that have begun (their intent is recorded) and
    /// have no result yet, in the order they began. The calls of one reply may run at
    /// once (see **Parallel calls** in `steadfast_journal`); after a crash each is
    /// resolved in turn.
    #[serde(default)]
    pub pending_tools: Vec<PendingTool>,
    /// Tool calls of the last model reply that have no result yet, in order.
    pub queued_tools: Vec<ToolUse>,
    /// Tokens consumed by recorded model calls.
    pub usage: Usage,
    /// Money spent on recorded model calls, millionths of a dollar.
    pub cost_micro_usd: u64,
    /// Bytes the session's history keeps beyond its log: what its tool calls'
    /// snapshots stored and their outputs offloaded ([`Event::kept_bytes`]), counted
    /// against the history quota.
    #[serde(default)]
    pub kept_bytes: u64,
    /// Model calls with a recorded outcome.
    pub model_calls: u64,
    /// Model call intents (attempts, including re-issued ones).
    pub model_attempts: u64,
    /// The last workspace snapshot the log knows of.
    pub last_snapshot: Option<String>,
    /// The last position folded.
    pub last_seq: u64,
    /// The retry scheduled after the last failure, until the session is driven again.
    /// Not a phase: a drive may fail in any phase but the end, and the next attempt
    /// begins in the phase the failure left; while one is scheduled the session's
    /// status says `retrying` ([`SessionState::status`]).
    pub retry: Option<Retry>,
    /// Failures to drive the session since its last recorded model or tool outcome.
    pub failures_in_row: u32,
    /// Tool calls a human approved (approval policy).
    pub approved: Vec<String>,
    /// Tool calls a human refused (approval policy), with what the agent is told. A
    /// wrapped agent's call is named by what it asks for ([`approval_key`]), since
    /// the CLI asks for it again when it is started again after the wait.
    #[serde(default)]
    pub refused: Vec<(String, String)>,
    /// Calls (tool and input) seen connecting out of the sandbox, or trying to: the
    /// same call is an external effect whenever it is made again (see
    /// [`SessionState::seen_reaching_out`]).
    #[serde(default)]
    pub reaches_network: Vec<(String, Value)>,
    /// Connections the approval policy held back for a person: made again, the same
    /// call waits for approval before it runs.
    #[serde(default)]
    pub held_for_approval: Vec<HeldConnection>,
    /// The last inbox entry taken into the log.
    pub inbox_consumed: u64,
    /// How many model turns compaction summaries stand for, in all.
    pub compacted_turns: u32,
    /// How many compactions (summaries) the conversation has had.
    pub compactions: u32,
    /// The position of the last checkpoint record (0: none).
    pub last_checkpoint: u64,
    /// A `compact` signal was taken and its compaction is not yet done (a crash cut
    /// it off): the next model call compacts first.
    pub compact_asked: bool,
    /// The session's bounds, as raised by `resume` signals.
    pub limits: Limits,
    /// The approval policy's layers (`approve_external` is one asking for every
    /// external effect); see [`crate::approval`].
    pub approval: Vec<crate::ApprovalPolicy>,
    /// The tools the session's client runs.
    pub client_tools: Vec<crate::ClientTool>,
    /// The credentials the egress proxy adds to the session's requests.
    pub egress_credentials: Vec<crate::EgressCredential>,
    /// The services the log says run (see [`ServiceRecord`]).
    #[serde(default)]
    pub services: Vec<ServiceRecord>,
    /// The repository the workspace came from (what `git_push` pushes to).
    pub git: Option<crate::GitSource>,
    /// The user's MCP servers the agent is offered tools of.
    pub mcp_servers: Vec<crate::McpServer>,
    /// The session's own network policy, if it has one.
    pub network: Option<crate::NetworkPolicy>,
    /// How many tool calls in a row were the same call with the same input and left
    /// the workspace as it was (the loop breaker's count).
    pub loop_streak: u32,
    /// The last tool call that ran (name and input), for the loop breaker.
    pub last_tool_call: Option<(String, Value)>,
    /// The step from which the step budget of the current turn counts (a `resume`
    /// after the step breaker grants a fresh budget).
    pub steps_from: u32,
    /// A wrapped agent's model requests, in order, as the gateway recorded them
    /// (superseded ones removed).
    pub exchanges: Vec<Exchange>,
    /// A wrapped agent's tool calls, in order (superseded ones removed).
    pub wrapped_tools: Vec<WrappedTool>,
    /// How many wrapped calls' results have been recorded (the last
    /// [`WrappedTool::result_order`] given).
    #[serde(default)]
    pub wrapped_results: u32,
    /// Exchanges replaced or superseded (their late replies are ignored).
    pub superseded_exchanges: Vec<String>,
    /// The exchange from which a wrapped turn's model-call budget counts (a `resume`
    /// after the step breaker grants a fresh one).
    pub exchanges_from: u32,
    /// A wrapped agent's last final answer.
    pub wrapped_reply: Option<String>,
    /// The blob of a wrapped CLI's conversation, as its last run kept it
    /// ([`Event::ConversationKept`]): what the next turn continues.
    #[serde(default)]
    pub kept_conversation: Option<String>,
    /// Where the current (or last) turn began.
    pub turn_start: TurnStart,
    /// Completed external effects of the current turn that a divergence superseded:
    /// still facts, answered from the record if the agent asks for them again.
    pub external_facts: Vec<WrappedTool>,
    /// How many explorers one `explore` call may fork (0: the tool is not offered).
    #[serde(default)]
    pub explorers: u32,
    /// The parent's call this session was forked to explore a task of, if it was.
    #[serde(default)]
    pub explorer: Option<crate::Explorer>,
    /// This explorer has answered its parent: a turn of its own ended (its first
    /// finished turn's answer is its share of the parent's call).
    #[serde(default)]
    pub explorer_answered: bool,
    /// The explorers' answers that have come for the `explore` call being waited on.
    #[serde(default)]
    pub explored: Vec<ExploredAnswer>,
    /// A wrapped agent's `explore` calls whose explorers have all answered, by their
    /// approval key, with the call's result: what the call answers when the agent,
    /// started again, makes it.
    #[serde(default)]
    pub explored_done: Vec<(String, String)>,
}

/// One explorer's answer to its parent's `explore` call (the signal's payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExploredAnswer {
    /// Which task (from 0).
    pub index: u32,
    /// How many tasks the call had.
    pub of: u32,
    /// The explorer.
    pub session: String,
    /// Its task.
    pub task: String,
    /// Its final answer.
    pub answer: String,
    /// What it spent on model calls since it was forked: counted against the
    /// parent's bounds when the call's answers are in.
    #[serde(default)]
    pub cost_micro_usd: u64,
    /// The tokens it used since it was forked, counted likewise.
    #[serde(default)]
    pub tokens: u64,
}

/// Why a log could not be folded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FoldError {
    /// The log has no `session_started` first record.
    #[error("log does not begin with session_started")]
    NotStarted,
    /// Positions skip or repeat.
    #[error("log positions are not contiguous: expected {expected}, found {found}")]
    Gap {
        /// The position expected.
        expected: u64,
        /// The position found.
        found: u64,
    },
    /// An event that cannot follow the ones before it.
    #[error("event at #{seq} ({kind}) is inconsistent with the log: {reason}")]
    Inconsistent {
        /// Its position.
        seq: u64,
        /// Its type.
        kind: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Folds a whole log into the session's state.
pub fn fold(records: &[Record]) -> Result<SessionState, FoldError> {
    let (first, rest) = records.split_first().ok_or(FoldError::NotStarted)?;
    let mut state = SessionState::start(first)?;
    for record in rest {
        state.apply(record)?;
    }
    Ok(state)
}

impl SessionState {
    /// The state after the first record, which must be `session_started` at #1.
    pub fn start(record: &Record) -> Result<Self, FoldError> {
        if record.seq != 1 {
            return Err(FoldError::Gap {
                expected: 1,
                found: record.seq,
            });
        }
        let Event::SessionStarted {
            agent,
            agent_cli,
            model,
            workspace,
            host,
            system,
            instructions,
            initial_snapshot,
            created_at_ms,
            budget_micro_usd,
            approve_external,
            approval,
            limits,
            network,
            client_tools,
            egress_credentials,
            git,
            mcp_servers,
            explorers,
        } = &record.event
        else {
            return Err(FoldError::NotStarted);
        };
        Ok(SessionState {
            agent: agent.clone(),
            agent_cli: agent_cli.clone(),
            model: model.clone(),
            workspace: workspace.clone(),
            workspace_host: host.clone(),
            former_workspaces: Vec::new(),
            rewind_note: None,
            open_shell: None,
            rewound_workspace: false,
            system: system.clone(),
            instructions: instructions.clone(),
            initial_snapshot: initial_snapshot.clone(),
            created_at_ms: *created_at_ms,
            conversation: Vec::new(),
            phase: Phase::Idle {
                interrupted_by: None,
            },
            turn: 0,
            step: 0,
            pending_model: None,
            pending_tools: Vec::new(),
            queued_tools: Vec::new(),
            usage: Usage::default(),
            cost_micro_usd: 0,
            kept_bytes: 0,
            model_calls: 0,
            model_attempts: 0,
            last_snapshot: initial_snapshot.clone(),
            last_seq: 1,
            retry: None,
            failures_in_row: 0,
            approved: Vec::new(),
            refused: Vec::new(),
            reaches_network: Vec::new(),
            held_for_approval: Vec::new(),
            inbox_consumed: 0,
            compacted_turns: 0,
            compactions: 0,
            last_checkpoint: 0,
            compact_asked: false,
            limits: Limits {
                max_cost_micro_usd: limits.max_cost_micro_usd.or(*budget_micro_usd),
                ..*limits
            },
            approval: approval
                .iter()
                .cloned()
                .chain(approve_external.then(crate::ApprovalPolicy::ask_external))
                .collect(),
            client_tools: client_tools.clone(),
            egress_credentials: egress_credentials.clone(),
            services: Vec::new(),
            git: git.as_deref().cloned(),
            mcp_servers: mcp_servers.clone(),
            network: network.clone(),
            loop_streak: 0,
            last_tool_call: None,
            steps_from: 0,
            exchanges: Vec::new(),
            wrapped_tools: Vec::new(),
            wrapped_results: 0,
            superseded_exchanges: Vec::new(),
            exchanges_from: 0,
            wrapped_reply: None,
            kept_conversation: None,
            turn_start: TurnStart {
                snapshot: initial_snapshot.clone(),
                ..TurnStart::default()
            },
            external_facts: Vec::new(),
            explorers: *explorers,
            explorer: None,
            explorer_answered: false,
            explored: Vec::new(),
            explored_done: Vec::new(),
        })
    }

    /// Every token the session's model calls used (what `max_tokens` bounds).
    pub fn tokens_used(&self) -> u64 {
        self.usage.input_tokens
            + self.usage.output_tokens
            + self.usage.cache_read_tokens
            + self.usage.cache_write_tokens
    }

    /// The bounds of each of `n` explorers forked from this state: the money and
    /// tokens this session has left, shared among them; each answer's spend then
    /// counts against this session (see [`ExploredAnswer::cost_micro_usd`]), so the
    /// explorers and the session together stay within its bounds.
    pub fn explorer_limits(&self, n: u32) -> Limits {
        let n = u64::from(n.max(1));
        let cost = self.cost_micro_usd;
        let tokens = self.tokens_used();
        Limits {
            max_cost_micro_usd: self
                .limits
                .max_cost_micro_usd
                .map(|max| cost + max.saturating_sub(cost) / n),
            max_tokens: self
                .limits
                .max_tokens
                .map(|max| tokens + max.saturating_sub(tokens) / n),
            ..self.limits
        }
    }

    /// Whether the session runs a wrapped agent (a CLI through the gateway) rather
    /// than the native loop.
    pub fn is_wrapped(&self) -> bool {
        !self.agent.is_native()
    }

    /// Whether the session is over for good.
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended { .. })
    }

    /// Whether a turn is open and not paused.
    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    /// Whether the session is between turns.
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle { .. })
    }

    /// Where the session stands, as its summary, stream and API say it: its phase, or
    /// `retrying` while a retry is scheduled.
    pub fn status(&self) -> Status {
        if self.retry.is_some() {
            return Status::Retrying;
        }
        self.phase.status()
    }

    /// The pause in force (a wait, or an escalation's wait for `resume`), if any.
    pub fn waiting(&self) -> Option<&Wait> {
        match &self.phase {
            Phase::Waiting(wait) | Phase::Escalated { wait, .. } => Some(wait),
            _ => None,
        }
    }

    /// The bound that stopped the session, while it is escalated.
    pub fn escalated_by(&self) -> Option<Breaker> {
        match self.phase {
            Phase::Escalated { breaker, .. } => Some(breaker),
            _ => None,
        }
    }

    /// Why the session ended, if it did.
    pub fn end_reason(&self) -> Option<&str> {
        match &self.phase {
            Phase::Ended { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// Who interrupted the last turn, while the session is idle after it.
    pub fn interrupted_by(&self) -> Option<&str> {
        match &self.phase {
            Phase::Idle { interrupted_by } => interrupted_by.as_deref(),
            _ => None,
        }
    }

    /// While a compaction call is pending: the position it summarises up to.
    pub fn compacting(&self) -> Option<u32> {
        match self.phase {
            Phase::Running { compacting } => compacting,
            _ => None,
        }
    }

    /// The bound this session has hit, if any, at `now_ms` with at most
    /// `max_steps_per_turn` model calls a turn. Checked before each model call and each
    /// tool call of a running turn; see [`Event::Escalated`].
    pub fn breaker(&self, now_ms: u64, max_steps_per_turn: u32) -> Option<(Breaker, String)> {
        if !self.is_running() {
            return None;
        }
        let next = self.next();
        if !matches!(next, Next::CallModel { .. } | Next::RunTool(_)) {
            return None;
        }
        if let Some(hit) = self.bound_hit(now_ms) {
            // The wall clock stops tool calls too; the rest, the next model call.
            if hit.0 == Breaker::Duration || matches!(next, Next::CallModel { .. }) {
                return Some(hit);
            }
        }
        let Next::CallModel { step } = next else {
            return None;
        };
        if let Some(hit) = self.loop_hit() {
            return Some(hit);
        }
        if step.saturating_sub(self.steps_from) > max_steps_per_turn {
            return Some((
                Breaker::Steps,
                format!(
                    "step budget exhausted: {} model calls in turn {}",
                    step - 1,
                    self.turn
                ),
            ));
        }
        None
    }

    /// What is left of the session's spend cap, in millionths of a dollar (`None`: no
    /// cap). A model call is made only if its worst case fits in it.
    pub fn spend_left(&self) -> Option<u64> {
        self.limits
            .max_cost_micro_usd
            .map(|max| max.saturating_sub(self.cost_micro_usd))
    }

    /// The session-wide bound (money, tokens, turns, wall clock) hit at `now_ms`, if
    /// any: what a wrapped agent's gateway checks before each model call.
    pub fn bound_hit(&self, now_ms: u64) -> Option<(Breaker, String)> {
        let elapsed = now_ms.saturating_sub(self.created_at_ms);
        if let Some(max) = self.limits.max_duration_ms.filter(|m| elapsed >= *m) {
            return Some((
                Breaker::Duration,
                format!(
                    "wall-clock limit reached: {}s of {}s",
                    elapsed / 1000,
                    max / 1000
                ),
            ));
        }
        if let Some(max) = self
            .limits
            .max_cost_micro_usd
            .filter(|m| self.cost_micro_usd >= *m)
        {
            return Some((
                Breaker::Cost,
                format!(
                    "spend cap reached: ${:.4} of ${:.4}",
                    crate::money::usd(self.cost_micro_usd),
                    crate::money::usd(max)
                ),
            ));
        }
        let tokens = self.tokens_used();
        if let Some(max) = self.limits.max_tokens.filter(|m| tokens >= *m) {
            return Some((
                Breaker::Tokens,
                format!("token limit reached: {tokens} of {max}"),
            ));
        }
        if let Some(max) = self.limits.max_turns.filter(|m| self.turn > *m) {
            return Some((
                Breaker::Turns,
                format!("turn limit reached: turn {} of at most {max}", self.turn),
            ));
        }
        None
    }

    /// What the harness must do next.
    pub fn next(&self) -> Next {
        if self.is_ended() {
            return Next::Ended(self.phase.status());
        }
        if let Some(w) = self.waiting() {
            return Next::WaitForSignal(w.clone());
        }
        if let Some(p) = &self.pending_model {
            return Next::ResolveModel(p.clone());
        }
        if let Some(p) = self.pending_tools.first() {
            return Next::ResolveTool(p.clone());
        }
        if !self.is_running() {
            return Next::WaitForMessage;
        }
        if let Some(t) = self.queued_tools.first() {
            return Next::RunTool(t.clone());
        }
        match self.conversation.last() {
            Some(m) if m.role == Role::Assistant => Next::EndTurn,
            _ => Next::CallModel {
                step: self.step + 1,
            },
        }
    }

    /// The tool call due next once a reply with `content` is folded into this state
    /// (its first tool use), when nothing would come before it: no wait, no other
    /// call pending, no breaker that stops tool calls. `None` when the reply has no tool
    /// call, or something would.
    pub fn tool_after_reply(&self, content: &[Block], now_ms: u64) -> Option<ToolUse> {
        if !self.is_running() || !self.pending_tools.is_empty() {
            return None;
        }
        // Of the bounds, only the wall clock stops a tool call (see `breaker`), and
        // the reply does not move it.
        if matches!(self.bound_hit(now_ms), Some((Breaker::Duration, _))) {
            return None;
        }
        content.iter().find_map(|b| match b {
            Block::ToolUse(t) => Some(t.clone()),
            _ => None,
        })
    }

    /// The text of the model's last reply.
    pub fn last_reply(&self) -> Option<String> {
        if self.is_wrapped() {
            return self.wrapped_reply.clone();
        }
        self.conversation
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(Message::text)
    }

    /// Folds one more record into the state.
    pub fn apply(&mut self, record: &Record) -> Result<(), FoldError> {
        let bad = |reason: String| FoldError::Inconsistent {
            seq: record.seq,
            kind: record.event.kind(),
            reason,
        };
        if let Event::Rewound { to, facts, .. } = &record.event {
            // The one record that follows a position other than the one before it.
            if self.last_seq != *to || record.seq <= *to {
                let at = self.last_seq;
                return Err(bad(format!("a rewind to {to} follows the state at {at}")));
            }
            self.rewind(facts);
            self.last_seq = record.seq;
            return Ok(());
        }
        if record.seq != self.last_seq + 1 {
            return Err(FoldError::Gap {
                expected: self.last_seq + 1,
                found: record.seq,
            });
        }
        self.kept_bytes = self.kept_bytes.saturating_add(record.event.kept_bytes());
        self.apply_event(record.seq, &record.event)
            .map_err(|reason| bad(reason.to_string()))?;
        self.last_seq = record.seq;
        Ok(())
    }

    /// Folds one event, each family by its own module.
    fn apply_event(&mut self, seq: u64, event: &Event) -> Folded {
        if let Event::Forked { .. } = event {
            return self.forked(event);
        }
        if self.is_ended() {
            return Err("the session has already ended");
        }
        // Records about the session rather than its turn leave a scheduled retry as
        // it is; the rest clear it, and an outcome ends a run of failures.
        match event {
            Event::DriveFailed { .. } => return self.drive_failed(event),
            Event::AgentChanged { .. } => return self.agent_changed(event),
            Event::WorkspaceEdited { .. } => return self.workspace_edited(event),
            Event::HumanShell { .. } => return self.human_shell(event),
            Event::WorkspaceMoved { .. } => return self.workspace_moved(event),
            Event::ModelCallOutcome { .. }
            | Event::ToolCallOutcome { .. }
            | Event::ExchangeOutcome { .. }
            | Event::TurnEnded { .. } => {
                self.failures_in_row = 0;
                self.retry = None;
            }
            _ => self.retry = None,
        }
        match event {
            Event::SessionStarted { .. } => Err("session already started"),
            Event::DriveFailed { .. }
            | Event::AgentChanged { .. }
            | Event::WorkspaceEdited { .. }
            | Event::HumanShell { .. }
            | Event::WorkspaceMoved { .. }
            | Event::Forked { .. }
            | Event::Rewound { .. } => Ok(()), // folded above
            Event::UserMessage { .. } => self.user_message(event),
            Event::Steered { .. } => self.steered(event),
            Event::TurnInterrupted { .. } => self.interrupted(event),
            Event::TurnEnded { .. } => self.turn_ended(event),
            Event::WaitStarted { .. } => self.wait_started(seq, event),
            Event::SignalReceived { .. } => self.signal_received(event),
            Event::Escalated { .. } => self.escalated(seq, event),
            Event::ModelDelta { .. } => self.model_delta(event),
            Event::ModelCallIntent { .. } => self.model_intent(event),
            Event::ModelCallOutcome { .. } => self.model_outcome(event),
            Event::ModelCallInterrupted { call_id } | Event::ModelCallFailed { call_id, .. } => {
                self.model_ended_without_reply(call_id)
            }
            Event::OutputsElided { .. } => self.outputs_elided(event),
            Event::CompactionIntent { .. } => self.compaction_intent(event),
            Event::Compacted { .. } => self.compacted(event),
            Event::ToolCallIntent { .. }
            | Event::ToolCallOutcome { .. }
            | Event::ToolCallInterrupted { .. } => self.tool_call(event),
            Event::Egress { .. } => self.egress(event),
            Event::ServicesRestarted { .. } => self.services_restarted(event),
            Event::SandboxLost { .. } => self.sandbox_lost(event),
            Event::ExchangeIntent { .. } => self.exchange_intent(event),
            Event::ExchangeOutcome { .. } => self.exchange_outcome(event),
            Event::ConversationKept { .. } => self.conversation_kept(event),
            Event::ReplayDiverged { .. } => self.replay_diverged(event),
            // A copy of the state so far: nothing new but where it is.
            Event::Checkpoint { .. } => {
                self.last_checkpoint = seq;
                Ok(())
            }
            Event::Pruned { .. } => Ok(()),
            Event::SessionEnded { .. } => self.ended(event),
        }
    }

    /// How the call `call_id` (the native loop's pending one, or a wrapped agent's)
    /// may have affected the world: its class, or external once it was seen sending
    /// out of the sandbox.
    pub fn effective_class_of(&self, call_id: &str) -> Option<ToolClass> {
        if let Some(p) = self.pending_tool(call_id) {
            return Some(p.effective_class());
        }
        self.wrapped_tools
            .iter()
            .find(|t| t.call_id == call_id)
            .map(WrappedTool::effective_class)
    }

    /// Where the call `tool` with `input` tried to connect when the approval policy
    /// held it back for a person, if it did: made again, it waits for approval first.
    pub fn held_for_approval(&self, tool: &str, input: &Value) -> Option<&str> {
        self.held_for_approval
            .iter()
            .find(|h| h.tool == tool && &h.input == input)
            .map(|h| h.destination.as_str())
    }

    /// Whether the call `tool` with `input` was seen connecting out of the sandbox
    /// before (or trying to): observation makes the classifier's guess more careful,
    /// never less.
    pub fn seen_reaching_out(&self, tool: &str, input: &Value) -> bool {
        self.reaches_network
            .iter()
            .any(|(t, i)| t == tool && i == input)
    }

    /// The loop breaker's verdict: the same call three times running with no change.
    pub fn loop_hit(&self) -> Option<(Breaker, String)> {
        (self.loop_streak >= 3).then(|| {
            let name = self.last_tool_call.as_ref().map_or("", |(n, _)| n.as_str());
            (
                Breaker::Loop,
                format!(
                    "loop detected: the same `{name}` call with the same input ran {} times in a row without changing the workspace",
                    self.loop_streak
                ),
            )
        })
    }

    fn take_inbox(&mut self, inbox_id: Option<u64>) {
        if let Some(id) = inbox_id {
            self.inbox_consumed = self.inbox_consumed.max(id);
        }
    }

    fn take_pending_model(&mut self, call_id: &str) -> Option<PendingModel> {
        match &self.pending_model {
            Some(p) if p.call_id == call_id => self.pending_model.take(),
            _ => None,
        }
    }

    fn take_pending_tool(&mut self, call_id: &str) -> Option<PendingTool> {
        let at = self
            .pending_tools
            .iter()
            .position(|p| p.call_id == call_id)?;
        Some(self.pending_tools.remove(at))
    }

    /// The native loop's call `call_id`, if it has begun and has no result yet.
    pub fn pending_tool(&self, call_id: &str) -> Option<&PendingTool> {
        self.pending_tools.iter().find(|p| p.call_id == call_id)
    }

    /// Whether the native loop's call `call_id` may begin now: it is a call of the
    /// running turn's last reply that has not begun, and nothing stands before tool
    /// calls (a wait, a model call, the session's end). Siblings of one reply may
    /// begin while others run.
    pub fn may_begin(&self, call_id: &str) -> bool {
        self.is_running()
            && self.pending_model.is_none()
            && self.queued_tools.iter().any(|t| t.id == call_id)
            && self.pending_tool(call_id).is_none()
    }

    /// The calls of the last reply that may begin now, in the reply's order.
    pub fn ready_tools(&self) -> Vec<ToolUse> {
        self.queued_tools
            .iter()
            .filter(|t| self.may_begin(&t.id))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests;
