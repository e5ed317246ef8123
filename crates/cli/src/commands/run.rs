//! `steadfast run` and `steadfast resume`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use steadfast_harness::{Awake, Driver, NewSession, Progress, Stop};
use steadfast_log::EndState;
use steadfast_model::Delta;
use steadfast_sandbox::Sandbox;
use steadfast_testkit::demo;
use steadfast_world::World;

use crate::config::Config;
use crate::render;
use crate::setup;

/// Arguments of `steadfast run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// What the agent should do. Optional with the fake provider (it plays the demo task).
    task: Option<String>,
    /// The workspace directory (default with the fake provider: a new demo project).
    /// It must exist, unless `--create` is given.
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Create the workspace directory if it does not exist (an empty one).
    #[arg(long)]
    create: bool,
    /// With the bundled fake provider: milliseconds between streamed chunks of its
    /// replies (default 25 for the demo, so Ctrl-C can land mid-run; 0 for full speed).
    #[arg(long, value_name = "MS")]
    pace: Option<u64>,
    /// `provider/model`: anthropic/..., openai/... or fake/... (default: from the API key set).
    #[arg(long, env = "STEADFAST_MODEL")]
    model: Option<String>,
    /// Print the final result as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// The agent: `native` (the built-in loop), a wrapped CLI (`claude-code`, ...) or
    /// an agent named in the configuration.
    #[arg(long, default_value = "native")]
    agent: String,
    /// Escalate when the session has spent this much on model calls, USD.
    #[arg(long)]
    max_cost_usd: Option<f64>,
    /// Escalate when the session has used this many tokens.
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Escalate before turn N+1.
    #[arg(long)]
    max_turns: Option<u32>,
    /// Escalate when the session has run this many seconds.
    #[arg(long)]
    max_duration_secs: Option<u64>,
    /// Offer the agent the `explore` tool, forking up to N explorers per
    /// call (each a session of its own, from the point the agent is at); `run`
    /// drives them here when no worker does.
    #[arg(long, value_name = "N", default_value_t = 0)]
    explorers: u32,
}

/// Arguments of `steadfast resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The session to carry on.
    session: String,
    /// A message for its next turn, queued before it is driven (after a turn left
    /// running is finished): how an idle or stopped session is carried on.
    message: Option<String>,
    /// Print the final result as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Move a session that works in a directory on another host (or elsewhere on
    /// this one) to DIR, here: an empty or new directory, which gets the session's
    /// last snapshot. The old directory is left as it is.
    #[arg(long, value_name = "DIR")]
    move_here: Option<std::path::PathBuf>,
}

pub async fn run(home: &Path, config: &Config, args: RunArgs) -> anyhow::Result<ExitCode> {
    let named_model = config
        .agents
        .named
        .iter()
        .find(|a| a.name == args.agent)
        .and_then(|a| a.model.clone());
    let model = args
        .model
        .or(named_model)
        .unwrap_or_else(|| config.default_model());
    let provider = model.split('/').next().unwrap_or_default().to_string();
    if let Some(w) = &args.workspace {
        if !w.is_dir() && !args.create {
            anyhow::bail!(
                "the workspace {} {}; pass --create to start in a new, empty directory",
                w.display(),
                if w.exists() {
                    "is not a directory"
                } else {
                    "does not exist"
                }
            );
        }
    }
    let world = setup::world(home, config, false).await?;
    // The bundled demo is paced for a person to watch (and interrupt).
    let pace = args.pace.or_else(|| {
        std::env::var_os("STEADFAST_FAKE_SCRIPT")
            .is_none()
            .then_some(setup::DEMO_PACE_MS)
    });
    let (harness, fake) = setup::harness_paced(home, config, world, &provider, pace).await?;
    // Before the session exists: an agent that cannot run here leaves nothing behind.
    harness.check_agent(&args.agent)?;
    if steadfast_log::agent::is_native(&args.agent) {
        harness.check_model(&model)?;
    }
    let task = match (args.task, &fake) {
        (Some(t), _) => t,
        (None, Some(_)) => demo::TASK.to_string(),
        (None, None) => anyhow::bail!("a task is required: steadfast run \"<what to do>\""),
    };
    let workspace = match (args.workspace, &fake) {
        (Some(w), _) => w,
        (None, Some(_)) => setup::demo_workspace()?,
        (None, None) => std::env::current_dir()?,
    };
    if args
        .max_cost_usd
        .is_some_and(|c| !c.is_finite() || c <= 0.0)
    {
        anyhow::bail!("--max-cost-usd must be a positive number");
    }
    let mut new = NewSession::native(&model, &workspace).with_task(&task);
    new.agent = args.agent.clone().into();
    new.explorers = args.explorers;
    new.mcp_servers = harness
        .options()
        .agents
        .mcp_servers_for(&args.agent, Vec::new());
    new.limits = config.limits(&crate::config::LimitsConfig {
        max_cost_usd: args.max_cost_usd,
        max_tokens: args.max_tokens,
        max_turns: args.max_turns,
        max_duration_secs: args.max_duration_secs,
    });
    // The network policy given for this run stays the session's across resumes.
    new.network = config.sandbox.network.clone();
    let id = harness.start_session(new).await?;
    eprintln!(
        "steadfast: session {id} ({}, {model}) in {}",
        args.agent,
        workspace.display()
    );
    eprintln!(
        "steadfast: if this process stops, carry on with: {} resume {id}",
        crate::home::me()
    );
    eprintln!(
        "steadfast: sandbox {}",
        steadfast_sandbox::describe(&harness.options().sandbox)
    );
    let mut awake = harness.wake(&id).await?;
    let code = drive(&harness, &mut awake, args.json, true).await;
    if !matches!(code, Ok(c) if c == ExitCode::from(130)) {
        report_changes(&harness, &id).await;
    }
    drop(fake);
    code
}

/// The session's changes to its workspace, one line each, and how to see them.
async fn report_changes<W: World + Clone, S: Sandbox>(
    harness: &steadfast_harness::Harness<W, S>,
    id: &str,
) {
    let Ok(diff) = harness.diff(id, None, None).await else {
        return;
    };
    if diff.files.is_empty() {
        eprintln!("steadfast: the workspace is unchanged");
        return;
    }
    eprintln!(
        "steadfast: the session changed {} file(s):",
        diff.files.len()
    );
    for line in diff.summary() {
        eprintln!("  {line}");
    }
    eprintln!(
        "steadfast: see the changes with: {} diff {id}",
        crate::home::me()
    );
}

pub async fn resume(home: &Path, config: &Config, args: ResumeArgs) -> anyhow::Result<ExitCode> {
    let world = setup::world(home, config, false).await?;
    // From the latest checkpoint: what waking costs does not grow with the history.
    let (state, records) =
        steadfast_world::load_state(&world, &setup::blobs(home, config)?, &args.session)
            .await
            .with_context(|| format!("reading session {}", args.session))?;
    let (harness, fake) = setup::harness(home, config, world, &state.model.provider).await?;
    // The model's context keeps excerpts, so a session can go on without its blobs;
    // but a lost one is said, with its position: at once for what came since the
    // checkpoint, and for the history before it while the session goes on.
    crate::commands::log::report_damage(harness.blobs(), &args.session, &records).await;
    let earlier_damage = records.first().filter(|r| r.seq > 1).map(|first| {
        let (world, blobs, session) = (
            harness.world().clone(),
            harness.blobs().clone(),
            args.session.clone(),
        );
        let before = first.seq;
        tokio::spawn(async move {
            if let Ok(mut earlier) = world.read(&session, 1).await {
                earlier.retain(|r| r.seq < before);
                crate::commands::log::report_damage(&blobs, &session, &earlier).await;
            }
        })
    });
    // A session bound to another host's directory is refused before its lease is
    // even asked for (that host may hold it a while yet, or be gone for good).
    if args.move_here.is_none() {
        harness.workspace_dir(&state)?;
    }
    if let Some(dir) = &args.move_here {
        let moved = harness.move_workspace_here(&args.session, dir).await?;
        let was = match &state.workspace_host {
            Some(host) => format!("{} on {host}", state.workspace),
            None => state.workspace.clone(),
        };
        let here = steadfast_world::host_id();
        let same_host = state.workspace_host.as_ref().is_none_or(|h| *h == here);
        match same_host && moved == std::path::Path::new(&state.workspace) {
            true => eprintln!("steadfast: session {} already works in {was}", args.session),
            false => eprintln!(
                "steadfast: session {} now works in {} on this host (it was in {was})",
                args.session,
                moved.display()
            ),
        }
    }
    if let Some(text) = args.message.as_deref() {
        anyhow::ensure!(!text.trim().is_empty(), "the message is empty");
        anyhow::ensure!(
            !state.is_ended(),
            "session {} has ended; it takes no more messages",
            args.session
        );
        harness
            .world()
            .post(
                &args.session,
                steadfast_world::InboundKind::Message,
                "",
                &serde_json::Value::String(text.to_string()),
            )
            .await?;
    }
    let mut awake = harness.wake(&args.session).await?;
    let session = args.session.clone();
    eprintln!(
        "steadfast: resuming session {} ({}) at #{} ({})",
        args.session,
        state.agent,
        state.last_seq,
        state.phase.status()
    );
    if state.is_wrapped() {
        eprintln!(
            "steadfast: the {} CLI replays its turn from the log",
            state.agent
        );
    }
    // A session of `run` is one task, over when it is done; one made through the API
    // (a logical workspace) takes messages for as long as its owner sends them, so
    // driving its turn here leaves it open.
    let one_task = !steadfast_log::is_workspace_id(&state.workspace);
    let code = drive(&harness, &mut awake, args.json, one_task).await;
    drop(awake);
    if !matches!(code, Ok(c) if c == ExitCode::from(130)) {
        report_changes(&harness, &session).await;
    }
    if let Some(check) = earlier_damage {
        let _ = check.await;
    }
    drop(fake);
    code
}

/// The tool call running now, for the progress line.
#[derive(Default)]
struct Running {
    /// Since when, and which tool.
    call: Option<(std::time::Instant, String)>,
    /// Whether a progress line is on the terminal (to be cleared before the next line).
    shown: bool,
}

type SharedRunning = std::sync::Arc<std::sync::Mutex<Running>>;

/// How often the progress of a long tool call is shown: every second on a terminal
/// (one line, rewritten), every ten seconds otherwise (plain lines).
fn progress_every(tty: bool) -> std::time::Duration {
    std::time::Duration::from_secs(if tty { 1 } else { 10 })
}

/// Shows how long the running tool call has taken, for as long as it is polled.
async fn show_progress(running: SharedRunning) -> std::convert::Infallible {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(progress_every(tty));
    tick.tick().await;
    loop {
        tick.tick().await;
        let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
        let Some((since, tool)) = &r.call else {
            continue;
        };
        let secs = since.elapsed().as_secs();
        if secs < 2 {
            continue;
        }
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r\x1b[2K  ⋯ {tool} running for {secs}s");
            let _ = err.flush();
            r.shown = true;
        } else {
            let _ = writeln!(err, "  ⋯ {tool} still running after {secs}s");
        }
    }
}

/// Shows the session's progress on stderr as it works.
fn watch<W: World + Clone, S: Sandbox>(driver: &mut Driver<'_, W, S>, running: SharedRunning) {
    let mut streaming = false;
    driver.observe(move |p| {
        let mut err = std::io::stderr().lock();
        if let Progress::Appended(record) = p {
            let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
            if r.shown {
                let _ = write!(err, "\r\x1b[2K");
                r.shown = false;
            }
            match &record.event {
                steadfast_log::Event::ToolCallIntent { tool, .. } => {
                    r.call = Some((std::time::Instant::now(), tool.clone()));
                }
                steadfast_log::Event::ToolCallOutcome { .. }
                | steadfast_log::Event::ToolCallInterrupted { .. }
                | steadfast_log::Event::TurnInterrupted { .. }
                | steadfast_log::Event::SandboxLost { .. } => r.call = None,
                _ => {}
            }
        }
        match p {
            Progress::Delta(Delta::Text(t)) => {
                if !streaming {
                    let _ = write!(err, "  ");
                    streaming = true;
                }
                let _ = write!(err, "{}", t.replace('\n', "\n  "));
            }
            Progress::Delta(Delta::Restart) => {
                let _ = writeln!(err, "\n  [connection dropped; the reply starts over]");
                streaming = false;
            }
            Progress::Delta(Delta::ToolUse { .. }) => {}
            Progress::Appended(record) => {
                // A journaled piece of the reply streaming now shows nothing: the
                // line goes on, so no word is split where a delta was written.
                if let Some(line) = render::progress(record) {
                    if streaming {
                        let _ = writeln!(err);
                        streaming = false;
                    }
                    let _ = writeln!(err, "{line}");
                }
            }
            Progress::Restored(snapshot) => {
                let _ = writeln!(
                    err,
                    "  workspace restored to snapshot {}",
                    &snapshot[..12.min(snapshot.len())]
                );
            }
        }
    });
}

/// Runs the session; while it waits for explorers that no worker drives, drives them
/// here and carries on.
async fn run_with_explorers<W: World + Clone, S: Sandbox>(
    harness: &steadfast_harness::Harness<W, S>,
    awake: &mut Awake<'_, W, S>,
) -> steadfast_harness::Result<Stop> {
    loop {
        let stop = awake.run().await?;
        match &stop {
            Stop::Waiting(name) if name.starts_with(steadfast_log::EXPLORED_SIGNAL) => {
                let session = awake.session().to_string();
                eprintln!("steadfast: driving the explorers of {session} here");
                if harness.run_explorers(&session).await? == 0 {
                    return Ok(stop);
                }
            }
            _ => return Ok(stop),
        }
    }
}

/// Drives the session until it stops; one that goes idle is ended `completed` when it
/// is `one_task` (a session of `run`), and left open otherwise.
async fn drive<W: World + Clone, S: Sandbox>(
    harness: &steadfast_harness::Harness<W, S>,
    awake: &mut Awake<'_, W, S>,
    json: bool,
    one_task: bool,
) -> anyhow::Result<ExitCode> {
    let running = SharedRunning::default();
    if let Awake::Native(driver) = awake {
        watch(driver, running.clone());
    }
    let result = tokio::select! {
        result = run_with_explorers(harness, awake) => result,
        never = show_progress(running.clone()) => match never {},
        _ = tokio::signal::ctrl_c() => {
            // Dropping the run stops the call in flight (a command's whole process
            // group is killed); its intent stays in the log for resume to resolve.
            // What is held for the next commit goes in now.
            if let Err(e) = awake.commit_staged().await {
                eprintln!("steadfast: {e}");
            }
            eprintln!("\nsteadfast: interrupted; nothing is lost. Carry on with: {} resume {}", crate::home::me(), awake.session());
            return Ok(ExitCode::from(130));
        }
    };
    if let Awake::Wrapped(driver) = awake {
        let r = driver.report();
        eprintln!(
            "steadfast: turn done: {} model calls answered from the log, {} sent to the provider; {} tool calls replayed, {} run; {} restart(s)",
            r.exchanges.replayed, r.exchanges.live, r.tools.0, r.tools.1, r.restarts
        );
    }
    let stop = match result {
        Ok(stop) => stop,
        Err(e) if e.is_retryable() => {
            eprintln!("steadfast: stopped: {e}");
            eprintln!(
                "steadfast: nothing is lost; carry on with: {} resume {}",
                crate::home::me(),
                awake.session()
            );
            return Ok(ExitCode::from(3));
        }
        Err(e) => return Err(e.into()),
    };
    let interrupted = awake.state().interrupted_by().map(str::to_string);
    if let Some(by) = &interrupted {
        eprintln!(
            "steadfast: the turn was interrupted by {by}; the session stays open (idle) with everything it did so far"
        );
    } else if stop == Stop::Idle && one_task {
        awake.end(EndState::Completed, "task completed").await?;
    } else if stop == Stop::Idle {
        eprintln!(
            "steadfast: session {} stays open (idle): it was made through the API; send it more with: {} send {} \"<text>\"",
            awake.session(),
            crate::home::me(),
            awake.session()
        );
    }
    let state = awake.state().clone();
    let reply = state.last_reply().unwrap_or_default();
    if json {
        let out = serde_json::json!({
            "session": awake.session(),
            "agent": state.agent,
            "status": state.phase.status(),
            "reason": state.end_reason().map(str::to_string).or(state.waiting().map(|w| w.reason.clone())),
            "escalated_by": state.escalated_by(),
            "reply": reply,
            "workspace": state.workspace,
            "model_calls": state.model_calls,
            "usage": state.usage,
            "cost_usd": steadfast_log::money::usd(state.cost_micro_usd),
        });
        println!("{out}");
    } else {
        println!("{reply}");
        eprintln!(
            "steadfast: session {} {}: {} model calls, {} input + {} output tokens, ${:.4}; workspace {}",
            awake.session(),
            state.phase.status(),
            state.model_calls,
            state.usage.input_tokens,
            state.usage.output_tokens,
            steadfast_log::money::usd(state.cost_micro_usd),
            state.workspace
        );
    }
    if let (Some(breaker), Some(wait)) = (state.escalated_by(), &state.waiting()) {
        // The raise that lets the bound that tripped pass (a loop or step budget needs
        // only a human's go-ahead).
        let raise = match breaker {
            steadfast_log::Breaker::Cost => format!(
                "{{\"max_cost_usd\": {:.2}}}",
                (steadfast_log::money::usd(state.cost_micro_usd) * 2.0).max(1.0)
            ),
            steadfast_log::Breaker::Tokens => format!(
                "{{\"max_tokens\": {}}}",
                (state.usage.input_tokens + state.usage.output_tokens)
                    .saturating_mul(2)
                    .max(100_000)
            ),
            steadfast_log::Breaker::Turns => {
                format!("{{\"max_turns\": {}}}", state.turn.saturating_mul(2).max(2))
            }
            steadfast_log::Breaker::Duration => "{\"max_duration_s\": 86400}".to_string(),
            _ => "{}".to_string(),
        };
        eprintln!(
            "steadfast: escalated by the {breaker} breaker: {}\nsteadfast: to go on, raise the bound and resume: {me} signal {id} resume '{raise}' && {me} resume {id}",
            wait.reason,
            id = awake.session(),
            me = crate::home::me()
        );
    }
    if interrupted.is_some() {
        return Ok(ExitCode::from(130));
    }
    Ok(match state.phase.status() {
        steadfast_log::Status::Completed => ExitCode::SUCCESS,
        // An API session's turn done, the session open for more.
        steadfast_log::Status::Idle if !one_task => ExitCode::SUCCESS,
        steadfast_log::Status::Escalated => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    })
}
