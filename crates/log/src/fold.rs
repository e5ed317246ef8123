//! `fold(records) -> SessionState`: the whole state a harness needs, from the log alone.
//!
//! Folding is pure: no I/O, no clock, no randomness. The state says what happened
//! (conversation, spend, last workspace snapshot) and what comes next ([`SessionState::next`]),
//! including calls whose intent is in the log without an outcome, which the harness must
//! resolve by docs/ARCHITECTURE.md rule 4 before doing anything else.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{
    Breaker, EndState, Event, Limits, ModelSpec, ToolClass, ToolResolution, Usage, DENIED,
    INTERRUPTED_NOT_BEGUN, INTERRUPTED_OUTCOME_UNKNOWN, INTERRUPTED_ROLLED_BACK,
    INTERRUPTED_ROLLED_BACK_BESIDE, RESUME_SIGNAL,
};
use crate::is_workspace_id;
use crate::message::{Block, Message, Role, ToolUse};
use crate::record::Record;

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Between turns, waiting for a user message.
    Idle,
    /// A turn is open.
    Running,
    /// Ended: completed.
    Completed,
    /// Ended: failed.
    Failed,
    /// Stopped by a bound and escalated to a human: waits for a `resume` signal
    /// (or, in logs that ended it, over for good).
    Escalated,
    /// Paused until a named signal arrives.
    Waiting,
    /// Ended: closed by a person.
    Closed,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Idle => "idle",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Escalated => "escalated",
            Status::Waiting => "waiting",
            Status::Closed => "closed",
        })
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
    pub api: String,
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
pub const CHECKPOINT_VERSION: u32 = 3;

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

/// The most changed paths an edit's note to the model names one by one.
const EDITED_NOTE_PATHS: usize = 50;

/// What the model is told of what a person changed in a shell in its sandbox.
fn shell_note(by: &str, changes: &[String]) -> String {
    changes_note(
        &format!(
            "[steadfast] Between turns, {by} opened a shell in this session's sandbox and \
             changed its workspace; the files are as they were left:"
        ),
        changes,
    )
}

/// What the model is told of a workspace changed from outside the session.
fn edited_note(changes: &[String]) -> String {
    changes_note(
        "[steadfast] While the session was paused, its workspace was changed from outside \
         it (by a person or another program); the files are as they were left:",
        changes,
    )
}

/// `opening`, then the changed paths a line each, the first [`EDITED_NOTE_PATHS`] of
/// them named.
fn changes_note(opening: &str, changes: &[String]) -> String {
    let mut note = opening.to_string();
    for change in changes.iter().take(EDITED_NOTE_PATHS) {
        note.push_str(&format!("\n- {change}"));
    }
    if changes.len() > EDITED_NOTE_PATHS {
        note.push_str(&format!(
            "\n- and {} more",
            changes.len() - EDITED_NOTE_PATHS
        ));
    }
    note
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
    pub agent: String,
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
    /// Where the session stands.
    pub status: Status,
    /// Why it ended, if it did.
    pub end_reason: Option<String>,
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
    /// The pause in force, if any.
    pub waiting: Option<Wait>,
    /// Who interrupted the last turn, while the session is idle after it.
    pub interrupted_by: Option<String>,
    /// The retry scheduled after the last failure, until the session is driven again.
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
    /// While a compaction call is pending: the position it summarises up to.
    pub compacting: Option<u32>,
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
    /// Whether the session is over for good.
    pub ended: bool,
    /// The session's own network policy, if it has one.
    pub network: Option<String>,
    /// The bound that stopped the session, while it is escalated.
    pub escalated: Option<Breaker>,
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

/// The `explore` call's result once every explorer has answered: each task with its
/// explorer's session and answer.
fn explored_result(answers: &[ExploredAnswer]) -> String {
    let mut answers = answers.to_vec();
    answers.sort_by_key(|a| a.index);
    let mut out = format!("{} explorer(s) finished.\n", answers.len());
    for a in &answers {
        out.push_str(&format!(
            "\n## Explorer {} ({})\nTask: {}\nAnswer:\n{}\n",
            a.index + 1,
            a.session,
            a.task,
            a.answer.trim()
        ));
    }
    out
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
            status: Status::Idle,
            end_reason: None,
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
            waiting: None,
            interrupted_by: None,
            retry: None,
            failures_in_row: 0,
            approved: Vec::new(),
            refused: Vec::new(),
            reaches_network: Vec::new(),
            held_for_approval: Vec::new(),
            inbox_consumed: 0,
            compacting: None,
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
            ended: false,
            network: network.clone(),
            escalated: None,
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
        self.agent != "native"
    }

    /// A wrapped agent's tool event; `Ok(false)` if `event` is not one.
    fn apply_wrapped_tool(&mut self, event: &Event) -> Result<bool, &'static str> {
        match event {
            Event::ToolCallIntent {
                call_id,
                tool,
                input,
                class,
                snapshot_before,
            } => {
                if snapshot_before.is_some() {
                    self.last_snapshot = snapshot_before.clone();
                }
                self.wrapped_tools.push(WrappedTool {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                    class: *class,
                    snapshot_before: snapshot_before.clone(),
                    after_exchanges: self.exchanges.len() as u32,
                    result: None,
                    snapshot_after: None,
                    done: false,
                    result_order: 0,
                    egress: Vec::new(),
                });
            }
            Event::ToolCallOutcome {
                call_id,
                is_error,
                output,
                snapshot_after,
                ..
            } => {
                let order = self.next_result_order();
                let t = self
                    .wrapped_tools
                    .iter_mut()
                    .find(|t| &t.call_id == call_id && t.result.is_none())
                    .ok_or("no such pending tool call")?;
                t.result = Some((output.for_model(), *is_error));
                t.result_order = order;
                t.done = true;
                t.snapshot_after = snapshot_after.clone().or_else(|| t.snapshot_before.clone());
                let unchanged = match snapshot_after {
                    None => true,
                    Some(after) => t.snapshot_before.as_ref() == Some(after),
                };
                let (tool, input) = (t.tool.clone(), t.input.clone());
                self.count_call(&tool, &input, unchanged);
                self.note_service(&tool, &input, *is_error);
                if snapshot_after.is_some() {
                    self.last_snapshot = snapshot_after.clone();
                }
            }
            Event::ToolCallInterrupted {
                call_id,
                resolution,
            } => {
                let at = self
                    .wrapped_tools
                    .iter()
                    .position(|t| &t.call_id == call_id && t.result.is_none())
                    .ok_or("no such pending tool call")?;
                let result = match resolution {
                    ToolResolution::Rerun | ToolResolution::Reconciled { done: false, .. } => None,
                    ToolResolution::RolledBack { snapshot } => {
                        if snapshot.is_some() {
                            self.last_snapshot = snapshot.clone();
                        }
                        // Put back to a later point than its own start: siblings that
                        // ran beside it were recorded after it began and are kept.
                        let beside = snapshot.is_some()
                            && *snapshot != self.wrapped_tools[at].snapshot_before;
                        let text = if beside {
                            INTERRUPTED_ROLLED_BACK_BESIDE
                        } else {
                            INTERRUPTED_ROLLED_BACK
                        };
                        Some((text.to_string(), true))
                    }
                    ToolResolution::OutcomeUnknown => {
                        Some((INTERRUPTED_OUTCOME_UNKNOWN.to_string(), true))
                    }
                    ToolResolution::Reconciled {
                        done: true,
                        evidence,
                    } => Some((evidence.clone(), false)),
                };
                let left_at = match resolution {
                    ToolResolution::RolledBack { snapshot } if snapshot.is_some() => {
                        snapshot.clone()
                    }
                    _ => self.wrapped_tools[at].snapshot_before.clone(),
                };
                let order = self.next_result_order();
                match result {
                    Some(r) => {
                        let t = &mut self.wrapped_tools[at];
                        t.result = Some(r);
                        t.snapshot_after = left_at;
                        t.result_order = order;
                    }
                    None => {
                        self.wrapped_tools.remove(at);
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The order the next wrapped call's result is recorded in (see
    /// [`WrappedTool::result_order`]).
    fn next_result_order(&mut self) -> u32 {
        self.wrapped_results += 1;
        self.wrapped_results
    }

    /// Whether the session is over for good.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The bound this session has hit, if any, at `now_ms` with at most
    /// `max_steps_per_turn` model calls a turn. Checked before each model call and each
    /// tool call of a running turn; see [`Event::Escalated`].
    pub fn breaker(&self, now_ms: u64, max_steps_per_turn: u32) -> Option<(Breaker, String)> {
        if self.status != Status::Running || self.waiting.is_some() {
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
        if self.ended {
            return Next::Ended(self.status);
        }
        if let Some(w) = &self.waiting {
            return Next::WaitForSignal(w.clone());
        }
        if let Some(p) = &self.pending_model {
            return Next::ResolveModel(p.clone());
        }
        if let Some(p) = self.pending_tools.first() {
            return Next::ResolveTool(p.clone());
        }
        if self.status != Status::Running {
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
        if self.ended
            || self.waiting.is_some()
            || !self.pending_tools.is_empty()
            || self.status != Status::Running
        {
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
        if let Event::Rewound { to, facts, .. } = &record.event {
            // The one record that follows a position other than the one before it.
            if self.last_seq != *to || record.seq <= *to {
                return Err(FoldError::Inconsistent {
                    seq: record.seq,
                    kind: record.event.kind(),
                    reason: format!("a rewind to {to} follows the state at {}", self.last_seq),
                });
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
        let kind = record.event.kind();
        let bad = |reason: &str| FoldError::Inconsistent {
            seq: record.seq,
            kind,
            reason: reason.to_string(),
        };
        if let Event::Forked {
            workspace,
            model,
            limits,
            agent,
            instructions,
            explorer,
            ..
        } = &record.event
        {
            if let Some(explorer) = explorer {
                let pending =
                    self.is_wrapped() || self.queued_tools.iter().any(|t| t.id == explorer.call_id);
                if !pending {
                    return Err(bad("an explorer is forked where its `explore` call is due"));
                }
                self.explorer = Some(explorer.clone());
            }
            self.fork(workspace, model.as_ref()).map_err(bad)?;
            if let Some(limits) = limits {
                self.limits = *limits;
            }
            if let Some((agent, cli)) = agent {
                if !self.is_wrapped() {
                    return Err(bad("only a wrapped agent's session can change its CLI"));
                }
                self.agent = agent.clone();
                self.agent_cli = Some(cli.clone());
            }
            if let Some(instructions) = instructions {
                if !self.is_wrapped() {
                    return Err(bad("only a wrapped agent's session is given instructions"));
                }
                self.instructions = Some(instructions.clone()).filter(|i| !i.is_empty());
            }
            self.last_seq = record.seq;
            return Ok(());
        }
        if self.ended {
            return Err(bad("the session has already ended"));
        }
        match &record.event {
            Event::DriveFailed {
                reason,
                attempt,
                retry_at_ms,
            } => {
                self.failures_in_row = *attempt;
                self.retry = retry_at_ms.map(|at_ms| Retry {
                    attempt: *attempt,
                    reason: reason.clone(),
                    at_ms,
                });
                self.last_seq = record.seq;
                return Ok(());
            }
            Event::AgentChanged {
                agent,
                cli,
                instructions,
            } => {
                if !self.is_wrapped() || self.status != Status::Idle {
                    return Err(bad("a wrapped session's agent is changed between turns"));
                }
                self.agent = agent.clone();
                self.agent_cli = Some(cli.clone());
                self.instructions = instructions.clone();
                self.last_seq = record.seq;
                return Ok(());
            }
            Event::WorkspaceEdited { snapshot, changes } => {
                if is_workspace_id(&self.workspace) || self.status != Status::Idle {
                    return Err(bad(
                        "an edit from outside is taken between turns, in a directory",
                    ));
                }
                self.last_snapshot = Some(snapshot.clone());
                // Files only touched (their times changed, not their content or
                // modes) are nothing to tell the model.
                if !changes.is_empty() {
                    self.note_for_next_turn(&edited_note(changes));
                }
                self.last_seq = record.seq;
                return Ok(());
            }
            Event::HumanShell {
                by,
                since_ms,
                detached,
                snapshot,
                changes,
                host,
            } => {
                if self.is_ended() || self.status == Status::Running {
                    return Err(bad(
                        "a person's shell is recorded between turns of a session that goes on",
                    ));
                }
                self.last_snapshot = Some(snapshot.clone());
                if !changes.is_empty() {
                    self.note_for_next_turn(&shell_note(by, changes));
                }
                self.open_shell = (!detached).then(|| OpenShell {
                    by: by.clone(),
                    since_ms: *since_ms,
                    host: host.clone(),
                });
                self.last_seq = record.seq;
                return Ok(());
            }
            Event::WorkspaceMoved {
                workspace,
                host,
                from_workspace,
                snapshot,
                ..
            } => {
                if is_workspace_id(&self.workspace) || is_workspace_id(workspace) {
                    return Err(bad("a logical workspace is on every host, never moved"));
                }
                if *from_workspace != self.workspace {
                    return Err(bad("moved from a directory the session is not in"));
                }
                if *snapshot != self.last_snapshot {
                    return Err(bad("the new directory is not at the last snapshot"));
                }
                // The native prompt names the directory: it names the new one now.
                self.system = self.system.replace(from_workspace.as_str(), workspace);
                self.former_workspaces
                    .push(std::mem::replace(&mut self.workspace, workspace.clone()));
                self.workspace_host = Some(host.clone());
                self.last_seq = record.seq;
                return Ok(());
            }
            Event::ModelCallOutcome { .. }
            | Event::ToolCallOutcome { .. }
            | Event::ExchangeOutcome { .. }
            | Event::TurnEnded { .. } => {
                self.failures_in_row = 0;
                self.retry = None;
            }
            _ => self.retry = None,
        }
        if self.is_wrapped() {
            match self.apply_wrapped_tool(&record.event) {
                Ok(true) => {
                    self.last_seq = record.seq;
                    return Ok(());
                }
                Ok(false) => {}
                Err(reason) => return Err(bad(reason)),
            }
        }
        match &record.event {
            Event::SessionStarted { .. } => return Err(bad("session already started")),
            Event::DriveFailed { .. }
            | Event::WorkspaceMoved { .. }
            | Event::WorkspaceEdited { .. }
            | Event::HumanShell { .. }
            | Event::AgentChanged { .. }
            | Event::Forked { .. }
            | Event::Rewound { .. } => {} // folded above
            Event::UserMessage {
                turn,
                text,
                inbox_id,
            } => {
                if self.status != Status::Idle {
                    return Err(bad("a turn is already open"));
                }
                self.take_inbox(*inbox_id);
                if *turn != self.turn + 1 {
                    return Err(bad("turn numbers must increase by one"));
                }
                self.turn = *turn;
                self.step = 0;
                self.steps_from = 0;
                self.exchanges_from = self.exchanges.len() as u32;
                self.turn_start = TurnStart {
                    exchanges: self.exchanges.len() as u32,
                    tools: self.wrapped_tools.len(),
                    snapshot: self.last_snapshot.clone(),
                    task: text.clone(),
                    history: self.kept_conversation.clone(),
                };
                self.rewound_workspace = false;
                if let Some(note) = self.rewind_note.take() {
                    self.turn_start.task = format!("{note}\n\n{text}");
                }
                self.external_facts.clear();
                self.status = Status::Running;
                self.interrupted_by = None;
                self.conversation
                    .push(Message::user_text(self.turn_start.task.clone()));
            }
            Event::Steered { text, inbox_id } => {
                if self.status != Status::Running
                    || !matches!(self.next(), Next::CallModel { .. } | Next::EndTurn)
                {
                    return Err(bad("a steer is taken only between calls of a running turn"));
                }
                self.take_inbox(Some(*inbox_id));
                let block = Block::Text { text: text.clone() };
                match self.conversation.last_mut() {
                    Some(m) if m.role == Role::User => m.content.push(block),
                    _ => self.conversation.push(Message {
                        role: Role::User,
                        content: vec![block],
                    }),
                }
            }
            Event::ModelDelta { call_id, .. } => {
                // A native model call in flight, or a wrapped agent's exchange whose
                // reply is streaming (or was cut off: its late pieces are kept).
                let exchange = self.exchanges.iter().any(|e| &e.call_id == call_id)
                    || self.superseded_exchanges.contains(call_id);
                if self.pending_model.as_ref().map(|p| &p.call_id) != Some(call_id) && !exchange {
                    return Err(bad("a delta of a model call that is not in flight"));
                }
            }
            Event::WaitStarted {
                name,
                reason,
                call_id,
                before_call,
            } => {
                if self.status != Status::Running || self.waiting.is_some() {
                    return Err(bad("only a running turn can start a wait"));
                }
                if call_id
                    .as_ref()
                    .is_some_and(|id| self.pending_tool(id).is_none())
                {
                    return Err(bad("the waiting tool call is not in flight"));
                }
                self.status = Status::Waiting;
                self.explored.clear();
                self.waiting = Some(Wait {
                    seq: record.seq,
                    name: name.clone(),
                    reason: reason.clone(),
                    call_id: call_id.clone(),
                    before_call: before_call.clone(),
                });
            }
            Event::SignalReceived {
                name,
                payload,
                inbox_id,
            } => {
                let wait = match &self.waiting {
                    Some(w) if &w.name == name => w.clone(),
                    _ => return Err(bad("no wait for this signal")),
                };
                self.take_inbox(Some(*inbox_id));
                if name.starts_with(&format!("{}.", crate::EXPLORED_SIGNAL)) {
                    // One explorer's answer: the call waits on until every task has
                    // one (an answer sent twice counts once).
                    let answer: ExploredAnswer = serde_json::from_value(payload.clone())
                        .map_err(|_| bad("an explorer's answer without its fields"))?;
                    if answer.index < answer.of
                        && !self.explored.iter().any(|a| a.index == answer.index)
                    {
                        self.explored.push(answer.clone());
                    }
                    if self.explored.len() < answer.of as usize {
                        self.last_seq = record.seq;
                        return Ok(());
                    }
                    self.waiting = None;
                    self.status = Status::Running;
                    let answers = std::mem::take(&mut self.explored);
                    for a in &answers {
                        self.cost_micro_usd += a.cost_micro_usd;
                        self.usage.input_tokens += a.tokens;
                    }
                    let result = explored_result(&answers);
                    match (&wait.call_id, &wait.before_call) {
                        (Some(call_id), _) => {
                            self.take_pending_tool(call_id)
                                .ok_or_else(|| bad("the waiting tool call is not in flight"))?;
                            self.push_result(call_id, result, false);
                        }
                        (None, Some(key)) => self.explored_done.push((key.clone(), result)),
                        (None, None) => return Err(bad("an explore wait names no call")),
                    }
                    self.last_seq = record.seq;
                    return Ok(());
                }
                self.waiting = None;
                self.status = Status::Running;
                if let Some(breaker) = self.escalated.take() {
                    self.resume(breaker, payload);
                }
                let denied =
                    payload.get("approved").and_then(serde_json::Value::as_bool) == Some(false);
                if let Some(call_id) = &wait.call_id {
                    self.take_pending_tool(call_id)
                        .ok_or_else(|| bad("the waiting tool call is not in flight"))?;
                    if *name == crate::tool_result_signal(call_id) {
                        // A client tool's result is the client's content, as it sent it.
                        let content = match payload.get("content") {
                            Some(serde_json::Value::String(text)) => text.clone(),
                            Some(other) => other.to_string(),
                            None => String::new(),
                        };
                        let is_error = payload.get("is_error").and_then(serde_json::Value::as_bool);
                        self.push_result(call_id, content, is_error == Some(true));
                    } else {
                        self.push_result(
                            call_id,
                            format!("signal {name} arrived: {payload}"),
                            false,
                        );
                    }
                }
                if let Some(call_id) = &wait.before_call {
                    if denied {
                        let message =
                            match payload.get("message").and_then(serde_json::Value::as_str) {
                                Some(m) => format!("{DENIED} They said: {m}"),
                                None => DENIED.to_string(),
                            };
                        if !self.is_wrapped() {
                            self.push_result(call_id, message.clone(), true);
                        }
                        self.refused.push((call_id.clone(), message));
                    } else {
                        self.approved.push(call_id.clone());
                    }
                }
            }
            Event::ModelCallIntent { call_id, step, .. } => {
                if self.next() != (Next::CallModel { step: *step }) {
                    return Err(bad("no model call is due here"));
                }
                self.model_attempts += 1;
                self.pending_model = Some(PendingModel {
                    call_id: call_id.clone(),
                    step: *step,
                });
            }
            Event::ModelCallOutcome {
                call_id,
                content,
                usage,
                cost_micro_usd,
                ..
            } => {
                let pending = self
                    .take_pending_model(call_id)
                    .ok_or_else(|| bad("no such pending model call"))?;
                self.step = pending.step;
                self.usage.add(usage);
                self.cost_micro_usd += cost_micro_usd;
                self.model_calls += 1;
                let message = Message {
                    role: Role::Assistant,
                    content: content.clone(),
                };
                self.queued_tools = message.tool_uses().cloned().collect();
                self.conversation.push(message);
            }
            Event::ModelCallInterrupted { call_id } | Event::ModelCallFailed { call_id, .. } => {
                self.take_pending_model(call_id)
                    .ok_or_else(|| bad("no such pending model call"))?;
                self.compacting = None;
            }
            // A copy of the state so far: nothing new but where it is.
            Event::Checkpoint { .. } => self.last_checkpoint = record.seq,
            Event::Pruned { .. } => {}
            Event::OutputsElided { before, .. } => {
                if !matches!(self.next(), Next::CallModel { .. }) {
                    return Err(bad("no model call is due here"));
                }
                let before = (*before as usize).min(self.conversation.len());
                for message in &mut self.conversation[..before] {
                    for block in &mut message.content {
                        if let Block::ToolResult {
                            content,
                            tool_use_id,
                            ..
                        } = block
                        {
                            if elides(content) {
                                *content = elided(content.len(), tool_use_id);
                            }
                        }
                    }
                }
            }
            Event::CompactionIntent {
                call_id,
                upto,
                inbox_id,
                ..
            } => {
                if !matches!(self.next(), Next::CallModel { .. }) {
                    return Err(bad("no model call is due here"));
                }
                if *upto as usize > self.conversation.len() {
                    return Err(bad("compaction past the conversation's end"));
                }
                self.model_attempts += 1;
                self.pending_model = Some(PendingModel {
                    call_id: call_id.clone(),
                    step: self.step,
                });
                self.compacting = Some(*upto);
                if inbox_id.is_some() {
                    self.take_inbox(*inbox_id);
                    self.compact_asked = true;
                }
            }
            Event::Compacted {
                call_id,
                summary,
                usage,
                cost_micro_usd,
                ..
            } => {
                self.take_pending_model(call_id)
                    .ok_or_else(|| bad("no such pending model call"))?;
                let upto =
                    self.compacting
                        .take()
                        .ok_or_else(|| bad("no compaction pending"))? as usize;
                let summarised = self.conversation[..upto]
                    .iter()
                    .filter(|m| m.role == Role::Assistant)
                    .count() as u32;
                self.compacted_turns += summarised;
                self.compactions += 1;
                self.compact_asked = false;
                self.usage.add(usage);
                self.cost_micro_usd += cost_micro_usd;
                self.model_calls += 1;
                let text = format!("{}{summary}", compaction_header(self.compacted_turns));
                let rest = self.conversation.split_off(upto);
                self.conversation = std::iter::once(Message::user_text(text))
                    .chain(rest)
                    .collect();
            }
            Event::ToolCallIntent {
                call_id,
                tool,
                input,
                class,
                snapshot_before,
            } => {
                if !self.may_begin(call_id) {
                    return Err(bad("this tool call is not one of the running reply's"));
                }
                if snapshot_before.is_some() {
                    self.last_snapshot = snapshot_before.clone();
                }
                self.pending_tools.push(PendingTool {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                    class: *class,
                    snapshot_before: snapshot_before.clone(),
                    egress: Vec::new(),
                });
            }
            Event::ToolCallOutcome {
                call_id,
                is_error,
                output,
                snapshot_after,
                ..
            } => {
                let pending = self
                    .take_pending_tool(call_id)
                    .ok_or_else(|| bad("no such pending tool call"))?;
                self.count_loop(&pending, snapshot_after.as_ref());
                self.note_service(&pending.tool, &pending.input, *is_error);
                if snapshot_after.is_some() {
                    self.last_snapshot = snapshot_after.clone();
                }
                self.push_result(call_id, output.for_model(), *is_error);
            }
            Event::ToolCallInterrupted {
                call_id,
                resolution,
            } => {
                self.take_pending_tool(call_id)
                    .ok_or_else(|| bad("no such pending tool call"))?;
                match resolution {
                    ToolResolution::Rerun => {}
                    ToolResolution::RolledBack { snapshot } => {
                        if snapshot.is_some() {
                            self.last_snapshot = snapshot.clone();
                        }
                        self.push_result(call_id, INTERRUPTED_ROLLED_BACK.to_string(), true);
                    }
                    ToolResolution::OutcomeUnknown => {
                        self.push_result(call_id, INTERRUPTED_OUTCOME_UNKNOWN.to_string(), true);
                    }
                    ToolResolution::Reconciled { done: false, .. } => {}
                    ToolResolution::Reconciled {
                        done: true,
                        evidence,
                    } => {
                        self.push_result(call_id, evidence.clone(), false);
                    }
                }
            }
            Event::Escalated {
                breaker, reason, ..
            } => {
                if self.status != Status::Running || self.waiting.is_some() {
                    return Err(bad("only a running turn can be escalated"));
                }
                self.status = Status::Escalated;
                self.escalated = Some(*breaker);
                self.waiting = Some(Wait {
                    seq: record.seq,
                    name: RESUME_SIGNAL.to_string(),
                    reason: reason.clone(),
                    call_id: None,
                    before_call: None,
                });
            }
            Event::Egress {
                call_ids,
                destination,
                admitted,
                denied,
            } => {
                for id in call_ids {
                    let call =
                        if let Some(p) = self.pending_tools.iter_mut().find(|p| &p.call_id == id) {
                            if *admitted && !p.egress.contains(destination) {
                                p.egress.push(destination.clone());
                            }
                            (p.tool.clone(), p.input.clone())
                        } else if let Some(t) = self
                            .wrapped_tools
                            .iter_mut()
                            .find(|t| &t.call_id == id && t.result.is_none())
                        {
                            if *admitted && !t.egress.contains(destination) {
                                t.egress.push(destination.clone());
                            }
                            (t.tool.clone(), t.input.clone())
                        } else {
                            // Its outcome was recorded a moment before (the connection
                            // came as it ended): nothing is left to resolve.
                            continue;
                        };
                    if !admitted && !denied {
                        let held = HeldConnection {
                            tool: call.0.clone(),
                            input: call.1.clone(),
                            destination: destination.clone(),
                        };
                        if !self.held_for_approval.contains(&held) {
                            self.held_for_approval.push(held);
                        }
                    }
                    if !self.reaches_network.contains(&call) {
                        self.reaches_network.push(call);
                    }
                }
            }
            Event::ServicesRestarted { services, .. } => {
                for (name, how) in services {
                    match self.services.iter_mut().find(|s| &s.name == name) {
                        Some(s) if how == "started" => s.restarts += 1,
                        // One that could not be started again is not running.
                        Some(_) => self.services.retain(|s| &s.name != name),
                        None => {}
                    }
                }
            }
            Event::SandboxLost { call_id, .. } => {
                if let Some(id) = call_id {
                    let native = self.pending_tool(id).is_some();
                    let wrapped = self
                        .wrapped_tools
                        .iter()
                        .any(|t| &t.call_id == id && t.result.is_none());
                    if !native && !wrapped {
                        return Err(bad("the lost call is not in flight"));
                    }
                }
            }
            Event::TurnInterrupted {
                turn,
                by,
                inbox_id,
                stopped,
                not_begun,
                ..
            } => {
                self.take_inbox(Some(*inbox_id));
                if *stopped {
                    if *turn != self.turn
                        || !matches!(self.status, Status::Running | Status::Waiting)
                        || !self.pending_tools.is_empty()
                    {
                        return Err(bad(
                            "an interrupt stops a running turn, after its tool outcome",
                        ));
                    }
                    for id in not_begun {
                        if !self.queued_tools.iter().any(|t| &t.id == id) {
                            return Err(bad(
                                "an interrupt names a call that is not waiting to begin",
                            ));
                        }
                        self.push_result(id, format!("{INTERRUPTED_NOT_BEGUN} by {by}"), true);
                    }
                    self.pending_model = None;
                    self.waiting = None;
                    self.status = Status::Idle;
                    self.interrupted_by = Some(by.clone());
                    // The model learns of it with the next turn: the conversation says
                    // where its work stopped, and keeps user and assistant alternating.
                    self.conversation.push(Message {
                        role: Role::Assistant,
                        content: vec![Block::Text {
                            text: format!(
                                "[This turn was interrupted by {by} before it finished.]"
                            ),
                        }],
                    });
                }
            }
            Event::TurnEnded { turn, reply } => {
                let finished = if self.is_wrapped() {
                    self.status == Status::Running
                } else {
                    self.next() == Next::EndTurn
                };
                if *turn != self.turn || !finished {
                    return Err(bad("the turn is not finished"));
                }
                self.status = Status::Idle;
                self.explorer_answered |= self.explorer.is_some();
                if let Some(reply) = reply {
                    self.wrapped_reply = Some(reply.clone());
                    // A wrapped agent's answer joins the conversation: the history the
                    // next turn's CLI is given (it keeps no memory between runs).
                    if self.is_wrapped() {
                        self.conversation.push(Message {
                            role: Role::Assistant,
                            content: vec![Block::Text {
                                text: reply.clone(),
                            }],
                        });
                    }
                }
            }
            Event::ExchangeIntent {
                call_id,
                index,
                api,
                fingerprint,
                stream,
                snapshot,
                ..
            } => {
                let exchange = Exchange {
                    call_id: call_id.clone(),
                    api: api.clone(),
                    fingerprint: fingerprint.clone(),
                    stream: *stream,
                    snapshot: snapshot.clone(),
                    reply: None,
                };
                let (at, len) = (*index as usize, self.exchanges.len());
                match self.exchanges.get_mut(at) {
                    None if at == len => self.exchanges.push(exchange),
                    Some(old) if old.reply.is_none() => {
                        self.superseded_exchanges.push(old.call_id.clone());
                        *old = exchange;
                    }
                    _ => {
                        return Err(bad(
                            "an exchange index must be the next one or a cut-off one",
                        ))
                    }
                }
            }
            Event::ExchangeOutcome {
                call_id,
                status,
                content_type,
                body,
                usage,
                cost_micro_usd,
            } => {
                // Paid for whether or not the reply is used.
                if let Some(u) = usage {
                    self.usage.add(u);
                }
                self.cost_micro_usd += cost_micro_usd;
                self.model_calls += 1;
                match self
                    .exchanges
                    .iter_mut()
                    .find(|e| &e.call_id == call_id && e.reply.is_none())
                {
                    Some(exchange) => {
                        exchange.reply = Some((*status, content_type.clone(), body.clone()))
                    }
                    // A reply that finished streaming after its request was asked
                    // again (or superseded by a divergence): kept, but not used.
                    None if self.superseded_exchanges.contains(call_id) => {}
                    None => return Err(bad("no such pending exchange")),
                }
            }
            Event::ConversationKept { turn, conversation } => {
                if *turn != self.turn || !self.is_wrapped() {
                    return Err(bad(
                        "a wrapped agent's conversation is kept for its own turn",
                    ));
                }
                self.kept_conversation = Some(conversation.clone());
            }
            Event::ReplayDiverged { index, snapshot } => {
                if *index as usize > self.exchanges.len() {
                    return Err(bad("divergence past the recorded exchanges"));
                }
                let cut = (*index as usize).min(self.exchanges.len());
                let gone = self.exchanges.drain(cut..).map(|e| e.call_id);
                self.superseded_exchanges.extend(gone);
                let (kept, superseded) = std::mem::take(&mut self.wrapped_tools)
                    .into_iter()
                    .partition(|t| t.after_exchanges <= *index);
                self.wrapped_tools = kept;
                self.external_facts
                    .extend(superseded.into_iter().filter(WrappedTool::is_external_fact));
                if snapshot.is_some() {
                    self.last_snapshot = snapshot.clone();
                }
            }
            Event::SessionEnded { state, reason, .. } => {
                self.status = match state {
                    EndState::Completed => Status::Completed,
                    EndState::Failed => Status::Failed,
                    EndState::Escalated => Status::Escalated,
                    EndState::Closed => Status::Closed,
                };
                self.end_reason = Some(reason.clone());
                self.ended = true;
                self.escalated = None;
                self.pending_model = None;
                self.pending_tools.clear();
                self.waiting = None;
            }
        }
        self.last_seq = record.seq;
        Ok(())
    }

    /// Becomes a fork of this state in its own logical `workspace` (and speaking to
    /// `model`, if given): open again if it had ended; a turn in progress stays in
    /// progress, for a wake to resolve its cut-off calls.
    fn fork(&mut self, workspace: &str, model: Option<&ModelSpec>) -> Result<(), &'static str> {
        if !is_workspace_id(workspace) {
            return Err("a fork works in a logical workspace of its own");
        }
        if workspace == self.workspace || self.former_workspaces.iter().any(|w| w == workspace) {
            return Err("a fork's workspace is one its history already used");
        }
        if !is_workspace_id(&self.workspace) {
            // The native prompt named the parent's directory; a logical workspace is
            // wherever the sandbox puts it, as in a session begun in one.
            self.system = self.system.replace(
                &format!("the directory {}", self.workspace),
                "the current directory",
            );
        }
        self.former_workspaces.push(std::mem::replace(
            &mut self.workspace,
            workspace.to_string(),
        ));
        self.workspace_host = None;
        if let Some(model) = model {
            self.model = model.clone();
        }
        if self.ended {
            self.ended = false;
            self.status = Status::Idle;
            self.end_reason = None;
        }
        self.retry = None;
        self.failures_in_row = 0;
        Ok(())
    }

    /// Becomes the state at a rewind's point again (it is already: the records set
    /// aside were never folded here); the external effects they recorded are told to
    /// the model with the next user message.
    fn rewind(&mut self, facts: &[String]) {
        self.retry = None;
        self.failures_in_row = 0;
        self.rewound_workspace = true;
        if !facts.is_empty() {
            let mut note = String::from(
                "[steadfast] This session was rewound to an earlier point: the work that \
                 followed it was set aside and the workspace is as it was then. These \
                 external effects had already happened after that point and still stand:",
            );
            for fact in facts {
                note.push_str(&format!("\n- {fact}"));
            }
            self.note_for_next_turn(&note);
        }
    }

    /// Adds `note` to what the model is told with the next user message.
    fn note_for_next_turn(&mut self, note: &str) {
        self.rewind_note = Some(match self.rewind_note.take() {
            Some(earlier) => format!("{earlier}\n\n{note}"),
            None => note.to_string(),
        });
    }

    /// Applies a `resume` signal's payload after `breaker` stopped the session.
    fn resume(&mut self, breaker: Breaker, payload: &Value) {
        let (raise, _) = Limits::from_resume(payload);
        self.limits = self.limits.raised(&raise);
        match breaker {
            Breaker::Loop => self.loop_streak = 0,
            Breaker::Steps => {
                self.steps_from = self.step;
                self.exchanges_from = self.exchanges.len() as u32;
            }
            _ => {}
        }
    }

    /// Keeps the services current with a finished call of the `service` tool: a
    /// start that succeeded adds one, a stop removes it.
    fn note_service(&mut self, tool: &str, input: &Value, is_error: bool) {
        if tool != "service" || is_error {
            return;
        }
        let text = |key: &str| input.get(key).and_then(Value::as_str).unwrap_or_default();
        let name = text("name").to_string();
        match text("action") {
            "start" => {
                self.services.retain(|s| s.name != name);
                self.services.push(ServiceRecord {
                    name,
                    command: text("command").to_string(),
                    port: input
                        .get("port")
                        .and_then(Value::as_u64)
                        .and_then(|p| u16::try_from(p).ok()),
                    restarts: 0,
                });
            }
            "stop" => self.services.retain(|s| s.name != name),
            _ => {}
        }
    }

    /// Counts a finished tool call towards the loop breaker.
    fn count_loop(&mut self, call: &PendingTool, snapshot_after: Option<&String>) {
        let unchanged = match snapshot_after {
            None => true,
            Some(after) => call.snapshot_before.as_ref() == Some(after),
        };
        self.count_call(&call.tool, &call.input, unchanged);
    }

    /// Counts a finished tool call (`unchanged`: it left the workspace as it was)
    /// towards the loop breaker.
    fn count_call(&mut self, tool: &str, input: &Value, unchanged: bool) {
        let same = self
            .last_tool_call
            .as_ref()
            .is_some_and(|(name, last)| name == tool && last == input);
        self.loop_streak = match (unchanged, same) {
            (false, _) => 0,
            (true, true) => self.loop_streak + 1,
            (true, false) => 1,
        };
        self.last_tool_call = Some((tool.to_string(), input.clone()));
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
        !self.ended
            && self.waiting.is_none()
            && self.pending_model.is_none()
            && self.status == Status::Running
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

    /// The tool-use ids of the last assistant message, in its order.
    fn tool_use_order(&self) -> Vec<String> {
        self.conversation
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(|m| m.tool_uses().map(|t| t.id.clone()).collect())
            .unwrap_or_default()
    }

    /// Records a tool result: removes the call from the queue and adds its result to
    /// the user message that follows the model's reply.
    /// Results stand in the order of the reply's tool uses, however the calls finished
    /// (calls of one reply may run at once): the conversation is the same whichever
    /// finished first.
    fn push_result(&mut self, call_id: &str, content: String, is_error: bool) {
        self.queued_tools.retain(|t| t.id != call_id);
        let block = Block::ToolResult {
            tool_use_id: call_id.to_string(),
            content,
            is_error,
        };
        let order = self.tool_use_order();
        let rank = |id: &str| order.iter().position(|o| o == id).unwrap_or(usize::MAX);
        match self.conversation.last_mut() {
            Some(m)
                if m.role == Role::User
                    && matches!(m.content.first(), Some(Block::ToolResult { .. })) =>
            {
                let mine = rank(call_id);
                let at = m
                    .content
                    .iter()
                    .position(|b| match b {
                        Block::ToolResult { tool_use_id, .. } => rank(tool_use_id) > mine,
                        _ => false,
                    })
                    .unwrap_or(m.content.len());
                m.content.insert(at, block)
            }
            _ => self.conversation.push(Message {
                role: Role::User,
                content: vec![block],
            }),
        }
    }
}

#[cfg(test)]
mod tests;
