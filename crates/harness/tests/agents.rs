//! One wake for every agent: a session is driven by the agent it was started with and
//! never by another. A wrapped session a worker cannot run (its CLI is not installed
//! on this host) is left as it is — no native model call, no tool call, one record
//! saying why — and the native loop refuses a wrapped session outright.

use serde_json::json;
use steadfast_harness::{Awake, Error, NewSession};
use steadfast_world::World;

mod common;

use common::{bash, Setup};

#[tokio::test]
async fn a_worker_never_drives_a_wrapped_session_with_the_native_loop() -> anyhow::Result<()> {
    let setup = Setup::new(json!([bash("echo native >> hello.txt"), {"text": "done"}])).await;
    let harness = setup.harness_with(|o| {
        o.agents.install_dir = Some(setup.dir.path().join("no-agents-here"));
    });
    let mut new = NewSession::native("anthropic/claude-sonnet-4-5", &setup.workspace())
        .with_task("write hello");
    new.agent = "claude-code".into();
    let wrapped = harness.start_session(new).await?;
    let native = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()).with_task("go"))
        .await?;
    let before = harness.world().read(&wrapped, 1).await?.len();

    // The native loop will not take it, with words that say why.
    let refused = harness.wake_native(&wrapped).await.err().expect("refused");
    assert!(
        matches!(&refused, Error::Invalid(m) | Error::NotHere(m) if m.contains("claude-code")),
        "{refused}"
    );
    // `wake` hands each session the driver of its own agent.
    match harness.wake(&native).await? {
        Awake::Native(d) => d.release().await?,
        Awake::Wrapped(_) => panic!("a native session got the wrapped driver"),
    }

    // A worker finds both sessions needing a driver: it finishes the native one and
    // leaves the wrapped one untouched.
    let (stop, rx) = tokio::sync::watch::channel(false);
    let work = harness.work(rx);
    let finished = async {
        for _ in 0..200 {
            if harness.state(&native).await?.phase.status() == steadfast_log::Status::Idle {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        // Long enough for several claims of the wrapped session.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        stop.send(true)?;
        anyhow::Ok(())
    };
    let (_, finished) = tokio::join!(work, finished);
    finished?;
    assert_eq!(
        harness.state(&native).await?.phase.status(),
        steadfast_log::Status::Idle
    );
    // One record says why (a person sees a session no worker can run, not an idle
    // one), however often it was claimed; no model call, no tool call.
    let records = harness.world().read(&wrapped, 1).await?;
    assert_eq!(records.len(), before + 1, "{records:?}");
    match &records[before].event {
        steadfast_log::Event::DriveFailed {
            reason,
            retry_at_ms: Some(_),
            ..
        } => assert!(
            reason.contains("@anthropic-ai/claude-code@") && reason.contains("install-agent"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    let state = harness.state(&wrapped).await?;
    assert!(state.retry.is_some(), "shown as waiting to be retried");
    assert!(state.pending_tools.is_empty() && state.model_calls == 0);
    assert_eq!(
        setup.fake.calls(),
        1 + 1,
        "only the native session called the model"
    );
    assert_eq!(
        std::fs::read_to_string(setup.workspace().join("hello.txt"))?,
        "hello\nnative\n"
    );
    Ok(())
}

#[tokio::test]
async fn an_agent_that_cannot_run_is_refused_before_a_session_exists() -> anyhow::Result<()> {
    let setup = Setup::new(json!([])).await;
    let harness = setup.harness_with(|o| {
        o.agents.install_dir = Some(setup.dir.path().join("no-agents-here"));
    });
    let err = harness.check_agent("claude-code").unwrap_err().to_string();
    assert!(
        err.contains("steadfast install-agent claude-code@"),
        "{err}"
    );
    let err = harness.check_agent("aider").unwrap_err().to_string();
    assert!(err.contains("unknown agent `aider`"), "{err}");
    harness.check_agent("native")?;
    let listed = harness.agents();
    let names: Vec<&str> = listed.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["native", "claude-code", "codex", "pi", "opencode"]);
    assert!(listed.iter().skip(1).all(|a| !a.installed));
    Ok(())
}

/// A host whose CLIs are installed under `dir` in the setup's directory, with a named
/// agent `reviewer`: Claude Code at `version`, with instructions of its own.
fn reviewer_host(setup: &Setup, dir: &str, version: &str) -> steadfast_harness::Harness {
    let install = setup.dir.path().join(dir);
    setup.harness_with(|o| {
        o.agents.install_dir = Some(install);
        o.agents.named = vec![steadfast_harness::NamedAgent {
            name: "reviewer".into(),
            adapter: "claude-code".into(),
            model: None,
            version: Some(version.into()),
            mcp_servers: Vec::new(),
            approval: None,
            instructions: Some("Review only.".into()),
        }];
    })
}

/// Puts a stand-in for `adapter`'s CLI (its package manifest and executable) where a
/// host looks for that version under `dir`.
fn install_stand_in(adapter: &steadfast_wrap::Adapter, dir: &std::path::Path) {
    let manifest = adapter
        .prefix(dir)
        .join("node_modules")
        .join(adapter.package)
        .join("package.json");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(&manifest, json!({"version": adapter.version}).to_string()).unwrap();
    let bin = adapter.executable(dir);
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::write(bin, "#!/bin/sh\n").unwrap();
}

/// A wrapped session runs the CLI version it began with, whatever version the host
/// that takes it up is configured for: another version would ask the model again
/// for what is recorded and diverge from the record. A host without that version
/// leaves the session as it is; one that has it (beside others) runs it.
#[tokio::test]
async fn a_wrapped_session_keeps_the_cli_version_it_began_with() -> anyhow::Result<()> {
    let setup = Setup::new(json!([{"text": "ok"}])).await;
    let host = |dir: &str, version: &str| reviewer_host(&setup, dir, version);
    // Host A runs the reviewer at 2.1.197; the session begins there.
    let a = host("agents-a", "2.1.197");
    let old = a.adapter("reviewer")?;
    install_stand_in(&old, &a.install_dir());
    let mut new =
        NewSession::native("anthropic/claude-sonnet-4-5", &setup.workspace()).with_task("review");
    new.agent = "reviewer".into();
    let id = a.start_session(new).await?;
    let state = a.state(&id).await?;
    assert_eq!(
        state.agent_cli.as_deref(),
        Some("@anthropic-ai/claude-code@2.1.197")
    );
    assert_eq!(a.session_adapter(&state)?.version, "2.1.197");

    // Host B is configured for 2.1.332 and has only that: it leaves the session.
    let b = host("agents-b", "2.1.332");
    install_stand_in(&b.adapter("reviewer")?, &b.install_dir());
    let before = b.world().read(&id, 1).await?.len();
    match b.wake(&id).await {
        Err(Error::NotHere(why)) => assert!(why.contains("2.1.197"), "{why}"),
        Ok(_) => panic!("a host without the session's version took it"),
        Err(other) => panic!("{other}"),
    }
    assert_eq!(
        b.world().read(&id, 1).await?.len(),
        before,
        "not one record"
    );

    // Host C is configured for 2.1.332 but has 2.1.197 too: it runs the session's.
    let c = host("agents-c", "2.1.332");
    install_stand_in(&c.adapter("reviewer")?, &c.install_dir());
    install_stand_in(&old, &c.install_dir());
    assert_eq!(c.session_adapter(&state)?.version, "2.1.197");
    Ok(())
}

/// Moving a session to another CLI version is its owner's explicit, recorded act,
/// between turns: `agent_changed` in its log, the next turn on a host that has that
/// version (and no longer on one that has only the old), a named agent's
/// instructions with it. Refused inside a turn, for a native session, for a version
/// that is not one and for a model the CLI cannot speak.
#[tokio::test]
async fn a_sessions_cli_is_changed_between_turns_and_recorded() -> anyhow::Result<()> {
    let setup = Setup::new(json!([{"text": "ok"}])).await;
    let host = |dir: &str, version: &str| reviewer_host(&setup, dir, version);
    let a = host("agents-a", "2.1.197");
    install_stand_in(&a.adapter("claude-code")?, &a.install_dir());
    let mut new = NewSession::native("anthropic/claude-sonnet-4-5", &setup.workspace());
    new.agent = "claude-code".into();
    let id = a.start_session(new).await?;

    let b = host("agents-b", "2.1.332");
    install_stand_in(&b.adapter("reviewer")?, &b.install_dir());
    assert!(matches!(b.wake(&id).await, Err(Error::NotHere(_))));

    let (agent, cli) = a.change_agent(&id, "reviewer").await?;
    assert_eq!(
        (agent.as_str(), cli.as_str()),
        ("reviewer", "@anthropic-ai/claude-code@2.1.197"),
        "a named agent at the version the changing host configures"
    );
    let (agent, cli) = a.change_agent(&id, "reviewer@2.1.332").await?;
    assert_eq!(cli, "@anthropic-ai/claude-code@2.1.332", "{agent}");
    let state = a.state(&id).await?;
    assert_eq!(state.agent, "reviewer");
    assert_eq!(state.instructions.as_deref(), Some("Review only."));
    let log = a.world().read(&id, 1).await?;
    let changes = log
        .iter()
        .filter(|r| matches!(r.event, steadfast_log::Event::AgentChanged { .. }))
        .count();
    assert_eq!(changes, 2);
    // The same again records nothing.
    a.change_agent(&id, "reviewer@2.1.332").await?;
    assert_eq!(a.world().read(&id, 1).await?.len(), log.len());
    // Host B, which has 2.1.332, runs it now; host A, which has only 2.1.197, leaves it.
    let awake = b.wake(&id).await?;
    awake.release().await?;
    assert!(matches!(a.wake(&id).await, Err(Error::NotHere(_))));

    for (spec, why) in [
        ("claude-code@latest!", "not a version"),
        ("native", "native loop"),
        ("codex", "model"),
        ("nobody", "unknown agent"),
    ] {
        match a.change_agent(&id, spec).await {
            Err(Error::Invalid(e)) => assert!(e.contains(why), "{spec}: {e}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    // Inside a turn it is refused, and the turn's CLI stays the session's.
    a.world()
        .post(
            &id,
            steadfast_world::InboundKind::Message,
            "",
            &serde_json::Value::String("go".into()),
        )
        .await?;
    let mut awake = b.wake(&id).await?;
    awake.send("review this").await?;
    match a.change_agent(&id, "claude-code@2.1.197").await {
        Err(Error::Invalid(e)) => assert!(e.contains("between turns"), "{e}"),
        other => panic!("{other:?}"),
    }
    awake.release().await?;
    match a.change_agent(&id, "claude-code@2.1.197").await {
        Err(Error::Invalid(e)) => assert!(e.contains("between turns"), "{e}"),
        other => panic!("{other:?}"),
    }
    let native = a
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    match a.change_agent(&native, "claude-code").await {
        Err(Error::Invalid(e)) => assert!(e.contains("native loop"), "{e}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}
