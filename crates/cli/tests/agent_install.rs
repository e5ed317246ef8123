//! A worker told to install what it lacks (`[agents] install-missing = true`) installs
//! the CLI version a session runs, says so in the session's log, and runs the session
//! once it is installed; without the setting it only leaves the session, saying why.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{call, idle_after, kind, printed_url};
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

/// `steadfast` of the site in `dir`, its CLIs under `dir/agents`, which starts empty.
fn command(dir: &Path, fake: &FakeProvider, args: &[&str]) -> tokio::process::Command {
    common::site_command(dir, &dir.join("agents"), fake, args)
}

/// An API server of the site in `dir` (no workers of its own), and its URL.
async fn api(dir: &Path, fake: &FakeProvider) -> (tokio::process::Child, String) {
    let mut api = command(
        dir,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = printed_url(&mut api).await;
    (api, url)
}

/// Why the log says this host left the session, if it does.
fn left_because(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|r| kind(r) == "drive_failed")
        .map(|r| {
            r["event"]["drive_failed"]["reason"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_installs_the_cli_a_session_runs_when_allowed() {
    let script =
        Script::from_json(&json!({"steps": [{"text": "Hello from pi."}]}).to_string()).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");

    // Not allowed: the session is refused at creation (nothing here runs pi), and a
    // worker never fetches anything.
    let (first, url) = api(dir.path(), &fake).await;
    let session = json!({"agent": "pi", "model": "anthropic/claude-sonnet-4-5", "workspace": {"kind": "empty"}});
    let (status, refused) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(session.clone()),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused.to_string().contains("install-agent"),
        "it says what to run: {refused}"
    );
    drop(first);

    // Allowed: created, and the worker installs pi, says so, then runs the turn.
    std::fs::write(
        dir.path().join("steadfast.toml"),
        "[agents]\ninstall-missing = true\n",
    )
    .unwrap();
    let (_api, _worker, url) =
        common::site_api(dir.path(), &dir.path().join("agents"), &fake).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"agent": "pi", "model": "anthropic/claude-sonnet-4-5", "workspace": {"kind": "empty"}, "task": "say hello"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let shown = tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            let (_, shown) = call(
                reqwest::Method::GET,
                &format!("{url}/v1/sessions/{id}"),
                None,
            )
            .await;
            if shown["turn"].as_u64() >= Some(1) && shown["status"] == "idle" {
                return shown;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("the session ran once pi was installed");
    assert_eq!(shown["reply"], "Hello from pi.", "{shown}");
    let log = common::log_lines(command(dir.path(), &fake, &["log", &id, "--json"])).await;
    let reasons = left_because(&log);
    assert!(
        reasons.iter().any(|r| r.contains("installing")),
        "the log says the host was installing the CLI: {reasons:?}"
    );
    assert!(
        agents
            .join("node_modules/@mariozechner/pi-coding-agent/package.json")
            .exists(),
        "pi is installed in the worker's agents directory"
    );
    assert!(
        !std::fs::read_dir(&agents).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".install-tmp")),
        "the install's scratch directory is gone"
    );
    idle_after(&url, &id, 1).await;
}
