//! Journal policies, the same for every agent, through the API and a worker, for the
//! native agent and for Claude Code, Codex, Pi and OpenCode:
//! - a tools sandbox that dies in the middle of a command: the death is recorded
//!   (`sandbox_lost`), the cut-off command is rolled back (its half-done append is
//!   gone) and the model told, it runs once more in a new sandbox, and the turn
//!   finishes with each effect in the workspace once;
//! - a worker killed (`SIGKILL`) while a command runs that has already had its external
//!   effect: with no reconciler for it (a `curl -X POST`), the next worker resolves it
//!   as *outcome unknown*; with one (a `git push`, checked against the remote), as done
//!   with the evidence. Either way the effect happened once and the call never ran again.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{agents_dir, call, idle_after, installed, kind, wait_for};
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

const AGENTS: &[(&str, &str)] = &[
    ("native", "anthropic/claude-sonnet-4-5"),
    ("claude-code", "anthropic/claude-sonnet-4-5"),
    ("codex", "openai/gpt-5"),
    ("pi", "anthropic/claude-sonnet-4-5"),
    ("opencode", "anthropic/claude-sonnet-4-5"),
];

fn script() -> Script {
    Script::from_json(
        &json!({"steps": [
            {"text": "Appending.", "tool_calls": [{"name": "bash", "input": {"command": "echo one >> log.txt; sleep 8"}}]},
            {"text": "Again.", "tool_calls": [{"name": "bash", "input": {"command": "echo two >> log.txt"}}]},
            {"text": "Done."},
        ]})
        .to_string(),
    )
    .unwrap()
}

fn command(dir: &Path, fake: &FakeProvider, args: &[&str]) -> tokio::process::Command {
    common::site_command(dir, &agents_dir(), fake, args)
}

/// The process's parent and name, from `/proc`.
fn parent_and_name(pid: i32) -> Option<(i32, String)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    Some((field("PPid:")?.parse().ok()?, field("Name:")?))
}

/// The outermost bubblewrap above the process running `needle`: the sandbox it runs in.
fn sandbox_of(needle: &str) -> Option<i32> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", needle])
        .output()
        .ok()?;
    let pid: i32 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()?;
    let mut outermost = None;
    let mut at = pid;
    while let Some((parent, name)) = parent_and_name(at) {
        if name == "bwrap" {
            outermost = Some(at);
        }
        if parent <= 1 {
            break;
        }
        at = parent;
    }
    outermost
}

async fn sandbox_dies_mid_command(agent: &str, model: &str) {
    let fake = FakeProvider::start(script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        "[sandbox]\nbackend = \"bwrap\"\n",
    )
    .unwrap();
    let (_api, _worker, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": agent, "model": model, "workspace": {"kind": "empty"}, "task": "append to the log"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&dir.path().join("home"), &created);

    // The command has appended and sleeps: its sandbox is killed under it.
    wait_for("the command to append", async || {
        workspace.join("log.txt").exists()
    })
    .await;
    let mut sandbox = None;
    wait_for("the command's sandbox", async || {
        sandbox = sandbox_of("^sleep 8$");
        sandbox.is_some()
    })
    .await;
    let sandbox = sandbox.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sandbox),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let shown = tokio::time::timeout(Duration::from_secs(180), idle_after(&url, &id, 1))
        .await
        .unwrap_or_else(|_| panic!("{agent}: the turn finished"));
    assert_eq!(shown["reply"], "Done.", "{agent}: {shown}");
    // The cut-off append was rolled back and the model told so; asked again, it is made
    // once more, in a new sandbox.
    assert_eq!(
        std::fs::read_to_string(workspace.join("log.txt")).unwrap(),
        "one\ntwo\n",
        "{agent}: the cut-off append was rolled back and made once more"
    );
    let log: Vec<Value> =
        common::log_lines(command(dir.path(), &fake, &["log", &id, "--json"])).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let lost = kinds
        .iter()
        .position(|k| k == "sandbox_lost")
        .unwrap_or_else(|| panic!("{agent}: the death is recorded: {kinds:?}"));
    assert_eq!(
        kinds.iter().filter(|k| *k == "sandbox_lost").count(),
        1,
        "{agent}: {kinds:?}"
    );
    assert_eq!(
        log[lost + 1]["event"]["tool_call_interrupted"]["resolution"]["kind"],
        "rolled_back",
        "{agent}: {}",
        log[lost + 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_dies_mid_command_is_handled_alike_for_every_agent() {
    for (agent, model) in AGENTS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        if *agent != "native" {
            installed(agent).await;
        }
        sandbox_dies_mid_command(agent, model).await;
    }
}

/// An external effect a command has, then goes on running.
#[derive(Debug, Clone, Copy)]
enum Effect {
    /// A POST to a counter: nothing can tell afterwards whether it happened.
    Post,
    /// A push to a bare repository: the `git push` reconciler checks the remote.
    Push,
}

/// A worker killed right after a command's external effect, the command still running;
/// a new worker takes the session over. The effect is never made again, and the call is
/// resolved as `effect` says it can be. The site's world is `world` (a PostgreSQL URL),
/// or its own SQLite file.
async fn cut_off_after_its_effect(agent: &str, model: &str, effect: Effect, world: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let (port, hits) = common::counter();
    let remote = dir.path().join("remote.git");
    let command = match effect {
        Effect::Post => format!("curl -sf -X POST -d go http://localhost:{port}/count && sleep 8"),
        Effect::Push => "git push -q origin main && sleep 8".to_string(),
    };
    // The agent makes the repository it pushes (a logical workspace is Steadfast's own
    // copy: what is in it is the agent's work).
    let setup = format!(
        "git init -q -b main && git -c user.name=Dev -c user.email=dev@example.com \
         commit -q --allow-empty -m first && git remote add origin {}",
        remote.display()
    );
    let mut steps = vec![
        json!({"text": "Shipping.", "tool_calls": [{"name": "bash", "input": {"command": command}}]}),
        json!({"text": "Done."}),
    ];
    if let Effect::Push = effect {
        steps.insert(
            0,
            json!({"text": "A repository.", "tool_calls": [{"name": "bash", "input": {"command": setup}}]}),
        );
    }
    let fake =
        FakeProvider::start(Script::from_json(&json!({ "steps": steps }).to_string()).unwrap())
            .await
            .unwrap();
    // The push goes to a repository on this host, which only the local backend reaches.
    let config = match effect {
        Effect::Post => {
            format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"localhost:{port}\"]\n")
        }
        Effect::Push => "[sandbox]\nbackend = \"local\"\n".to_string(),
    } + "[harness]\nlease-ttl-secs = 3\n";
    let config = match world {
        Some(url) => format!("world = \"{url}\"\nmigrate-on-open = true\n{config}"),
        None => config,
    };
    std::fs::write(dir.path().join("steadfast.toml"), config).unwrap();
    let (_api, mut worker, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
    let mut body = json!({"agent": agent, "model": model, "workspace": {"kind": "empty"}});
    if let Effect::Post = effect {
        body["network"] = json!(format!("allow:localhost:{port}"));
    }
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(body),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let pushes = || common::pushes(&remote);
    if let Effect::Push = effect {
        common::counting_remote(dir.path());
    }
    // Queued, its turn's stream not read: the turn runs on the worker.
    let sent = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .header("accept", "application/json")
        .json(&json!({"text": "ship it"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
    let label = format!("{agent}, {effect:?}");
    for waited in 0.. {
        let made = match effect {
            Effect::Post => hits.load(Ordering::SeqCst),
            Effect::Push => pushes(),
        };
        if made == 1 {
            break;
        }
        if waited == 600 {
            let events = common::event_page(&format!("{url}/v1/sessions/{id}/events")).await;
            panic!("{label}: the effect never happened: {events:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    // The machine dies with it: a sandbox that outlived the worker alone would be
    // adopted by the next with its command, which would then not be cut off at all
    // (`outlives_harness.rs`).
    common::kill_sandboxes_of(&id);
    let (_next, shown) = common::next_worker_ends_turn(dir.path(), &fake, &url, &id).await;
    assert_eq!(shown["reply"], "Done.", "{label}: {shown}");
    let made = match effect {
        Effect::Post => hits.load(Ordering::SeqCst),
        Effect::Push => pushes(),
    };
    assert_eq!(made, 1, "{label}: the effect happened once");
    let log: Vec<Value> = common::log_lines(common::site_command(
        dir.path(),
        &agents_dir(),
        &fake,
        &["log", &id, "--json"],
    ))
    .await;
    let of = |kind_: &str| common::events_of(&log, kind_);
    let intents: Vec<_> = of("tool_call_intent")
        .into_iter()
        .filter(|i| {
            i["input"].to_string().contains(match effect {
                Effect::Post => "/count",
                Effect::Push => "git push",
            })
        })
        .collect();
    assert_eq!(
        intents.len(),
        1,
        "{label}: the call began once: {intents:?}"
    );
    assert_eq!(intents[0]["class"], "external", "{label}");
    let cut_off = of("tool_call_interrupted");
    let kinds: Vec<String> = log.iter().map(kind).collect();
    assert_eq!(cut_off.len(), 1, "{label}: {kinds:?}");
    assert_eq!(cut_off[0]["call_id"], intents[0]["call_id"], "{label}");
    let resolution = &cut_off[0]["resolution"];
    match effect {
        Effect::Post => assert_eq!(
            resolution["kind"], "outcome_unknown",
            "{label}: {resolution}"
        ),
        Effect::Push => {
            assert_eq!(resolution["kind"], "reconciled", "{label}: {resolution}");
            assert_eq!(resolution["done"], true, "{label}: {resolution}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_external_call_is_never_run_again_with_or_without_a_reconciler_for_every_agent() {
    for (agent, model) in AGENTS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        if *agent != "native" {
            installed(agent).await;
        }
        for effect in [Effect::Post, Effect::Push] {
            cut_off_after_its_effect(agent, model, effect, None).await;
        }
    }
}

/// The same on a PostgreSQL world, for the native agent and a wrapped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_external_call_is_outcome_unknown_on_postgres_too() {
    installed("claude-code").await;
    for (agent, model) in &AGENTS[..2] {
        let db = common::TestDatabase::create(&format!(
            "steadfast_cut_off_{}_{}",
            agent.replace('-', "_"),
            std::process::id()
        ))
        .await;
        cut_off_after_its_effect(agent, model, Effect::Post, Some(&db.url)).await;
        db.drop_now().await;
    }
}

/// A worker whose snapshots may take no time at all (`[harness] snapshot-timeout-secs
/// = 0`): a command that would change the workspace is never run, since what it changed
/// could be neither recorded nor undone. The agent is told so as the call's result (one
/// outcome, an error, nothing snapshotted), and the turn goes on.
async fn snapshot_times_out(agent: &str, model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(
        Script::from_json(
            &json!({"steps": [
                {"text": "Writing.", "tool_calls": [{"name": "bash", "input": {"command": "echo ran > ran.txt"}}]},
                {"text": "Done."},
            ]})
            .to_string(),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        "[sandbox]\nbackend = \"bwrap\"\n",
    )
    .unwrap();
    // The API server takes the session's first snapshot as usual; the worker's run out.
    let worker_config = dir.path().join("worker.toml");
    std::fs::write(
        &worker_config,
        "[sandbox]\nbackend = \"bwrap\"\n[harness]\nsnapshot-timeout-secs = 0\n",
    )
    .unwrap();
    let mut api = common::site_command(
        dir.path(),
        &agents_dir(),
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    let _worker = common::site_command(
        dir.path(),
        &agents_dir(),
        &fake,
        &["worker", "--workers", "1"],
    )
    .env("STEADFAST_CONFIG", &worker_config)
    .spawn()
    .unwrap();
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": agent, "model": model, "workspace": {"kind": "empty"}, "task": "write it"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&dir.path().join("home"), &created);
    let shown = tokio::time::timeout(Duration::from_secs(180), idle_after(&url, &id, 1))
        .await
        .unwrap_or_else(|_| panic!("{agent}: the turn finished"));
    assert_eq!(shown["reply"], "Done.", "{agent}: {shown}");
    assert!(!workspace.join("ran.txt").exists(), "{agent}: nothing ran");
    let log: Vec<Value> =
        common::log_lines(command(dir.path(), &fake, &["log", &id, "--json"])).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let intents: Vec<usize> = (0..log.len())
        .filter(|&i| kinds[i] == "tool_call_intent")
        .collect();
    assert_eq!(intents.len(), 1, "{agent}: {kinds:?}");
    let intent = &log[intents[0]]["event"]["tool_call_intent"];
    assert!(intent["snapshot_before"].is_null(), "{agent}: {intent}");
    assert_eq!(
        kinds[intents[0] + 1],
        "tool_call_outcome",
        "{agent}: {kinds:?}"
    );
    let outcome = &log[intents[0] + 1]["event"]["tool_call_outcome"];
    assert_eq!(outcome["is_error"], true, "{agent}: {outcome}");
    assert!(
        outcome["output"].to_string().contains("did not run"),
        "{agent}: {outcome}"
    );
    assert!(
        !kinds.iter().any(|k| k == "tool_call_interrupted"),
        "{agent}: nothing was left to resolve: {kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_snapshot_times_out_never_runs_and_is_told_alike_for_every_agent() {
    for (agent, model) in AGENTS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        if *agent != "native" {
            installed(agent).await;
        }
        snapshot_times_out(agent, model).await;
    }
}
