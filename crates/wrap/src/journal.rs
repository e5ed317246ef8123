//! Journaled tool calls of a wrapped agent: the same intent/outcome discipline as the
//! native harness (snapshot before, intent, effect, snapshot after, outcome), plus
//! replay: a restarted agent that makes a recorded call again gets the recorded result
//! and nothing runs.

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};

use serde_json::Value;
use steadfast_drive::Drive;
use steadfast_fault::{point, points};
use steadfast_log::{Event, Output, SessionState, ToolClass, ToolResolution, WrappedTool};
use steadfast_sandbox::{classify, Sandbox};
use steadfast_world::{strip_ansi, Blobs, Lease, World, INLINE_LIMIT};
use tokio::sync::{Mutex, OnceCell};

use crate::{Error, Result};

/// How many recorded calls past the cursor a call may match (agents run read-only
/// tools in parallel, in any order).
const REPLAY_WINDOW: usize = 8;

/// Makes the sandbox tools run in, when the first call needs one.
pub type MakeSandbox<S> = Arc<dyn Fn() -> steadfast_sandbox::Result<S> + Send + Sync>;

struct Replay {
    recorded: Vec<WrappedTool>,
    consumed: Vec<bool>,
}

/// Runs and records a wrapped agent's tool calls.
pub struct ToolJournal<W, S> {
    world: W,
    lease: Lease,
    drive: Drive,
    blobs: Blobs,
    workspace: PathBuf,
    make_sandbox: MakeSandbox<S>,
    sandbox: OnceCell<S>,
    replay: Mutex<Replay>,
    last_snapshot: Arc<StdMutex<Option<String>>>,
    /// Tool calls recorded after this many exchanges are superseded (a divergence).
    superseded_after: StdMutex<Option<u32>>,
    /// The session as folded at the start, counting the loop breaker on from there.
    session: StdMutex<SessionState>,
    counters: StdMutex<(u64, u64)>,
}

impl<W: World + Clone, S: Sandbox> ToolJournal<W, S> {
    /// A journal for one run of the agent, replaying `recorded` (the session's wrapped
    /// tool calls, all resolved).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        world: W,
        lease: Lease,
        drive: Drive,
        blobs: Blobs,
        workspace: PathBuf,
        make_sandbox: MakeSandbox<S>,
        session: &SessionState,
        last_snapshot: Arc<StdMutex<Option<String>>>,
    ) -> Self {
        let recorded = session.wrapped_tools.clone();
        let consumed = vec![false; recorded.len()];
        ToolJournal {
            world,
            lease,
            drive,
            blobs,
            workspace,
            make_sandbox,
            sandbox: OnceCell::new(),
            replay: Mutex::new(Replay { recorded, consumed }),
            last_snapshot,
            superseded_after: StdMutex::new(None),
            session: StdMutex::new(session.clone()),
            counters: StdMutex::new((0, 0)),
        }
    }

    /// The loop breaker's verdict over the calls so far (for the gateway to refuse the
    /// next model call and the session to escalate).
    pub fn loop_hit(&self) -> Option<(steadfast_log::Breaker, String)> {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .loop_hit()
    }

    /// Calls answered from the record, and calls run.
    pub fn counters(&self) -> (u64, u64) {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The gateway superseded the record from exchange `index` on: tool calls made
    /// after it are no longer answered from the record.
    pub fn diverged(&self, index: u32) {
        *self
            .superseded_after
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(index);
    }

    /// Runs (or replays) one call; the text and error flag the agent gets back.
    pub async fn call(&self, tool: &str, input: &Value) -> Result<(String, bool)> {
        if let Some(result) = self.replayed(tool, input).await {
            return Ok(result);
        }
        self.run(tool, input).await
    }

    async fn replayed(&self, tool: &str, input: &Value) -> Option<(String, bool)> {
        let limit = *self
            .superseded_after
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut replay = self.replay.lock().await;
        let cursor = replay
            .consumed
            .iter()
            .position(|c| !c)
            .unwrap_or(replay.consumed.len());
        let end = (cursor + REPLAY_WINDOW).min(replay.recorded.len());
        let hit = (cursor..end).find(|&i| {
            let t = &replay.recorded[i];
            !replay.consumed[i]
                && t.tool == tool
                && &t.input == input
                && t.result.is_some()
                && limit.is_none_or(|l| t.after_exchanges <= l)
        })?;
        replay.consumed[hit] = true;
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
        replay.recorded[hit].result.clone()
    }

    async fn snapshot(&self) -> Result<String> {
        let (drive, ws) = (self.drive.clone(), self.workspace.clone());
        tokio::task::spawn_blocking(move || drive.snapshot(&ws))
            .await
            .map_err(|e| Error::Task(e.to_string()))?
            .map_err(Error::from)
    }

    async fn run(&self, tool: &str, input: &Value) -> Result<(String, bool)> {
        let class = classify(tool, input);
        let touches = class != ToolClass::Read;
        let snapshot_before = if touches {
            Some(self.snapshot().await?)
        } else {
            None
        };
        let call_id = format!("wt_{}", uuid::Uuid::now_v7().simple());
        self.world
            .append(
                &self.lease,
                &[Event::ToolCallIntent {
                    call_id: call_id.clone(),
                    tool: tool.to_string(),
                    input: input.clone(),
                    class,
                    snapshot_before: snapshot_before.clone(),
                }],
            )
            .await?;
        let snapshot_before_copy = snapshot_before;
        point(points::TOOL_INTENT);
        let sandbox = self
            .sandbox
            .get_or_try_init(|| async {
                let make = self.make_sandbox.clone();
                tokio::task::spawn_blocking(move || make())
                    .await
                    .map_err(|e| Error::Task(e.to_string()))?
                    .map_err(Error::from)
            })
            .await?;
        let out = sandbox.execute(tool, input).await?;
        point(points::TOOL_EFFECT);
        let snapshot_after = if touches {
            Some(self.snapshot().await?)
        } else {
            None
        };
        let text = strip_ansi(&out.text);
        let output = if text.len() > INLINE_LIMIT {
            Output::Blob(self.blobs.put(text.as_bytes()).await?)
        } else {
            Output::Inline { text }
        };
        let shown = output.for_model();
        self.world
            .append(
                &self.lease,
                &[Event::ToolCallOutcome {
                    call_id,
                    is_error: out.is_error,
                    exit_code: out.exit_code,
                    output,
                    snapshot_after: snapshot_after.clone(),
                }],
            )
            .await?;
        let unchanged = snapshot_after.is_none() || snapshot_after == snapshot_before_copy;
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .count_call(tool, input, unchanged);
        if snapshot_after.is_some() {
            *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot_after;
        }
        point(points::TOOL_OUTCOME);
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
        Ok((shown, out.is_error))
    }
}

/// Resolves the wrapped tool calls a crash cut off (DESIGN.md invariant 4): a read
/// runs again when the agent asks again; a mutation is rolled back to its snapshot and
/// the agent, on replay, is told so; an external effect is reported outcome-unknown.
/// Returns the snapshot the workspace must be at.
pub async fn resolve_cut_off<W: World>(
    world: &W,
    lease: &Lease,
    drive: &Drive,
    workspace: &std::path::Path,
    tools: &[WrappedTool],
    mut last_snapshot: Option<String>,
) -> Result<Option<String>> {
    for t in tools.iter().filter(|t| t.result.is_none()) {
        let resolution = match t.class {
            ToolClass::Read => ToolResolution::Rerun,
            ToolClass::Mutate => {
                if t.snapshot_before.is_some() {
                    last_snapshot = t.snapshot_before.clone();
                }
                ToolResolution::RolledBack {
                    snapshot: t.snapshot_before.clone(),
                }
            }
            ToolClass::External => ToolResolution::OutcomeUnknown,
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
        let (drive, ws, snap) = (drive.clone(), workspace.to_path_buf(), snap.clone());
        tokio::task::spawn_blocking(move || drive.restore(&ws, &snap))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
    }
    Ok(last_snapshot)
}
