//! `steadfast serve` and `steadfast worker` as real processes: a worker SIGKILLed
//! mid-turn, and a waiting session across a server restart.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

mod common;

use common::{service as command, wait_for};

/// Starts `steadfast serve` and returns it with its base URL.
async fn serve(home: &Path, fake: &FakeProvider, workers: &str) -> (tokio::process::Child, String) {
    serve_configured(home, fake, workers, "").await
}

/// Starts `steadfast serve` with `config` as its configuration file.
async fn serve_configured(
    home: &Path,
    fake: &FakeProvider,
    workers: &str,
    config: &str,
) -> (tokio::process::Child, String) {
    std::fs::create_dir_all(home).unwrap();
    let file = home.join("steadfast-test.toml");
    std::fs::write(&file, config).unwrap();
    let mut child = command(
        home,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", workers],
    )
    .env("STEADFAST_CONFIG", &file)
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut child).await;
    (child, url)
}

async fn post(url: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.json().await.unwrap_or(Value::Null)
}

async fn get(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

fn db(home: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(
        home.join("world.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap()
}

/// Stops `serve` with SIGTERM; it must exit cleanly.
async fn stop(server: &mut tokio::process::Child) {
    kill(Pid::from_raw(server.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "serve stops cleanly on SIGTERM");
}

fn home(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("home")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_worker_s_turn_is_finished_by_another() {
    let long = "I am going to explain this slowly, one careful piece at a time, so the reply takes a while to stream.";
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": long, "chunk_delay_ms": 30, "tool_calls": [{"name": "write", "input": {"file_path": "notes.txt", "content": "one\n"}}]},
        // The second reply streams for about two seconds: the kill lands inside it.
        {"text": long.repeat(3), "chunk_delay_ms": 30, "tool_calls": [{"name": "bash", "input": {"command": "echo two >> notes.txt"}}]},
        {"text": long, "chunk_delay_ms": 30},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    let (_api, url) = serve(&home, &fake, "0").await;
    let mut workers: Vec<_> = (0..2)
        .map(|_| command(&home, &fake, &["worker"]).spawn().unwrap())
        .collect();
    let pids: Vec<i32> = workers.iter().map(|w| w.id().unwrap() as i32).collect();

    let created = post(&format!("{url}/v1/sessions"), json!({"task": "take notes"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    let events_url = format!("{url}/v1/sessions/{id}/events");
    let reader = tokio::spawn(async move {
        let resp = reqwest::get(events_url).await.unwrap();
        let mut stream = resp.bytes_stream().eventsource();
        let mut frames = Vec::new();
        while let Some(ev) = stream.next().await {
            let ev = ev.unwrap();
            if ev.event == "end" {
                break;
            }
            frames.push((steadfast_testkit::frame_kind(&ev.event, &ev.data), ev.data));
        }
        frames
    });

    // Kill the worker driving the turn in the middle of its second model reply.
    let mut victim = 0;
    wait_for("the second reply to be streaming", async || {
        let conn = db(&home);
        let outcomes: i64 = conn
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'model_call_outcome'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let last: String = conn
            .query_row(
                "SELECT kind FROM events ORDER BY seq DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .unwrap_or_default();
        victim = conn
            .query_row("SELECT coalesce(lease_pid, 0) FROM sessions", [], |r| {
                r.get(0)
            })
            .unwrap_or(0);
        outcomes == 1 && last == "model_delta" && pids.contains(&victim)
    })
    .await;
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();

    let frames = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .unwrap()
        .unwrap();
    let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "restart").count(),
        1,
        "{kinds:?}"
    );
    let restart_at = kinds.iter().position(|k| *k == "restart").unwrap();
    assert_eq!(
        kinds[restart_at - 1],
        "model_delta",
        "the restart follows the cut reply: {kinds:?}"
    );
    let restart: Value = serde_json::from_str(&frames[restart_at].1).unwrap();
    assert_eq!(
        restart["text"], long,
        "the text to show: the turn's first reply"
    );
    assert_eq!(kinds.last(), Some(&"turn_ended"));

    // Only the cut reply was asked for again; every recorded reply exactly once.
    assert_eq!(fake.calls(), 4);
    assert_eq!(fake.state().distinct_requests(), 3);
    let session = get(&format!("{url}/v1/sessions/{id}")).await;
    assert_eq!(session["status"], "idle");
    let ws = common::workspace_in(&home, &created);
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "one\ntwo\n"
    );
    // The log's epochs show one driver at a time.
    let conn = db(&home);
    let epochs: Vec<i64> = conn
        .prepare("SELECT epoch FROM events ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "{epochs:?}");
    for w in &mut workers {
        let _ = w.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_resumes_after_a_server_restart() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "This needs a human.", "tool_calls": [{"name": "request_approval", "input": {"reason": "release v2"}}]},
        {"text": "Approved; releasing.", "tool_calls": [{"name": "bash", "input": {"command": "echo released > RELEASED"}}]},
        {"text": "Released."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    let (mut server, url) = serve(&home, &fake, "1").await;
    let created = post(&format!("{url}/v1/sessions"), json!({"task": "release it"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the session to wait", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "waiting"
    })
    .await;
    let shown = get(&format!("{url}/v1/sessions/{id}")).await;
    assert_eq!(shown["waiting_for"], "approval");
    assert_eq!(shown["waiting_reason"], "release v2");

    stop(&mut server).await;

    let (_server, url) = serve(&home, &fake, "1").await;
    let accepted = post(
        &format!("{url}/v1/sessions/{id}/signals/approval"),
        json!({"approved": true}),
    )
    .await;
    assert_eq!(accepted["signal"], "approval");
    wait_for("the session to finish", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "idle"
    })
    .await;
    let ws = common::workspace_in(&home, &created);
    assert_eq!(
        std::fs::read_to_string(ws.join("RELEASED")).unwrap(),
        "released\n"
    );
    assert_eq!(
        get(&format!("{url}/v1/sessions/{id}")).await["reply"],
        "Released."
    );
    assert_eq!(fake.calls(), 3);
}

/// A server and its workers started together on a new home all open its world: none
/// fails with "database is locked" (SQLite's switch of a new file to WAL does not wait
/// for the busy handler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_and_workers_started_at_once_all_open_a_new_world() {
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let worker = command(&home, &fake, &["worker", "--workers", "2"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let server = command(
            &home,
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        for mut child in [worker, server] {
            assert!(
                child.try_wait().unwrap().is_none(),
                "round {round}: a process exited: {}",
                {
                    let out = child.wait_with_output().await.unwrap();
                    String::from_utf8_lossy(&out.stderr).into_owned()
                }
            );
            child.start_kill().unwrap();
            let _ = child.wait().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_never_block_a_session_and_sigterm_always_stops_the_server() {
    let bash =
        |command: &str| json!({"tool_calls": [{"name": "bash", "input": {"command": command}}]});
    let script: Script = serde_json::from_value(json!({"steps": [
        bash("mkfifo pipe && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && echo made-special"),
        bash("echo next-command-works > after.txt"),
        {"text": "done"},
        bash("sleep 120"),
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    // The long command outlasts the workers' stop grace, and is cut off at its end.
    let config = "[harness]\nstop-grace-secs = 2\n";
    let (mut server, url) = serve_configured(&home, &fake, "1", config).await;
    let created = post(&format!("{url}/v1/sessions"), json!({"task": "make pipes"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the session to finish its turn", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "idle"
    })
    .await;
    let shown = get(&format!("{url}/v1/sessions/{id}")).await;
    assert_eq!(shown["reply"], "done", "{shown}");
    let ws = common::workspace_in(&home, &created);
    assert_eq!(
        std::fs::read_to_string(ws.join("after.txt")).unwrap(),
        "next-command-works\n"
    );

    // An open event stream (of a turn busy with a long command) does not keep a
    // stopping server alive.
    let stream = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": "now wait"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    wait_for("the long command to start", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "running"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill(Pid::from_raw(server.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), server.wait())
        .await
        .expect("SIGTERM stops the server")
        .unwrap();
    assert!(status.success(), "{status}");
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrunnable_session_fails_once_with_its_reason_and_can_be_deleted() {
    let script: Script = serde_json::from_value(json!({"steps": [{"text": "hi"}]})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    // Created while the server had a key (and no worker to run it)...
    let (mut first, url) = serve(&home, &fake, "0").await;
    let created = post(&format!("{url}/v1/sessions"), json!({"task": "say hi"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    first.kill().await.unwrap();
    let _ = first.wait().await;

    // ...then driven by one without: the wake fails for good, once, and says why.
    let mut keyless = command(
        &home,
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    );
    keyless.env_remove("ANTHROPIC_API_KEY");
    let mut server = keyless.spawn().unwrap();
    let stdout = server.stdout.take().unwrap();
    let url = tokio::io::BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    wait_for("the session to fail", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "failed"
    })
    .await;
    let shown = get(&format!("{url}/v1/sessions/{id}")).await;
    let reason = shown["end_reason"].as_str().unwrap();
    assert!(
        reason.contains("no API key for provider `anthropic`"),
        "{shown}"
    );
    // The stream shows it as an `error` frame, and then ends.
    let resp = reqwest::get(format!("{url}/v1/sessions/{id}/events"))
        .await
        .unwrap();
    let mut stream = resp.bytes_stream().eventsource();
    let mut errors = Vec::new();
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        if ev.event == "end" {
            break;
        }
        let data: Value = serde_json::from_str(&ev.data).unwrap();
        if data["type"] == "error" {
            errors.push(data);
        }
    }
    assert_eq!(errors.len(), 1, "one error frame: {errors:?}");
    assert_eq!(errors[0]["error"]["code"], "failed");
    assert!(
        errors[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no API key"),
        "{errors:?}"
    );

    // New sessions it cannot run are refused up front, naming what is missing.
    for (model, says) in [
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("evil/x", "evil"),
    ] {
        let resp = reqwest::Client::new()
            .post(format!("{url}/v1/sessions"))
            .json(&json!({ "model": model }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 422, "{model}");
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
    let deleted = reqwest::Client::new()
        .delete(format!("{url}/v1/sessions/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let _ = server.kill().await;
}

/// The kinds of a session's records, in order.
fn kinds(home: &Path, id: &str) -> Vec<String> {
    db(home)
        .prepare("SELECT kind FROM events WHERE session_id = ?1 ORDER BY seq")
        .unwrap()
        .query_map([id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A server stopped (SIGTERM) while its worker runs a command longer than the stop
/// grace leaves the step in hand, once the grace is over, to the next worker on its
/// machine: the command runs on in the session's sandbox, the lease is left to the
/// stopped process (a worker of this machine takes it at once, that process being
/// gone; one elsewhere only once it lapses, by when the sandbox has ended itself), and
/// the next server adopts the sandbox and records the command whole, once, with no
/// rollback and no model call more than the crash-free run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_leaves_its_running_command_to_the_next_one() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Running it.", "tool_calls": [{"name": "bash", "input": {"command": "echo started > started.txt; sleep 4; echo ended >> started.txt"}}]},
        {"text": "It ran; done."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    let config = "[sandbox]\nbackend = \"bwrap\"\n[harness]\nstop-grace-secs = 1\n";
    let (mut server, url) = serve_configured(&home, &fake, "1", config).await;
    let created = post(&format!("{url}/v1/sessions"), json!({"task": "run it"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    let ws = common::workspace_in(&home, &created);
    wait_for("the command to start", async || {
        ws.join("started.txt").exists()
    })
    .await;

    stop(&mut server).await;
    let holder: Option<String> = db(&home)
        .query_row(
            "SELECT lease_holder FROM sessions WHERE id = ?1",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        holder.is_some(),
        "the lease is left to the stopped worker's machine"
    );

    let (mut server, url) = serve_configured(&home, &fake, "1", config).await;
    wait_for("the turn to finish", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "idle"
    })
    .await;
    let kinds = kinds(&home, &id);
    assert!(
        !kinds.iter().any(|k| k == "tool_call_interrupted"),
        "the command was not cut off: {kinds:?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("started.txt")).unwrap(),
        "started\nended\n",
        "it ran once, whole"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("turn_ended"),
        "{kinds:?}"
    );
    // The two replies; no request was sent twice.
    assert_eq!(fake.calls(), 2, "{kinds:?}");
    assert_eq!(fake.state().distinct_requests(), 2, "{kinds:?}");
    let _ = server.kill().await;
}

/// A server stopped (SIGTERM) while a model reply streams in lets that reply finish
/// and records it before handing the session back, so the next server carries on
/// from it and the provider is never asked (nor paid) for it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_lets_the_reply_it_is_paying_for_finish() {
    let long = "I am going to explain this slowly, one careful piece at a time, so the reply takes a while to stream. ";
    let script: Script = serde_json::from_value(json!({"steps": [
        // About three seconds of streaming: the stop lands inside it.
        {"text": long.repeat(4), "chunk_delay_ms": 30, "tool_calls": [{"name": "bash", "input": {"command": "echo once >> ran.txt"}}]},
        {"text": "Done."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = home(&dir);
    let (mut server, url) = serve(&home, &fake, "1").await;
    let created = post(&format!("{url}/v1/sessions"), json!({"task": "explain"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the reply to stream in", async || {
        kinds(&home, &id).iter().any(|k| k == "model_delta")
    })
    .await;
    assert!(
        !kinds(&home, &id).iter().any(|k| k == "model_call_outcome"),
        "the stop must land inside the reply"
    );

    stop(&mut server).await;
    let stopped = kinds(&home, &id);
    assert!(
        stopped.iter().any(|k| k == "model_call_outcome"),
        "the reply in hand was recorded before the server stopped: {stopped:?}"
    );
    assert!(
        !stopped.iter().any(|k| k == "model_call_interrupted"),
        "{stopped:?}"
    );
    assert_eq!(fake.calls(), 1);

    let (mut server, url) = serve(&home, &fake, "1").await;
    wait_for("the turn to finish", async || {
        get(&format!("{url}/v1/sessions/{id}")).await["status"] == "idle"
    })
    .await;
    let kinds = kinds(&home, &id);
    // The recorded reply's command ran once, and only the next reply was asked for.
    let ws = common::workspace_in(&home, &created);
    assert_eq!(
        std::fs::read_to_string(ws.join("ran.txt")).unwrap(),
        "once\n"
    );
    assert_eq!(fake.calls(), 2, "{kinds:?}");
    assert_eq!(fake.state().distinct_requests(), 2, "{kinds:?}");
    let _ = server.kill().await;
}
