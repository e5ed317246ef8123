//! `steadfast run --agent <cli>` and `steadfast resume` of such a session: a wrapped
//! CLI (Claude Code, ...) driven durably through the gateway and the journaled tools.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use steadfast_gateway::{Upstream, Upstreams};
use steadfast_harness::{Harness, NewSession};
use steadfast_log::{EndState, Event, Status};
use steadfast_sandbox::AnySandbox;
use steadfast_testkit::FakeProvider;
use steadfast_world::{AnyWorld, Holder, InboundKind, World};
use steadfast_wrap::{drive_turn, Adapter, WrappedOptions};

use crate::config::Config;
use crate::setup;

/// Where wrapped CLIs are installed: `[agents] install-dir`, `STEADFAST_AGENTS_DIR`, or
/// `agents/` under the home directory.
pub fn install_dir(home: &Path, config: &Config) -> PathBuf {
    std::env::var_os("STEADFAST_AGENTS_DIR")
        .map(PathBuf::from)
        .or_else(|| config.agents.install_dir.clone())
        .unwrap_or_else(|| home.join("agents"))
}

/// The adapter a session's agent name stands for (a configured agent's, or a
/// built-in one's).
pub fn adapter(config: &Config, name: &str) -> anyhow::Result<Adapter> {
    let adapter_name = config
        .agents
        .named
        .iter()
        .find(|a| a.name == name)
        .map_or(name, |a| a.adapter.as_str());
    let mut adapter = Adapter::named(adapter_name).with_context(|| {
        format!(
            "unknown agent `{name}` (built in: native, {}; or name one in [[agents.named]])",
            Adapter::names().join(", ")
        )
    })?;
    adapter.name = name.to_string();
    Ok(adapter)
}

/// `steadfast install-agent <name>`: installs the CLI's pinned npm package.
pub async fn install(home: &Path, config: &Config, name: &str) -> anyhow::Result<ExitCode> {
    let adapter = adapter(config, name)?;
    let dir = install_dir(home, config);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let command = adapter.install_command(&dir);
    eprintln!("steadfast: {command}");
    let status = tokio::process::Command::new("bash")
        .args(["-c", &command])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "npm install failed ({status})");
    eprintln!(
        "steadfast: {} installed at {}",
        adapter.package,
        adapter.executable(&dir).display()
    );
    Ok(ExitCode::SUCCESS)
}

fn upstreams(config: &Config, fake: Option<&FakeProvider>) -> Upstreams {
    match fake {
        Some(fake) => Upstreams {
            anthropic: Some(Upstream {
                base_url: fake.base_url(),
                api_key: "fake-provider-key".into(),
            }),
            openai: Some(Upstream {
                base_url: format!("{}/v1", fake.base_url()),
                api_key: "fake-provider-key".into(),
            }),
        },
        None => {
            let up = |p: &str| {
                config.endpoint(p).map(|e| Upstream {
                    base_url: e.base_url,
                    api_key: e.api_key,
                })
            };
            Upstreams {
                anthropic: up("anthropic"),
                openai: up("openai"),
            }
        }
    }
}

fn options(
    home: &Path,
    config: &Config,
    harness: &Harness<AnyWorld, AnySandbox>,
    adapter: Adapter,
    fake: Option<&FakeProvider>,
) -> anyhow::Result<WrappedOptions> {
    let install_dir = install_dir(home, config);
    anyhow::ensure!(
        adapter.executable(&install_dir).exists(),
        "{} is not installed in {}; run: steadfast install-agent {}",
        adapter.package,
        install_dir.display(),
        adapter.name
    );
    Ok(WrappedOptions {
        adapter,
        install_dir,
        sandbox: harness.options().sandbox.clone(),
        upstreams: upstreams(config, fake),
        max_restarts: config.agents.max_restarts.unwrap_or(5),
        turn_timeout: Duration::from_secs(config.agents.turn_timeout_secs.unwrap_or(3600)),
        lease_ttl: harness.options().lease_ttl,
        max_exchanges_per_turn: harness.options().max_steps_per_turn as usize,
        prices: harness.options().prices.clone(),
    })
}

/// Drives the session's open turn and ends the session; prints the result.
async fn drive(
    harness: &Harness<AnyWorld, AnySandbox>,
    id: &str,
    options: &WrappedOptions,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let world = harness.world();
    let holder = Holder::new(format!("cli-{}", uuid_like()));
    let lease = world
        .acquire_lease(id, &holder, harness.options().lease_ttl)
        .await?;
    let mut state = harness.state(id).await?;
    // A session escalated (or waiting) goes on once its signal has arrived.
    if let Some(wait) = &state.waiting {
        let inbox = world.inbox(id).await?;
        if let Some(signal) = inbox
            .into_iter()
            .find(|i| i.kind == InboundKind::Signal && i.name == wait.name)
        {
            world
                .append(
                    &lease,
                    &[Event::SignalReceived {
                        name: signal.name,
                        payload: signal.body,
                        inbox_id: signal.id,
                    }],
                )
                .await?;
            state = harness.state(id).await?;
        }
    }
    if state.status == Status::Running {
        let report = drive_turn(world, &lease, harness.blobs(), harness.drive(), options)
            .await
            .with_context(|| format!("driving {} in session {id}", options.adapter.name))?;
        eprintln!(
            "steadfast: turn done: {} model calls answered from the log, {} sent to the provider; {} tool calls replayed, {} run; {} restart(s)",
            report.exchanges.replayed, report.exchanges.live, report.tools.0, report.tools.1, report.restarts
        );
    }
    let state = harness.state(id).await?;
    if state.status == Status::Idle {
        world
            .append(
                &lease,
                &[Event::SessionEnded {
                    state: EndState::Completed,
                    reason: "task completed".into(),
                    diff: Vec::new(),
                }],
            )
            .await?;
    }
    world.release_lease(&lease).await?;
    let state = harness.state(id).await?;
    if let (Some(breaker), Some(wait)) = (state.escalated, &state.waiting) {
        eprintln!(
            "steadfast: escalated by the {breaker} breaker: {}\nsteadfast: to go on, raise the bound and resume: steadfast signal {id} resume '{{\"max_tokens\": 1000000}}' && steadfast resume {id}",
            wait.reason
        );
    }
    let reply = state.last_reply().unwrap_or_default();
    if json {
        println!(
            "{}",
            serde_json::json!({"session": id, "status": state.status, "reply": reply,
                "workspace": state.workspace, "agent": state.agent})
        );
    } else {
        println!("{reply}");
    }
    Ok(match state.status {
        Status::Completed => ExitCode::SUCCESS,
        Status::Escalated => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    })
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    )
}

/// `steadfast run --agent <cli>`.
pub async fn run(
    home: &Path,
    config: &Config,
    adapter: Adapter,
    mut new: NewSession,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let provider = new.model.split('/').next().unwrap_or_default().to_string();
    let world = setup::world(home, config, false).await?;
    let (harness, fake) = setup::harness(home, config, world, &provider).await?;
    let options = options(home, config, &harness, adapter, fake.as_ref())?;
    new.agent = options.adapter.name.clone();
    let id = harness.start_session(new).await?;
    eprintln!(
        "steadfast: session {id} ({}) — if this process stops, carry on with: steadfast resume {id}",
        options.adapter.name
    );
    drive(&harness, &id, &options, json).await
}

/// `steadfast resume` of a wrapped session.
pub async fn resume(
    home: &Path,
    config: &Config,
    id: &str,
    agent: &str,
    provider: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let world = setup::world(home, config, false).await?;
    let (harness, fake) = setup::harness(home, config, world, provider).await?;
    let options = options(
        home,
        config,
        &harness,
        adapter(config, agent)?,
        fake.as_ref(),
    )?;
    eprintln!("steadfast: resuming {agent} session {id} by replaying its log");
    drive(&harness, id, &options, json).await
}
