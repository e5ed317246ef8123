//! Journaled tool calls, for every agent: snapshot before, intent, effect, snapshot
//! after, outcome. The native loop runs its model's calls through [`Journal::run`];
//! a wrapped CLI's MCP server through [`Journal::call`], which adds replay: a
//! restarted agent that makes a recorded call again gets the recorded result and
//! nothing runs.
//!
//! **Lockstep.** A replayed call also puts the workspace where that call left it the
//! first time (its recorded after-snapshot), so everything the agent folds into its
//! next request — `git status`, file listings, what it reads itself — is what it saw
//! the first time, and its requests match the record without masking anything. The
//! turn's driver starts the agent on the turn's starting snapshot; once the replay
//! reaches the frontier the workspace is the live one again.
//!
//! **Facts.** A completed external effect (a `curl -X POST`, a push) is never run
//! again: if a divergence superseded its record and the agent asks for the very same
//! call, it is answered from that record (and recorded again, as answered).
//!
//! **Steering.** A `steer` message waiting in the inbox reaches the agent with the
//! next tool result it gets (appended to the result's text, in the same append that
//! records the result, so a replay shows it again at the same point).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use steadfast_drive::Drive;
use steadfast_fault::{point, points};
use steadfast_log::approval::{self, Subject};
use steadfast_log::{Event, Output, SessionState, ToolClass, ToolResolution, Verdict, WrappedTool};
use steadfast_sandbox::egress::{EgressDesk, Judge};
use steadfast_sandbox::reconcile::Reconciler;
use steadfast_sandbox::{classify, Sandbox, ToolOutput};
use steadfast_world::{strip_ansi, Blobs, Inbound, InboundKind, LiveSession, World, INLINE_LIMIT};
use tokio::sync::Mutex;

use crate::git::{GitPusher, GIT_PUSH_TOOL};
use crate::remote::{RemoteTools, SEPARATOR};
use crate::slot::SandboxSlot;
use crate::{Error, Result};

/// The tools the harness runs for a session outside its sandbox: its own MCP servers'
/// and, when its workspace came from git, `git_push`.
#[derive(Debug, Clone, Default)]
pub struct Hosted {
    /// The session's own MCP servers' tools.
    pub remote: Option<Arc<RemoteTools>>,
    /// `git_push`.
    pub git: Option<Arc<GitPusher>>,
    /// `explore`, for a session that allows explorers.
    pub explore: Option<crate::explore::Explorers>,
}

/// A tool call to run live.
#[derive(Debug, Clone)]
pub struct Call {
    /// Its id: the model's, for the native loop.
    pub id: String,
    /// The tool.
    pub tool: String,
    /// Its input.
    pub input: Value,
    /// What it may do (see [`Journal::class_of`]).
    pub class: ToolClass,
    /// Whether its intent is in the log already (it went in with the reply that
    /// asked for it): then no snapshot is taken before it, and no intent appended.
    pub announced: bool,
}

/// How a live call ended.
#[derive(Debug)]
pub enum Ran {
    /// It ran (or could not: its error is its outcome) and its outcome is recorded:
    /// what the agent is told.
    Done {
        /// The result's text as the model sees it.
        text: String,
        /// Whether it failed.
        is_error: bool,
    },
    /// An interrupt stopped it: the command was killed and its outcome recorded with
    /// the workspace as the kill left it, or, when the interrupt came before the call
    /// began (a sibling of one reply waiting its turn), it never began and nothing of
    /// it is recorded. The interrupt is the caller's to record.
    Interrupted(Inbound),
    /// Its sandbox died under it: recorded, and the call resolved as a crash would
    /// resolve it (see [`Journal::run`]).
    SandboxDied {
        /// What the agent is told.
        text: String,
    },
}

/// Connections refused at the egress proxy, by call: where to, and whether the policy
/// denied it outright (else it was held back for a person).
pub type HeldBack = Arc<StdMutex<HashMap<String, Vec<(String, bool)>>>>;

/// What the agent is told of a call the approval policy refuses before it runs.
pub fn denied_by_policy(tool: &str) -> String {
    format!("[steadfast] denied: this session's approval policy does not let `{tool}` run here; nothing ran, and no one will approve it")
}

/// How many recorded calls past the cursor a call may match (agents run read-only
/// tools in parallel, in any order).
const REPLAY_WINDOW: usize = 8;

/// What a recorded call answers with.
enum Answer {
    /// A call of the current record: its id, its result, where it left the
    /// workspace, and its place in the record's order of results.
    Recorded(String, (String, bool), Option<String>, ResultPlace),
    /// A superseded external effect asked for again: re-recorded, its result given.
    Fact(WrappedTool),
}

/// Where a recorded call's result stands among the session's: the order results were
/// recorded in ([`WrappedTool::result_order`]), then the order of the calls.
type ResultPlace = (u32, usize);

/// Past every recorded call: the workspace is at the log's frontier.
const FRONTIER: ResultPlace = (u32::MAX, usize::MAX);

/// Runs and records a wrapped agent's tool calls.
///
/// **Parallel calls.** An agent may run the calls of one reply at once (Pi and OpenCode
/// do, and so does the native loop). They share one workspace. Reads run at once; calls that may change it (or reach
/// outside) take turns, each from its snapshot before to its outcome, so the two
/// snapshots bracket that call's effect and nobody else's. Two calls changing one
/// workspace at once could not be told apart: a sibling's snapshot would hold half of a
/// call still running, and after a crash that call, rolled back to it and run again,
/// would do its half twice (an append appended twice). So the last snapshot in the log
/// is the workspace as every recorded call left it, and a call cut off by a crash is
/// rolled back to exactly where it began, which undoes no recorded sibling and leaves
/// nothing of itself. The record is kept in the order things happened: taking a
/// snapshot and appending the event that names it is one step. A replay moves the
/// workspace to a recorded call's after-snapshot only forwards in the order results
/// were recorded, whatever order the restarted agent asks in.
pub struct Journal<W, S> {
    pub(crate) live: Arc<LiveSession<W>>,
    pub(crate) drive: Drive,
    blobs: Blobs,
    workspace: PathBuf,
    /// The sandbox tools run in: made by the first call that needs one, and made again
    /// after one dies.
    sandbox: SandboxSlot<S>,
    /// The recorded calls (and superseded external facts) this run has been answered
    /// from, and the calls it made itself: never matched again.
    pub(crate) consumed: Mutex<HashSet<String>>,
    pub(crate) last_snapshot: Arc<StdMutex<Option<String>>>,
    /// Held while a snapshot is taken and the event naming it appended, and while a
    /// replay moves the workspace: one writer of the record and the workspace at a time.
    pub(crate) recording: Mutex<()>,
    /// Held by a call that may change the workspace from its snapshot before to its
    /// outcome: such calls of one reply take turns (see **Parallel calls**).
    pub(crate) one_writer: Mutex<()>,
    /// The recorded call whose after-snapshot a replay last put the workspace at.
    replayed_to: StdMutex<Option<ResultPlace>>,
    counters: StdMutex<(u64, u64)>,
    /// The most tool calls the turn may make; past it calls are refused and the
    /// session escalates (the runaway guard, whatever the agent does).
    max_calls: usize,
    /// The longest a snapshot may take (see [`Drive::snapshot_within`]).
    snapshot_timeout: Duration,
    /// A read that finished within this long has its outcome staged (see
    /// [`LiveSession::stage`]), not committed alone; none: every outcome commits.
    stage_reads_within: Option<Duration>,
    /// Whether the agent replays the turn's recorded calls after a restart (a wrapped
    /// CLI does; the native loop's conversation is the log itself).
    replays: bool,
    /// Whether a steer waiting in the inbox goes to the agent with the next tool
    /// result (a wrapped CLI's only way to hear it mid-turn) rather than between calls.
    steers_with_results: bool,
    /// Connections refused at the egress proxy (under an approval policy), by call:
    /// the agent is told with the call's result.
    held_back: HeldBack,
    /// Tool calls this turn has made so far (recorded ones included).
    calls: std::sync::atomic::AtomicUsize,
    /// Calls running now (they run to their end even if the agent that asked died).
    inflight: tokio::sync::watch::Sender<usize>,
    /// Set when a call of a wrapped agent has started a wait for a person's approval:
    /// the agent is stopped, to be started again once the answer comes.
    pub(crate) paused: tokio::sync::watch::Sender<bool>,
    /// Set when the run this journal serves is over (see [`Self::close`]).
    pub(crate) closed: tokio::sync::watch::Sender<bool>,
    /// The session's own MCP servers' tools, run by the harness (not in the sandbox).
    remote: Option<Arc<RemoteTools>>,
    /// `git_push`, run by the harness with the session's credential.
    git: Option<Arc<GitPusher>>,
    /// The hook that makes a wrapped agent's explorers.
    explore: Option<crate::explore::Explorers>,
    /// Which calls run in the tools' sandbox, for its egress proxy's records.
    egress: Option<Arc<EgressDesk>>,
    /// Bytes the snapshots taken since the last recorded outcome stored: recorded
    /// with the next outcome (see [`crate::history`]).
    stored: std::sync::atomic::AtomicU64,
    /// The operator's history quotas.
    history: crate::history::HistoryQuota,
    /// What the model is to be told with its next call's result: the services a
    /// visitor's request started again in a new sandbox (see [`crate::reach`]).
    told_later: StdMutex<Option<String>>,
    /// The journal serves no turn, only visitors (a visitors' hold): only then may a
    /// person's shell write (see [`crate::people`]).
    for_visitors: bool,
    /// Set when the run this journal serves has let its session go, though something
    /// may still hold the journal: visitors are no longer sent here.
    retired: std::sync::atomic::AtomicBool,
    /// People in writable shells now (see [`crate::people`]).
    pub(crate) people: Arc<tokio::sync::watch::Sender<usize>>,
    /// Set when people are asked to leave.
    pub(crate) leave: tokio::sync::watch::Sender<bool>,
}

/// Counts a running call as finished when dropped (however it ends).
struct Running<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<W, S> Journal<W, S> {
    /// Sends visitors of the session elsewhere from now on: the run this journal
    /// serves has let the session go (its driver is done with it).
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl<W: World + Clone, S: Sandbox> Journal<W, S> {
    /// A journal for one run of the agent over the session's log (its cut-off calls
    /// resolved), its calls running in `sandbox`'s sandboxes; a wrapped agent's
    /// replays the open turn's recorded calls. `last_snapshot`: the snapshot the
    /// workspace is at, shared with whatever else moves it (the gateway's replay).
    pub fn new(
        live: Arc<LiveSession<W>>,
        drive: Drive,
        blobs: Blobs,
        sandbox: SandboxSlot<S>,
        last_snapshot: Arc<StdMutex<Option<String>>>,
    ) -> Self {
        let recorded = live.with(|s| s.wrapped_tools.len().saturating_sub(s.turn_start.tools));
        sandbox.runs_services(live.with(|s| !s.services.is_empty()));
        Journal {
            live,
            drive,
            blobs,
            workspace: sandbox.workspace().to_path_buf(),
            sandbox,
            calls: std::sync::atomic::AtomicUsize::new(recorded),
            consumed: Mutex::new(HashSet::new()),
            max_calls: usize::MAX,
            snapshot_timeout: Duration::from_secs(600),
            stage_reads_within: None,
            steers_with_results: true,
            replays: true,
            held_back: Arc::default(),
            last_snapshot,
            recording: Mutex::new(()),
            one_writer: Mutex::new(()),
            replayed_to: StdMutex::new(None),
            counters: StdMutex::new((0, 0)),
            inflight: tokio::sync::watch::Sender::new(0),
            paused: tokio::sync::watch::Sender::new(false),
            closed: tokio::sync::watch::Sender::new(false),
            remote: None,
            git: None,
            explore: None,
            egress: None,
            stored: std::sync::atomic::AtomicU64::new(0),
            history: crate::history::HistoryQuota::default(),
            told_later: StdMutex::new(None),
            for_visitors: false,
            retired: std::sync::atomic::AtomicBool::new(false),
            people: Arc::new(tokio::sync::watch::Sender::new(0)),
            leave: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The same journal serving visitors only, no turn (a visitors' hold): a person's
    /// shell may write through it (see [`crate::people`]).
    pub fn for_visitors(mut self) -> Self {
        self.for_visitors = true;
        self
    }

    /// Refuses calls once the session's history, or its owner's, is as big as
    /// `quota` allows (see [`crate::history`]).
    pub fn with_history_quota(mut self, quota: crate::history::HistoryQuota) -> Self {
        self.history = quota;
        self
    }

    /// The history quotas this journal holds calls to.
    pub fn history_quota(&self) -> crate::history::HistoryQuota {
        self.history
    }

    /// The bytes snapshots stored since the last outcome that recorded them, taken
    /// for the outcome being recorded now.
    fn take_stored(&self) -> u64 {
        self.stored.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts each call as running at `desk` while it runs in the sandbox, so what its
    /// egress proxy sees it open is recorded against it (see
    /// `steadfast_sandbox::egress`).
    pub fn with_egress(mut self, desk: Arc<EgressDesk>) -> Self {
        self.egress = Some(desk);
        self
    }

    /// What the egress proxy's records are appended with: through the live log, noting
    /// each connection refused for the call it was refused for. For the
    /// [`EgressDesk::watch`] of the sandbox options this journal's sandboxes are made
    /// with (made before the journal, so it reads the live log from `live`).
    pub fn egress_recorder(
        live: Arc<std::sync::OnceLock<Arc<LiveSession<W>>>>,
        held_back: HeldBack,
    ) -> steadfast_sandbox::egress::RecordEgress
    where
        W: 'static,
    {
        Arc::new(move |event| {
            let live = live.get().cloned();
            let held_back = held_back.clone();
            Box::pin(async move {
                let Some(live) = live else { return false };
                if let Event::Egress {
                    call_ids,
                    destination,
                    admitted: false,
                    denied,
                } = &event
                {
                    let mut held = held_back.lock().unwrap_or_else(|e| e.into_inner());
                    for id in call_ids {
                        held.entry(id.clone())
                            .or_default()
                            .push((destination.clone(), *denied));
                    }
                }
                live.append(&[event]).await.is_ok()
            })
        })
    }

    /// The same journal noting refused connections in `held_back` (the map its
    /// [`Self::egress_recorder`] fills).
    pub fn with_held_back(mut self, held_back: HeldBack) -> Self {
        self.held_back = held_back;
        self
    }

    /// The same journal staging the outcome of a read that took less than `within`
    /// (the native loop: one commit fewer per step), and giving steers to the agent
    /// between calls rather than with results.
    pub fn for_native_loop(mut self, within: Duration) -> Self {
        self.stage_reads_within = Some(within);
        self.steers_with_results = false;
        self.replays = false;
        self
    }

    /// The sandboxes calls run in.
    pub fn sandbox(&self) -> &SandboxSlot<S> {
        &self.sandbox
    }

    /// The session's log and state.
    pub fn live(&self) -> &Arc<LiveSession<W>> {
        &self.live
    }

    /// Offers (and runs) the tools the harness runs outside the sandbox too: the
    /// session's own MCP servers' and `git_push`.
    pub fn with_hosted(mut self, hosted: Hosted) -> Self {
        self.remote = hosted.remote;
        self.git = hosted.git;
        self.explore = hosted.explore;
        self
    }

    /// How many explorers one `explore` call may fork, when the tool is offered.
    pub fn explorers(&self) -> Option<u32> {
        self.explore.as_ref()?;
        Some(self.live.with(|s| s.explorers))
    }

    /// Whether this journal runs `git_push`.
    pub fn pushes(&self) -> bool {
        self.git.is_some()
    }

    /// The tools of the session's own MCP servers this journal runs.
    pub fn remote_tools(&self) -> &[crate::remote::RemoteTool] {
        self.remote.as_deref().map_or(&[], |r| r.tools())
    }

    /// Waits (at most `limit`) until every call this journal started has recorded its
    /// outcome: a command still running when its agent died finishes and is recorded
    /// before the agent is started again (it is answered from the record then, never
    /// run twice).
    pub async fn settle(&self, limit: std::time::Duration) {
        let mut rx = self.inflight.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n == 0)).await;
    }

    /// Puts the workspace at snapshot `to`, if this driver still holds the lease: one
    /// that lost it must never touch a workspace another may be driving already.
    async fn restore(&self, to: &str) -> Result<()> {
        self.live.ensure_lease()?;
        self.drive.restore_async(&self.workspace, to).await?;
        Ok(())
    }

    /// The lease was lost while a call ran: another holder may take the session over
    /// as soon as it lapses, and restore the workspace, so nothing this driver started
    /// may go on. The command is killed and its sandbox with it (every process in it);
    /// the call is left without an outcome, for the next holder to resolve.
    async fn lease_lost(&self) -> Error {
        self.cancel().await;
        self.sandbox.discard().await;
        steadfast_world::Error::LeaseLost(self.live.lease().session.clone()).into()
    }

    /// Stops the command running in the tools' sandbox, if one is (an interrupt): the
    /// call then records its outcome, with the workspace as the command left it.
    pub async fn cancel(&self) {
        if let Some(sandbox) = self.sandbox.running().await {
            sandbox.cancel().await;
        }
    }

    /// The same journal with snapshots abandoned after `limit`.
    pub fn with_snapshot_timeout(mut self, limit: Duration) -> Self {
        self.snapshot_timeout = limit;
        self
    }

    /// The same journal with at most `max` tool calls a turn.
    pub fn with_max_calls(mut self, max: usize) -> Self {
        self.max_calls = max;
        self
    }

    /// The loop breaker's verdict over the calls so far, or the runaway guard's (for
    /// the gateway to refuse the next model call and the session to escalate).
    pub fn loop_hit(&self) -> Option<(steadfast_log::Breaker, String)> {
        let calls = self.calls.load(std::sync::atomic::Ordering::SeqCst);
        if calls >= self.max_calls {
            return Some((
                steadfast_log::Breaker::Steps,
                format!("step budget exhausted: {calls} tool calls in this turn"),
            ));
        }
        self.live.with(SessionState::loop_hit)
    }

    /// The journaled model calls of the same run of a wrapped agent: each notes where
    /// this journal's calls left the workspace (what a divergence there restores to),
    /// and they are refused once its loop breaker or runaway guard trips, as they are
    /// past `max_exchanges` a turn or any of the session's bounds.
    pub fn exchanges(
        self: &Arc<Self>,
        max_exchanges: usize,
        prices: steadfast_model::pricing::PriceTable,
        mismatch: crate::exchange::Mismatch,
    ) -> crate::exchange::Exchanges<W>
    where
        S: 'static,
        W: 'static,
    {
        let journal = self.clone();
        crate::exchange::Exchanges::new(crate::exchange::ExchangesConfig {
            live: self.live.clone(),
            drive: self.drive.clone(),
            workspace: self.workspace.clone(),
            last_snapshot: self.last_snapshot.clone(),
            blobs: self.blobs.clone(),
            max_exchanges: Some(max_exchanges),
            extra_bound: Some(Arc::new(move || journal.loop_hit())),
            prices,
            mismatch,
        })
    }

    /// Calls answered from the record, and calls run.
    pub fn counters(&self) -> (u64, u64) {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the session's approval policy says of a call about to start (see
    /// [`steadfast_log::approval`]): run it, wait for a person first, or refuse it. A
    /// call approved under `approval_id` (the native loop's call id, or a wrapped
    /// agent's [`approval_key`](steadfast_log::approval_key)) runs; one whose connection
    /// was held back for a person before waits for one now.
    pub fn admission(
        &self,
        approval_id: &str,
        tool: &str,
        input: &Value,
        class: ToolClass,
    ) -> Verdict {
        let server = self.mcp_server_of(tool);
        let in_sandbox = server.is_none() && !self.runs_git_push(tool);
        self.live.with(|s| {
            if s.approval.is_empty() || s.approved.iter().any(|a| a == approval_id) {
                return Verdict::Allow;
            }
            let subject = Subject {
                tool,
                mcp_server: server.as_deref(),
                class,
                in_sandbox,
            };
            match approval::judge_call(&s.approval, &subject) {
                Verdict::Allow if s.held_for_approval(tool, input).is_some() => Verdict::Ask,
                verdict => verdict,
            }
        })
    }

    /// What a person is asked before `tool` with `input` runs: the command, and where
    /// it tried to connect when it was held back.
    pub fn approval_reason(&self, tool: &str, input: &Value) -> String {
        let command = input.get("command").and_then(Value::as_str).unwrap_or(tool);
        match self
            .live
            .with(|s| s.held_for_approval(tool, input).map(str::to_string))
        {
            Some(destination) => format!("about to reach {destination}: {command}"),
            None => format!("about to run an external effect: {command}"),
        }
    }

    /// How the egress proxy judges the connections of a running call (`None`: under
    /// no policy, or approved, all are let through).
    fn judge_for(&self, call: &Call, key: &str) -> Option<Judge> {
        let layers = self.live.with(|s| {
            let approved = s.approved.iter().any(|a| *a == call.id || a == key);
            (!approved && s.approval.iter().any(|l| !l.is_open())).then(|| s.approval.clone())
        })?;
        let tool = call.tool.clone();
        let class = call.class;
        Some(Arc::new(move |destination: &str| {
            let subject = Subject {
                tool: &tool,
                mcp_server: None,
                class,
                in_sandbox: true,
            };
            approval::judge_connection(&layers, &subject, destination)
        }))
    }

    /// Resolves once a call has started a wait for approval: the agent is to be
    /// stopped (the call itself never answers; the agent asks again when started again
    /// after the wait).
    pub async fn paused(&self) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(|paused| *paused).await;
    }

    /// Runs (or replays) one call; the text and error flag the agent gets back.
    pub async fn call(&self, tool: &str, input: &Value) -> Result<(String, bool)> {
        match self.replayed(tool, input).await {
            Some(Answer::Recorded(_, result, after, place)) => {
                self.lockstep(after, place).await?;
                return Ok(result);
            }
            Some(Answer::Fact(fact)) => return self.answer_fact(fact).await,
            None => {}
        }
        if tool == crate::explore::EXPLORE_TOOL {
            if let Some(make) = self.explore.clone() {
                return self.explore(input, &make.0).await;
            }
        }
        let class = self.class_of(tool, input);
        let key = steadfast_log::approval_key(tool, input);
        let refused = self.live.with(|s| {
            s.refused
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, told)| told.clone())
        });
        if let Some(told) = refused {
            return self.answer_refused(tool, input, class, told).await;
        }
        match self.admission(&key, tool, input, class) {
            Verdict::Allow => {}
            Verdict::Ask => return self.wait_for_approval(tool, input, key).await,
            Verdict::Deny => {
                let told = denied_by_policy(tool);
                return self.answer_refused(tool, input, class, told).await;
            }
        }
        let calls = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if calls > self.max_calls {
            return Ok((
                format!("[steadfast] refused: this turn has made {} tool calls, its limit; the session is escalated to a human", self.max_calls),
                true,
            ));
        }
        self.inflight.send_modify(|n| *n += 1);
        let _running = Running(&self.inflight);
        let call = Call {
            id: format!("wt_{}", uuid::Uuid::now_v7().simple()),
            tool: tool.to_string(),
            input: input.clone(),
            class,
            announced: false,
        };
        // Made by this run: never an answer for a later call of it.
        self.consumed.lock().await.insert(call.id.clone());
        match self.run(call, std::future::pending()).await? {
            Ran::Done { text, is_error } => Ok((text, is_error)),
            Ran::SandboxDied { text } => Ok((text, true)),
            // Never: a wrapped call is stopped by `cancel`, not by an interrupt it awaits.
            Ran::Interrupted(_) => Ok(("[steadfast] interrupted".to_string(), true)),
        }
    }

    async fn replayed(&self, tool: &str, input: &Value) -> Option<Answer> {
        let mut consumed = self.consumed.lock().await;
        let answer = self.live.with(|s| {
            let from = s.turn_start.tools.min(s.wrapped_tools.len());
            let open = |t: &&WrappedTool| !consumed.contains(&t.call_id);
            let turn = &s.wrapped_tools[from..];
            let cursor = turn.iter().position(|t| open(&t)).unwrap_or(turn.len());
            let end = (cursor + REPLAY_WINDOW).min(turn.len());
            let recorded = turn[cursor..end]
                .iter()
                .enumerate()
                .filter(|(_, t)| open(t))
                .find(|(_, t)| t.tool == tool && &t.input == input && t.result.is_some());
            if let Some((at, t)) = recorded {
                return Some(Answer::Recorded(
                    t.call_id.clone(),
                    t.result.clone()?,
                    t.snapshot_after.clone(),
                    (t.result_order, from + cursor + at),
                ));
            }
            // A completed external effect is a fact, superseded or not: the same call
            // is answered from its record, wherever it stood.
            s.external_facts
                .iter()
                .filter(open)
                .find(|t| t.is_external_fact() && t.tool == tool && &t.input == input)
                .map(|t| Answer::Fact(t.clone()))
        })?;
        let id = match &answer {
            Answer::Recorded(id, ..) => id.clone(),
            Answer::Fact(t) => t.call_id.clone(),
        };
        consumed.insert(id);
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
        Some(answer)
    }

    /// Puts the workspace where a replayed call left it the first time, unless a call
    /// recorded later already put it further on (parallel calls replayed in another
    /// order than they finished).
    async fn lockstep(&self, after: Option<String>, place: ResultPlace) -> Result<()> {
        let Some(after) = after else { return Ok(()) };
        let _writer = self.recording.lock().await;
        let mut replayed_to = *self.replayed_to.lock().unwrap_or_else(|e| e.into_inner());
        if replayed_to.is_some_and(|at| at >= place) {
            return Ok(());
        }
        replayed_to = Some(place);
        let current = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if current.as_deref() != Some(after.as_str()) {
            self.restore(&after).await?;
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(after);
        }
        *self.replayed_to.lock().unwrap_or_else(|e| e.into_inner()) = replayed_to;
        Ok(())
    }

    /// Before a call runs live: the workspace as the log last left it. A restarted
    /// agent running a reply's calls in parallel may run a new call while calls it made
    /// before the crash are still being answered from the record; the new one must run
    /// on the workspace every recorded call left, not on a replay's earlier point. From
    /// here on no replayed call moves the workspace. (Called with the writer held.)
    async fn to_frontier(&self) -> Result<()> {
        if !self.replays {
            return Ok(());
        }
        let already = self
            .replayed_to
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(FRONTIER)
            == Some(FRONTIER);
        if already {
            return Ok(());
        }
        let frontier = self.live.with(|s| s.last_snapshot.clone());
        let current = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(frontier) = frontier.filter(|f| current.as_ref() != Some(f)) {
            self.restore(&frontier).await?;
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(frontier);
        }
        Ok(())
    }

    /// Starts a wait for a person's approval of a wrapped agent's call, naming the
    /// command, and stops the agent (see [`Self::paused`]); the call never answers.
    /// When the answer comes the agent is started again over the turn, replays up to
    /// this call and asks for it again: approved, it runs; refused, it is told so.
    async fn wait_for_approval(
        &self,
        tool: &str,
        input: &Value,
        key: String,
    ) -> Result<(String, bool)> {
        let reason = self.approval_reason(tool, input);
        tracing::info!(session = %self.live.lease().session, %reason, "an external effect waits for approval");
        let wait = Event::WaitStarted {
            name: steadfast_log::APPROVAL_SIGNAL.into(),
            reason,
            call_id: None,
            before_call: Some(key),
        };
        self.stop_waiting(wait, "[steadfast] this call waits for a person's approval; the turn goes on once they answer")
            .await
    }

    /// Records `wait` (unless a sibling call recorded one first: the agent is stopping
    /// anyway, and asks again) and stops the agent; the call returns `told` when the
    /// run ends (its server's connection must not outlive it). The turn goes on from
    /// the log once the wait is answered.
    pub(crate) async fn stop_waiting(&self, wait: Event, told: &str) -> Result<(String, bool)> {
        {
            let _writer = self.recording.lock().await;
            if self.live.with(|s| s.waiting().is_none()) {
                self.live.append(&[wait]).await?;
            }
        }
        self.paused.send_replace(true);
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
        Ok((told.to_string(), true))
    }

    /// Ends the run this journal serves: its sandbox is stopped (a command the agent
    /// left running is killed; the next run makes one again) and a call waiting for
    /// approval returns. Whatever still holds the journal (a connection of the dead
    /// agent's) holds no sandbox.
    pub async fn close(&self) {
        self.closed.send_replace(true);
        if let Some(sandbox) = self.sandbox.running().await {
            sandbox.cancel().await;
        }
        self.sandbox.discard().await;
    }

    /// Records a call a person refused (intent and outcome, so a replay answers it the
    /// same way) and tells the agent so; nothing runs.
    async fn answer_refused(
        &self,
        tool: &str,
        input: &Value,
        class: ToolClass,
        told: String,
    ) -> Result<(String, bool)> {
        let call_id = format!("wt_{}", uuid::Uuid::now_v7().simple());
        self.consumed.lock().await.insert(call_id.clone());
        self.refuse(call_id, tool, input, class, told).await
    }

    /// Records a call refused before it ran (by a person, or by the approval policy)
    /// under `call_id`, its outcome what the agent is told; nothing runs and the
    /// workspace does not move.
    pub async fn refuse(
        &self,
        call_id: String,
        tool: &str,
        input: &Value,
        class: ToolClass,
        told: String,
    ) -> Result<(String, bool)> {
        self.record_answered(call_id, tool, input, class, told, true)
            .await
    }

    /// Records a call answered without running anything (refused, or answered by the
    /// harness itself) under `call_id`, its outcome `text`; the workspace does not
    /// move.
    pub(crate) async fn record_answered(
        &self,
        call_id: String,
        tool: &str,
        input: &Value,
        class: ToolClass,
        text: String,
        is_error: bool,
    ) -> Result<(String, bool)> {
        let told = text;
        let _writer = self.recording.lock().await;
        let snapshot = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.live
            .append(&[
                Event::ToolCallIntent {
                    call_id: call_id.clone(),
                    tool: tool.to_string(),
                    input: input.clone(),
                    class,
                    snapshot_before: snapshot.clone(),
                },
                Event::ToolCallOutcome {
                    call_id,
                    is_error,
                    exit_code: None,
                    output: Output::Inline { text: told.clone() },
                    snapshot_after: snapshot,
                    stored_bytes: 0,
                },
            ])
            .await?;
        Ok((told, is_error))
    }

    /// Answers a superseded external effect from its record, and records it again in
    /// the new line of history (nothing runs; the workspace does not move).
    async fn answer_fact(&self, fact: WrappedTool) -> Result<(String, bool)> {
        let _writer = self.recording.lock().await;
        let (text, is_error) = fact.result.clone().unwrap_or_default();
        let snapshot = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let call_id = format!("wt_{}", uuid::Uuid::now_v7().simple());
        tracing::info!(tool = %fact.tool, original = %fact.call_id, "an external effect already done is answered from its record, not run again");
        self.consumed.lock().await.insert(call_id.clone());
        self.live
            .append(&[
                Event::ToolCallIntent {
                    call_id: call_id.clone(),
                    tool: fact.tool.clone(),
                    input: fact.input.clone(),
                    class: ToolClass::External,
                    snapshot_before: snapshot.clone(),
                },
                Event::ToolCallOutcome {
                    call_id,
                    is_error,
                    exit_code: None,
                    output: Output::Inline { text: text.clone() },
                    snapshot_after: snapshot,
                    stored_bytes: 0,
                },
            ])
            .await?;
        Ok((text, is_error))
    }

    /// A steer waiting in the inbox, taken with the result it is appended to.
    async fn steer(&self) -> Result<Option<(String, u64)>> {
        let inbox = self.live.world().inbox(&self.live.lease().session).await?;
        Ok(inbox
            .into_iter()
            .find(|i| i.kind == InboundKind::Steer)
            .map(|i| {
                let text = match i.body {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (text, i.id)
            }))
    }

    pub(crate) async fn snapshot(&self) -> Result<String> {
        use tracing::Instrument;
        let taken = self
            .drive
            .snapshot_within(&self.workspace, self.snapshot_timeout)
            .instrument(steadfast_metrics::trace::snapshot_span())
            .await?;
        self.stored
            .fetch_add(taken.stored_bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(taken.id)
    }

    /// A call's class: the harness's own tools by what they do, a call seen sending
    /// out of the sandbox before as an external effect whatever its text suggests, the
    /// rest as the sandbox classifies them.
    pub fn class_of(&self, tool: &str, input: &Value) -> ToolClass {
        if self.runs_git_push(tool) || self.live.with(|s| s.seen_reaching_out(tool, input)) {
            ToolClass::External
        } else if let Some(remote) = self.remote.as_ref().and_then(|r| r.find(tool)) {
            remote.class
        } else if self.names_mcp_server(tool) {
            ToolClass::External
        } else {
            classify(tool, input)
        }
    }

    /// Whether `tool` is `git_push`, run by the harness.
    fn runs_git_push(&self, tool: &str) -> bool {
        self.git.is_some() && tool == GIT_PUSH_TOOL
    }

    /// Whether `tool` is namespaced by one of the session's MCP servers (connected now
    /// or not): it runs elsewhere, and the workspace is not its to change.
    pub fn names_mcp_server(&self, tool: &str) -> bool {
        self.mcp_server_of(tool).is_some()
    }

    /// The session's MCP server whose namespace `tool` is in, by name.
    fn mcp_server_of(&self, tool: &str) -> Option<String> {
        self.live.with(|s| {
            s.mcp_servers
                .iter()
                .find(|server| {
                    tool.strip_prefix(server.name.as_str())
                        .is_some_and(|rest| rest.starts_with(SEPARATOR))
                })
                .map(|server| server.name.clone())
        })
    }

    /// Runs a call where it runs: an MCP server's tool at its server, `git_push` by the
    /// harness (its git commands in the sandbox), every other tool in the sandbox.
    /// `call`: the call's id, and whether to attach to its kept command rather than
    /// start one (see [`Self::reattach`]).
    async fn execute(
        &self,
        call: Option<(&str, bool)>,
        tool: &str,
        input: &Value,
    ) -> Result<ToolOutput> {
        if self.names_mcp_server(tool) {
            return Ok(match &self.remote {
                Some(remote) if remote.find(tool).is_some() => remote.call(tool, input).await,
                _ => ToolOutput::error(format!(
                    "[steadfast] `{tool}`: its MCP server is not connected now"
                )),
            });
        }
        match &self.git {
            Some(git) if tool == GIT_PUSH_TOOL => {
                git.push(input, |command| async move {
                    self.execute_in_sandbox(
                        None,
                        "bash",
                        &serde_json::json!({ "command": command }),
                    )
                    .await
                })
                .await
            }
            _ => self.execute_in_sandbox(call, tool, input).await,
        }
    }

    /// Runs a call in the session's sandbox, made when the first call needs it (by
    /// its id, or attached to, as `call` says; see [`Self::execute`]).
    async fn execute_in_sandbox(
        &self,
        call: Option<(&str, bool)>,
        tool: &str,
        input: &Value,
    ) -> Result<ToolOutput> {
        let sandbox = self.sandbox.get().await?;
        let restarted = match self.sandbox.take_fresh() {
            true => self.restart_services(call.map(|c| c.0), &sandbox).await?,
            false => None,
        };
        let told_before = self
            .told_later
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let restarted = match (told_before, restarted) {
            (Some(before), Some(now)) => Some(before + &now),
            (before, now) => before.or(now),
        };
        let mut executed = match call {
            Some((id, true)) => sandbox.attach(id).await,
            Some((id, false)) => sandbox.execute_call(id, tool, input).await,
            None => sandbox.execute(tool, input).await,
        };
        if let (Some(told), Ok(out)) = (restarted, executed.as_mut()) {
            out.text.push_str(&told);
        }
        match &executed {
            // The next call gets a new one (unless a sibling already made it).
            Err(steadfast_sandbox::Error::Died(_)) => self.sandbox.discard_if(&sandbox).await,
            _ => self.sandbox.touch().await,
        }
        Ok(executed?)
    }

    /// The session's sandbox for a visitor (a preview URL's request): the running one,
    /// or one started as a tool call would start it, its services started again. What
    /// the model would have been told of that is told with its next call's result.
    pub(crate) async fn visit(&self) -> Result<Arc<S>> {
        if *self.closed.borrow() {
            return Err(steadfast_sandbox::Error::Unavailable(
                "the session's run is over; its sandbox is stopping".into(),
            )
            .into());
        }
        let sandbox = match self.sandbox.running().await {
            Some(sandbox) => sandbox,
            None => {
                // Not while a replay moves the workspace: a new sandbox is hydrated.
                let _recording = self.recording.lock().await;
                self.sandbox.get().await?
            }
        };
        if self.sandbox.take_fresh() {
            let told = self.restart_services(None, &sandbox).await?;
            *self.told_later.lock().unwrap_or_else(|e| e.into_inner()) = told;
        }
        self.sandbox.touch().await;
        Ok(sandbox)
    }

    /// Makes this journal the one visitors of its session reach while it lives.
    pub fn reachable(self: &Arc<Self>)
    where
        W: 'static,
    {
        let weak: std::sync::Weak<dyn crate::reach::Reachable> = Arc::downgrade(self) as _;
        crate::reach::register(&self.live.lease().session, weak);
    }

    /// Starts again, in `sandbox` (just started anew), the services the log says run:
    /// the sandbox they ran in stopped (idle, moved to another host, died). Recorded
    /// ([`Event::ServicesRestarted`]); returns what the model is told, with the result
    /// of the call that needed the sandbox.
    async fn restart_services(&self, call_id: Option<&str>, sandbox: &S) -> Result<Option<String>> {
        let services = self.live.with(|s| s.services.clone());
        if services.is_empty() {
            return Ok(None);
        }
        let mut outcomes = Vec::new();
        for service in &services {
            let mut input = serde_json::json!({
                "action": "start", "name": service.name, "command": service.command,
            });
            if let Some(port) = service.port {
                input["port"] = port.into();
            }
            let how = match sandbox.execute("service", &input).await {
                Ok(out) if !out.is_error => "started".to_string(),
                Ok(out) => out.text,
                Err(e) => e.to_string(),
            };
            outcomes.push((service.name.clone(), how));
        }
        self.live
            .append(&[Event::ServicesRestarted {
                call_id: call_id.map(str::to_string),
                services: outcomes.clone(),
            }])
            .await?;
        let lines: Vec<String> = services
            .iter()
            .zip(&outcomes)
            .map(|(s, (_, how))| format!("- {} (`{}`): {how}", s.name, s.command))
            .collect();
        Ok(Some(format!(
            "\n[steadfast] this session's sandbox was started anew before this ran (the \
             last one had stopped), so its services were started again:\n{}",
            lines.join("\n")
        )))
    }

    /// The sandbox died while `call_id` ran in it (killed, out of memory, evicted):
    /// recorded, and the call resolved as a crash would resolve it (a mutation rolled
    /// back to the newest recorded snapshot, an external effect's outcome unknown, a
    /// read dropped to run again). The next call gets a new sandbox. Returns what the
    /// agent is told.
    async fn sandbox_died(&self, call: &Call, reason: String) -> Result<String> {
        tracing::warn!(session = %self.live.lease().session, %reason, "sandbox died mid-call");
        let _writer = self.recording.lock().await;
        // What it was seen doing counts: one that sent out is an external effect.
        let class = self
            .live
            .with(|s| s.effective_class_of(&call.id))
            .unwrap_or(call.class);
        let rollback_to = match class {
            ToolClass::Mutate => self.live.with(|s| s.last_snapshot.clone()),
            _ => None,
        };
        let resolution = steadfast_sandbox::reconcile::resolve(
            &[],
            class,
            &call.tool,
            &call.input,
            rollback_to,
            |_| async { Err("no probe".to_string()) },
        )
        .await;
        if let ToolResolution::RolledBack { snapshot: Some(to) } = &resolution {
            self.restore(to).await?;
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(to.clone());
        }
        self.live
            .append(&[
                Event::SandboxLost {
                    call_id: Some(call.id.clone()),
                    reason: reason.clone(),
                },
                Event::ToolCallInterrupted {
                    call_id: call.id.clone(),
                    resolution,
                },
            ])
            .await?;
        let told = self.live.with(|s| {
            s.wrapped_tools
                .iter()
                .find(|t| t.call_id == call.id)
                .and_then(|t| t.result.clone())
        });
        Ok(told.map_or_else(
            || format!("[steadfast] the sandbox died while this ran ({reason}); it had no effect that was kept. Run it again."),
            |(text, _)| text,
        ))
    }

    /// Runs one call live and records it: a snapshot before (if it may change the
    /// workspace) and its intent, unless they are in the log already; the effect, with
    /// what the egress proxy sees it open recorded against it; a snapshot after; its
    /// outcome, with a steer that arrived meanwhile for an agent that hears steers with
    /// results. A call whose intent is recorded always gets an outcome (its error, if it
    /// could not run), a resolution (its sandbox died), or an interrupted outcome (`stop`
    /// resolved first: the command is killed).
    pub async fn run(&self, call: Call, stop: impl Future<Output = Inbound>) -> Result<Ran> {
        self.run_or_attach(call, stop, false).await
    }

    /// For a call a crash cut off whose command the session's sandbox kept running —
    /// the sandbox outlived the holder that began it and was adopted by this one (see
    /// [`Sandbox::kept_calls`]) — waits for the command to end and records its outcome
    /// as [`Self::run`] records any: it ran once, whole, and nothing is rolled back.
    /// `None` (nothing recorded) when the sandbox keeps no command of the call: it is
    /// resolved by rule 4 as usual.
    pub async fn reattach(
        &self,
        call: Call,
        stop: impl Future<Output = Inbound>,
    ) -> Result<Option<Ran>> {
        let sandbox = self.sandbox.get().await?;
        if !sandbox.kept_calls().contains(&call.id) {
            return Ok(None);
        }
        tracing::info!(session = %self.live.lease().session, call = %call.id, "waiting for a command the last holder began, kept running by its sandbox");
        let call = Call {
            announced: true,
            ..call
        };
        self.run_or_attach(call, stop, true).await.map(Some)
    }

    /// [`Self::run`], or with `attach`, [`Self::reattach`]'s wait for a kept command in
    /// place of running it.
    async fn run_or_attach(
        &self,
        call: Call,
        stop: impl Future<Output = Inbound>,
        attach: bool,
    ) -> Result<Ran> {
        // An MCP server's tool runs elsewhere: the workspace is not its to change.
        let remote = self.names_mcp_server(&call.tool);
        let touches = call.class.touches_workspace() && !remote;
        // Calls that may change the workspace take turns, from the snapshot before to
        // the outcome, so each one's snapshots bracket its effect alone (reads run
        // beside them).
        let _one_writer = if touches {
            Some(self.one_writer.lock().await)
        } else {
            None
        };
        let mut stop = std::pin::pin!(stop);
        if !call.announced {
            // Stopped while it waited for its turn: it never begins.
            if let Some(item) = futures_util::FutureExt::now_or_never(stop.as_mut()) {
                return Ok(Ran::Interrupted(item));
            }
            if let Some(why) = self.history_full().await? {
                let (text, is_error) = self
                    .refuse(call.id, &call.tool, &call.input, call.class, why)
                    .await?;
                return Ok(Ran::Done { text, is_error });
            }
            let _writer = self.recording.lock().await;
            self.to_frontier().await?;
            let snapshot_before = if touches {
                match self.snapshot().await {
                    Err(Error::Drive(e)) if e.is_timeout() => {
                        return self.record_not_run(call).await;
                    }
                    snapshot => Some(snapshot?),
                }
            } else {
                None
            };
            self.live
                .append(&[Event::ToolCallIntent {
                    call_id: call.id.clone(),
                    tool: call.tool.clone(),
                    input: call.input.clone(),
                    class: call.class,
                    snapshot_before,
                }])
                .await?;
            point(points::TOOL_INTENT);
        }
        let started = Instant::now();
        let in_sandbox = !remote && !self.runs_git_push(&call.tool);
        // Under an approval policy each connection of a call not yet approved (by its
        // id, or for a wrapped agent's, by what it asks for) is judged where it goes.
        let key = steadfast_log::approval_key(&call.tool, &call.input);
        let judge = self.judge_for(&call, &key);
        let _running = self
            .egress
            .as_ref()
            .filter(|_| in_sandbox)
            .map(|desk| desk.running(&call.id, judge));
        let executed = tokio::select! {
            executed = self.execute(Some((&call.id, attach)), &call.tool, &call.input) => executed,
            item = &mut stop => {
                self.cancel().await;
                return self.record_interrupted(&call, touches, item, started).await;
            }
            () = self.live.lease_lost() => return Err(self.lease_lost().await),
        };
        drop(_running);
        let mut out = match executed {
            Err(Error::Sandbox(steadfast_sandbox::Error::Died(reason))) => {
                let text = self.sandbox_died(&call, reason).await?;
                return Ok(Ran::SandboxDied { text });
            }
            // A call whose intent is recorded gets an outcome, even when it could not
            // run: one left without would be rolled back later, as if cut off.
            Err(e) => ToolOutput::error(format!("[steadfast] the call could not run: {e}")),
            Ok(out) => out,
        };
        point(points::TOOL_EFFECT);
        let refused = self
            .held_back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&call.id);
        for (destination, denied) in refused.into_iter().flatten() {
            let why = if denied {
                steadfast_sandbox::egress::DENIED_BY_POLICY
            } else {
                steadfast_sandbox::egress::HELD_BACK
            };
            out.text.push_str(&format!(
                "\n[steadfast] this command tried to reach {destination}: {why}"
            ));
        }
        let _writer = self.recording.lock().await;
        let snapshot_after = if touches {
            Some(self.snapshot().await?)
        } else {
            None
        };
        let mut text = strip_ansi(&out.text);
        let steer = if self.steers_with_results {
            self.steer().await?
        } else {
            None
        };
        if let Some((words, _)) = &steer {
            text.push_str(&format!(
                "\n\n[steadfast] a message from the user arrived while this ran: {words}"
            ));
        }
        let output = if text.len() > INLINE_LIMIT {
            Output::Blob(self.blobs.put(text.as_bytes()).await?)
        } else {
            Output::Inline { text }
        };
        let shown = output.for_model();
        let outcome = Event::ToolCallOutcome {
            call_id: call.id,
            is_error: out.is_error,
            exit_code: out.exit_code,
            output,
            snapshot_after: snapshot_after.clone(),
            stored_bytes: self.take_stored(),
        };
        let staged = call.class == ToolClass::Read
            && self
                .stage_reads_within
                .is_some_and(|within| started.elapsed() < within);
        if staged {
            // Its fault point is passed when the stage commits.
            self.live.stage(outcome).await?;
        } else {
            let mut events = vec![outcome];
            if let Some((text, inbox_id)) = steer {
                events.push(Event::Steered { text, inbox_id });
            }
            // The fold counts the call towards the loop breaker as the outcome is applied.
            self.live.append(&events).await?;
        }
        if snapshot_after.is_some() {
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot_after;
        }
        self.sandbox
            .runs_services(self.live.with(|s| !s.services.is_empty()));
        drop(_writer);
        if !staged {
            point(points::TOOL_OUTCOME);
        }
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
        Ok(Ran::Done {
            text: shown,
            is_error: out.is_error,
        })
    }

    /// A call whose snapshot before could not be taken in time (see
    /// [`Self::with_snapshot_timeout`]): it never runs, since its effect could be neither
    /// told apart nor undone. It is recorded as begun and answered at once with an error
    /// that says so, the same for every agent, and the agent decides what next (the
    /// abandoned snapshot goes on in the background, so the next one is quicker).
    async fn record_not_run(&self, call: Call) -> Result<Ran> {
        let text = format!(
            "[steadfast] this call did not run: the workspace snapshot before it took longer \
             than {} s, so what it changed could not have been recorded or undone. Nothing \
             was changed; run it again.",
            self.snapshot_timeout.as_secs()
        );
        tracing::warn!(session = %self.live.lease().session, tool = %call.tool, "a call's snapshot before it timed out: not run");
        self.live
            .append(&[
                Event::ToolCallIntent {
                    call_id: call.id.clone(),
                    tool: call.tool,
                    input: call.input,
                    class: call.class,
                    snapshot_before: None,
                },
                Event::ToolCallOutcome {
                    call_id: call.id,
                    is_error: true,
                    exit_code: None,
                    output: Output::Inline { text: text.clone() },
                    snapshot_after: None,
                    stored_bytes: 0,
                },
            ])
            .await?;
        Ok(Ran::Done {
            text,
            is_error: true,
        })
    }

    /// A command stopped by an interrupt: killed, its outcome recorded with the
    /// workspace as the kill left it.
    async fn record_interrupted(
        &self,
        call: &Call,
        touches: bool,
        item: Inbound,
        started: Instant,
    ) -> Result<Ran> {
        let by = steadfast_world::interrupt::sender(&item);
        let _writer = self.recording.lock().await;
        let snapshot_after = if touches {
            Some(self.snapshot().await?)
        } else {
            None
        };
        self.live
            .append(&[Event::ToolCallOutcome {
                call_id: call.id.clone(),
                is_error: true,
                exit_code: None,
                output: Output::Inline {
                    text: format!(
                        "[steadfast] interrupted by {by} after {} ms; the command was stopped",
                        started.elapsed().as_millis()
                    ),
                },
                snapshot_after: snapshot_after.clone(),
                stored_bytes: self.take_stored(),
            }])
            .await?;
        if snapshot_after.is_some() {
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot_after;
        }
        Ok(Ran::Interrupted(item))
    }

    /// Resolves a call a crash cut off (docs/ARCHITECTURE.md rule 4) — the native
    /// loop's pending call, or a wrapped agent's — through the one resolution every
    /// agent shares ([`resolve_call`]), its probes run in this journal's sandbox.
    /// `rollback_to`: where a mutation goes back to (the caller has put the workspace
    /// there already).
    pub async fn resolve(
        &self,
        cut: &CutOff,
        rollback_to: Option<String>,
        reconcilers: &[Arc<dyn Reconciler>],
    ) -> Result<ToolResolution> {
        let resolution = resolve_call(
            cut,
            rollback_to,
            reconcilers,
            self.git.as_deref(),
            &self.sandbox,
        )
        .await;
        self.live
            .append(&[Event::ToolCallInterrupted {
                call_id: cut.call_id.clone(),
                resolution: resolution.clone(),
            }])
            .await?;
        Ok(resolution)
    }
}

/// A tool call a crash cut off: what it was, and what it was seen doing.
#[derive(Debug, Clone)]
pub struct CutOff {
    /// Its id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its input.
    pub input: Value,
    /// Its class, made more careful by what it was seen doing (one seen sending out
    /// of the sandbox is an external effect, whatever it was classed as when it began).
    pub class: ToolClass,
    /// The snapshot taken just before it, if it may have changed the workspace.
    pub snapshot_before: Option<String>,
}

/// The one resolution of a cut-off call (invariant 4): `git_push` by its own check of
/// the remote, every other call by [`steadfast_sandbox::reconcile::resolve`] (a read
/// runs again when asked again, a mutation is rolled back to `rollback_to`, an
/// external effect is asked of the reconcilers, else its outcome is unknown). Probes
/// run in `slot`'s sandbox, on the workspace as the caller left it.
pub async fn resolve_call<S: Sandbox>(
    cut: &CutOff,
    rollback_to: Option<String>,
    reconcilers: &[Arc<dyn Reconciler>],
    git: Option<&GitPusher>,
    slot: &SandboxSlot<S>,
) -> ToolResolution {
    let probe = |command: String| async move {
        let sandbox = slot.get().await.map_err(|e| e.to_string())?;
        sandbox
            .execute("bash", &serde_json::json!({ "command": command }))
            .await
            .map_err(|e| e.to_string())
    };
    match git.filter(|_| cut.tool == GIT_PUSH_TOOL) {
        Some(git) => git.resolve(&cut.input, probe).await,
        None => {
            steadfast_sandbox::reconcile::resolve(
                reconcilers,
                cut.class,
                &cut.tool,
                &cut.input,
                rollback_to,
                probe,
            )
            .await
        }
    }
}

/// Resolves the wrapped tool calls a crash cut off (docs/ARCHITECTURE.md rule 4), each
/// through the one [`resolve_call`]: a read runs again when the agent asks again; a
/// mutation is rolled back and the agent, on replay, is told so; an external effect
/// is asked of the reconcilers (their probes run in `slot`'s sandbox, on the workspace
/// as it was just before the call) and otherwise reported outcome-unknown. Returns the
/// snapshot the workspace must be at.
pub async fn resolve_cut_off<W: World, S: Sandbox>(
    live: &LiveSession<W>,
    drive: &Drive,
    tools: &[WrappedTool],
    last_snapshot: Option<String>,
    reconcilers: &[Arc<dyn Reconciler>],
    git: Option<&GitPusher>,
    slot: &SandboxSlot<S>,
) -> Result<Option<String>> {
    let workspace = slot.workspace();
    // Where the workspace goes back to: the last snapshot the log names, which is as
    // new as every recorded result (see [`Journal`]'s parallel calls). For a call
    // cut off alone it is the one taken just before it; for calls of one reply cut off
    // beside siblings recorded after they began, it keeps those siblings' work.
    for t in tools.iter().filter(|t| t.result.is_none()) {
        let cut = CutOff {
            call_id: t.call_id.clone(),
            tool: t.tool.clone(),
            input: t.input.clone(),
            class: t.effective_class(),
            snapshot_before: t.snapshot_before.clone(),
        };
        let probing = cut.class == ToolClass::External
            && ((git.is_some() && t.tool == GIT_PUSH_TOOL)
                || reconcilers.iter().any(|r| r.matches(&t.tool, &t.input)));
        if probing {
            if let Some(snap) = &t.snapshot_before {
                drive.restore_async(workspace, snap).await?;
            }
        }
        let rollback_to = match cut.class {
            ToolClass::Mutate => last_snapshot.clone().or(t.snapshot_before.clone()),
            _ => t.snapshot_before.clone(),
        };
        let resolution = resolve_call(&cut, rollback_to, reconcilers, git, slot).await;
        tracing::info!(call = %t.call_id, tool = %t.tool, ?resolution, "resolving a cut-off tool call");
        live.append(&[Event::ToolCallInterrupted {
            call_id: t.call_id.clone(),
            resolution,
        }])
        .await?;
    }
    // A sandbox made for probes goes before the agent's is made: the agent's must be
    // the one it had before the crash (a local sandbox's home is the first free one),
    // or its first request differs from the record. One adopted from the last holder
    // stays: it was there before the crash, with the session's services.
    if !slot.running().await.is_some_and(|s| s.adopted()) {
        slot.discard().await;
    }
    if let Some(snap) = &last_snapshot {
        drive.restore_async(workspace, snap).await?;
    }
    Ok(last_snapshot)
}

impl<W: World + Clone + 'static, S: Sandbox> crate::reach::Reachable for Journal<W, S> {
    fn ports(&self) -> crate::reach::Reached<'_, Vec<u16>> {
        Box::pin(async move {
            let sandbox = self.visit().await?;
            Ok(sandbox.ports().await?)
        })
    }

    fn connect(&self, port: u16) -> crate::reach::Reached<'_, crate::reach::Pipe> {
        Box::pin(async move {
            let sandbox = self.visit().await?;
            let stream = sandbox.connect(port).await?;
            Ok(crate::reach::Pipe::new(stream, sandbox))
        })
    }

    fn is_open(&self) -> bool {
        !*self.closed.borrow() && !self.retired.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn serves_a_turn(&self) -> bool {
        !self.for_visitors
    }

    fn shell(
        &self,
        request: steadfast_sandbox::shell::ShellRequest,
    ) -> crate::reach::Reached<'_, crate::reach::Pipe> {
        Box::pin(async move {
            let sandbox = self.visit().await?;
            let stream = sandbox.shell(&request).await?;
            Ok(crate::reach::Pipe::new(stream, sandbox))
        })
    }

    fn person_in(&self) -> Option<crate::reach::PersonIn> {
        self.for_visitors.then(|| Journal::person_in(self))
    }

    fn asked_to_leave(&self) -> crate::reach::Reached<'_, ()> {
        Box::pin(async move {
            Journal::asked_to_leave(self).await;
            Ok(())
        })
    }

    fn record_person<'a>(
        &'a self,
        by: &'a str,
        since_ms: u64,
        moment: crate::reach::ShellMoment,
    ) -> crate::reach::Reached<'a, Vec<String>> {
        Box::pin(Journal::record_person(self, by, since_ms, moment))
    }
}
