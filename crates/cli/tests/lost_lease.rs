//! A command never outlives the lease it was started under. A worker that loses a
//! session's lease while alive — stopped past the lease (`SIGSTOP`), or cut off from
//! the store by a network partition — must not have its command go on writing into the
//! workspace after the next holder restored it: the log would say the call was rolled
//! back while its effect is there (and, run again, there twice).
//! - **Stopped** (it cannot act): the next holder on the host kills its sandboxes
//!   before restoring the workspace (`steadfast_sandbox::take_over`).
//! - **Partitioned** (it can, but cannot renew): it kills its own command once it can
//!   no longer vouch for its lease, before anyone else may take the session over (the
//!   heartbeat's self-fencing), and records nothing more.
//!
//! Either way, through the API with bubblewrap sandboxes and two worker processes, the
//! workspace ends as the log says: the slow append is there exactly as many times as
//! the log records it done.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{agents_dir, call, idle_after, installed, kind, running, wait_for};
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

fn script(sleep: &str) -> Script {
    Script::from_json(
        &json!({"steps": [
            {"text": "Starting.", "tool_calls": [{"name": "bash", "input": {"command": "echo start > f.txt"}}]},
            {"text": "Slow.", "tool_calls": [{"name": "bash", "input": {"command": format!("sleep {sleep}; echo X >> f.txt")}}]},
            {"text": "Done."},
        ]})
        .to_string(),
    )
    .unwrap()
}

fn signal(child: &tokio::process::Child, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
}

/// Creates a session of `agent` and waits until its slow command runs.
async fn start(url: &str, agent: &str, sleep: &str) -> (String, Value) {
    let model = match agent {
        "codex" => "openai/gpt-5",
        _ => "anthropic/claude-sonnet-4-5",
    };
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": agent, "model": model, "workspace": {"kind": "empty"}, "task": "append"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the slow command to run", async || {
        running(&format!("sleep {sleep}"))
    })
    .await;
    (id, created)
}

/// The workspace holds the slow append exactly as many times as the log says it was
/// done, and the log resolved the cut-off call.
async fn matches_the_log(dir: &Path, fake: &FakeProvider, id: &str, f_txt: &Path, sleep: &str) {
    let label = sleep;
    let log: Vec<Value> = common::log_lines(common::site_command(
        dir,
        &agents_dir(),
        fake,
        &["log", id, "--json"],
    ))
    .await;
    let of = |kind_: &str| common::events_of(&log, kind_);
    let slow: Vec<String> = of("tool_call_intent")
        .into_iter()
        .filter(|i| i["input"].to_string().contains("echo X"))
        .map(|i| i["call_id"].as_str().unwrap().to_string())
        .collect();
    assert!(!slow.is_empty(), "{label}: the slow call began");
    let done = of("tool_call_outcome")
        .into_iter()
        .filter(|o| slow.iter().any(|id| o["call_id"] == id.as_str()) && o["exit_code"] == 0)
        .count();
    let cut_off = of("tool_call_interrupted");
    let kinds: Vec<String> = log.iter().map(kind).collect();
    assert!(
        cut_off
            .iter()
            .any(|c| slow.iter().any(|id| c["call_id"] == id.as_str())),
        "{label}: the cut-off call was resolved: {kinds:?}"
    );
    let text = std::fs::read_to_string(f_txt).unwrap();
    assert_eq!(
        text.matches('X').count(),
        done,
        "{label}: the workspace says {text:?}, the log {done} appends done: {kinds:?}"
    );
    assert!(
        !running(&format!("sleep {sleep}")),
        "{label}: no command was left"
    );
}

/// A worker stopped past its lease while a command runs; a second worker on the host
/// takes the session over. The stopped worker's command is killed before the
/// workspace is restored, for the native agent and a wrapped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holders_command_is_killed_before_the_next_holder_restores() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "5.1"), ("claude-code", "5.2")] {
        let fake = FakeProvider::start(script(sleep)).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("steadfast.toml"),
            "[sandbox]\nbackend = \"bwrap\"\n[harness]\nlease-ttl-secs = 3\n",
        )
        .unwrap();
        let (_api, mut first, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
        let (id, created) = start(&url, agent, sleep).await;
        let workspace = common::workspace_in(&dir.path().join("home"), &created);

        signal(&first, nix::sys::signal::Signal::SIGSTOP);
        let (_second, shown) = common::next_worker_ends_turn(dir.path(), &fake, &url, &id).await;
        assert_eq!(shown["reply"], "Done.", "{agent}: {shown}");
        // Past when the stopped command would have appended, had it been left.
        tokio::time::sleep(Duration::from_secs(3)).await;
        signal(&first, nix::sys::signal::Signal::SIGCONT);
        tokio::time::sleep(Duration::from_millis(500)).await;
        first.start_kill().unwrap();
        first.wait().await.unwrap();
        matches_the_log(dir.path(), &fake, &id, &workspace.join("f.txt"), sleep).await;
    }
}

/// A TCP relay to PostgreSQL that can be cut: while `cut`, nothing passes either way
/// (connections hang, as behind a network partition).
async fn relay(cut: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
                continue;
            };
            let (c_read, c_write) = client.into_split();
            let (s_read, s_write) = server.into_split();
            tokio::spawn(pass(c_read, s_write, cut.clone()));
            tokio::spawn(pass(s_read, c_write, cut.clone()));
        }
    });
    port
}

async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A worker cut off from a PostgreSQL world while a command runs; a worker on another
/// host (a home of its own; the world and the blob store are shared), which still
/// reaches the world, takes the session over once the lease lapses. Nothing the cut-off
/// worker's command does is seen from outside it (the local backend has no egress
/// proxy, and its post goes through Python's `urllib`, which the classifier takes for a
/// mere change to the workspace), and its host is not the next holder's: only the
/// cut-off worker itself can stop the command. The next holder rolls the call back and
/// the model asks for it again, so a post made after the lease was lost would be made
/// twice: the cut-off worker kills its own command before its lease can lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_kills_its_own_command_before_its_lease_lapses() {
    let db =
        common::TestDatabase::create(&format!("steadfast_lost_lease_{}", std::process::id())).await;
    let cut = Arc::new(AtomicBool::new(false));
    let relay_port = relay(cut.clone()).await;
    let (port, hits) = common::counter();
    let post = format!(
        "sleep 5.3; python3 -c \"import urllib.request as u; u.urlopen(u.Request('http://localhost:{port}/deploy', data=b'go'))\""
    );
    let fake = FakeProvider::start(
        Script::from_json(
            &json!({"steps": [
                {"text": "Deploying.", "tool_calls": [{"name": "bash", "input": {"command": post}}]},
                {"text": "Done."},
            ]})
            .to_string(),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        format!(
            "world = \"{}\"\nmigrate-on-open = true\nblobs = \"{}\"\n\
             [sandbox]\nbackend = \"local\"\n[harness]\nlease-ttl-secs = 3\n",
            db.url,
            dir.path().join("shared-blobs").display()
        ),
    )
    .unwrap();
    let host = |home: &str, args: &[&str]| {
        let mut cmd = common::service(&dir.path().join(home), &fake, args);
        cmd.current_dir(dir.path()).env("STEADFAST_HOST_ID", home);
        cmd
    };
    let mut api = host(
        "api",
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    let mut first = host("first", &["worker", "--workers", "1"]);
    first.env(
        "STEADFAST_WORLD",
        db.url.replace(":5432/", &format!(":{relay_port}/")),
    );
    let mut first = first.spawn().unwrap();
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"workspace": {"kind": "empty"}, "task": "deploy"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the slow command to run", async || running("sleep 5.3")).await;

    cut.store(true, Ordering::SeqCst);
    let _second = host("second", &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    let shown = tokio::time::timeout(Duration::from_secs(120), idle_after(&url, &id, 1))
        .await
        .unwrap_or_else(|_| panic!("the second worker finished the turn"));
    assert_eq!(shown["reply"], "Done.", "{shown}");
    // Past when the cut-off command would have posted, had it been left.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log: Vec<Value> = common::log_lines(host("api", &["log", &id, "--json"])).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let resolution = log
        .iter()
        .find(|r| kind(r) == "tool_call_interrupted")
        .map(|r| r["event"]["tool_call_interrupted"]["resolution"]["kind"].clone())
        .unwrap_or_else(|| panic!("the cut-off call was resolved: {kinds:?}"));
    assert_eq!(resolution, "rolled_back", "{kinds:?}");
    // Told it was rolled back, the model asks for the post again: made once, by the
    // second worker, as the log says.
    let done = log
        .iter()
        .filter(|r| kind(r) == "tool_call_outcome")
        .filter(|r| r["event"]["tool_call_outcome"]["exit_code"] == 0)
        .count();
    assert_eq!(
        hits.load(Ordering::SeqCst),
        done,
        "the post was made as often as the log says it was: {kinds:?}"
    );
    assert!(!running("sleep 5.3"), "no command was left");
    cut.store(false, Ordering::SeqCst);
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    drop(api);
    db.drop_now().await;
}
