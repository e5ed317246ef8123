//! Forks of wrapped agents' sessions: a Claude Code, Codex, Pi or OpenCode session
//! forked inside its turn is carried on by a worker in a fresh CLI process, answered
//! from the shared part of the log with no provider call, and finishes the task in a
//! workspace of its own while the parent's stays as it was.

mod common;

use std::process::Stdio;

use serde_json::{json, Value};
use steadfast_testkit::{demo, FakeProvider};
use tokio::io::AsyncBufReadExt;

use common::{agents_dir, installed, kind};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

const CLIS: &[(&str, &str)] = &[
    ("claude-code", "anthropic/claude-sonnet-4-5"),
    ("codex", "openai/gpt-5"),
    ("pi", "anthropic/claude-sonnet-4-5"),
    ("opencode", "anthropic/claude-sonnet-4-5"),
];

/// `steadfast` in `home`, run from `home`'s parent (where a test's `steadfast.toml`
/// naming agents is).
fn command(home: &std::path::Path, fake: &FakeProvider, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .current_dir(home.parent().unwrap())
        .env("STEADFAST_HOME", home)
        .env("STEADFAST_AGENTS_DIR", agents_dir())
        .env("ANTHROPIC_API_KEY", "sk-ant-the-harness-real-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
        .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url()))
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_WORLD")
        .env_remove("STEADFAST_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn log(home: &std::path::Path, fake: &FakeProvider, id: &str) -> Vec<Value> {
    let out = command(home, fake, &["log", id, "--json"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_session_forked_inside_its_turn_finishes_it_on_its_own() {
    for (agent, model) in CLIS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        installed(agent).await;
        fork_inside_a_turn(agent, model, None).await;
    }
}

/// The same with the newest Claude Code and Codex the npm registry serves, as named
/// agents at that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_claude_code_and_codex_fork_inside_a_turn_too() {
    for (adapter, package, model) in [
        (
            "claude-code",
            "@anthropic-ai/claude-code",
            "anthropic/claude-sonnet-4-5",
        ),
        ("codex", "@openai/codex", "openai/gpt-5"),
    ] {
        let (name, _, config) = common::newest_agent(adapter, package).await;
        fork_inside_a_turn(&name, model, Some(&config)).await;
    }
}

/// A session of `agent` on the demo, forked after its third reply inside the turn.
async fn fork_inside_a_turn(agent: &str, model: &str, config: Option<&str>) {
    {
        let fake = FakeProvider::start(demo::script()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        if let Some(config) = config {
            std::fs::write(dir.path().join("steadfast.toml"), config).unwrap();
        }
        let home = dir.path().join("home");
        let mut api = command(
            &home,
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
        )
        .spawn()
        .unwrap();
        let stdout = api.stdout.take().unwrap();
        let url = tokio::io::BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .unwrap()
            .unwrap();
        let _worker = command(&home, &fake, &["worker", "--workers", "1"])
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let created: Value = http
            .post(format!("{url}/v1/sessions"))
            .json(&json!({"agent": agent, "model": model, "workspace": {"kind": "demo"}, "task": demo::TASK}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let parent = created["id"].as_str().unwrap().to_string();
        let parent_dir = common::workspace_in(&home, &created);
        common::idle_after(&url, &parent, 1).await;
        let parent_calls = fake.calls();
        let parent_files = std::fs::read_to_string(parent_dir.join("CHANGELOG.md")).unwrap();

        // Inside the turn: just after its third reply was recorded.
        let records = log(&home, &fake, &parent).await;
        let outcomes: Vec<u64> = records
            .iter()
            .filter(|r| kind(r) == "exchange_outcome")
            .map(|r| r["seq"].as_u64().unwrap())
            .collect();
        assert!(outcomes.len() >= 4, "{agent}: {} replies", outcomes.len());
        let at = outcomes[2];
        let made: Value = http
            .post(format!("{url}/v1/sessions/{parent}/fork"))
            .json(&json!({"at": at}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let fork = made["sessions"][0]["id"].as_str().unwrap().to_string();
        assert_eq!(made["sessions"][0]["status"], "running", "{made}");
        let shown = common::idle_after(&url, &fork, 1).await;
        assert!(
            shown["reply"].as_str().is_some_and(|r| !r.is_empty()),
            "{agent}: {shown}"
        );

        // The shared replies were answered from the log: the fork paid only for
        // what came after its fork point.
        let fork_calls = fake.calls() - parent_calls;
        assert!(
            fork_calls <= parent_calls - 3,
            "{agent}: the fork made {fork_calls} calls, the parent {parent_calls}"
        );
        let own = log(&home, &fake, &fork).await;
        let own: Vec<&Value> = own
            .iter()
            .filter(|r| r["seq"].as_u64().unwrap() > at)
            .collect();
        let kinds: Vec<String> = own.iter().map(|r| kind(r)).collect();
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("forked"),
            "{kinds:?}"
        );
        assert!(
            !kinds.iter().any(|k| k == "replay_diverged"),
            "{agent}: {kinds:?}"
        );
        assert!(
            !kinds.iter().any(|k| k.starts_with("model_call")),
            "{agent}: {kinds:?}"
        );
        assert!(
            kinds.iter().any(|k| k == "turn_ended"),
            "{agent}: {kinds:?}"
        );

        // Its workspace is its own: the task done there, the parent's untouched.
        let fork_shown: Value = http
            .get(format!("{url}/v1/sessions/{fork}/files/CHANGELOG.md"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .map(Value::String)
            .unwrap();
        assert!(
            fork_shown.as_str().unwrap().contains("off-by-one"),
            "{agent}: {fork_shown}"
        );
        assert_eq!(
            std::fs::read_to_string(parent_dir.join("CHANGELOG.md")).unwrap(),
            parent_files
        );
        let _ = api.start_kill();
    }
}

/// A wrapped session bound to a user's directory (`steadfast run --workspace DIR`),
/// forked inside its turn and carried on here with `resume`: the fork works in a
/// logical workspace of its own, and its CLI's requests, which name another directory
/// than the recorded ones did, are still answered from the shared part of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_sessions_fork_replays_its_shared_part_in_a_workspace_of_its_own() {
    for (agent, model) in CLIS[..2]
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        installed(agent).await;
        let fake = FakeProvider::start(demo::script()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let repo = dir.path().join("repo");
        demo::write_project(&repo).unwrap();
        let run = command(
            &home,
            &fake,
            &[
                "run",
                demo::TASK,
                "--agent",
                agent,
                "--workspace",
                repo.to_str().unwrap(),
                "--model",
                model,
                "--json",
            ],
        )
        .output()
        .await
        .unwrap();
        assert!(
            run.status.success(),
            "{agent}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let parent = serde_json::from_slice::<Value>(&run.stdout).unwrap()["session"]
            .as_str()
            .unwrap()
            .to_string();
        let parent_calls = fake.calls();
        let before = std::fs::read_to_string(repo.join("CHANGELOG.md")).unwrap();
        let records = log(&home, &fake, &parent).await;
        let at = records
            .iter()
            .filter(|r| kind(r) == "exchange_outcome")
            .map(|r| r["seq"].as_u64().unwrap())
            .nth(2)
            .expect("three replies");
        let forked = command(&home, &fake, &["fork", &parent, "--at", &at.to_string()])
            .output()
            .await
            .unwrap();
        assert!(forked.status.success());
        let fork = String::from_utf8_lossy(&forked.stdout).trim().to_string();
        let resumed = command(&home, &fake, &["resume", &fork, "--json"])
            .output()
            .await
            .unwrap();
        assert!(
            resumed.status.success(),
            "{agent}: {}",
            String::from_utf8_lossy(&resumed.stderr)
        );
        let own: Vec<String> = log(&home, &fake, &fork)
            .await
            .iter()
            .filter(|r| r["seq"].as_u64().unwrap() > at)
            .map(kind)
            .collect();
        assert!(
            !own.iter().any(|k| k == "replay_diverged"),
            "{agent}: {own:?}"
        );
        assert!(own.iter().any(|k| k == "turn_ended"), "{agent}: {own:?}");
        let fork_calls = fake.calls() - parent_calls;
        assert!(
            fork_calls <= parent_calls - 3,
            "{agent}: fork {fork_calls}, parent {parent_calls}"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("CHANGELOG.md")).unwrap(),
            before,
            "the user's directory is the parent's alone"
        );
        let workspaces: Vec<_> = std::fs::read_dir(home.join("workspaces"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(workspaces.len(), 1);
        assert!(
            std::fs::read_to_string(workspaces[0].path().join("CHANGELOG.md"))
                .unwrap()
                .contains("off-by-one")
        );
    }
}
