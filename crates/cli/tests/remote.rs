//! The CLI through a server (`--server URL`, a token in `STEADFAST_TOKEN`): listing,
//! following, stopping, messaging, signalling, diffing, closing and deleting a session
//! a worker drives, from a machine that has no world at all (its world is set to a
//! database that does not exist, so any command that opened it would fail). Only the
//! token's owner's sessions are reachable, and refusals say what the server said.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{service, stderr};

/// `steadfast --server url args` from `dir` with `token`, on a machine without a world.
async fn remote(dir: &Path, url: &str, token: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["--server", url])
        .args(args)
        .current_dir(dir)
        .env("STEADFAST_HOME", dir.join("no-home-here"))
        .env("STEADFAST_WORLD", "postgres://nobody@127.0.0.1:1/nothing")
        .env("STEADFAST_TOKEN", token)
        .env_remove("STEADFAST_SERVER")
        .env_remove("STEADFAST_TOKEN_FILE")
        .env_remove("STEADFAST_CONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_and_controls_sessions_through_a_server_with_a_token() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Running it.", "tool_calls": [{"name": "bash", "input": {"command": "echo started > started.txt; sleep 30"}}]},
        // (The fake picks a step by the replies so far; the interrupted turn left one.)
        {"text": "not asked for"},
        {"text": "Stopped as asked."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("steadfast.toml");
    let hash = |t: &str| blake3::hash(t.as_bytes()).to_hex().to_string();
    std::fs::write(
        &config,
        format!(
            "[server]\ntokens = [{{ owner = \"alice\", token-hash = \"{}\" }}, {{ owner = \"bob\", token-hash = \"{}\" }}]\n",
            hash("alice-secret"),
            hash("bob-secret")
        ),
    )
    .unwrap();
    let mut api = service(
        &dir.path().join("home"),
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    );
    let mut api = api.env("STEADFAST_CONFIG", &config).spawn().unwrap();
    let url = common::printed_url(&mut api).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let here = elsewhere.path();

    let created: Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .bearer_auth("alice-secret")
        .json(&json!({"task": "run the slow thing", "labels": {"team": "infra"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap();

    // Listed for its owner, filtered by label; nobody else sees it.
    let listed = remote(
        here,
        &url,
        "alice-secret",
        &["sessions", "--json", "--label", "team=infra"],
    )
    .await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows = lines(&listed);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], id);
    assert_eq!(rows[0]["labels"]["team"], "infra");
    let bobs = remote(here, &url, "bob-secret", &["sessions", "--json"]).await;
    assert!(bobs.status.success(), "{}", stderr(&bobs));
    assert!(lines(&bobs).is_empty());
    let peek = remote(here, &url, "bob-secret", &["log", id]).await;
    assert!(!peek.status.success());
    assert!(
        stderr(&peek).contains("404 session_not_found"),
        "{}",
        stderr(&peek)
    );

    // Followed until the command runs, then stopped: the command is killed.
    let mut running = false;
    for _ in 0..300 {
        let log = remote(here, &url, "alice-secret", &["log", "--json", id]).await;
        assert!(log.status.success(), "{}", stderr(&log));
        if lines(&log).iter().any(|e| e["type"] == "tool_call_intent") {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(running, "the command started");
    let stopped = remote(here, &url, "alice-secret", &["stop", id]).await;
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    assert!(
        stderr(&stopped).contains(&format!("--server {url} send {id}")),
        "the line it prints works here: {}",
        stderr(&stopped)
    );

    // A message for the next turn, which the worker takes; `log --follow` would wait
    // for the end, so the turn is awaited by polling.
    let sent = remote(here, &url, "alice-secret", &["send", id, "carry on"]).await;
    assert!(sent.status.success(), "{}", stderr(&sent));
    let mut replied = false;
    for _ in 0..300 {
        let log = remote(here, &url, "alice-secret", &["log", "--json", id]).await;
        let events = lines(&log);
        let answered = events
            .iter()
            .any(|e| e["type"] == "model_call_outcome" && e["text"] == "Stopped as asked.");
        if answered && events.last().is_some_and(|e| e["type"] == "turn_ended") {
            replied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        replied,
        "the second turn ran: {}",
        String::from_utf8_lossy(
            &remote(here, &url, "alice-secret", &["log", id])
                .await
                .stdout
        )
    );
    let timeline = remote(here, &url, "alice-secret", &["log", id]).await;
    let text = String::from_utf8_lossy(&timeline.stdout).to_string();
    assert!(
        text.contains("user_message") && text.contains("carry on"),
        "{text}"
    );
    assert!(text.contains("turn_interrupted"), "{text}");

    // What it changed, as the server reads it.
    let diff = remote(here, &url, "alice-secret", &["diff", "--json", id]).await;
    assert!(diff.status.success(), "{}", stderr(&diff));
    let diff: Value = serde_json::from_slice(&diff.stdout).unwrap();
    assert_eq!(diff["files"][0]["path"], "started.txt", "{diff}");
    let diff = remote(here, &url, "alice-secret", &["diff", id]).await;
    assert!(String::from_utf8_lossy(&diff.stdout).contains("+started"));

    // Forked through the server: the fork is the caller's and names its parent.
    let forked = remote(
        here,
        &url,
        "alice-secret",
        &["fork", id, "--title", "again"],
    )
    .await;
    assert!(forked.status.success(), "{}", stderr(&forked));
    let fork = String::from_utf8_lossy(&forked.stdout).trim().to_string();
    assert!(fork.starts_with("ses_") && fork != id, "{fork}");
    let listed = remote(here, &url, "alice-secret", &["sessions", "--json"]).await;
    let listed = lines(&listed);
    let row = listed
        .iter()
        .find(|s| s["id"] == fork.as_str())
        .expect("the fork is listed");
    assert_eq!(
        (row["parent"].as_str(), row["title"].as_str()),
        (Some(id), Some("again")),
        "{row}"
    );
    let bobs = remote(here, &url, "bob-secret", &["fork", id]).await;
    assert!(
        !bobs.status.success() && stderr(&bobs).contains("404"),
        "{}",
        stderr(&bobs)
    );

    // A signal nobody waits for is refused as the server says, unless queued.
    let refused = remote(
        here,
        &url,
        "alice-secret",
        &["signal", id, "approval", r#"{"approved": true}"#],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("409 not_waiting"),
        "{}",
        stderr(&refused)
    );
    let queued = remote(
        here,
        &url,
        "alice-secret",
        &["signal", "--queue", id, "approval", "{}"],
    )
    .await;
    assert!(queued.status.success(), "{}", stderr(&queued));

    // A hook: made (its secret on stdout, its URL on stderr), listed, used, revoked;
    // not another owner's to make. The session is idle, so a `message` hook's
    // delivery starts a turn.
    let bobs = remote(here, &url, "bob-secret", &["hooks", "create", id, "page"]).await;
    assert!(
        stderr(&bobs).contains("404 session_not_found"),
        "{}",
        stderr(&bobs)
    );
    let made = remote(
        here,
        &url,
        "alice-secret",
        &["hooks", "create", id, "page", "--then", "message"],
    )
    .await;
    assert!(made.status.success(), "{}", stderr(&made));
    let token = String::from_utf8_lossy(&made.stdout).trim().to_string();
    assert!(token.starts_with("hk_"), "{token}");
    let hook_url = stderr(&made)
        .split_whitespace()
        .find(|w| w.starts_with("http"))
        .unwrap()
        .to_string();
    assert!(hook_url.ends_with(&format!("?token={token}")), "{hook_url}");
    let listed = remote(here, &url, "alice-secret", &["hooks", "list", id]).await;
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.starts_with("page\ttoken\tmessage\t"), "{listed}");
    assert!(!listed.contains(&token), "{listed}");
    let delivered = reqwest::Client::new()
        .post(&hook_url)
        .json(&json!({"note": "from the pager"}))
        .send()
        .await
        .unwrap();
    assert_eq!(delivered.status(), 202);
    let revoked = remote(here, &url, "alice-secret", &["hooks", "delete", id, "page"]).await;
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    let after = reqwest::Client::new()
        .post(&hook_url)
        .json(&json!({"note": "again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 404);
    let local = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["hooks", "list", id])
        .env("STEADFAST_HOME", here.join("no-home-here"))
        .env_remove("STEADFAST_SERVER")
        .output()
        .await
        .unwrap();
    assert!(stderr(&local).contains("--server"), "{}", stderr(&local));

    // Closed, then deleted.
    let closed = remote(here, &url, "alice-secret", &["close", id]).await;
    assert!(closed.status.success(), "{}", stderr(&closed));
    assert!(stderr(&closed).contains("closed"), "{}", stderr(&closed));
    let ended = remote(
        here,
        &url,
        "alice-secret",
        &["log", "--json", "--follow", id],
    )
    .await;
    assert!(ended.status.success(), "follow ends with the session");
    assert!(lines(&ended)
        .iter()
        .any(|e| e["type"] == "session_ended" && e["state"] == "closed"));
    let deleted = remote(here, &url, "alice-secret", &["delete", id]).await;
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let gone = remote(here, &url, "alice-secret", &["log", id]).await;
    assert!(
        stderr(&gone).contains("404 session_not_found"),
        "{}",
        stderr(&gone)
    );

    // A wrong token, an unreachable server and a command that needs the world here
    // each say so; the token is never printed.
    let wrong = remote(here, &url, "wrong-secret", &["sessions"]).await;
    assert!(!wrong.status.success());
    assert!(
        stderr(&wrong).contains("401 unauthorized"),
        "{}",
        stderr(&wrong)
    );
    assert!(!stderr(&wrong).contains("wrong-secret"));
    let away = remote(here, "http://127.0.0.1:1", "alice-secret", &["sessions"]).await;
    assert!(
        stderr(&away).contains("cannot reach the server"),
        "{}",
        stderr(&away)
    );
    let run = remote(here, &url, "alice-secret", &["run", "--pace", "0"]).await;
    assert!(!run.status.success());
    assert!(stderr(&run).contains("drop --server"), "{}", stderr(&run));
    assert!(!here.join("no-home-here").exists(), "no home was made");
    api.start_kill().unwrap();
}

/// `steadfast resume` drives an API session's turn here (no worker runs), and leaves
/// it open: the next message through the API is taken, not refused as ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_an_api_session_here_leaves_it_open() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "First answer."},
        {"text": "Second answer."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut api = service(
        &home,
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    let (status, created) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "say something"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let resumed = service(&home, &fake, &["resume", id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        stderr(&resumed).contains("stays open"),
        "{}",
        stderr(&resumed)
    );
    assert_eq!(common::status(&url, id).await, "idle");
    // Resumed again with nothing to do: still open.
    let again = service(&home, &fake, &["resume", id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(common::status(&url, id).await, "idle");
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": "and more"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the session takes more messages");
    api.start_kill().unwrap();
}
