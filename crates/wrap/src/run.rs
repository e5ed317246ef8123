//! Driving one turn of a wrapped CLI, durably.

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde_json::json;
use steadfast_drive::Drive;
use steadfast_gateway::history::{Continuing, Conversation};
use steadfast_gateway::{Gateway, GatewayConfig, Upstreams};
use steadfast_journal::exchange::{Counters, Divergence, Mismatch};
use steadfast_journal::{resolve_cut_off, Journal, MakeSandbox, SandboxSlot};
use steadfast_log::{EndState, Event, Role, SessionState, Status};
use steadfast_sandbox::egress::EgressDesk;
use steadfast_sandbox::{isolates, AnySandbox, NetworkPolicy, Sandbox, SandboxOptions};
use steadfast_world::{Blobs, LiveSession, World};

use crate::adapters::{Adapter, Launch};
use crate::{mcp, Error, Result};

/// The loopback ports inside the CLI's sandbox that lead to the gateway and the MCP
/// server.
const GATEWAY_PORT: u16 = 4180;
const MCP_PORT: u16 = 4181;

/// Where an isolated CLI sees its install directory, on every host.
const AGENTS_MOUNT: &str = "/run/steadfast-agents";

/// How a wrapped CLI is run.
#[derive(Debug, Clone)]
pub struct WrappedOptions {
    /// The CLI.
    pub adapter: Adapter,
    /// Where its npm package is installed.
    pub install_dir: PathBuf,
    /// The session's workspace on this host (materialized by the harness).
    pub workspace: PathBuf,
    /// Sandbox settings (of the tools' sandbox; the CLI's gets no network but the
    /// gateway and the tools).
    pub sandbox: SandboxOptions,
    /// The providers the gateway calls.
    pub upstreams: Upstreams,
    /// How many times a CLI that died mid-turn is started again before the session fails.
    pub max_restarts: u32,
    /// The longest a turn may run.
    pub turn_timeout: Duration,
    /// The most model calls a turn may make; past it the session escalates.
    pub max_exchanges_per_turn: usize,
    /// Model prices overriding the built-in table (for the cost bound).
    pub prices: steadfast_model::pricing::PriceTable,
    /// The most tool calls a turn may make; past it the session escalates (the
    /// runaway guard).
    pub max_tool_calls_per_turn: usize,
    /// The longest a workspace snapshot of a tool call may take (see
    /// [`Drive::snapshot_within`]).
    pub snapshot_timeout: Duration,
    /// Probes that decide, after a crash, whether an external effect took place.
    pub reconcilers: Vec<Arc<dyn steadfast_sandbox::reconcile::Reconciler>>,
    /// The tools the harness runs for the session outside its sandbox, which the
    /// journaled MCP server offers too.
    pub hosted: Hosted,
    /// The HTTP client the gateway calls the providers through (the harness's).
    pub http: reqwest::Client,
    /// What a model request the record does not have does: a replay against another
    /// CLI notes it, and stops there or goes on live.
    pub mismatch: Mismatch,
    /// The last holder's tools' sandbox was adopted at wake: a tool call it cut off
    /// may still run there, to be waited for rather than resolved by rule 4.
    pub adopted: bool,
}

pub use steadfast_journal::Hosted;

/// How a turn went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnReport {
    /// The CLI's final answer.
    pub reply: String,
    /// Times the CLI was started again after dying.
    pub restarts: u32,
    /// The gateway's counts, over all starts.
    pub exchanges: Counters,
    /// Tool calls answered from the record, and run, over all starts.
    pub tools: (u64, u64),
    /// Who interrupted the turn, if someone did.
    pub interrupted_by: Option<String>,
    /// The CLI was stopped because its driver is stopping (the turn goes on
    /// elsewhere, from the log), or because a replay that only checks reached a
    /// request the record did not have: nothing more is recorded for the turn.
    pub stopped: bool,
    /// Replaying against something new: the first model request the record did not
    /// have.
    pub divergence: Option<Divergence>,
    /// Replaying against something new: the turn's recorded model requests the CLI
    /// never made.
    pub unanswered: usize,
}

/// How a run of the CLI ended.
enum RunEnd {
    /// By itself (or stopped by a bound).
    Ran(steadfast_sandbox::Result<steadfast_sandbox::ToolOutput>),
    /// Someone interrupted the turn.
    Interrupted(steadfast_world::Inbound),
    /// The driver is stopping (its worker was told to).
    Stopped,
    /// A call waits for a person's approval: the turn goes on, from the log, once the
    /// answer comes.
    Waiting,
    /// A replay that only checks reached a request the record did not have.
    Diverged,
    /// The lease could not be renewed in time: the CLI and its commands are killed
    /// before another holder may take the session over.
    LeaseLost,
}

/// Resolves once `stopping` turns true; never, if its sender is gone first.
async fn stop_requested(mut stopping: tokio::sync::watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How long an interrupted turn waits for the model reply and the command it cut off
/// to be recorded.
const INTERRUPT_SETTLE: Duration = Duration::from_secs(5);

/// Serves `router` until dropped.
struct Served(tokio::task::JoinHandle<()>);

/// Closes a run's journal when the run ends, however it ends (see [`Journal::close`]).
struct Closing<W: World + Clone + 'static>(Arc<Journal<W, AnySandbox>>);

impl<W: World + Clone + 'static> Drop for Closing<W> {
    fn drop(&mut self) {
        let journal = self.0.clone();
        tokio::spawn(async move { journal.close().await });
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where the CLI reaches a server, and the server.
async fn serve(
    router: axum::Router,
    unix: Option<(u16, PathBuf)>,
) -> Result<(String, Served, Option<(u16, PathBuf)>)> {
    // Each request is handled inside the span of the session being driven, so the
    // gateway's and the MCP server's lines carry its id like every other.
    let span = tracing::Span::current();
    let router = router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            use tracing::Instrument;
            next.run(request).instrument(span.clone())
        },
    ));
    match unix {
        Some((port, path)) => {
            let _ = std::fs::remove_file(&path);
            let listener = tokio::net::UnixListener::bind(&path)
                .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            });
            Ok((
                format!("http://127.0.0.1:{port}"),
                Served(task),
                Some((port, path)),
            ))
        }
        None => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| Error::Invalid(e.to_string()))?;
            let addr = listener
                .local_addr()
                .map_err(|e| Error::Invalid(e.to_string()))?;
            // The CLI's streamed replies must not wait for Nagle's algorithm.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            });
            Ok((format!("http://{addr}"), Served(task), None))
        }
    }
}

/// What a turn's CLI is asked when it has no kept conversation to continue (see
/// [`steadfast_gateway::history`]; a session recorded before conversations were kept,
/// or a turn whose CLI made no conversation request): the turn's message as sent,
/// preceded by the session's earlier turns (each user message, steers included, and
/// the agent's final answer). Built from the log alone, so a CLI started again to
/// replay the turn is asked the same.
pub fn turn_prompt(state: &SessionState) -> String {
    let task = &state.turn_start.task;
    let current = state
        .conversation
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0);
    let earlier = &state.conversation[..current];
    if earlier.is_empty() {
        return task.clone();
    }
    let mut prompt = String::from(
        "This session has had earlier turns. What was said, for context (the workspace already has their changes):\n",
    );
    for message in earlier {
        let who = match message.role {
            Role::User => "User",
            Role::Assistant => "You answered",
        };
        prompt.push_str(&format!("\n{who}: {}\n", message.text().trim()));
    }
    prompt.push_str(&format!("\nThe user's new message:\n\n{task}"));
    prompt
}

/// A random session-scoped token: worth nothing outside this gateway.
fn token() -> String {
    let seed = format!(
        "{}-{:?}",
        uuid::Uuid::now_v7(),
        std::time::SystemTime::now()
    );
    format!("sf-gw-{}", &blake3::hash(seed.as_bytes()).to_hex()[..40])
}

/// Drives the open turn of a wrapped session to its end: the CLI runs (again, after a
/// crash, replaying the log) until it finishes, and the turn's end is recorded.
pub async fn drive_turn<W: World + Clone + 'static>(
    live: &Arc<LiveSession<W>>,
    blobs: &Blobs,
    drive: &Drive,
    options: &WrappedOptions,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> Result<TurnReport> {
    let mut report = TurnReport::default();
    let (world, lease) = (live.world(), live.lease());
    loop {
        let state = live.state();
        if state.phase.status() != Status::Running {
            return Err(Error::Invalid(format!(
                "session {} is {}: no turn to drive",
                lease.session,
                state.phase.status()
            )));
        }
        let history = kept_history(blobs, &state, &options.adapter).await;
        let task = match history {
            Some(_) => state.turn_start.task.clone(),
            None => turn_prompt(&state),
        };
        let instructions = state.instructions.clone();
        let workspace = options.workspace.clone();
        let model = state.model.model.clone();
        let provider = state.model.provider.clone();
        // What the tools' sandbox opens through its egress proxy is recorded against
        // the calls running, in the live log this run appends to (made below).
        let desk = EgressDesk::new();
        let held_back: steadfast_journal::HeldBack = Arc::default();
        let record = Journal::<W, AnySandbox>::egress_recorder(
            Arc::new(std::sync::OnceLock::from(live.clone())),
            Arc::clone(&held_back),
        );
        let tool_options = SandboxOptions {
            forwards: Vec::new(),
            egress_watch: Some(desk.watch(record)),
            ..options.sandbox.clone()
        };
        let tool_ws = workspace.clone();
        let make: MakeSandbox<AnySandbox> =
            Arc::new(move || AnySandbox::provision(&tool_ws, &tool_options));
        let slot = SandboxSlot::new(workspace.clone(), make, drive.clone(), None);
        let last_snapshot = Arc::new(StdMutex::new(state.last_snapshot.clone()));
        let journal = Arc::new(
            Journal::new(
                live.clone(),
                drive.clone(),
                blobs.clone(),
                slot,
                last_snapshot.clone(),
            )
            .with_held_back(held_back)
            .with_max_calls(options.max_tool_calls_per_turn)
            .with_snapshot_timeout(options.snapshot_timeout)
            .with_hosted(options.hosted.clone())
            .with_egress(desk)
            .with_history_quota(steadfast_journal::history::HistoryQuota::of(
                &options.sandbox.limits,
            )),
        );
        journal.reachable();
        // A call the crash cut off whose command the adopted sandbox kept running is
        // waited for and its outcome recorded: the CLI, started again, is answered
        // from the record.
        if options.adopted {
            let cut: Vec<_> = state
                .wrapped_tools
                .iter()
                .filter(|t| t.result.is_none())
                .cloned()
                .collect();
            for t in cut {
                let call = steadfast_journal::calls::Call {
                    id: t.call_id.clone(),
                    tool: t.tool.clone(),
                    input: t.input.clone(),
                    class: t.effective_class(),
                    announced: true,
                };
                journal.reattach(call, std::future::pending()).await?;
            }
        }
        // Invariant 4 for tool calls a crash cut off, and the workspace back in step.
        let state = live.state();
        let last = resolve_cut_off(
            live,
            drive,
            &state.wrapped_tools,
            state.last_snapshot.clone(),
            &options.reconcilers,
            options.hosted.git.as_deref(),
            journal.sandbox(),
        )
        .await?;
        let state = live.state();
        // Lockstep: a CLI started again over a turn with a record sees the workspace
        // as the turn began; each call answered from the record moves it on to where
        // that call left it, until the replay reaches the frontier.
        let replays = state.exchanges.len() > state.turn_start.exchanges as usize
            || state.wrapped_tools.len() > state.turn_start.tools;
        let start = match &state.turn_start.snapshot {
            Some(snap) if replays && last.as_ref() != Some(snap) => {
                drive.restore_async(&workspace, snap).await?;
                state.turn_start.snapshot.clone()
            }
            _ => last,
        };
        *last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = start;

        // However this run ends, its tools' sandbox goes with it.
        let _closing = Closing(journal.clone());
        let token = token();
        let exchanges = Arc::new(journal.exchanges(
            options.max_exchanges_per_turn,
            options.prices.clone(),
            options.mismatch,
        ));
        let gateway = Gateway::open(GatewayConfig {
            http: options.http.clone(),
            exchanges: exchanges.clone(),
            token: token.clone(),
            upstreams: options.upstreams.clone(),
            models: vec![model.clone()],
            continuing: Continuing {
                task: task.clone(),
                history,
            },
        });

        // In an isolating sandbox the CLI reaches the servers through forwarded
        // loopback ports (its network has nothing else); in a local one, directly.
        let sockets = tempfile_dir()?;
        let isolated = isolates(&options.sandbox);
        let unix = |port: u16, name: &str| isolated.then(|| (port, sockets.0.join(name)));
        let (gw_url, _gw, gw_fwd) =
            serve(gateway.router(), unix(GATEWAY_PORT, "gateway.sock")).await?;
        let (mcp_base, _mcp, mcp_fwd) =
            serve(mcp::router(journal.clone()), unix(MCP_PORT, "mcp.sock")).await?;
        let mut cli_options = SandboxOptions {
            network: NetworkPolicy::DenyAll,
            forwards: gw_fwd.into_iter().chain(mcp_fwd).collect(),
            max_timeout: options.turn_timeout,
            // The CLI goes with this process (it talks to this gateway); the tools'
            // sandbox is the one that outlives it, with the commands it runs.
            hold: None,
            ..options.sandbox.clone()
        };
        // An isolated CLI sees its install directory at one fixed path on every host
        // (Pi names it in its system prompt: a host with another path would diverge).
        let install_dir = if isolated {
            let inside = PathBuf::from(AGENTS_MOUNT);
            cli_options
                .read_only_mounts
                .push((options.install_dir.clone(), inside.clone()));
            inside
        } else {
            options.install_dir.clone()
        };
        // The CLIs are Node programs: V8 reserves address space far beyond what it uses.
        cli_options.limits.memory_mb = None;
        let launch = Launch {
            gateway: &gw_url,
            mcp: &format!("{mcp_base}/mcp"),
            token: &token,
            task: &task,
            instructions: instructions.as_deref(),
            provider: &provider,
            model: &model,
            install_dir: &install_dir,
        };
        let command = options.adapter.command(&launch);
        let cli_ws = workspace.clone();
        let cli = tokio::task::spawn_blocking(move || AnySandbox::provision(&cli_ws, &cli_options))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
        tracing::info!(agent = %options.adapter.name, restarts = report.restarts, "starting the wrapped CLI");
        let input = json!({"command": command, "timeout": options.turn_timeout.as_millis() as u64});
        // A bound crossed stops the CLI at once (it would only retry the refusal).
        // An interrupt stops the CLI and the command it runs at once, wherever it
        // was sent from.
        let ended = tokio::select! {
            result = cli.execute("bash", &input) => RunEnd::Ran(result),
            () = exchanges.escalated() => RunEnd::Ran(Ok(steadfast_sandbox::ToolOutput::error("stopped: a bound was crossed"))),
            item = steadfast_world::interrupt::arrives(world.clone(), lease.session.clone()) => RunEnd::Interrupted(item),
            () = stop_requested(stopping.clone()) => RunEnd::Stopped,
            () = journal.paused() => RunEnd::Waiting,
            () = exchanges.stopped() => RunEnd::Diverged,
            () = live.lease_lost() => RunEnd::LeaseLost,
        };
        let interrupted = matches!(ended, RunEnd::Interrupted(_));
        let lease_lost = matches!(ended, RunEnd::LeaseLost);
        if interrupted
            || matches!(
                ended,
                RunEnd::Stopped | RunEnd::Waiting | RunEnd::Diverged | RunEnd::LeaseLost
            )
        {
            cli.cancel().await;
        }
        if interrupted || matches!(ended, RunEnd::Diverged | RunEnd::LeaseLost) {
            journal.cancel().await;
            gateway.abandon();
        }

        drop(cli);
        // A reply the dead CLI was receiving is still being recorded: let it finish, so
        // the next start gets it from the log rather than paying for it again (when
        // stopping, for as long as the driver's grace lets this run).
        // With the lease lost nothing more can be recorded: nothing is waited for.
        gateway
            .settle(if lease_lost {
                Duration::ZERO
            } else if interrupted {
                INTERRUPT_SETTLE
            } else {
                Duration::from_secs(600)
            })
            .await;
        // So is a tool call it was waiting on (a killed one records how it was left).
        journal
            .settle(if lease_lost {
                Duration::ZERO
            } else if interrupted {
                INTERRUPT_SETTLE
            } else {
                options.turn_timeout
            })
            .await;
        let counters = exchanges.counters();
        report.exchanges.replayed += counters.replayed;
        report.exchanges.live += counters.live;
        report.exchanges.diverged += counters.diverged;
        let (replayed, ran) = journal.counters();
        report.tools.0 += replayed;
        report.tools.1 += ran;
        if options.mismatch != Mismatch::Diverge {
            if report.divergence.is_none() {
                report.divergence = exchanges.divergence().await;
            }
            report.unanswered = exchanges.unanswered().await;
        }
        let result = match ended {
            RunEnd::Ran(result) => result,
            // Its CLI and commands are killed; another holder may take over.
            RunEnd::LeaseLost => {
                return Err(steadfast_world::Error::LeaseLost(lease.session.clone()).into())
            }
            RunEnd::Diverged => {
                tracing::info!(session = %lease.session, "replay stopped at a request the record did not have");
                report.stopped = true;
                return Ok(report);
            }
            RunEnd::Stopped => {
                tracing::info!(session = %lease.session, "wrapped turn stopped; it goes on from the log");
                report.stopped = true;
                return Ok(report);
            }
            RunEnd::Waiting => {
                tracing::info!(session = %lease.session, "wrapped turn waits for approval; it goes on from the log");
                // Kept in case the wait ends the turn (an interrupt): what the next
                // turn continues. The turn itself, resumed, continues what it began with.
                let kept =
                    keep_conversation(blobs, &gateway, &options.adapter, state.turn, None).await?;
                if !kept.is_empty() {
                    live.append(&kept).await?;
                }
                report.reply = "waiting for approval".to_string();
                return Ok(report);
            }
            RunEnd::Interrupted(item) => {
                let by = steadfast_world::interrupt::sender(&item);
                tracing::info!(session = %lease.session, %by, "wrapped turn interrupted");
                let note = interrupted_note(&live.state(), gateway.seen().as_ref(), &by);
                let mut events =
                    keep_conversation(blobs, &gateway, &options.adapter, state.turn, Some(&note))
                        .await?;
                events.push(Event::TurnInterrupted {
                    turn: state.turn,
                    by: by.clone(),
                    inbox_id: item.id,
                    call_id: None,
                    stopped: true,
                    not_begun: Vec::new(),
                });
                live.append(&events).await?;
                report.reply = format!("interrupted by {by}");
                report.interrupted_by = Some(by);
                return Ok(report);
            }
        };
        if let Some((breaker, reason)) = exchanges.escalation() {
            journal.escalate(breaker, reason.clone()).await?;
            report.reply = reason;
            return Ok(report);
        }
        let why = match result {
            Ok(out) if !out.is_error => {
                // The model's own words: a CLI may print notices around them.
                let reply = gateway
                    .answer()
                    .unwrap_or_else(|| out.text.trim().to_string());
                let now = live.state();
                steadfast_journal::explore::send_answer(world, &lease.session, &now, &reply)
                    .await?;
                let mut events =
                    keep_conversation(blobs, &gateway, &options.adapter, state.turn, Some(&reply))
                        .await?;
                events.push(Event::TurnEnded {
                    turn: state.turn,
                    reply: Some(reply.clone()),
                });
                live.append(&events).await?;
                report.reply = reply;
                return Ok(report);
            }
            Ok(out) => format!("the CLI stopped: {}", tail(&out.text)),
            Err(steadfast_sandbox::Error::Died(why)) => format!("its sandbox died: {why}"),
            Err(e) => return Err(e.into()),
        };
        if report.restarts >= options.max_restarts {
            let reason = format!(
                "{} failed {} times; last: {why}",
                options.adapter.name,
                report.restarts + 1
            );
            steadfast_journal::explore::ending(world, &lease.session, &live.state(), &reason)
                .await?;
            live.append(&[Event::SessionEnded {
                state: EndState::Failed,
                reason: reason.clone(),
                diff: Vec::new(),
            }])
            .await?;
            return Err(Error::Invalid(reason));
        }
        tracing::warn!(agent = %options.adapter.name, %why, "the wrapped CLI died mid-turn; starting it again");
        report.restarts += 1;
    }
}

/// The conversation this turn continues, if the turns before kept one for this CLI
/// and the API it calls for the session's model. One that cannot be read is left out
/// (the CLI is then told the earlier turns in its prompt), with a warning.
async fn kept_history(
    blobs: &Blobs,
    state: &SessionState,
    adapter: &Adapter,
) -> Option<Conversation> {
    let hash = state.turn_start.history.as_deref()?;
    let read = async {
        let bytes = blobs.get(hash).await.map_err(|e| e.to_string())?;
        serde_json::from_slice::<Conversation>(&bytes).map_err(|e| e.to_string())
    };
    let conversation = match read.await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(blob = hash, error = %e, "the kept conversation cannot be read: the CLI is told the earlier turns in its prompt");
            return None;
        }
    };
    let api = adapter.api_for(&state.model.provider).ok()?;
    let same = conversation.cli == adapter.cli_name() && conversation.api.provider() == api;
    same.then_some(conversation)
}

/// The `conversation_kept` to record as the CLI's run stops, its blob stored first:
/// the last conversation request the CLI made, closed by `closing` (none when the
/// CLI made no conversation request).
async fn keep_conversation<W: World + Clone>(
    blobs: &Blobs,
    gateway: &Gateway<W>,
    adapter: &Adapter,
    turn: u32,
    closing: Option<&str>,
) -> Result<Vec<Event>> {
    let Some(seen) = gateway.seen() else {
        return Ok(Vec::new());
    };
    let conversation = seen.kept(adapter.cli_name(), closing);
    let bytes = serde_json::to_vec(&conversation).map_err(|e| Error::Invalid(e.to_string()))?;
    let blob = blobs.put_raw(&bytes).await?;
    Ok(vec![Event::ConversationKept {
        turn,
        conversation: blob,
    }])
}

/// What the model is told of an interrupted turn, after the last request it saw: who
/// stopped it, and each tool call it had asked for since, with its result (a command
/// that reached a server must not be run again unknowingly).
fn interrupted_note(
    state: &SessionState,
    seen: Option<&steadfast_gateway::history::Seen>,
    by: &str,
) -> String {
    let mut note = format!("[This turn was interrupted by {by} before it finished.]");
    let Some(seen) = seen else {
        return note;
    };
    let since: Vec<_> = state
        .wrapped_tools
        .iter()
        .filter(|t| t.after_exchanges as usize > seen.index)
        .collect();
    if since.is_empty() {
        return note;
    }
    note.push_str("\nThe tool calls I had made since my last message, and what they returned:");
    for call in since {
        let result = match &call.result {
            Some((text, _)) => tail(text),
            None => "(no result: it was cut off)".to_string(),
        };
        note.push_str(&format!("\n- {} {}: {result}", call.tool, call.input));
    }
    note
}

/// The end of a CLI's output (at most 600 bytes), for a reason or a note.
fn tail(text: &str) -> String {
    let start = text.len().saturating_sub(600);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text[start..].trim().to_string()
}

/// A private temporary directory (the CLI's sockets), removed on drop; one a dead
/// process left behind is reaped by the next run.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TEMP_PREFIX: &str = "steadfast-wrap-";

fn tempfile_dir() -> Result<TempDir> {
    let root = steadfast_sandbox::paths::socket_root();
    reap_temp_dirs(&root);
    let dir = root.join(format!(
        "{TEMP_PREFIX}{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Invalid(format!("{}: {e}", dir.display())))?;
    Ok(TempDir(dir))
}

/// Removes the per-run directories of processes that no longer exist (a SIGKILL
/// leaves its directory behind).
pub fn reap_temp_dirs(root: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut reaped = 0;
    for entry in entries.filter_map(std::result::Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(TEMP_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            || std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive && std::fs::remove_dir_all(entry.path()).is_ok() {
            reaped += 1;
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_dead_runs_are_reaped_and_live_ones_kept() {
        let root =
            std::env::temp_dir().join(format!("reap-test-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&root).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let gone = root.join(format!("{TEMP_PREFIX}{dead}-a"));
        let live = root.join(format!("{TEMP_PREFIX}{}-b", std::process::id()));
        let other = root.join("something-else");
        for dir in [&gone, &live, &other] {
            std::fs::create_dir_all(dir.join("inner")).unwrap();
        }
        assert_eq!(reap_temp_dirs(&root), 1);
        assert!(!gone.exists() && live.exists() && other.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
