//! Wrapped CLIs over several turns, through the API and a worker: each turn continues
//! the CLI's conversation with every earlier message, tool call and result, as the
//! CLI run interactively would, an interrupted turn tells the next what its tool
//! calls had done, and a fork continues the conversation as it was at its fork point.
//! For Claude Code, Codex, Pi and OpenCode at their pinned versions, and at the newest
//! the npm registry serves.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{agents_dir, call, idle_after, installed, kind, wait_for};
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

const CLIS: &[(&str, &str)] = &[
    ("claude-code", "anthropic/claude-sonnet-4-5"),
    ("codex", "openai/gpt-5"),
    ("pi", "anthropic/claude-sonnet-4-5"),
    ("opencode", "anthropic/claude-sonnet-4-5"),
];

/// The CLIs that speak a second API, with a model of it: Pi calls OpenAI's Chat
/// Completions, OpenCode OpenAI's Responses.
const OTHER_APIS: &[(&str, &str)] = &[("pi", "openai/gpt-5"), ("opencode", "openai/gpt-5")];

const FIRST: &str = "Run the marker command and tell me what it printed.";
const SECOND: &str = "Which number did the marker command print?";
const THIRD: &str = "Now write the post file.";
const FOURTH: &str = "Did the post file get written before you stopped?";

/// Five turns: a command whose output only its result holds; a question about it; a
/// command interrupted while it sleeps after writing a file; a question about that; a
/// reply interrupted while it streams.
fn script() -> Script {
    Script::from_json(
        &json!({"steps": [
            {"text": "Running it.", "tool_calls": [{"name": "bash", "input": {"command": "echo MARKER-$((6*7))"}}]},
            {"text": "It printed the marker."},
            {"text": "The number was in the output."},
            {"text": "Writing it.", "tool_calls": [{"name": "bash", "input": {"command": "echo POSTED > post-file.txt; sleep 60"}}]},
            {"text": "The file was written."},
            {"text": "Let me explain at length. ".repeat(12), "chunk_delay_ms": 150},
        ]})
        .to_string(),
    )
    .unwrap()
}

/// `steadfast` of the site in `dir`, its CLIs in the test's agents directory.
fn command(dir: &Path, fake: &FakeProvider, args: &[&str]) -> tokio::process::Command {
    common::site_command(dir, &agents_dir(), fake, args)
}

/// The requests the fake provider got from `from` on that hold `needle`: the turn's
/// conversation requests (the CLIs' side requests do not carry its message).
fn requests_with(fake: &FakeProvider, from: usize, needle: &str) -> Vec<String> {
    fake.state().requests()[from..]
        .iter()
        .filter(|r| r.contains(needle))
        .cloned()
        .collect()
}

/// The session's log as `steadfast log --json` prints it.
async fn log_of(dir: &Path, fake: &FakeProvider, id: &str) -> Vec<Value> {
    common::log_lines(command(dir, fake, &["log", id, "--json"])).await
}

/// Sends `text` as the session's next message and waits until that turn is over.
async fn turn(url: &str, id: &str, text: &str, turns: u64) -> Value {
    let (status, body) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/messages"),
        Some(json!({"text": text})),
    )
    .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    idle_after(url, id, turns).await
}

async fn several_turns(agent: &str, model: &str, config: Option<&str>) {
    let fake = FakeProvider::start(script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    if let Some(config) = config {
        std::fs::write(dir.path().join("steadfast.toml"), config).unwrap();
    }
    let (_api, _worker, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": agent, "model": model, "workspace": {"kind": "empty"}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();

    // Turn 1 runs the command; turn 2's CLI is a new process, and its requests carry
    // turn 1's tool call and result (the output is nowhere else).
    turn(&url, &id, FIRST, 1).await;
    let before = fake.state().requests().len();
    let shown = turn(&url, &id, SECOND, 2).await;
    assert_eq!(shown["reply"], "The number was in the output.", "{shown}");
    let second = requests_with(&fake, before, SECOND);
    assert!(!second.is_empty(), "{agent}: turn 2 asked the model");
    for request in &second {
        assert!(
            request.contains(FIRST) && request.contains("MARKER-42"),
            "{agent}: turn 2 continues turn 1's conversation, tool result included: {request}"
        );
        assert!(
            !request.contains("This session has had earlier turns"),
            "{agent}: no summary of earlier turns in the prompt: {request}"
        );
    }

    // Turn 3 is interrupted while its command sleeps after writing a file: turn 4 is
    // told the call ran, and what it returned.
    let queued = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .header("accept", "application/json")
        .json(&json!({"text": THIRD}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202);
    let workspace = common::workspace_in(&dir.path().join("home"), &created);
    wait_for("the command to write its file", async || {
        workspace.join("post-file.txt").exists()
    })
    .await;
    let (status, body) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/interrupt"),
        None,
    )
    .await;
    assert_eq!(
        status,
        202,
        "{body}\n{:#?}",
        log_of(dir.path(), &fake, &id).await
    );
    idle_after(&url, &id, 3).await;
    // Nothing of the interrupted turn is left running: not the CLI's sandbox, not the
    // tools' (both name the session's workspace in their command lines).
    let left = || {
        let out = std::process::Command::new("pgrep")
            .args(["-a", "-f", &workspace.display().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    wait_for("the interrupted turn's processes to go", async || {
        left().is_empty()
    })
    .await;
    let before = fake.state().requests().len();
    turn(&url, &id, FOURTH, 4).await;
    let fourth = requests_with(&fake, before, FOURTH);
    assert!(!fourth.is_empty(), "{agent}: turn 4 asked the model");
    for request in &fourth {
        for needle in [FIRST, "MARKER-42", THIRD, "interrupted by", "post-file.txt"] {
            assert!(
                request.contains(needle),
                "{agent}: turn 4 knows `{needle}`: {request}"
            );
        }
    }

    // Turn 5 is interrupted while its reply streams: the stream is cut off, the reply
    // is not recorded (nor read to its end), and the turn ends interrupted.
    let queued = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .header("accept", "application/json")
        .json(&json!({"text": "Explain everything."}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202);
    wait_for("the slow reply to be asked for", async || {
        fake.state().calls_per_step().get(5).is_some_and(|n| *n > 0)
    })
    .await;
    let asked = std::time::Instant::now();
    let (status, body) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/interrupt"),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    idle_after(&url, &id, 5).await;
    eprintln!(
        "{agent}: a streaming reply was cut off {} ms after the interrupt was asked",
        asked.elapsed().as_millis()
    );

    // Each turn's run kept its conversation in the log.
    let log = log_of(dir.path(), &fake, &id).await;
    let kept: Vec<u64> = log
        .iter()
        .filter(|r| kind(r) == "conversation_kept")
        .map(|r| r["event"]["conversation_kept"]["turn"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [1, 2, 3, 4, 5], "{agent}");
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let last_intent = kinds.iter().rposition(|k| k == "exchange_intent").unwrap();
    assert!(
        !kinds[last_intent..].contains(&"exchange_outcome".to_string()),
        "{agent}: the reply streaming when the interrupt came was cut off, not recorded: {kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("turn_interrupted"));
    assert!(
        !kinds.iter().any(|k| k == "replay_diverged"),
        "{agent}: {kinds:?}"
    );

    // A fork at turn 1's end continues turn 1's conversation, and nothing after it.
    let first_end = log
        .iter()
        .find(|r| kind(r) == "turn_ended")
        .and_then(|r| r["seq"].as_u64())
        .unwrap();
    let (status, forks) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/fork"),
        Some(json!({"at": first_end})),
    )
    .await;
    assert_eq!(status, 201, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap().to_string();
    let before = fake.state().requests().len();
    let asked = "In this fork: which number was it?";
    turn(&url, &fork, asked, 2).await;
    wait_for("the fork's CLI to go", async || left().is_empty()).await;
    let forked = requests_with(&fake, before, asked);
    assert!(!forked.is_empty(), "{agent}: the fork asked the model");
    for request in &forked {
        assert!(
            request.contains(FIRST) && request.contains("MARKER-42"),
            "{agent}: the fork continues turn 1: {request}"
        );
        assert!(
            !request.contains(SECOND) && !request.contains(THIRD),
            "{agent}: the fork knows nothing after its fork point: {request}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_turn_continues_the_cli_conversation_with_its_tool_results() {
    for (agent, model) in CLIS
        .iter()
        .chain(OTHER_APIS)
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        installed(agent).await;
        tokio::time::timeout(Duration::from_secs(600), several_turns(agent, model, None))
            .await
            .unwrap_or_else(|_| panic!("{agent}: its turns took over ten minutes"));
    }
}

/// The same with the newest version of each CLI the npm registry serves, as a named
/// agent at that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_clis_continue_their_conversations_too() {
    for (adapter, model) in CLIS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        let package = match *adapter {
            "claude-code" => "@anthropic-ai/claude-code",
            "codex" => "@openai/codex",
            "pi" => "@mariozechner/pi-coding-agent",
            _ => "opencode-ai",
        };
        let (name, _, config) = common::newest_agent(adapter, package).await;
        tokio::time::timeout(
            Duration::from_secs(600),
            several_turns(&name, model, Some(&config)),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: its turns took over ten minutes"));
    }
}
