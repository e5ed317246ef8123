//! A crash of the harness never kills the command in flight. A session's sandbox
//! belongs to its lease, not to the process that drives it: when a worker is killed
//! while a command runs, the command runs on; the next worker on the machine adopts
//! the sandbox, waits for the command and records its outcome with its whole output.
//! The command ran once, whole, and nothing is rolled back. Only when the sandbox dies
//! too (the machine died) does a cut-off call fall to rule 4, as before.
//!
//! Through the API, with bubblewrap sandboxes and two worker processes, for the native
//! agent and a wrapped one, on SQLite and on PostgreSQL.

mod common;

use std::sync::atomic::Ordering;

use common::{agents_dir, call, installed, kind, running, wait_for};
use serde_json::json;

/// How the worker running the command goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Crash {
    /// The worker alone is SIGKILLed.
    Worker,
    /// The worker and its sandbox are SIGKILLed (the machine died).
    Machine,
    /// The worker is stopped (SIGTERM) with no grace for the step in hand, as a
    /// rolling deploy replaces it.
    Deploy,
}

async fn a_crash_while_a_command_runs(agent: &str, world: Option<&str>, crash: Crash, sleep: &str) {
    let label = format!(
        "{agent}, {crash:?}, {}",
        world.map_or("sqlite", |_| "postgres")
    );
    let (port, hits) = common::counter();
    let command = format!(
        "sleep {sleep}; echo done >> f.txt; curl -sf -X POST -d go http://localhost:{port}/count; echo finished {sleep}"
    );
    let fake = common::fake_playing(json!([
        {"text": "Building.", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "Done."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"localhost:{port}\"]\n\
         [harness]\nlease-ttl-secs = 6\nstop-grace-secs = 0\n"
    );
    let config = match world {
        Some(url) => format!("world = \"{url}\"\nmigrate-on-open = true\n{config}"),
        None => config,
    };
    std::fs::write(dir.path().join("steadfast.toml"), config).unwrap();
    let (_api, mut worker, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
    let model = "anthropic/claude-sonnet-4-5";
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({
            "agent": agent, "model": model, "workspace": {"kind": "empty"},
            "network": format!("allow:localhost:{port}"), "task": "build",
        })),
    )
    .await;
    assert_eq!(status, 201, "{label}: {created}");
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&dir.path().join("home"), &created);
    wait_for("the command to run", async || {
        running(&format!("sleep {sleep}"))
    })
    .await;

    match crash {
        Crash::Deploy => {
            let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        }
        _ => worker.start_kill().unwrap(),
    }
    worker.wait().await.unwrap();
    if crash == Crash::Machine {
        assert!(common::kill_sandboxes_of(&id) > 0, "{label}: a sandbox ran");
    }
    let (_next, shown) = common::next_worker_ends_turn(dir.path(), &fake, &url, &id).await;
    assert_eq!(shown["reply"], "Done.", "{label}: {shown}");

    let log = common::site_log(dir.path(), &fake, &id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let of = |kind_: &str| common::events_of(&log, kind_);
    let intents: Vec<_> = of("tool_call_intent")
        .into_iter()
        .filter(|i| i["input"].to_string().contains("/count"))
        .collect();
    let call_id = intents[0]["call_id"].clone();
    let text = std::fs::read_to_string(workspace.join("f.txt")).unwrap_or_default();
    match crash {
        Crash::Worker | Crash::Deploy => {
            assert_eq!(intents.len(), 1, "{label}: the call began once: {kinds:?}");
            assert!(
                of("tool_call_interrupted").is_empty(),
                "{label}: nothing was cut off: {kinds:?}"
            );
            let outcome = of("tool_call_outcome")
                .into_iter()
                .find(|o| o["call_id"] == call_id)
                .unwrap_or_else(|| panic!("{label}: its outcome is recorded: {kinds:?}"));
            assert_eq!(outcome["exit_code"], 0, "{label}: {outcome}");
            assert!(
                outcome["output"]
                    .to_string()
                    .contains(&format!("finished {sleep}")),
                "{label}: the whole output is recorded: {outcome}"
            );
            assert_eq!(text, "done\n", "{label}: the command ran once, whole");
            assert_eq!(hits.load(Ordering::SeqCst), 1, "{label}: it posted once");
        }
        Crash::Machine => {
            // Rule 4: the post went out (or may have): never run again.
            let cut_off = of("tool_call_interrupted");
            assert_eq!(cut_off.len(), 1, "{label}: {kinds:?}");
            assert_eq!(cut_off[0]["call_id"], call_id, "{label}");
            assert!(
                hits.load(Ordering::SeqCst) <= 1,
                "{label}: posted at most once"
            );
            assert!(!text.contains("done\ndone"), "{label}: {text:?}");
        }
    }
    assert!(
        !running(&format!("sleep {sleep}")),
        "{label}: no command was left"
    );
}

/// The worker is SIGKILLed while a command runs; the next worker on the machine
/// adopts the sandbox and records the command's outcome once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_outlives_its_harness_and_is_recorded_whole_once() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "4.1"), ("claude-code", "4.2")] {
        a_crash_while_a_command_runs(agent, None, Crash::Worker, sleep).await;
    }
}

/// The same on a PostgreSQL world.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_outlives_its_harness_on_postgres_too() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "4.3"), ("claude-code", "4.4")] {
        let db = common::TestDatabase::create(&format!(
            "steadfast_outlives_{}_{}",
            agent.replace('-', "_"),
            std::process::id()
        ))
        .await;
        a_crash_while_a_command_runs(agent, Some(&db.url), Crash::Worker, sleep).await;
        db.drop_now().await;
    }
}

/// The machine dies (the worker and its sandbox are SIGKILLed): the cut-off call is
/// resolved by rule 4 as before, its post never made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_sandbox_dies_with_the_harness_the_call_is_resolved_by_rule_4() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "4.5"), ("claude-code", "4.6")] {
        a_crash_while_a_command_runs(agent, None, Crash::Machine, sleep).await;
    }
}

/// A rolling deploy: the worker is stopped (SIGTERM) with `stop-grace-secs = 0` while a
/// command runs; the next worker on the machine adopts the sandbox, as after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_hands_the_command_in_flight_to_the_next_worker() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "4.7"), ("claude-code", "4.8")] {
        a_crash_while_a_command_runs(agent, None, Crash::Deploy, sleep).await;
    }
}
