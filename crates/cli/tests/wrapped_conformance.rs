//! One journal policy, the same for every agent, through the API and a worker: a
//! tools sandbox that dies in the middle of a command. For the native agent and for
//! Claude Code, Codex, Pi and OpenCode, the death is recorded (`sandbox_lost`), the
//! cut-off command is rolled back (its half-done append is gone) and the model told,
//! it runs once more in a new sandbox, and the turn finishes with each effect in the
//! workspace once.

mod common;

use std::path::Path;
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
