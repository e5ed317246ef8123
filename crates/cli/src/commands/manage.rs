//! `steadfast stop`, `close`, `delete` and `diff`: controlling and inspecting a
//! session from any directory, whichever process drives it.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use steadfast_harness::Harness;
use steadfast_sandbox::AnySandbox;
use steadfast_world::{AnyWorld, World};

use crate::config::Config;
use crate::home::me;

/// How long `stop` waits to see the turn stopped.
const WAIT: Duration = Duration::from_secs(15);

/// Who the log records as having stopped, closed or deleted a session: the login
/// name (`USER`, `LOGNAME`, else the user database's name for this process's user,
/// else its uid), so a service or container without `USER` still names someone.
fn by() -> String {
    format!("cli:{}", crate::home::user_name())
}

/// A harness over the world (no model is called), and the session's summary.
async fn open(
    home: &Path,
    config: &Config,
    session: &str,
) -> anyhow::Result<(
    Harness<AnyWorld, AnySandbox>,
    steadfast_world::SessionSummary,
)> {
    let world = crate::setup::world(home, config, false).await?;
    let summary = world.session(session).await.map_err(|e| match e {
        steadfast_world::Error::NotFound(_) => anyhow::anyhow!(
            "no session {session} in the home {} (pass --home DIR, or set STEADFAST_HOME, to look elsewhere)",
            home.display()
        ),
        other => other.into(),
    })?;
    let (harness, _) = crate::setup::harness(home, config, world, "none").await?;
    Ok((harness, summary))
}

pub async fn stop(home: &Path, config: &Config, session: &str) -> anyhow::Result<ExitCode> {
    let (harness, summary) = open(home, config, session).await?;
    if !summary.status.is_interruptible() {
        eprintln!(
            "steadfast: session {session} is {}; nothing runs, so there is nothing to stop",
            summary.status
        );
        return Ok(ExitCode::from(1));
    }
    let id = harness.interrupt(session, &by()).await?;
    let started = Instant::now();
    while started.elapsed() < WAIT {
        let now = harness.world().session(session).await?;
        if !now.status.is_interruptible() {
            eprintln!(
                "steadfast: session {session} stopped ({}, #{}) in {} ms; carry on with: {} resume {session} \"<what next>\"",
                now.status,
                now.last_seq,
                started.elapsed().as_millis(),
                me()
            );
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "steadfast: interrupt #{id} queued for {session}; its driver has not taken it yet (is one running?)"
    );
    Ok(ExitCode::from(1))
}

pub async fn close(home: &Path, config: &Config, session: &str) -> anyhow::Result<ExitCode> {
    let (harness, _) = open(home, config, session).await?;
    let status = harness.close_session(session, &by()).await?;
    let how = match status {
        steadfast_log::Status::Closed => "closed".to_string(),
        other => format!("had already ended ({other})"),
    };
    eprintln!(
        "steadfast: session {session} {how}; its log stays: {} log {session}",
        me()
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn delete(home: &Path, config: &Config, session: &str) -> anyhow::Result<ExitCode> {
    let (harness, _) = open(home, config, session).await?;
    let state = harness.delete_session(session, &by()).await?;
    eprintln!(
        "steadfast: session {session} deleted (its log and outputs); the workspace {} is left as it is",
        state.workspace
    );
    Ok(ExitCode::SUCCESS)
}

/// `steadfast rekey-vault`: every credential sealed under an older key is opened with
/// it and sealed again under the current one; sessions, which name credentials, are
/// untouched.
pub async fn rekey_vault(home: &Path, config: &Config) -> anyhow::Result<ExitCode> {
    let keys = steadfast_world::VaultKeys::from_env()?.ok_or_else(|| {
        anyhow::anyhow!(
            "no vault key: set {} (and the keys being retired in {})",
            steadfast_world::vault::KEY_ENV,
            steadfast_world::vault::OLD_KEYS_ENV
        )
    })?;
    let world = crate::setup::world(home, config, false).await?;
    let (mut resealed, mut current) = (0, 0);
    for entry in world.vault_list(None).await? {
        if keys.is_current(&entry.sealed) {
            current += 1;
            continue;
        }
        let value = keys
            .open(&entry.owner, &entry.name, &entry.sealed)
            .map_err(|e| anyhow::anyhow!("{}'s credential {}: {e}", entry.owner, entry.name))?;
        let sealed = keys.seal(&entry.owner, &entry.name, &value);
        world.vault_put(&entry.owner, &entry.name, &sealed).await?;
        resealed += 1;
    }
    // Hooks' signing keys are sealed by the same keys, as the session's credentials.
    for hook in world.hooks(None).await? {
        let steadfast_world::HookSecret::Sealed(sealed) = &hook.secret else {
            continue;
        };
        if keys.is_current(sealed) {
            current += 1;
            continue;
        }
        let name = steadfast_world::Hook::sealed_name(&hook.name);
        let value = keys
            .open(&hook.session, &name, sealed)
            .map_err(|e| anyhow::anyhow!("session {}'s hook {}: {e}", hook.session, hook.name))?;
        let sealed = keys.seal(&hook.session, &name, &value);
        world
            .hook_reseal(&hook.session, &hook.name, &sealed)
            .await?;
        resealed += 1;
    }
    eprintln!(
        "steadfast: {resealed} credentials sealed again under the current key ({current} already were; hooks' signing keys count as credentials)"
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast signal`.
#[derive(Debug, Args)]
pub struct SignalArgs {
    /// The session.
    pub(crate) session: String,
    /// The signal's name (`approval`, `resume`, ...).
    pub(crate) name: String,
    /// Its JSON payload.
    #[arg(default_value = "null")]
    pub(crate) payload: String,
    /// Queue it for a wait on this name that has not begun yet (otherwise a session
    /// that is not waiting for it refuses it).
    #[arg(long)]
    pub(crate) queue: bool,
    /// The log position of the wait it answers (`waiting since #N`): refused if that
    /// wait is over.
    #[arg(long, value_name = "N")]
    pub(crate) wait: Option<u64>,
}

pub async fn signal(home: &Path, config: &Config, args: SignalArgs) -> anyhow::Result<ExitCode> {
    let payload: serde_json::Value = serde_json::from_str(&args.payload)
        .map_err(|e| anyhow::anyhow!("the payload is not JSON: {e}"))?;
    let (harness, _) = open(home, config, &args.session).await?;
    let target = steadfast_harness::SignalTarget {
        queue: args.queue,
        wait: args.wait,
    };
    let (id, answers) = harness
        .signal(&args.session, &args.name, &payload, target)
        .await?;
    let what = match answers {
        Some(seq) => format!("answers the wait at #{seq}"),
        None => "queued for the next wait on it".to_string(),
    };
    eprintln!(
        "steadfast: signal {} for {} (#{id}) {what}; `{} resume {}` or a worker carries on",
        args.name,
        args.session,
        me(),
        args.session
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The session to fork.
    pub(crate) session: String,
    /// The parent's last log position the forks share (`steadfast log` numbers them);
    /// default: its latest.
    #[arg(long)]
    pub(crate) at: Option<u64>,
    /// How many forks to make.
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u32,
    /// The forks' title (default: the parent's).
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// The model the forks speak to, `provider/model` (default: the parent's).
    #[arg(long)]
    pub(crate) model: Option<String>,
}

/// `steadfast fork`: new sessions whose history is the parent's up to `--at` and
/// whose workspace is the snapshot recorded there; prints their ids, one a line.
pub async fn fork(home: &Path, config: &Config, args: ForkArgs) -> anyhow::Result<ExitCode> {
    let (harness, summary) = open(home, config, &args.session).await?;
    let forks = harness
        .fork(&steadfast_harness::ForkRequest {
            parent: args.session.clone(),
            at: args.at,
            count: args.count,
            owner: summary.owner,
            title: args.title,
            model: args.model,
            limits: None,
            agent: None,
            instructions: None,
            held: false,
            explorer: None,
        })
        .await?;
    for fork in &forks {
        println!("{}", fork.id);
    }
    if let Some(first) = forks.first() {
        eprintln!(
            "steadfast: {} fork(s) of {} at #{}, {}; give one a message with `{} send {} \"...\"` \
             and drive it with `{} resume {}`",
            forks.len(),
            args.session,
            first.forked_at.unwrap_or_default(),
            first.status,
            crate::home::me(),
            first.id,
            crate::home::me(),
            first.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast rewind`.
#[derive(Debug, Args)]
pub struct RewindArgs {
    /// The session to rewind.
    pub(crate) session: String,
    /// The last log position it keeps: a turn's end, or 1 (`steadfast log` numbers
    /// them).
    #[arg(long)]
    pub(crate) to: u64,
}

/// `steadfast rewind`: the session carries on from an earlier turn's end, its
/// workspace put back; what followed is kept in a fork, whose id is printed.
pub async fn rewind(home: &Path, config: &Config, args: RewindArgs) -> anyhow::Result<ExitCode> {
    let (harness, _) = open(home, config, &args.session).await?;
    let report = harness
        .rewind(&args.session, args.to, crate::home::me())
        .await?;
    println!("{}", report.branch);
    eprintln!(
        "steadfast: {} rewound to #{}; what followed is kept as {} (printed above)",
        args.session, report.to, report.branch
    );
    for fact in &report.facts {
        eprintln!("steadfast: still standing (the model will be told): {fact}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast upgrade`.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The wrapped session.
    pub(crate) session: String,
    /// The agent its next turn runs: `claude-code@2.1.332`, or a named agent.
    #[arg(long)]
    pub(crate) agent: String,
}

/// `steadfast upgrade`: the session's next turn runs another CLI version or named
/// agent; the change is recorded in its log.
pub async fn upgrade(home: &Path, config: &Config, args: UpgradeArgs) -> anyhow::Result<ExitCode> {
    let (harness, _) = open(home, config, &args.session).await?;
    let (agent, cli) = harness.change_agent(&args.session, &args.agent).await?;
    println!("{agent} ({cli})");
    eprintln!(
        "steadfast: session {}'s next turn runs {agent} ({cli}); a host runs it once that \
         version is installed there (steadfast install-agent {})",
        args.session, args.agent
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The session.
    pub(crate) session: String,
    /// What to say.
    pub(crate) text: String,
    /// Steer the running turn (the agent gets it with its next tool result) instead of
    /// queueing a message for the next turn.
    #[arg(long)]
    pub(crate) steer: bool,
}

/// `steadfast send`: a message for the session's next turn (or a steer for the running
/// one), queued in its inbox for whichever process drives it.
pub async fn send(home: &Path, config: &Config, args: SendArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.text.trim().is_empty(), "the text is empty");
    // An ended session's inbox refuses it, saying so.
    let (harness, _) = open(home, config, &args.session).await?;
    let kind = match args.steer {
        true => steadfast_world::InboundKind::Steer,
        false => steadfast_world::InboundKind::Message,
    };
    let id = harness
        .world()
        .post(
            &args.session,
            kind,
            "",
            &serde_json::Value::String(args.text),
        )
        .await?;
    let what = match args.steer {
        true => "steer",
        false => "message",
    };
    eprintln!(
        "steadfast: {what} #{id} queued for {}; a worker takes it, or `{} resume {}` here",
        args.session,
        me(),
        args.session
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `steadfast diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The session.
    pub(crate) session: String,
    /// From this log position (default: as the session began).
    #[arg(long)]
    pub(crate) from: Option<u64>,
    /// To this log position (default: now).
    #[arg(long)]
    pub(crate) to: Option<u64>,
    /// The diff as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

pub async fn diff(home: &Path, config: &Config, args: DiffArgs) -> anyhow::Result<ExitCode> {
    let (harness, _) = open(home, config, &args.session).await?;
    let diff = harness.diff(&args.session, args.from, args.to).await?;
    print_diff(&diff, args.json)
}

/// Prints a diff as `git diff` would, with a count on stderr, or as JSON.
pub(crate) fn print_diff(
    diff: &steadfast_harness::WorkspaceDiff,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string(diff)?);
    } else {
        use std::io::Write;
        std::io::stdout()
            .lock()
            .write_all(diff.to_text().as_bytes())?;
        eprintln!(
            "steadfast: {} file(s) changed from #{} to #{}",
            diff.files.len(),
            diff.from_seq,
            diff.to_seq
        );
    }
    Ok(ExitCode::SUCCESS)
}
