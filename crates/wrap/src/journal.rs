//! Journaled tool calls of a wrapped agent: the same intent/outcome discipline as the
//! native harness (snapshot before, intent, effect, snapshot after, outcome), plus
//! replay: a restarted agent that makes a recorded call again gets the recorded result
//! and nothing runs.
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

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};

use serde_json::Value;
use steadfast_drive::Drive;
use steadfast_fault::{point, points};
use steadfast_log::{Event, Output, SessionState, ToolClass, WrappedTool};
use steadfast_sandbox::egress::EgressDesk;
use steadfast_sandbox::reconcile::Reconciler;
use steadfast_sandbox::{classify, Sandbox};
use steadfast_world::{strip_ansi, Blobs, InboundKind, Lease, LiveSession, World, INLINE_LIMIT};
use tokio::sync::Mutex;

use crate::{Error, Result};

/// How many recorded calls past the cursor a call may match (agents run read-only
/// tools in parallel, in any order).
const REPLAY_WINDOW: usize = 8;

/// Makes the sandbox tools run in, when the first call needs one.
pub type MakeSandbox<S> = Arc<dyn Fn() -> steadfast_sandbox::Result<S> + Send + Sync>;

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
/// do). They share one workspace, so a snapshot is the workspace as all of them left it
/// at that instant, and the record is kept in the order things happened: taking a
/// snapshot and appending the event that names it is one step that parallel calls take
/// in turn, so each snapshot in the log is at least as new as every one before it, and
/// the last one is the workspace as every recorded call left it. A call cut off by a
/// crash is rolled back to that last one, which never undoes a sibling whose result is
/// recorded. A replay moves the workspace to a recorded call's after-snapshot only
/// forwards in the order results were recorded, whatever order the restarted agent
/// asks in.
pub struct ToolJournal<W, S> {
    live: Arc<LiveSession<W>>,
    drive: Drive,
    blobs: Blobs,
    workspace: PathBuf,
    make_sandbox: MakeSandbox<S>,
    /// The sandbox tools run in: made by the first call that needs one, and made again
    /// after one dies.
    sandbox: Mutex<Option<Arc<S>>>,
    /// The recorded calls (and superseded external facts) this run has been answered
    /// from, and the calls it made itself: never matched again.
    consumed: Mutex<HashSet<String>>,
    last_snapshot: Arc<StdMutex<Option<String>>>,
    /// Held while a snapshot is taken and the event naming it appended, and while a
    /// replay moves the workspace: one writer of the record and the workspace at a time.
    recording: Mutex<()>,
    /// The recorded call whose after-snapshot a replay last put the workspace at.
    replayed_to: StdMutex<Option<ResultPlace>>,
    counters: StdMutex<(u64, u64)>,
    /// The most tool calls the turn may make; past it calls are refused and the
    /// session escalates (the runaway guard, whatever the agent does).
    max_calls: usize,
    /// The longest a snapshot may take (see [`Drive::snapshot_within`]).
    snapshot_timeout: std::time::Duration,
    /// Tool calls this turn has made so far (recorded ones included).
    calls: std::sync::atomic::AtomicUsize,
    /// Calls running now (they run to their end even if the agent that asked died).
    inflight: tokio::sync::watch::Sender<usize>,
    /// The session's own MCP servers' tools, run by the harness (not in the sandbox).
    remote: Option<Arc<crate::remote::RemoteTools>>,
    /// `git_push`, run by the harness with the session's credential.
    git: Option<Arc<crate::git::GitPusher>>,
    /// Which calls run in the tools' sandbox, for its egress proxy's records.
    egress: Option<Arc<EgressDesk>>,
}

/// Counts a running call as finished when dropped (however it ends).
struct Running<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<W: World + Clone, S: Sandbox> ToolJournal<W, S> {
    /// A journal for one run of the agent over the session's log (its cut-off calls
    /// resolved), replaying the open turn's recorded calls.
    pub fn new(
        live: Arc<LiveSession<W>>,
        drive: Drive,
        blobs: Blobs,
        workspace: PathBuf,
        make_sandbox: MakeSandbox<S>,
        last_snapshot: Arc<StdMutex<Option<String>>>,
    ) -> Self {
        let recorded = live.with(|s| s.wrapped_tools.len().saturating_sub(s.turn_start.tools));
        ToolJournal {
            live,
            drive,
            blobs,
            workspace,
            make_sandbox,
            sandbox: Mutex::new(None),
            calls: std::sync::atomic::AtomicUsize::new(recorded),
            consumed: Mutex::new(HashSet::new()),
            max_calls: usize::MAX,
            snapshot_timeout: std::time::Duration::from_secs(600),
            last_snapshot,
            recording: Mutex::new(()),
            replayed_to: StdMutex::new(None),
            counters: StdMutex::new((0, 0)),
            inflight: tokio::sync::watch::Sender::new(0),
            remote: None,
            git: None,
            egress: None,
        }
    }

    /// Counts each call as running at `desk` while it runs in the sandbox, so what its
    /// egress proxy sees it open is recorded against it (see
    /// `steadfast_sandbox::egress`).
    pub fn with_egress(mut self, desk: Arc<EgressDesk>) -> Self {
        self.egress = Some(desk);
        self
    }

    /// Offers (and runs) the tools the harness runs outside the sandbox too: the
    /// session's own MCP servers' and `git_push`.
    pub fn with_hosted(mut self, hosted: crate::run::Hosted) -> Self {
        self.remote = hosted.remote;
        self.git = hosted.git;
        self
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

    /// Stops the command running in the tools' sandbox, if one is (an interrupt): the
    /// call then records its outcome, with the workspace as the command left it.
    pub async fn cancel(&self) {
        let sandbox = self.sandbox.lock().await.clone();
        if let Some(sandbox) = sandbox {
            sandbox.cancel().await;
        }
    }

    /// The same journal with snapshots abandoned after `limit`.
    pub fn with_snapshot_timeout(mut self, limit: std::time::Duration) -> Self {
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

    /// Calls answered from the record, and calls run.
    pub fn counters(&self) -> (u64, u64) {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
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
        let calls = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if calls > self.max_calls {
            return Ok((
                format!("[steadfast] refused: this turn has made {} tool calls, its limit; the session is escalated to a human", self.max_calls),
                true,
            ));
        }
        self.inflight.send_modify(|n| *n += 1);
        let _running = Running(&self.inflight);
        self.run(tool, input).await
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
            self.drive.restore_async(&self.workspace, &after).await?;
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
            self.drive.restore_async(&self.workspace, &frontier).await?;
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(frontier);
        }
        Ok(())
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

    async fn snapshot(&self) -> Result<String> {
        Ok(self
            .drive
            .snapshot_within(&self.workspace, self.snapshot_timeout)
            .await?)
    }

    /// Runs a call in the session's sandbox, made when the first call needs it.
    async fn execute_in_sandbox(
        &self,
        tool: &str,
        input: &Value,
    ) -> Result<steadfast_sandbox::ToolOutput> {
        let sandbox = {
            let mut held = self.sandbox.lock().await;
            match &*held {
                Some(sandbox) => sandbox.clone(),
                None => {
                    let make = self.make_sandbox.clone();
                    let made = Arc::new(
                        tokio::task::spawn_blocking({
                            let parent = tracing::Span::current();
                            move || parent.in_scope(|| make())
                        })
                        .await
                        .map_err(|e| Error::Task(e.to_string()))??,
                    );
                    *held = Some(made.clone());
                    made
                }
            }
        };
        let executed = sandbox.execute(tool, input).await;
        if let Err(steadfast_sandbox::Error::Died(_)) = &executed {
            // The next call gets a new one (unless a sibling already made it).
            let mut held = self.sandbox.lock().await;
            if held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &sandbox)) {
                held.take();
            }
        }
        Ok(executed?)
    }

    /// The sandbox died while `call_id` ran in it (killed, out of memory, evicted):
    /// recorded, and the call resolved as a crash would resolve it (a mutation rolled
    /// back to the newest recorded snapshot, an external effect's outcome unknown, a
    /// read dropped to run again). The next call gets a new sandbox. Returns what the
    /// agent is told.
    async fn sandbox_died(
        &self,
        call_id: String,
        class: ToolClass,
        tool: &str,
        input: &Value,
        reason: String,
    ) -> Result<(String, bool)> {
        tracing::warn!(session = %self.live.lease().session, %reason, "sandbox died mid-call");
        let _writer = self.recording.lock().await;
        let newest = self.live.with(|s| s.last_snapshot.clone());
        let rollback_to = if class == ToolClass::Mutate {
            newest
        } else {
            None
        };
        let resolution = steadfast_sandbox::reconcile::resolve(
            &[],
            class,
            tool,
            input,
            rollback_to,
            |_| async { Err("no probe".to_string()) },
        )
        .await;
        if let steadfast_log::ToolResolution::RolledBack { snapshot: Some(to) } = &resolution {
            self.drive.restore_async(&self.workspace, to).await?;
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(to.clone());
        }
        self.live
            .append(&[
                Event::SandboxLost {
                    call_id: Some(call_id.clone()),
                    reason: reason.clone(),
                },
                Event::ToolCallInterrupted {
                    call_id: call_id.clone(),
                    resolution,
                },
            ])
            .await?;
        let told = self.live.with(|s| {
            s.wrapped_tools
                .iter()
                .find(|t| t.call_id == call_id)
                .and_then(|t| t.result.clone())
        });
        Ok(told.unwrap_or_else(|| {
            (
                format!("[steadfast] the sandbox died while this ran ({reason}); it had no effect that was kept. Run it again."),
                true,
            )
        }))
    }

    async fn run(&self, tool: &str, input: &Value) -> Result<(String, bool)> {
        let remote = self.remote.as_ref().filter(|r| r.find(tool).is_some());
        let pushing = self
            .git
            .as_ref()
            .filter(|_| tool == crate::git::GIT_PUSH_TOOL);
        let class = match remote.and_then(|r| r.find(tool)) {
            Some(t) => t.class,
            None if pushing.is_some() => ToolClass::External,
            // Seen sending out of the sandbox before: external, whatever the text says.
            None if self.live.with(|s| s.seen_reaching_out(tool, input)) => ToolClass::External,
            None => classify(tool, input),
        };
        // An MCP server's tool runs elsewhere: the workspace is not its to change.
        let touches = class.touches_workspace() && remote.is_none();
        let call_id = format!("wt_{}", uuid::Uuid::now_v7().simple());
        // Made by this run: never an answer for a later call of it.
        self.consumed.lock().await.insert(call_id.clone());
        {
            let _writer = self.recording.lock().await;
            self.to_frontier().await?;
            let snapshot_before = if touches {
                Some(self.snapshot().await?)
            } else {
                None
            };
            self.live
                .append(&[Event::ToolCallIntent {
                    call_id: call_id.clone(),
                    tool: tool.to_string(),
                    input: input.clone(),
                    class,
                    snapshot_before,
                }])
                .await?;
        }
        point(points::TOOL_INTENT);
        let _running = self
            .egress
            .as_ref()
            .filter(|_| remote.is_none() && pushing.is_none())
            .map(|desk| desk.running(&call_id, false));
        let executed = match (remote, pushing) {
            (Some(remote), _) => Ok(remote.call(tool, input).await),
            (None, Some(git)) => {
                git.push(input, |command| async move {
                    self.execute_in_sandbox("bash", &serde_json::json!({ "command": command }))
                        .await
                })
                .await
            }
            (None, None) => self.execute_in_sandbox(tool, input).await,
        };
        if let Err(Error::Sandbox(steadfast_sandbox::Error::Died(reason))) = executed {
            // What it was seen doing counts: one that sent out is an external effect.
            let class = self.live.with(|s| {
                s.wrapped_tools
                    .iter()
                    .find(|t| t.call_id == call_id)
                    .map_or(class, WrappedTool::effective_class)
            });
            return self.sandbox_died(call_id, class, tool, input, reason).await;
        }
        // A call whose intent is recorded gets an outcome, even when it could not run:
        // one left without would be rolled back by the next turn, as if cut off.
        let out = executed.unwrap_or_else(|e| {
            steadfast_sandbox::ToolOutput::error(format!("[steadfast] the call could not run: {e}"))
        });
        point(points::TOOL_EFFECT);
        let _writer = self.recording.lock().await;
        let snapshot_after = if touches {
            Some(self.snapshot().await?)
        } else {
            None
        };
        let mut text = strip_ansi(&out.text);
        let steer = self.steer().await?;
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
        let mut events = vec![Event::ToolCallOutcome {
            call_id,
            is_error: out.is_error,
            exit_code: out.exit_code,
            output,
            snapshot_after: snapshot_after.clone(),
        }];
        if let Some((text, inbox_id)) = steer {
            events.push(Event::Steered { text, inbox_id });
        }
        // The fold counts the call towards the loop breaker as the outcome is applied.
        self.live.append(&events).await?;
        if snapshot_after.is_some() {
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot_after;
        }
        drop(_writer);
        point(points::TOOL_OUTCOME);
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
        Ok((shown, out.is_error))
    }
}

/// Resolves the wrapped tool calls a crash cut off (docs/ARCHITECTURE.md rule 4), through the
/// same [`resolve`](steadfast_sandbox::reconcile::resolve) as the native loop: a read
/// runs again when the agent asks again; a mutation is rolled back to its snapshot and
/// the agent, on replay, is told so; an external effect is asked of the reconcilers
/// (their probes run in a sandbox from `make_sandbox`, on the workspace as it was just
/// before the call) and otherwise reported outcome-unknown. Returns the snapshot the
/// workspace must be at.
#[allow(clippy::too_many_arguments)]
pub async fn resolve_cut_off<W: World, S: Sandbox>(
    world: &W,
    lease: &Lease,
    drive: &Drive,
    workspace: &std::path::Path,
    tools: &[WrappedTool],
    last_snapshot: Option<String>,
    reconcilers: &[Arc<dyn Reconciler>],
    git: Option<&crate::git::GitPusher>,
    make_sandbox: &MakeSandbox<S>,
) -> Result<Option<String>> {
    let restore = |snap: String| {
        let (drive, ws) = (drive.clone(), workspace.to_path_buf());
        async move { drive.restore_async(&ws, &snap).await.map_err(Error::from) }
    };
    let mut sandbox: Option<S> = None;
    // Where the workspace goes back to: the last snapshot the log names, which is as
    // new as every recorded result (see [`ToolJournal`]'s parallel calls). For a call
    // cut off alone it is the one taken just before it; for calls of one reply cut off
    // beside siblings recorded after they began, it keeps those siblings' work.
    let rolled_back_to = last_snapshot.clone();
    for t in tools.iter().filter(|t| t.result.is_none()) {
        // A call seen sending out of the sandbox is an external effect, whatever it
        // was classed as when it began: never rolled back and run again.
        let class = t.effective_class();
        let pushed = git.filter(|_| t.tool == crate::git::GIT_PUSH_TOOL);
        let probing = class == ToolClass::External
            && (pushed.is_some() || reconcilers.iter().any(|r| r.matches(&t.tool, &t.input)));
        if probing {
            if let Some(snap) = &t.snapshot_before {
                restore(snap.clone()).await?;
            }
            if sandbox.is_none() {
                let make = make_sandbox.clone();
                sandbox = Some(
                    tokio::task::spawn_blocking({
                        let parent = tracing::Span::current();
                        move || parent.in_scope(|| make())
                    })
                    .await
                    .map_err(|e| Error::Task(e.to_string()))??,
                );
            }
        }
        let probe_in = sandbox.as_ref();
        let probe = |command: String| async move {
            let sandbox = probe_in.ok_or("no sandbox to probe in")?;
            sandbox
                .execute("bash", &serde_json::json!({ "command": command }))
                .await
                .map_err(|e| e.to_string())
        };
        let resolution = match pushed {
            Some(git) => git.resolve(&t.input, probe).await,
            None => {
                let rollback_to = match class {
                    ToolClass::Mutate => rolled_back_to.clone().or(t.snapshot_before.clone()),
                    _ => t.snapshot_before.clone(),
                };
                steadfast_sandbox::reconcile::resolve(
                    reconcilers,
                    class,
                    &t.tool,
                    &t.input,
                    rollback_to,
                    probe,
                )
                .await
            }
        };
        tracing::info!(call = %t.call_id, tool = %t.tool, ?resolution, "resolving a cut-off tool call");
        world
            .append(
                lease,
                &[Event::ToolCallInterrupted {
                    call_id: t.call_id.clone(),
                    resolution,
                }],
            )
            .await?;
    }
    if let Some(snap) = &last_snapshot {
        restore(snap.clone()).await?;
    }
    Ok(last_snapshot)
}
