//! Interrupting a running turn through the API of one process while a worker in
//! another drives it, on SQLite and on PostgreSQL: a model stream is cut (no restart),
//! a long command killed within a second (its snapshot recorded), the model told on
//! the next turn; close and delete of a running session interrupt it first; and
//! `steadfast stop` does the same from the command line.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

fn command(
    home: &Path,
    world: Option<&str>,
    fake: &FakeProvider,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env("STEADFAST_HOME", home)
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
        .env("USER", "tester")
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_WORLD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(steadfast_testkit::service_log::stderr(env!(
            "CARGO_TARGET_TMPDIR"
        )))
        .kill_on_drop(true);
    if let Some(url) = world {
        cmd.env("STEADFAST_WORLD", url)
            .env("STEADFAST_MIGRATE", "true");
    }
    cmd
}

async fn api(
    home: &Path,
    world: Option<&str>,
    fake: &FakeProvider,
) -> (tokio::process::Child, String) {
    let mut child = command(
        home,
        world,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("serve printed its URL")
        .unwrap()
        .unwrap();
    (child, url)
}

async fn request(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Posts a message; the reply is the turn's event stream, which is not read here.
async fn send_message(url: &str, id: &str, text: &str) -> u16 {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({ "text": text }))
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

/// Asks the API to interrupt session `id`'s turn; it is accepted.
async fn interrupt(url: &str, id: &str) {
    let (code, body) = request(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/interrupt"),
        None,
    )
    .await;
    assert_eq!(code, 202, "{body}");
}

async fn status(url: &str, id: &str) -> Value {
    request(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}"),
        None,
    )
    .await
    .1
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The session's log, through the CLI (which reads the world directly).
async fn log(home: &Path, world: Option<&str>, fake: &FakeProvider, id: &str) -> Vec<Value> {
    let out = command(home, world, fake, &["log", id, "--json"])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds(log: &[Value]) -> Vec<String> {
    log.iter()
        .map(|r| {
            r["event"]
                .as_object()
                .unwrap()
                .keys()
                .next()
                .unwrap()
                .clone()
        })
        .collect()
}

/// An API process and a worker process on one home and world, with the fake provider
/// playing `script`.
struct Processes {
    fake: FakeProvider,
    _dir: tempfile::TempDir,
    home: std::path::PathBuf,
    url: String,
    _api: tokio::process::Child,
    _worker: tokio::process::Child,
}

impl Processes {
    async fn start(world: Option<&str>, script: Script) -> Self {
        let fake = FakeProvider::start(script).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let (api, url) = api(&home, world, &fake).await;
        let worker = command(&home, world, &fake, &["worker"]).spawn().unwrap();
        Processes {
            fake,
            _dir: dir,
            home,
            url,
            _api: api,
            _worker: worker,
        }
    }

    /// Creates a session with `task` through the API: its id and workspace.
    async fn create(&self, task: &str) -> (String, std::path::PathBuf) {
        let (code, created) = request(
            reqwest::Method::POST,
            &format!("{}/v1/sessions", self.url),
            Some(json!({ "task": task })),
        )
        .await;
        assert_eq!(code, 201, "{created}");
        (
            created["id"].as_str().unwrap().to_string(),
            common::workspace_in(&self.home, &created),
        )
    }
}

async fn interrupt_everything(world: Option<&str>) {
    let long = "This reply streams slowly, a few words at a time, so there is time to stop it. "
        .repeat(20);
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": long, "chunk_delay_ms": 40},
        {"text": "Running it.", "tool_calls": [{"name": "bash", "input": {"command": "echo started > started.txt; sleep 30; echo finished > finished.txt"}}]},
        // (The fake picks a step by the replies so far; each interrupted turn left one.)
        {"text": "not asked for"},
        {"text": "Understood, I stopped."},
    ]}))
    .unwrap();
    let procs = Processes::start(world, script).await;
    let (fake, home, url) = (&procs.fake, &procs.home, &procs.url);

    // 1. Mid model stream: cut, recorded as interrupted by its owner, no restart.
    let (id, ws) = procs.create("talk").await;
    wait_until("the reply to stream", async || {
        kinds(&log(home, world, fake, &id).await)
            .iter()
            .any(|k| k == "model_delta")
    })
    .await;
    let started = Instant::now();
    interrupt(url, &id).await;
    wait_until("the turn to stop", async || {
        status(url, &id).await["status"] == "idle"
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let records = log(home, world, fake, &id).await;
    let names = kinds(&records);
    assert!(
        !names.contains(&"model_call_outcome".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"model_call_interrupted".to_string()),
        "not a restart: {names:?}"
    );
    let stopped = &records.last().unwrap()["event"]["turn_interrupted"];
    assert_eq!(stopped["by"], "local", "{stopped}");
    assert_eq!(stopped["stopped"], true);
    assert!(stopped["call_id"].as_str().unwrap().starts_with("mc_"));

    // 2. Mid command: killed within a second, the workspace after it recorded.
    assert_eq!(send_message(url, &id, "run it").await, 200);
    wait_until("the command to start", async || {
        ws.join("started.txt").exists()
    })
    .await;
    let started = Instant::now();
    interrupt(url, &id).await;
    wait_until("the command to stop", async || {
        status(url, &id).await["status"] == "idle"
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    let records = log(home, world, fake, &id).await;
    let outcome = records
        .iter()
        .rev()
        .find_map(|r| r["event"].get("tool_call_outcome"))
        .expect("the killed command has an outcome");
    assert!(
        outcome["output"]["text"]
            .as_str()
            .unwrap()
            .contains("interrupted by local"),
        "{outcome}"
    );
    assert!(outcome["snapshot_after"].is_string(), "{outcome}");
    assert!(
        !ws.join("finished.txt").exists(),
        "the command did not run on"
    );

    // 3. The next turn works, and the model is told what happened.
    assert_eq!(send_message(url, &id, "what now?").await, 200);
    wait_until("the next turn", async || {
        status(url, &id).await["reply"] == "Understood, I stopped."
    })
    .await;
    let asked = fake.state().requests().last().cloned().unwrap();
    assert!(
        asked.contains("This turn was interrupted by local"),
        "{asked}"
    );

    // 4. Close and delete of a running session interrupt it first.
    for (method, path) in [
        (reqwest::Method::POST, "/close"),
        (reqwest::Method::DELETE, ""),
    ] {
        let (_, created) = request(
            reqwest::Method::POST,
            &format!("{url}/v1/sessions"),
            Some(json!({"task": "sleep"})),
        )
        .await;
        let other = created["id"].as_str().unwrap().to_string();
        wait_until("the reply to stream", async || {
            kinds(&log(home, world, fake, &other).await)
                .iter()
                .any(|k| k == "model_delta")
        })
        .await;
        let started = Instant::now();
        let (code, body) = request(method, &format!("{url}/v1/sessions/{other}{path}"), None).await;
        assert!(code == 200 || code == 204, "{path}: {code} {body}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        if path == "/close" {
            // Closed half done is recorded as closed, not as completed.
            assert_eq!(body["status"], "closed", "{body}");
            let records = log(home, world, fake, &other).await;
            let ended = &records.last().unwrap()["event"]["session_ended"];
            assert_eq!(ended["state"], "closed", "{ended}");
            assert_eq!(status(url, &other).await["status"], "closed");
            // Closing it again changes nothing and says how it ended.
            let (code, again) = request(
                reqwest::Method::POST,
                &format!("{url}/v1/sessions/{other}/close"),
                None,
            )
            .await;
            assert_eq!((code, &again["status"]), (200, &json!("closed")), "{again}");
        }
    }

    // Nothing runs now: an interrupt is refused, saying so.
    let (code, body) = request(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/interrupt"),
        None,
    )
    .await;
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (409, json!("not_running")),
        "{body}"
    );
}

/// The native loop runs a reply's calls at once; one interrupt stops them all: the
/// ones running are killed, each with its outcome; the one still waiting its turn (a
/// writer behind a writer) never begins and is answered as not run; the turn ends
/// interrupted once, and the next message is a new turn that runs none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_stops_every_call_of_a_reply_running_at_once() {
    let bash = |command: &str| json!({"name": "bash", "input": {"command": command}});
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "All three.", "tool_calls": [
            bash("echo started > started.txt; sleep 30; echo finished > finished.txt"),
            bash("tail -f /dev/null"),
            bash("echo third > third.txt"),
        ]},
        {"text": "Understood, I stopped."},
    ]}))
    .unwrap();
    let procs = Processes::start(None, script).await;
    let (fake, home, url) = (&procs.fake, &procs.home, &procs.url);
    let (id, ws) = procs.create("all at once").await;
    wait_until("the writer and the reader to run", async || {
        ws.join("started.txt").exists()
            && kinds(&log(home, None, fake, &id).await)
                .iter()
                .filter(|k| *k == "tool_call_intent")
                .count()
                == 2
    })
    .await;
    interrupt(url, &id).await;
    wait_until("the turn to stop", async || {
        status(url, &id).await["status"] == "idle"
    })
    .await;
    let records = log(home, None, fake, &id).await;
    let names = kinds(&records);
    assert_eq!(
        names.iter().filter(|k| *k == "tool_call_intent").count(),
        2,
        "the third call never began: {names:?}"
    );
    assert_eq!(
        names.iter().filter(|k| *k == "tool_call_outcome").count(),
        2,
        "each running call has its outcome: {names:?}"
    );
    let stops: Vec<&Value> = records
        .iter()
        .filter_map(|r| r["event"].get("turn_interrupted"))
        .collect();
    assert_eq!(stops.len(), 1, "{names:?}");
    assert_eq!(
        stops[0]["not_begun"],
        json!(["toolu_fake_1_2"]),
        "{}",
        stops[0]
    );
    assert!(!ws.join("finished.txt").exists() && !ws.join("third.txt").exists());

    // The next message is a new turn: the model is asked at once, and nothing of the
    // interrupted reply runs.
    assert_eq!(send_message(url, &id, "carry on").await, 200);
    wait_until("the next turn to end", async || {
        kinds(&log(home, None, fake, &id).await)
            .iter()
            .any(|k| k == "turn_ended")
    })
    .await;
    let records = log(home, None, fake, &id).await;
    let names = kinds(&records);
    let second = names.iter().rposition(|k| k == "user_message").unwrap();
    assert!(
        !names[second..].iter().any(|k| k.starts_with("tool_call")),
        "{names:?}"
    );
    assert!(!ws.join("third.txt").exists());
    // The model saw a result for every call it asked for.
    let asked = fake.state().requests();
    let last = asked.last().unwrap().to_string();
    assert!(last.contains("not run: the turn was interrupted"), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_process_interrupts_a_turn_a_worker_drives_on_sqlite() {
    interrupt_everything(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_process_interrupts_a_turn_a_worker_drives_on_postgres() {
    let db = common::TestDatabase::create("steadfast_interrupt").await;
    interrupt_everything(Some(&db.url)).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadfast_stop_interrupts_a_running_cli_session() {
    stop_a_running_command("sleep 30").await;
}

/// A read-only command runs before the reply that asks for it is committed (if the
/// sandbox already runs): one that goes on has the reply committed while it runs, and
/// is stopped like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadfast_stop_interrupts_a_running_read_only_command() {
    stop_a_running_command("tail -f notes.txt").await;
}

async fn stop_a_running_command(command_line: &str) {
    let script: Script = serde_json::from_value(json!({"steps": [
        // The sandbox runs by the second reply.
        {"tool_calls": [{"name": "bash", "input": {"command": "true"}}]},
        {"tool_calls": [{"name": "bash", "input": {"command": command_line}}]},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "notes\n").unwrap();
    let run = command(
        &home,
        None,
        &fake,
        &[
            "run",
            "sleep",
            "--workspace",
            ws.to_str().unwrap(),
            "--json",
        ],
    )
    .spawn()
    .unwrap();
    let mut id = String::new();
    wait_until("the session to run its command", async || {
        let out = command(&home, None, &fake, &["sessions", "--json"])
            .output()
            .await
            .unwrap();
        let listed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        match listed.first() {
            Some(s) => {
                id = s["id"].as_str().unwrap().to_string();
                true
            }
            _ => false,
        }
    })
    .await;
    wait_until("the command's intent in the log", async || {
        log(&home, None, &fake, &id)
            .await
            .iter()
            .any(|r| r["event"]["tool_call_intent"]["input"]["command"] == command_line)
    })
    .await;
    // Well past the moment its reply and intent committed: the command runs now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let stop = command(&home, None, &fake, &["stop", &id])
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let done = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("the run ends once stopped")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let result: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(result["status"], "idle", "{result}");
    let records = log(&home, None, &fake, &id).await;
    assert_eq!(
        records.last().unwrap()["event"]["turn_interrupted"]["by"],
        "cli:tester"
    );
    // Both replies recorded, and the stopped command's outcome after its intent.
    let kinds = kinds(&records);
    assert_eq!(
        kinds.iter().filter(|k| *k == "model_call_outcome").count(),
        2,
        "{kinds:?}"
    );
    let intents: Vec<&Value> = records
        .iter()
        .filter_map(|r| r["event"].get("tool_call_intent"))
        .collect();
    let last = intents.last().unwrap();
    assert_eq!(last["input"]["command"], command_line, "{kinds:?}");
    let at = |kind: &str| {
        records
            .iter()
            .position(|r| r["event"][kind]["call_id"] == last["call_id"])
            .unwrap_or_else(|| panic!("no {kind} for the stopped command: {kinds:?}"))
    };
    assert!(
        at("tool_call_intent") < at("tool_call_outcome"),
        "{kinds:?}"
    );
    let outcome = &records[at("tool_call_outcome")]["event"]["tool_call_outcome"];
    assert_eq!(outcome["is_error"], true, "{outcome}");

    // The line a stop prints is one that works: resume with what to do next. And a
    // message sent (for whichever process drives the session) is taken by a resume.
    let said = String::from_utf8_lossy(&stop.stderr);
    assert!(
        said.contains(&format!("resume {id} \"<what next>\"")),
        "{said}"
    );
    let carry_on = |args: &[&str]| {
        let mut cmd = command(&home, None, &fake, args);
        cmd.stderr(Stdio::piped());
        cmd
    };
    let sent = carry_on(&["send", &id, "carry on"]).output().await.unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let resumed = carry_on(&["resume", &id, "and once more", "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let records = log(&home, None, &fake, &id).await;
    let messages: Vec<&str> = records
        .iter()
        .filter_map(|r| r["event"]["user_message"]["text"].as_str())
        .collect();
    assert_eq!(messages[1..], ["carry on", "and once more"], "{messages:?}");
    let ended = records
        .iter()
        .filter(|r| common::kind(r) == "turn_ended")
        .count();
    assert!(ended >= 2, "both turns ran to their end: {records:?}");
    // A session `run` drove to its end takes no more.
    let late = carry_on(&["send", &id, "too late"]).output().await.unwrap();
    assert!(!late.status.success());
    assert!(String::from_utf8_lossy(&late.stderr).contains("has ended"));
    // An empty message is refused, naming it.
    let empty = carry_on(&["send", &id, " "]).output().await.unwrap();
    assert!(!empty.status.success());
    assert!(String::from_utf8_lossy(&empty.stderr).contains("empty"));
}

/// A steer sent through the API of one process while a worker in another runs a
/// command is taken right after that command, before the next model call, on either
/// world. (On PostgreSQL the worker skips the inbox read before a model call when its
/// last append found the inbox empty; the append after the command finds the steer.)
async fn steer_between_calls(world: Option<&str>) {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Running it.", "tool_calls": [{"name": "bash", "input": {"command": "echo started > started.txt; sleep 2"}}]},
        {"text": "Reading it.", "tool_calls": [{"name": "read", "input": {"file_path": "started.txt"}}]},
        {"text": "Done, and steered."},
    ]}))
    .unwrap();
    let procs = Processes::start(world, script).await;
    let (fake, home, url) = (&procs.fake, &procs.home, &procs.url);
    let (id, ws) = procs.create("go").await;
    wait_until("the command to start", async || {
        ws.join("started.txt").exists()
    })
    .await;
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": "also read the notes", "kind": "steer"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    drop(resp);
    wait_until("the turn to end", async || {
        kinds(&log(home, world, fake, &id).await)
            .iter()
            .any(|k| k == "turn_ended")
    })
    .await;
    let names: Vec<String> = kinds(&log(home, world, fake, &id).await)
        .into_iter()
        .filter(|k| k != "model_delta")
        .collect();
    let at = names
        .iter()
        .position(|k| k == "steered")
        .expect("the steer is in the log");
    assert_eq!(
        (names[at - 1].as_str(), names[at + 1].as_str()),
        ("tool_call_outcome", "model_call_intent"),
        "taken after the command, before the next call: {names:?}"
    );
    assert_eq!(
        names.iter().filter(|k| *k == "tool_call_outcome").count(),
        2,
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_is_taken_between_calls_on_sqlite() {
    steer_between_calls(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_is_taken_between_calls_on_postgres() {
    let db = common::TestDatabase::create("steadfast_steer").await;
    steer_between_calls(Some(&db.url)).await;
    db.drop_now().await;
}
