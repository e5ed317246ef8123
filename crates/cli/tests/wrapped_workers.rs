//! Wrapped agents hosted by the API and its workers: a session of each CLI is created
//! through `POST /v1/sessions`, its turn is streamed over SSE, and the worker process
//! driving it is SIGKILLed mid-turn; the other worker takes the session over and
//! finishes the turn by replaying its log (nothing paid twice, nothing run by the
//! native loop), and the SSE client sees the turn through to its `end`. On the
//! embedded SQLite world and on PostgreSQL. A worker stopped with SIGTERM instead
//! records the reply its CLI was receiving before it exits.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use steadfast_testkit::{demo, FakeProvider};
use tokio::io::AsyncBufReadExt;

use common::{agents_dir, installed, kind, TestDatabase};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

struct Site {
    home: PathBuf,
    world: Option<String>,
    fake_url: String,
    /// Where the second worker finds the CLIs, when not where the first does (another
    /// host, with its own home, installs them at its own path).
    second_agents: Option<PathBuf>,
}

impl Site {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("STEADFAST_HOME", &self.home)
            .env("STEADFAST_AGENTS_DIR", agents_dir())
            .env("ANTHROPIC_API_KEY", "sk-ant-the-harness-real-key")
            .env("ANTHROPIC_BASE_URL", &self.fake_url)
            .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", self.fake_url))
            .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_WORLD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(world) = &self.world {
            cmd.env("STEADFAST_WORLD", world);
        }
        cmd
    }

    async fn api(&self) -> (tokio::process::Child, String) {
        let mut child = self
            .command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let url = tokio::io::BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .unwrap()
            .unwrap();
        (child, url)
    }

    fn worker(&self) -> tokio::process::Child {
        self.command(&["worker", "--workers", "1"]).spawn().unwrap()
    }

    /// A worker as on a second host: the CLIs installed at another path.
    fn second_worker(&self) -> tokio::process::Child {
        let mut cmd = self.command(&["worker", "--workers", "1"]);
        if let Some(dir) = &self.second_agents {
            cmd.env("STEADFAST_AGENTS_DIR", dir);
        }
        cmd.spawn().unwrap()
    }

    async fn log(&self, id: &str) -> Vec<Value> {
        let out = self.command(&["log", id, "--json"]).output().await.unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The installed CLIs at another path (hard links: no download, no copy of the bytes),
/// as a second host with a home of its own has them.
fn agents_elsewhere() -> tempfile::TempDir {
    let installed = agents_dir();
    let dir = tempfile::tempdir_in(installed.parent().unwrap()).unwrap();
    let status = std::process::Command::new("cp")
        .arg("-al")
        .arg(&installed)
        .arg(dir.path().join("agents"))
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

/// The parent of process `pid`.
fn parent(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
}

/// Which of `workers` runs the CLI working in `workspace` (seen from the host, or as
/// its sandbox shows it), if one does yet.
fn driving_worker(workers: &[i32], needle: &str, workspace: &Path) -> Option<i32> {
    let ws = workspace.display().to_string();
    for entry in std::fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let cwd = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        // A logical workspace is at one fixed path inside its sandbox.
        let inside = cwd == Path::new(steadfast_sandbox::WORKSPACE_MOUNT);
        if !cmdline.contains(needle) || (cwd.display().to_string() != ws && !inside) {
            continue;
        }
        let mut at = pid;
        while let Some(up) = parent(at) {
            if workers.contains(&up) {
                return Some(up);
            }
            if up <= 1 {
                break;
            }
            at = up;
        }
    }
    None
}

/// The four CLIs: agent, model, and what its process's command line contains.
const CLIS: &[(&str, &str, &str)] = &[
    ("claude-code", "anthropic/claude-sonnet-4-5", "claude"),
    ("codex", "openai/gpt-5", "codex"),
    ("pi", "anthropic/claude-sonnet-4-5", "pi  "),
    ("opencode", "anthropic/claude-sonnet-4-5", "opencode"),
];

/// Returns how many replies the kill cut off (asked again by the other worker).
async fn takeover(
    site: Site,
    fake: &FakeProvider,
    (agent, model, needle): (&str, &str, &str),
) -> usize {
    let (_api, url) = site.api().await;
    let mut workers = [site.worker(), site.second_worker()];
    let pids: Vec<i32> = workers.iter().map(|w| w.id().unwrap() as i32).collect();
    let http = reqwest::Client::new();

    // The agents this server offers, and a wrapped session through the API.
    let agents: Value = http
        .get(format!("{url}/v1/agents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let claude = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == agent)
        .expect("the agent is listed");
    assert_eq!(claude["installed"], true, "{agents}");
    let resp = http
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"agent": agent, "model": model, "workspace": {"kind": "demo"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&site.home, &created);

    // The turn streams over SSE from the message's own request.
    let stream = http
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": demo::TASK}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let reader = tokio::spawn(async move {
        let mut events = Vec::new();
        let mut stream = stream.bytes_stream().eventsource();
        while let Some(ev) = stream.next().await {
            let ev = ev.unwrap();
            let end = ev.event == "end";
            events.push(steadfast_testkit::frame_kind(&ev.event, &ev.data));
            if end {
                break;
            }
        }
        events
    });

    // While the fifth reply streams (slowly), SIGKILL the worker that drives the
    // session: the reply is cut off, and asked again by the other worker's CLI.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let victim = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI never got going"
        );
        // The slow fifth reply has been asked for (some CLIs send side requests too,
        // so the call count alone does not say which reply streams).
        if fake
            .state()
            .calls_per_step()
            .get(4)
            .is_some_and(|n| *n >= 1)
        {
            if let Some(pid) = driving_worker(&pids, needle, &workspace) {
                break pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let at = pids.iter().position(|p| *p == victim).unwrap();
    workers[at].start_kill().unwrap();
    let _ = workers[at].wait().await;

    let events = tokio::time::timeout(Duration::from_secs(180), reader)
        .await
        .expect("the turn finished on the other worker")
        .unwrap();
    assert_eq!(
        events.last().map(String::as_str),
        Some("end"),
        "{agent}: {events:?}"
    );
    assert!(events.iter().any(|e| e == "turn_ended"), "{events:?}");
    assert!(
        events.iter().any(|e| e == "model_delta"),
        "the replies' text streamed as it was written: {events:?}"
    );
    let shown: Value = http
        .get(format!("{url}/v1/sessions/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["status"], "idle", "{shown}");
    assert!(
        std::fs::read_to_string(workspace.join("CHANGELOG.md"))
            .unwrap()
            .contains("off-by-one"),
        "the task was finished"
    );
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    // A reply the kill cut off is asked again at its index; the stream says so.
    let mut asked = std::collections::BTreeMap::new();
    for r in &log {
        if let Some(index) = r["event"]["exchange_intent"]["index"].as_u64() {
            *asked.entry(index).or_insert(0) += 1;
        }
    }
    let reasked = asked.values().filter(|n| **n > 1).count();
    assert_eq!(
        events.iter().filter(|e| *e == "restart").count(),
        reasked,
        "{agent}: each cut-off reply was announced as starting over: {events:?}"
    );
    assert!(
        !kinds.iter().any(|k| k.starts_with("model_call")),
        "the native loop never touched the wrapped session: {kinds:?}"
    );
    assert!(!kinds.iter().any(|k| k == "replay_diverged"), "{kinds:?}");
    let intents = kinds.iter().filter(|k| *k == "exchange_intent").count() as u64;
    let outcomes = kinds.iter().filter(|k| *k == "exchange_outcome").count() as u64;
    assert!(
        fake.calls() <= intents && fake.calls() <= outcomes + 1,
        "{} calls, {intents} intents, {outcomes} outcomes",
        fake.calls()
    );
    assert!(log.len() < 200, "no runaway: {} records", log.len());
    // The turn was driven under two leases: the killed worker's, then the other's.
    let opened = kinds.iter().position(|k| k == "user_message").unwrap();
    let epochs: std::collections::BTreeSet<u64> = log[opened..]
        .iter()
        .filter_map(|r| r["epoch"].as_u64())
        .collect();
    assert!(
        epochs.len() >= 2,
        "the turn moved to another worker: epochs {epochs:?}"
    );

    // A second turn starts from where the first left off: its CLI is a new run that
    // replays nothing of turn 1 (no divergence, no workspace put back).
    let before = fake.calls();
    let second = http
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": "Now check the tests once more."}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(120), second.text())
        .await
        .expect("the second turn finished")
        .unwrap();
    assert!(body.contains("event: end"), "{body}");
    assert!(fake.calls() > before, "the second turn called the model");
    // Its CLI continues turn 1's conversation as the worker that finished it kept
    // it: the task, and the tool results (the failing test's output is in no
    // message but a result).
    let turn_two = fake.state().requests()[before as usize..].to_vec();
    assert!(
        turn_two
            .iter()
            .any(|r| r.contains("Now check the tests once more")
                && r.contains("The test suite of this project fails")
                && r.contains("AssertionError")),
        "{agent}: turn 2 continues turn 1's conversation"
    );
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    assert!(
        !kinds.iter().any(|k| k == "replay_diverged"),
        "turn 2 replayed nothing of turn 1: {kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "turn_ended").count(),
        2,
        "{kinds:?}"
    );
    assert!(
        std::fs::read_to_string(workspace.join("CHANGELOG.md"))
            .unwrap()
            .contains("off-by-one"),
        "turn 1's work is still there"
    );
    reasked
}

/// The session as the API shows it.
async fn shown(http: &reqwest::Client, url: &str, id: &str) -> Value {
    http.get(format!("{url}/v1/sessions/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A Claude Code session of the demo task created through an API process and driven
/// by a worker process (both kept alive by the returned children).
async fn demo_on_a_worker(
    fake: &FakeProvider,
) -> (
    tempfile::TempDir,
    Site,
    Vec<tokio::process::Child>,
    String,
    String,
) {
    let dir = tempfile::tempdir().unwrap();
    let site = Site {
        home: dir.path().join("home"),
        world: None,
        fake_url: fake.base_url(),
        second_agents: None,
    };
    let (api, url) = site.api().await;
    let worker = site.worker();
    let created: Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"agent": "claude-code", "workspace": {"kind": "demo"}, "task": demo::TASK}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    (dir, site, vec![api, worker], url, id)
}

fn slow_fifth_reply() -> steadfast_testkit::Script {
    let mut script = demo::script();
    // Long enough that the kill surely lands while it streams.
    script.steps[4].chunk_delay_ms = 400;
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapped_sessions_move_to_another_worker_on_sqlite() {
    let mut cut_off = 0;
    for cli in CLIS {
        installed(cli.0).await;
        let fake = FakeProvider::start(slow_fifth_reply()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let site = Site {
            home: dir.path().join("home"),
            world: None,
            fake_url: fake.base_url(),
            second_agents: None,
        };
        cut_off += takeover(site, &fake, *cli).await;
    }
    assert!(cut_off > 0, "at least one kill cut a reply off mid-stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapped_sessions_move_to_another_worker_on_postgres() {
    for cli in CLIS {
        installed(cli.0).await;
    }
    // As on two hosts with homes of their own: each has the CLIs at its own path.
    let elsewhere = agents_elsewhere();
    for cli in CLIS
        .iter()
        .filter(|c| std::env::var("ONLY").map_or(true, |o| o == c.0))
    {
        let name = format!(
            "steadfast_wrapped_{}_{}",
            std::process::id(),
            cli.0.replace('-', "_")
        );
        let db = TestDatabase::create(&name).await;
        let fake = FakeProvider::start(slow_fifth_reply()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let site = Site {
            home: dir.path().join("home"),
            world: Some(db.url.clone()),
            fake_url: fake.base_url(),
            second_agents: Some(elsewhere.path().join("agents")),
        };
        let migrated = site.command(&["migrate"]).output().await.unwrap();
        assert!(migrated.status.success());
        takeover(site, &fake, *cli).await;
        db.drop_now().await;
    }
}

/// A steer reaches a running wrapped turn with the next tool result its CLI gets, and
/// the log records it there (so a replay shows it again at the same point).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_reaches_a_running_wrapped_turn() {
    installed("claude-code").await;
    let fake = FakeProvider::start(slow_fifth_reply()).await.unwrap();
    let (_dir, site, _processes, url, id) = demo_on_a_worker(&fake).await;
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while fake.calls() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the turn never got going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    const STEER: &str = "Also keep the changelog entry short.";
    let steered = http
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": STEER, "kind": "steer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(steered.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(120), steered.text())
        .await
        .expect("the turn finished")
        .unwrap();
    assert!(body.contains("event: end"), "{body}");
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let at = kinds
        .iter()
        .position(|k| k == "steered")
        .expect("the steer was taken");
    assert_eq!(kinds[at - 1], "tool_call_outcome", "{kinds:?}");
    let outcome = log[at - 1]["event"]["tool_call_outcome"].to_string();
    assert!(
        outcome.contains(STEER),
        "the CLI got it with the tool result: {outcome}"
    );
    assert!(
        kinds[at..].iter().any(|k| k == "exchange_intent"),
        "the turn went on after the steer: {kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_stops_a_running_wrapped_turn_at_once() {
    installed("claude-code").await;
    let mut script = demo::script();
    // The second step's command runs far longer than anyone waits.
    script.steps[1].tool_calls[0].input = json!({"command": "sleep 67; echo never"});
    let fake = FakeProvider::start(script).await.unwrap();
    let (_dir, site, _processes, url, id) = demo_on_a_worker(&fake).await;
    let http = reqwest::Client::new();
    let running = || {
        std::process::Command::new("pgrep")
            .args(["-f", "sleep 67"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // From the API process, which does not drive the turn: the worker does.
    let asked = std::time::Instant::now();
    let resp = http
        .post(format!("{url}/v1/sessions/{id}/interrupt"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    loop {
        let shown = shown(&http, &url, &id).await;
        if shown["status"] == "idle" {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "the turn stopped within seconds: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!running(), "the command was killed");
    // Nothing of the turn is left running: not the CLI's sandbox, not the tools'
    // (both name the session's workspace, under the test's directory, in their
    // command lines; the API and the worker do not).
    let left = || {
        let out = std::process::Command::new("pgrep")
            .args(["-a", "-f", &_dir.path().display().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !left().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "processes of the interrupted turn are left: {}",
            left()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let stopped = log
        .iter()
        .find(|r| kind(r) == "turn_interrupted")
        .unwrap_or_else(|| panic!("the interrupt is recorded: {kinds:?}"));
    assert_eq!(
        stopped["event"]["turn_interrupted"]["by"], "local",
        "{stopped}"
    );
    assert_eq!(stopped["event"]["turn_interrupted"]["stopped"], true);
    assert!(!kinds.contains(&"turn_ended".to_string()), "{kinds:?}");
}

/// An interrupt while a wrapped CLI's reply streams cuts the reply off: it is not
/// read to its end (paid for) and recorded, since no later start of the CLI asks for
/// it; the exchange stays unanswered and the turn ends interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_cuts_off_a_streaming_reply_of_a_wrapped_cli() {
    installed("claude-code").await;
    let mut script = demo::script();
    // About three seconds of streaming: longer than an interrupt takes to land, and
    // short enough that a driver waiting for the reply to be recorded would record it.
    script.steps[4].chunk_delay_ms = 150;
    let fake = FakeProvider::start(script).await.unwrap();
    let (_dir, site, _processes, url, id) = demo_on_a_worker(&fake).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while fake.state().calls_per_step().get(4).is_none_or(|n| *n == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the turn never got going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{url}/v1/sessions/{id}/interrupt"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let asked = std::time::Instant::now();
    while shown(&http, &url, &id).await["status"] != "idle" {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the turn never stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    assert!(kinds.contains(&"turn_interrupted".to_string()), "{kinds:?}");
    let last_intent = kinds.iter().rposition(|k| k == "exchange_intent").unwrap();
    assert!(
        !kinds[last_intent..].contains(&"exchange_outcome".to_string()),
        "the reply streaming when the interrupt came was cut off, not recorded: {kinds:?}"
    );
}

/// A worker stopped (SIGTERM) while the wrapped CLI it drives receives a reply stops
/// the CLI at once, but records the reply before it exits: the next worker's CLI gets
/// it from the log, and the provider is never asked (nor paid) for it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_records_the_reply_its_wrapped_cli_was_receiving() {
    installed("claude-code").await;
    let mut script = demo::script();
    // About three seconds of streaming, well within the stop grace.
    script.steps[4].chunk_delay_ms = 150;
    let fake = FakeProvider::start(script).await.unwrap();
    let (_dir, site, mut processes, url, id) = demo_on_a_worker(&fake).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while fake.state().calls_per_step().get(4).is_none_or(|n| *n == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the turn never got going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let worker = &mut processes[1];
    let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops within its grace")
        .unwrap();
    assert!(status.success(), "the worker stops cleanly on SIGTERM");
    let stopped: Vec<String> = site.log(&id).await.iter().map(kind).collect();
    assert!(
        !stopped.iter().any(|k| k == "turn_ended"),
        "the stop landed mid-turn: {stopped:?}"
    );
    let intents = stopped.iter().filter(|k| *k == "exchange_intent").count();
    let outcomes = stopped.iter().filter(|k| *k == "exchange_outcome").count();
    assert_eq!(
        intents, outcomes,
        "every reply the stopped CLI asked for was recorded: {stopped:?}"
    );

    let _next = site.worker();
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let shown = shown(&http, &url, &id).await;
        if shown["status"] == "idle" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the next worker finished the turn: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = site.log(&id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    assert!(!kinds.iter().any(|k| k == "replay_diverged"), "{kinds:?}");
    let per_step = fake.state().calls_per_step();
    assert_eq!(
        per_step.get(4),
        Some(&1),
        "the reply the stop landed in was asked for once: {per_step:?} {kinds:?}"
    );
    assert!(
        per_step.iter().all(|n| *n <= 1),
        "no reply was asked for twice: {per_step:?}"
    );
}

/// A wrapped CLI given a model whose API it does not speak, or whose provider this
/// server has no key for, is refused at creation (422 naming `model`) rather than
/// made into a session that sits idle for ever; nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_a_wrapped_cli_cannot_call_is_refused_at_creation() {
    let fake =
        FakeProvider::start(serde_json::from_value(json!({"steps": [{"text": "ok"}]})).unwrap())
            .await
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = Site {
        home: dir.path().join("home"),
        world: None,
        fake_url: fake.base_url(),
        second_agents: None,
    };
    let create = async |url: &str, agent: &str, model: &str| {
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/sessions"))
            .json(&json!({"agent": agent, "model": model}))
            .send()
            .await
            .unwrap();
        let code = response.status().as_u16();
        (code, response.json::<Value>().await.unwrap())
    };
    let sessions = async |url: &str| {
        let list: Value = reqwest::get(format!("{url}/v1/sessions"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["sessions"].as_array().map_or(0, Vec::len)
    };
    let (_api, url) = site.api().await;
    for (agent, model) in [
        ("codex", "anthropic/claude-sonnet-4-5"),
        ("claude-code", "openai/gpt-5"),
    ] {
        let (code, body) = create(&url, agent, model).await;
        assert_eq!(code, 422, "{agent} with {model}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("model: ") && message.contains("speaks only"),
            "{message}"
        );
    }
    let (code, body) = create(&url, "pi", "openai/gpt-5").await;
    assert_eq!(code, 201, "pi speaks both: {body}");
    assert_eq!(sessions(&url).await, 1);

    // A server with no OpenAI key cannot give Codex its model.
    let mut api = site
        .command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
        .env_remove("OPENAI_API_KEY")
        .spawn()
        .unwrap();
    let url = common::printed_url(&mut api).await;
    let (code, body) = create(&url, "codex", "openai/gpt-5").await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no key for `openai`"),
        "{body}"
    );
    assert_eq!(sessions(&url).await, 1, "nothing made");
}
