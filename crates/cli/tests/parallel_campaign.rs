//! Parallel tool calls under SIGKILL at random points, through the API and worker
//! processes, with one worker and with two.
//!
//! Pi, OpenCode and the native loop run a reply's tool calls at once. Each run here
//! gives one reply of eight parallel calls — a slow command, two appends to one file,
//! four writes and a `curl -X POST` to a counter (and for the native agent a read,
//! which runs beside the slow command) — and kills a worker (`SIGKILL`) at a random moment
//! while the turn runs; another worker (a new one, or the second) carries the session
//! on. Whatever the moment: every call whose intent is recorded has exactly one outcome
//! or resolution, the counter saw the POST once, the workspace is the crash-free run's,
//! and a second message rolls nothing back.
//!
//! `STEADFAST_CAMPAIGN_RUNS` sets the runs per agent and worker count (default 2; the
//! issue's campaign is 20).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{agents_dir, call, counter, event_page, installed, status, tree};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

fn runs() -> usize {
    std::env::var("STEADFAST_CAMPAIGN_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2)
}

/// One reply of eight parallel calls (nine for the native agent), its closing reply,
/// and the second turn's.
fn script(port: u16, agent: &str) -> Script {
    let bash = |command: String| json!({"name": "bash", "input": {"command": command}});
    let mut calls = vec![
        bash("sleep 2; echo late > late.txt".into()),
        bash("echo x >> appended.txt".into()),
        bash("echo x >> appended.txt".into()),
        bash(format!(
            "curl -sf -X POST -d go http://localhost:{port}/count"
        )),
    ];
    calls.extend((0..4).map(|i| bash(format!("echo {i} > f{i}.txt"))));
    if agent == "native" {
        // A read takes no turn with the writers: it runs while the slow command does.
        calls.push(bash("ls".into()));
    }
    serde_json::from_value(json!({"steps": [
        {"text": "All at once.", "tool_calls": calls},
        {"text": "Written."}
    ]}))
    .unwrap()
}

/// A home, its configuration, and the processes serving it.
struct Site {
    home: PathBuf,
    config: PathBuf,
    fake_url: String,
}

impl Site {
    fn new(dir: &Path, port: u16, fake: &FakeProvider) -> Self {
        let config = dir.join("steadfast.toml");
        std::fs::write(
            &config,
            format!(
                "[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"localhost:{port}\"]\n\
                 [harness]\nlease-ttl-secs = 3\n"
            ),
        )
        .unwrap();
        Site {
            home: dir.join("home"),
            config,
            fake_url: fake.base_url(),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("STEADFAST_HOME", &self.home)
            .env("STEADFAST_CONFIG", &self.config)
            .env("STEADFAST_AGENTS_DIR", agents_dir())
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", &self.fake_url)
            .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
            .env_remove("OPENAI_API_KEY")
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_WORLD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(steadfast_testkit::service_log::stderr(env!(
                "CARGO_TARGET_TMPDIR"
            )))
            .kill_on_drop(true);
        cmd
    }

    async fn api(&self) -> (tokio::process::Child, String) {
        let mut child = self
            .command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
            .spawn()
            .unwrap();
        let url = common::printed_url(&mut child).await;
        (child, url)
    }

    fn worker(&self) -> tokio::process::Child {
        self.command(&["worker", "--workers", "1"]).spawn().unwrap()
    }
}

/// Queues a message; its turn's stream is not read (the turn runs on a worker).
async fn message(url: &str, id: &str, text: &str) {
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({ "text": text }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{text}");
}

/// Waits until `turns` turns have ended and the session is idle.
async fn until_turns(url: &str, id: &str, turns: usize, what: &str) {
    for _ in 0..1800 {
        let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
        let ended = events.iter().filter(|e| e["type"] == "turn_ended").count();
        if ended >= turns && status(url, id).await == "idle" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    panic!("{what}: the session never went idle: {events:?}");
}

/// A pseudo-random number in `0..n` (the kill's moment; printed, so a failing run
/// can be told apart).
fn random(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    (nanos ^ (nanos >> 7)).wrapping_mul(2654435761) % n
}

/// What a run ended with: the workspace, and how often the POST reached its server.
struct Ran {
    tree: BTreeMap<String, (Vec<u8>, bool)>,
    hits: usize,
    /// Calls the kill cut off (resolved after it), by resolution.
    cut_off: Vec<String>,
    /// Whether calls of the reply ran at once (see [`overlapped`]).
    overlapped: bool,
}

/// When a kill comes: this long after the message, or after the first tool call began.
#[derive(Debug, Clone, Copy)]
enum Kill {
    AfterMessage(Duration),
    AfterFirstCall(Duration),
}

/// Whether process `pid` has children (a worker driving a session runs its sandboxes),
/// made by any of its threads.
fn has_children(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("children")).is_ok_and(|c| !c.trim().is_empty())
    })
}

/// One session of `agent`: a turn of parallel calls (with the worker driving it killed
/// at `kill`, if given, among `workers` worker processes), then a second message.
/// Checks every run's invariants and returns what it ended with.
async fn run(agent: &str, workers: usize, kill: Option<Kill>) -> Ran {
    let (port, hits) = counter();
    let fake = FakeProvider::start(script(port, agent)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut site = Site::new(dir.path(), port, &fake);
    let (_api, url) = site.api().await;
    let mut running: Vec<tokio::process::Child> = (0..workers).map(|_| site.worker()).collect();
    let (code, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": agent, "network": format!("allow:localhost:{port}")})),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&site.home, &created);
    let label = format!("{agent}, {workers} worker(s), kill {kill:?}");
    message(&url, &id, "write them all").await;
    if let Some(kill) = kill {
        let after = match kill {
            Kill::AfterMessage(after) => after,
            Kill::AfterFirstCall(after) => {
                for _ in 0..600 {
                    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
                    if events.iter().any(|e| e["type"] == "tool_call_intent") {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                after
            }
        };
        tokio::time::sleep(after).await;
        // The worker driving it (the one running sandboxes), else one at random; a
        // fresh one takes its place.
        let victim = running
            .iter()
            .position(|w| w.id().is_some_and(has_children))
            .unwrap_or_else(|| random(running.len() as u64) as usize);
        running[victim].start_kill().unwrap();
        let _ = running[victim].wait().await;
        running[victim] = site.worker();
    }
    until_turns(&url, &id, 1, &label).await;
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    one_ending_per_call(&events, &label);
    let cut_off = events
        .iter()
        .filter(|e| e["type"] == "tool_call_interrupted")
        .map(|e| {
            e["resolution"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "{label}: the POST reached its server once: {events:?}"
    );
    let first = tree(&workspace);

    // A second message rolls nothing back. (A wrapped CLI starts each turn as a new
    // conversation, which a scripted provider cannot tell from the first: the workers
    // are replaced by ones whose provider answers the second turn.)
    for mut worker in running.drain(..) {
        let _ = worker.start_kill();
        let _ = worker.wait().await;
    }
    let second_fake = FakeProvider::start(
        serde_json::from_value(json!({"steps": [{"text": "Nothing more to do."}]})).unwrap(),
    )
    .await
    .unwrap();
    site.fake_url = second_fake.base_url();
    running.push(site.worker());
    message(&url, &id, "anything else?").await;
    until_turns(&url, &id, 2, &label).await;
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let turns = events.iter().filter(|e| e["type"] == "turn_ended").count();
    assert_eq!(turns, 2, "{label}: {events:?}");
    let second = events
        .iter()
        .rposition(|e| e["type"] == "user_message")
        .unwrap();
    assert!(
        !events[second..]
            .iter()
            .any(|e| e["type"] == "tool_call_interrupted" || e["type"] == "replay_diverged"),
        "{label}: the second turn rolled nothing back: {:?}",
        &events[second..]
    );
    let after = tree(&workspace);
    assert_eq!(after, first, "{label}: the second message changed nothing");
    for mut worker in running {
        let _ = worker.start_kill();
        let _ = worker.wait().await;
    }
    Ran {
        tree: after,
        hits: hits.load(Ordering::SeqCst),
        cut_off,
        overlapped: overlapped(&events),
    }
}

/// Whether some call began while another ran (its intent between the other's intent
/// and outcome): the calls of the reply ran at once, not one after another.
fn overlapped(events: &[Value]) -> bool {
    let at = |kind: &str, id: &str| {
        events
            .iter()
            .position(|e| e["type"] == kind && e["call_id"] == id)
    };
    events
        .iter()
        .filter(|e| e["type"] == "tool_call_intent")
        .filter_map(|e| e["call_id"].as_str())
        .any(|id| {
            let (Some(began), Some(ended)) =
                (at("tool_call_intent", id), at("tool_call_outcome", id))
            else {
                return false;
            };
            events[began + 1..ended]
                .iter()
                .any(|e| e["type"] == "tool_call_intent")
        })
}

/// Every call whose intent is recorded has exactly one outcome or resolution. (A read
/// the native loop began again after a crash, under its id, begins again only once
/// its first beginning is resolved: `rerun`.)
fn one_ending_per_call(events: &[Value], label: &str) {
    let mut open: BTreeMap<String, bool> = BTreeMap::new();
    for event in events {
        let id = event["call_id"].as_str().unwrap_or_default().to_string();
        match event["type"].as_str() {
            Some("tool_call_intent") => {
                let was_open = open.insert(id.clone(), true);
                assert_ne!(was_open, Some(true), "{label}: {id} began twice at once");
            }
            Some("tool_call_outcome") | Some("tool_call_interrupted") => {
                let was_open = open.insert(id.clone(), false);
                assert_eq!(
                    was_open,
                    Some(true),
                    "{label}: an ending of no running call: {event}"
                );
                let rerun = event["resolution"]["kind"] == "rerun";
                assert!(
                    !rerun || !id.starts_with("wt_"),
                    "{label}: only the native loop runs a call again under its id: {event}"
                );
            }
            _ => {}
        }
    }
    assert!(!open.is_empty(), "{label}: no calls ran: {events:?}");
    for (id, running) in &open {
        assert!(!running, "{label}: {id} has no ending: {events:?}");
    }
}

async fn campaign(agent: &str) {
    if agent != "native" {
        installed(agent).await;
    }
    let clean = run(agent, 1, None).await;
    assert_eq!(clean.hits, 1);
    if agent == "native" {
        assert!(
            clean.overlapped,
            "the native loop ran the reply's calls at once"
        );
    }
    assert!(
        clean.tree.contains_key("late.txt"),
        "{:?}",
        clean.tree.keys()
    );
    assert_eq!(
        clean.tree["appended.txt"].0, b"x\nx\n",
        "both appends, once each"
    );
    for workers in [1, 2] {
        for i in 0..runs() {
            // Anywhere in the turn, or while its calls run (the slow one, with the
            // writers waiting behind it, takes about two and a half seconds).
            let kill = if i % 2 == 0 {
                Kill::AfterMessage(Duration::from_millis(300 + random(5000)))
            } else {
                Kill::AfterFirstCall(Duration::from_millis(random(2600)))
            };
            eprintln!("{agent}: {workers} worker(s), kill {kill:?}");
            let crashed = run(agent, workers, Some(kill)).await;
            eprintln!("  calls cut off: {:?}", crashed.cut_off);
            assert_eq!(
                crashed.tree, clean.tree,
                "{agent}, {workers} worker(s), kill {kill:?}: the crash-free workspace"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_s_parallel_calls_hold_under_random_kills() {
    campaign("pi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_loop_s_parallel_calls_hold_under_random_kills() {
    campaign("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_s_parallel_calls_hold_under_random_kills() {
    campaign("opencode").await;
}
