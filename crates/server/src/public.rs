//! The public event schema (version [`SCHEMA`]): what clients are sent of each log
//! record, in the event stream and the JSON pages alike. Every event is an object with
//! `type` (the record's kind), `seq` (its log position, also the SSE id) and `at_ms`,
//! and the fields of its kind, flat. The kinds are the variants of [`EventBody`]; the
//! OpenAPI document describes each one from these types. Storage internals never
//! appear: no lease epochs, request fingerprints, snapshot ids, inbox ids, host paths,
//! system prompts or raw provider replies. Each kind is written out field by field (no
//! internal record is passed through), so a field added to the log stays internal
//! until it is added here. The internal records stay available to operators
//! (`steadfast log --json`).

use serde::Serialize;
use serde_json::Value;
use steadfast_log::{
    Block, Breaker, EndState, Event, Limits, Output, Record, ToolClass, ToolResolution, Usage,
};
use utoipa::ToSchema;

/// The schema's version, sent as `schema` in every JSON page.
pub(crate) const SCHEMA: u32 = 1;

/// How much of a tool's output an event carries; the rest is in the workspace's log
/// (`steadfast log`) and, for big outputs, the blob store.
const EXCERPT: usize = 4096;

/// One event of a session, as clients see it: its position, its time, and the fields
/// of its `type`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PublicEvent {
    /// The log position, also the event's SSE id.
    pub seq: u64,
    /// When it was recorded, ms since the Unix epoch.
    pub at_ms: u64,
    /// `type` and the fields of that type.
    #[serde(flatten)]
    pub body: EventBody,
}

/// A service started again with a new sandbox.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ServiceRestart {
    /// Its name.
    pub name: String,
    /// `started`, or why it could not be.
    pub how: String,
}

/// Every type of public event, with its fields.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// The session began.
    SessionStarted {
        /// `native` or the wrapped agent.
        agent: String,
        /// The wrapped agent's CLI the session runs, `package@version` (hosts without
        /// that version leave the session to one that has it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_cli: Option<String>,
        /// `provider/model`.
        model: String,
        /// Whether external-effect calls wait for the `approval` signal.
        approve_external: bool,
        /// The approval policy's layers (the operator's, the named agent's, the
        /// session's own); the strictest verdict of all stands.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        approval: Vec<steadfast_log::ApprovalPolicy>,
        /// The session's bounds.
        limits: Limits,
        /// Its network policy, if it has its own.
        #[schema(required = true)]
        network: Option<String>,
        /// The repository the workspace was cloned from (and `git_push` pushes to).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        git: Option<steadfast_log::GitSource>,
        /// The caller's own MCP servers whose tools the agent is offered.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        mcp_servers: Vec<steadfast_log::McpServer>,
    },
    /// A user message: a turn starts.
    UserMessage {
        /// The turn it opens.
        turn: u32,
        /// What the user said.
        text: String,
    },
    /// A message that reached the running turn.
    Steered {
        /// What the user said.
        text: String,
    },
    /// Streamed text of a model reply, in pieces.
    ModelDelta {
        /// The model call.
        call_id: String,
        /// The next piece of text.
        text: String,
        /// Whether the reply so far was discarded (a re-issued call).
        restart: bool,
    },
    /// The session waits for a named signal.
    WaitStarted {
        /// The signal awaited.
        signal: String,
        /// Why.
        reason: String,
        /// The tool call whose result the signal will be, if any.
        #[schema(required = true)]
        call_id: Option<String>,
    },
    /// A signal arrived.
    SignalReceived {
        /// Its name.
        signal: String,
        /// Its payload.
        payload: Value,
    },
    /// A model call begins (the native agent).
    ModelCallIntent {
        /// The call.
        call_id: String,
        /// Its step in the turn.
        step: u32,
    },
    /// A model call's reply.
    ModelCallOutcome {
        /// The call.
        call_id: String,
        /// Why the model stopped.
        stop_reason: String,
        /// The reply's text.
        text: String,
        /// The tools it called.
        tool_uses: Vec<ToolUseRef>,
        /// Tokens it used.
        usage: Usage,
        /// What it cost.
        cost_usd: f64,
    },
    /// Old tool outputs were elided from what the model is sent (the log keeps them),
    /// to stay within its context window.
    OutputsElided {
        /// Messages before this position lost their long tool outputs.
        before: u32,
        /// The request's estimated size before, tokens.
        tokens_before: u64,
        /// And after.
        tokens_after: u64,
    },
    /// The session's state so far was stored, so waking it reads only what follows.
    Checkpoint {},
    /// What this record held was removed by retention (e.g. a streamed piece of a
    /// reply whose turn ended long ago; the reply's outcome holds it whole).
    Pruned {
        /// The kind of event it was.
        was: String,
        /// Its size then, in bytes.
        bytes: u64,
    },
    /// The conversation is being compacted: a model call summarises its older messages.
    CompactionIntent {
        /// The summarising call.
        call_id: String,
        /// The messages before this position are summarised.
        upto: u32,
        /// The request's estimated size before, tokens.
        tokens_before: u64,
    },
    /// The conversation was compacted: the summary stands for the older messages in
    /// what the model is sent (the log keeps them all).
    Compacted {
        /// The summarising call.
        call_id: String,
        /// The summary.
        summary: String,
        /// The request's estimated size after, tokens.
        tokens_after: u64,
        /// Tokens the summarising call used.
        usage: Usage,
        /// What it cost.
        cost_usd: f64,
    },
    /// A model call cut off (a crash, a dropped stream); it is asked again.
    ModelCallInterrupted {
        /// The call.
        call_id: String,
    },
    /// A model call that failed for good.
    ModelCallFailed {
        /// The call.
        call_id: String,
        /// What went wrong.
        message: String,
    },
    /// A tool call begins.
    ToolCallIntent {
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Its input, as the model gave it.
        input: Value,
        /// How it may affect the world.
        class: ToolClass,
    },
    /// A tool call's result.
    ToolCallOutcome {
        /// The call.
        call_id: String,
        /// Whether the tool reported an error.
        is_error: bool,
        /// The command's exit status, for commands.
        #[schema(required = true)]
        exit_code: Option<i32>,
        /// What it printed or returned.
        output: ToolOutput,
        /// Bytes of new workspace objects its snapshots stored (0 for a call that
        /// changed nothing new): with an offloaded output's, what the session's
        /// history keeps for it, counted against the operator's history quota.
        stored_bytes: u64,
    },
    /// A tool call cut off, and how it was resolved.
    ToolCallInterrupted {
        /// The call.
        call_id: String,
        /// What was done about it.
        resolution: Resolution,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn.
        turn: u32,
        /// Its final answer.
        #[schema(required = true)]
        reply: Option<String>,
    },
    /// A turn was interrupted.
    TurnInterrupted {
        /// The turn.
        turn: u32,
        /// Who interrupted it.
        by: String,
        /// The call in flight, if any.
        #[schema(required = true)]
        call_id: Option<String>,
        /// Whether the turn is over (the session idle).
        stopped: bool,
    },
    /// A bound stopped the session until a `resume` signal.
    Escalated {
        /// The bound.
        breaker: Breaker,
        /// Why, in words.
        reason: String,
        /// The workspace's changed paths since the session began.
        diff: Vec<String>,
    },
    /// A worker could not drive the session (sent as `error` in streams and pages).
    DriveFailed {
        /// What went wrong.
        reason: String,
        /// Failures in a row.
        attempt: u32,
        /// When the next attempt may begin; none when the failure is final.
        #[schema(required = true)]
        retry_at_ms: Option<u64>,
    },
    /// A connection out of the sandbox, seen at the egress proxy while tool calls ran
    /// (recorded before its first byte went out), or held back by the approval policy.
    Egress {
        /// The calls running when it was opened.
        call_ids: Vec<String>,
        /// Where to: `host:port`.
        destination: String,
        /// Whether it was let through (false: held back, nothing sent).
        admitted: bool,
        /// Held back because the approval policy denies it (no one is asked).
        denied: bool,
    },
    /// The sandbox died (killed, out of memory) and was replaced.
    SandboxLost {
        /// The call it was running, if any.
        #[schema(required = true)]
        call_id: Option<String>,
        /// What happened.
        reason: String,
    },
    /// The sandbox was started anew and the session's services started again in it.
    ServicesRestarted {
        /// The call whose sandbox it was, if any.
        #[schema(required = true)]
        call_id: Option<String>,
        /// Each service's name and how its start went (`started`, or why not).
        services: Vec<ServiceRestart>,
    },
    /// A wrapped agent's model request.
    ExchangeIntent {
        /// The exchange.
        call_id: String,
        /// Its position in the turn.
        index: u32,
        /// The wire format, as recorded.
        api: steadfast_log::Api,
        /// Whether the reply streams.
        stream: bool,
    },
    /// A wrapped agent's model reply.
    ExchangeOutcome {
        /// The exchange.
        call_id: String,
        /// The provider's HTTP status.
        status: u16,
        /// Tokens it used, when the reply says.
        #[schema(required = true)]
        usage: Option<Usage>,
        /// What it cost.
        cost_usd: f64,
    },
    /// A wrapped agent replayed after a crash asked something new from here on.
    ReplayDiverged {
        /// The first exchange that differed.
        index: u32,
    },
    /// A wrapped CLI's conversation was kept when its run for the turn stopped: the
    /// next turn's CLI continues it, with every earlier message, tool call and result.
    ConversationKept {
        /// The turn whose run kept it.
        turn: u32,
    },
    /// Its user moved a session bound to a directory to another directory (on this
    /// host or another), where it is driven from here on. Which directory and host
    /// are for operators (`steadfast log`): host paths never reach clients.
    WorkspaceMoved {},
    /// Its owner moved the wrapped session to another CLI version or named agent;
    /// its next turn runs that CLI.
    AgentChanged {
        /// The agent from here on.
        agent: String,
        /// The CLI it stands for, `package@version`.
        cli: String,
    },
    /// Between turns the session's directory was found changed from outside it (a
    /// person, an editor, a build): the session goes on from the files as they were
    /// left, and the model is told. `changes` lists what changed, a line per path.
    WorkspaceEdited {
        /// What changed, a line per path (`modified src/x.rs`).
        changes: Vec<String>,
    },
    /// A person's shell in the session's sandbox: who, since when, whether they left,
    /// and what they changed, a line per path (the model is told with its next user
    /// message).
    HumanShell {
        /// Who attached.
        by: String,
        /// When the shell was opened, Unix ms.
        since_ms: u64,
        /// Whether the person has left (`false`: recorded while still attached).
        detached: bool,
        /// What changed, a line per path.
        changes: Vec<String>,
    },
    /// The session began as a fork of `parent`: the events before this one are the
    /// parent's up to `at`; from here on it is a session of its own.
    Forked {
        /// The session forked.
        parent: String,
        /// The parent's last event this session shares.
        at: u64,
        /// The model spoken to from here on, when it is not the parent's.
        #[serde(skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// The agent run from here on (`name (package@version)`), when it is not the
        /// parent's: a replay against another CLI.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
    },
    /// The session was rewound to `to`: the events after it (before this one) are set
    /// aside, readable whole as the fork `branch`; a reader following the stream
    /// carries on from here. `facts` are the external effects those events recorded,
    /// which still stand (the model is told with the next message).
    Rewound {
        /// The last event the session keeps.
        to: u64,
        /// The fork holding the events set aside.
        #[serde(skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
        /// The external effects set-aside events recorded, in words.
        facts: Vec<String>,
    },
    /// The session ended for good.
    SessionEnded {
        /// How.
        state: EndState,
        /// Why.
        reason: String,
        /// The workspace's changed paths since the session began.
        diff: Vec<String>,
    },
    /// Replace the turn's text shown so far with `text`: a reply a crash cut short is
    /// asked again (sent for the record that re-issues it).
    Restart {
        /// The turn's text before the cut-off reply.
        text: String,
    },
    /// A failure to show: a retry scheduled, a failure that ended the session, or a
    /// log that could not be read (then `seq` is the last position delivered).
    Error {
        /// What failed.
        error: StreamError,
        /// The model call that failed, if one did.
        #[serde(skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
}

/// A tool call named in a model reply.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolUseRef {
    /// The tool call's id (its `call_id` in tool events).
    pub id: String,
    /// The tool.
    pub name: String,
}

/// A tool's output: an excerpt, and for big outputs the blob holding all of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolOutput {
    /// The output's beginning (at most 4 KiB).
    pub excerpt: String,
    /// The output's end, for big outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excerpt_end: Option<String>,
    /// Whether the excerpts leave part of it out.
    pub truncated: bool,
    /// Its whole length.
    pub bytes: u64,
    /// The blob holding all of it, for big outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob: Option<BlobLink>,
}

/// A blob, named by content.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BlobLink {
    /// BLAKE3 of its bytes, hex.
    pub hash: String,
    /// Its length.
    pub bytes: u64,
}

/// How an interrupted tool call was resolved.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resolution {
    /// A read: run again.
    Rerun,
    /// A mutation: the workspace was restored to its snapshot.
    RolledBack,
    /// An external effect: not run again; whether it happened is unknown.
    OutcomeUnknown,
    /// An external effect a reconciler observed.
    Reconciled {
        /// Whether it had happened.
        done: bool,
        /// What the reconciler saw.
        evidence: String,
    },
}

/// What an `error` event reports.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamError {
    /// `retrying` (another attempt is scheduled), `failed` (over) or `log_unreadable`.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
    /// Failures in a row, for a worker's failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// When the next attempt may begin, while retrying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at_ms: Option<u64>,
}

/// The kinds of failure an `error` event reports.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Another attempt is scheduled.
    Retrying,
    /// The failure is final.
    Failed,
    /// The session's log could not be read; the stream ends.
    LogUnreadable,
}

/// The public event of `record`.
pub(crate) fn event(record: &Record) -> PublicEvent {
    PublicEvent {
        seq: record.seq,
        at_ms: record.at_ms,
        body: body(&record.event),
    }
}

/// The `error` event a failure the log records is shown as, if `event` is one: a
/// retry that is scheduled (`retrying`, with when) or a failure that is final.
pub(crate) fn error(event: &Event) -> Option<EventBody> {
    match event {
        Event::DriveFailed {
            reason,
            attempt,
            retry_at_ms,
        } => Some(EventBody::Error {
            error: StreamError {
                code: match retry_at_ms {
                    Some(_) => ErrorCode::Retrying,
                    None => ErrorCode::Failed,
                },
                message: reason.clone(),
                attempt: Some(*attempt),
                next_attempt_at_ms: *retry_at_ms,
            },
            call_id: None,
        }),
        Event::ModelCallFailed { call_id, error } => Some(EventBody::Error {
            error: StreamError {
                code: ErrorCode::Failed,
                message: error.clone(),
                attempt: None,
                next_attempt_at_ms: None,
            },
            call_id: Some(call_id.clone()),
        }),
        _ => None,
    }
}

fn cost_usd(micro: u64) -> f64 {
    steadfast_log::money::usd(micro)
}

/// The first `max` bytes of `text` (on a character boundary), and whether it was cut.
fn excerpt(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

fn output(output: &Output) -> ToolOutput {
    match output {
        Output::Inline { text } => {
            let (shown, truncated) = excerpt(text, EXCERPT);
            ToolOutput {
                excerpt: shown.to_string(),
                excerpt_end: None,
                truncated,
                bytes: text.len() as u64,
                blob: None,
            }
        }
        Output::Blob(blob) => {
            let (head, _) = excerpt(&blob.head, EXCERPT / 2);
            let (tail, _) = excerpt(&blob.tail, EXCERPT / 2);
            ToolOutput {
                excerpt: head.to_string(),
                excerpt_end: Some(tail.to_string()),
                truncated: true,
                bytes: blob.size,
                blob: Some(BlobLink {
                    hash: blob.hash.clone(),
                    bytes: blob.size,
                }),
            }
        }
    }
}

fn resolution(resolution: &ToolResolution) -> Resolution {
    match resolution {
        ToolResolution::Rerun => Resolution::Rerun,
        ToolResolution::RolledBack { .. } => Resolution::RolledBack,
        ToolResolution::OutcomeUnknown => Resolution::OutcomeUnknown,
        ToolResolution::Reconciled { done, evidence } => Resolution::Reconciled {
            done: *done,
            evidence: evidence.clone(),
        },
    }
}

/// The public fields of each kind of event. Matched by reference: a record's big
/// internal fields (a wrapped agent's raw reply) are never copied.
fn body(event: &Event) -> EventBody {
    let s = |v: &String| v.clone();
    match event {
        Event::SessionStarted {
            agent,
            agent_cli,
            model,
            approve_external,
            approval,
            limits,
            network,
            git,
            mcp_servers,
            ..
        } => EventBody::SessionStarted {
            agent: agent.to_string(),
            agent_cli: agent_cli.clone(),
            model: format!("{}/{}", model.provider, model.model),
            approve_external: *approve_external,
            approval: approval.clone(),
            limits: *limits,
            network: network.as_ref().map(ToString::to_string),
            git: git.as_deref().cloned(),
            mcp_servers: mcp_servers.clone(),
        },
        Event::UserMessage { turn, text, .. } => EventBody::UserMessage {
            turn: *turn,
            text: s(text),
        },
        Event::Steered { text, .. } => EventBody::Steered { text: s(text) },
        Event::ModelDelta {
            call_id,
            text,
            restart,
        } => EventBody::ModelDelta {
            call_id: s(call_id),
            text: s(text),
            restart: *restart,
        },
        Event::WaitStarted {
            name,
            reason,
            call_id,
            ..
        } => EventBody::WaitStarted {
            signal: s(name),
            reason: s(reason),
            call_id: call_id.clone(),
        },
        Event::SignalReceived { name, payload, .. } => EventBody::SignalReceived {
            signal: s(name),
            payload: payload.clone(),
        },
        Event::ModelCallIntent { call_id, step, .. } => EventBody::ModelCallIntent {
            call_id: s(call_id),
            step: *step,
        },
        Event::ModelCallOutcome {
            call_id,
            content,
            stop_reason,
            usage,
            cost_micro_usd,
        } => {
            let text: Vec<&str> = content
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            let tool_uses = content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse(u) => Some(ToolUseRef {
                        id: u.id.clone(),
                        name: u.name.clone(),
                    }),
                    _ => None,
                })
                .collect();
            EventBody::ModelCallOutcome {
                call_id: s(call_id),
                stop_reason: s(stop_reason),
                text: text.join("\n"),
                tool_uses,
                usage: *usage,
                cost_usd: cost_usd(*cost_micro_usd),
            }
        }
        Event::OutputsElided {
            before,
            tokens_before,
            tokens_after,
        } => EventBody::OutputsElided {
            before: *before,
            tokens_before: *tokens_before,
            tokens_after: *tokens_after,
        },
        Event::Checkpoint { .. } => EventBody::Checkpoint {},
        Event::Pruned { was, bytes } => EventBody::Pruned {
            was: s(was),
            bytes: *bytes,
        },
        Event::CompactionIntent {
            call_id,
            upto,
            tokens_before,
            ..
        } => EventBody::CompactionIntent {
            call_id: s(call_id),
            upto: *upto,
            tokens_before: *tokens_before,
        },
        Event::Compacted {
            call_id,
            summary,
            tokens_after,
            usage,
            cost_micro_usd,
        } => EventBody::Compacted {
            call_id: s(call_id),
            summary: s(summary),
            tokens_after: *tokens_after,
            usage: *usage,
            cost_usd: cost_usd(*cost_micro_usd),
        },
        Event::ModelCallInterrupted { call_id } => EventBody::ModelCallInterrupted {
            call_id: s(call_id),
        },
        Event::ModelCallFailed { call_id, error } => EventBody::ModelCallFailed {
            call_id: s(call_id),
            message: s(error),
        },
        Event::ToolCallIntent {
            call_id,
            tool,
            input,
            class,
            ..
        } => EventBody::ToolCallIntent {
            call_id: s(call_id),
            tool: s(tool),
            input: input.clone(),
            class: *class,
        },
        Event::ToolCallOutcome {
            call_id,
            is_error,
            exit_code,
            output: out,
            stored_bytes,
            ..
        } => EventBody::ToolCallOutcome {
            call_id: s(call_id),
            is_error: *is_error,
            exit_code: *exit_code,
            output: output(out),
            stored_bytes: *stored_bytes,
        },
        Event::ToolCallInterrupted {
            call_id,
            resolution: r,
        } => EventBody::ToolCallInterrupted {
            call_id: s(call_id),
            resolution: resolution(r),
        },
        Event::TurnEnded { turn, reply } => EventBody::TurnEnded {
            turn: *turn,
            reply: reply.clone(),
        },
        Event::TurnInterrupted {
            turn,
            by,
            call_id,
            stopped,
            ..
        } => EventBody::TurnInterrupted {
            turn: *turn,
            by: s(by),
            call_id: call_id.clone(),
            stopped: *stopped,
        },
        Event::Escalated {
            breaker,
            reason,
            diff,
        } => EventBody::Escalated {
            breaker: *breaker,
            reason: s(reason),
            diff: diff.clone(),
        },
        Event::DriveFailed {
            reason,
            attempt,
            retry_at_ms,
        } => EventBody::DriveFailed {
            reason: s(reason),
            attempt: *attempt,
            retry_at_ms: *retry_at_ms,
        },
        Event::Egress {
            call_ids,
            destination,
            admitted,
            denied,
        } => EventBody::Egress {
            call_ids: call_ids.clone(),
            destination: s(destination),
            admitted: *admitted,
            denied: *denied,
        },
        Event::SandboxLost { call_id, reason } => EventBody::SandboxLost {
            call_id: call_id.clone(),
            reason: s(reason),
        },
        Event::ServicesRestarted { call_id, services } => EventBody::ServicesRestarted {
            call_id: call_id.clone(),
            services: services
                .iter()
                .map(|(name, how)| ServiceRestart {
                    name: s(name),
                    how: s(how),
                })
                .collect(),
        },
        Event::ExchangeIntent {
            call_id,
            index,
            api,
            stream,
            ..
        } => EventBody::ExchangeIntent {
            call_id: s(call_id),
            index: *index,
            api: *api,
            stream: *stream,
        },
        Event::ExchangeOutcome {
            call_id,
            status,
            usage,
            cost_micro_usd,
            ..
        } => EventBody::ExchangeOutcome {
            call_id: s(call_id),
            status: *status,
            usage: *usage,
            cost_usd: cost_usd(*cost_micro_usd),
        },
        Event::ReplayDiverged { index, .. } => EventBody::ReplayDiverged { index: *index },
        Event::ConversationKept { turn, .. } => EventBody::ConversationKept { turn: *turn },
        Event::WorkspaceMoved { .. } => EventBody::WorkspaceMoved {},
        Event::AgentChanged { agent, cli, .. } => EventBody::AgentChanged {
            agent: agent.to_string(),
            cli: cli.clone(),
        },
        Event::WorkspaceEdited { changes, .. } => EventBody::WorkspaceEdited {
            changes: changes.clone(),
        },
        Event::HumanShell {
            by,
            since_ms,
            detached,
            changes,
            ..
        } => EventBody::HumanShell {
            by: by.clone(),
            since_ms: *since_ms,
            detached: *detached,
            changes: changes.clone(),
        },
        Event::Rewound { to, branch, facts } => EventBody::Rewound {
            to: *to,
            branch: branch.clone(),
            facts: facts.clone(),
        },
        Event::Forked {
            parent,
            at,
            model,
            agent,
            ..
        } => EventBody::Forked {
            parent: s(parent),
            at: *at,
            model: model
                .as_ref()
                .map(|m| format!("{}/{}", m.provider, m.model)),
            agent: agent.as_ref().map(|(name, cli)| format!("{name} ({cli})")),
        },
        Event::SessionEnded {
            state,
            reason,
            diff,
        } => EventBody::SessionEnded {
            state: *state,
            reason: s(reason),
            diff: diff.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use steadfast_log::{BlobRef, ModelSpec, ToolClass};

    fn json_of(record: &Record) -> Value {
        serde_json::to_value(event(record)).unwrap()
    }

    fn record(event: Event) -> Record {
        Record {
            seq: 7,
            epoch: 3,
            at_ms: 1_000,
            event,
        }
    }

    #[test]
    fn internals_never_reach_clients() {
        let internal = [
            Event::bare_start(
                "native",
                ModelSpec {
                    provider: "anthropic".into(),
                    model: "claude-sonnet-4-5".into(),
                },
                "/srv/steadfast/workspaces/ws_secret_path",
            ),
            Event::ModelCallIntent {
                call_id: "mc_1".into(),
                step: 1,
                fingerprint: "f1ngerpr1nt".into(),
            },
            Event::ToolCallIntent {
                call_id: "t1".into(),
                tool: "bash".into(),
                input: json!({"command": "ls"}),
                class: ToolClass::Read,
                snapshot_before: Some("snap_before_id".into()),
            },
            Event::ExchangeIntent {
                call_id: "gx_1".into(),
                index: 0,
                api: steadfast_log::Api::AnthropicMessages,
                fingerprint: "f1ngerpr1nt".into(),
                stream: true,
                snapshot: Some("snap_before_id".into()),
                request: Some(steadfast_log::RequestParts {
                    frame: "fr4me_blob".into(),
                    base: None,
                    kept: 0,
                    added: vec!["m3ssage_blob".into()],
                }),
            },
            Event::ExchangeOutcome {
                call_id: "gx_1".into(),
                status: 200,
                content_type: "text/event-stream".into(),
                body: "raw provider reply".into(),
                usage: None,
                cost_micro_usd: 1_500,
            },
            Event::SignalReceived {
                name: "approval".into(),
                payload: json!({"approved": true}),
                inbox_id: 4242,
            },
        ];
        for e in internal {
            let text = serde_json::to_string(&event(&record(e))).unwrap();
            for secret in [
                "epoch",
                "f1ngerpr1nt",
                "snap_before_id",
                "ws_secret_path",
                "raw provider reply",
                "fr4me_blob",
                "m3ssage_blob",
                "4242",
                "\"event\"",
            ] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                (v["seq"].as_u64(), v["at_ms"].as_u64()),
                (Some(7), Some(1_000))
            );
        }
    }

    #[test]
    fn tool_results_carry_an_excerpt_and_big_ones_their_blob() {
        let long = "é".repeat(EXCERPT);
        let inline = json_of(&record(Event::ToolCallOutcome {
            call_id: "t1".into(),
            is_error: false,
            exit_code: Some(0),
            output: Output::Inline { text: long.clone() },
            snapshot_after: Some("snap".into()),
            stored_bytes: 0,
        }));
        assert_eq!(inline["output"]["truncated"], true);
        assert_eq!(inline["output"]["bytes"], long.len());
        assert!(inline["output"]["excerpt"].as_str().unwrap().len() <= EXCERPT);
        assert_eq!(inline["exit_code"], 0);
        let blob = json_of(&record(Event::ToolCallOutcome {
            call_id: "t2".into(),
            is_error: true,
            exit_code: Some(2),
            output: Output::Blob(BlobRef {
                hash: "abc".into(),
                size: 9_000_000,
                uri: "s3://internal-bucket/abc".into(),
                head: "first lines".into(),
                tail: "last lines".into(),
            }),
            snapshot_after: None,
            stored_bytes: 0,
        }));
        assert_eq!(
            blob["output"]["blob"],
            json!({"hash": "abc", "bytes": 9_000_000})
        );
        assert_eq!(blob["output"]["excerpt"], "first lines");
        assert_eq!(blob["output"]["excerpt_end"], "last lines");
        assert!(!blob.to_string().contains("internal-bucket"));
    }
}
