//! Forks that a crash cuts short: a `steadfast fork` killed (SIGABRT at a fault
//! point) after writing a fork's rows but before committing them, or between two forks
//! of one request, leaves no fork or whole ones — on SQLite and on PostgreSQL.

mod common;

use std::path::PathBuf;
use std::process::{Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// A user's machine: a home of its own, no API key (the bundled fake provider plays
/// the demo), and the world at `world` (the home's SQLite file if `None`).
struct Machine {
    dir: tempfile::TempDir,
    world: Option<String>,
}

impl Machine {
    fn new(world: Option<String>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("user")).unwrap();
        Machine { dir, world }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    async fn steadfast(&self, fault: Option<&str>, args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.path("user"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .env("HOME", self.path("user"))
            .env("USER", "pat")
            .env("STEADFAST_HOME", self.path("home"));
        for var in [
            "XDG_DATA_HOME",
            "STEADFAST_CONFIG",
            "STEADFAST_WORLD",
            "STEADFAST_MODEL",
            "STEADFAST_FAKE_SCRIPT",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "RUST_LOG",
            steadfast_fault::FAULT_ENV,
        ] {
            cmd.env_remove(var);
        }
        if let Some(world) = &self.world {
            cmd.env("STEADFAST_WORLD", world);
        }
        if let Some(fault) = fault {
            cmd.env(steadfast_fault::FAULT_ENV, fault);
        }
        cmd.output().await.unwrap()
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.steadfast(None, args).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// The forks of `parent` the world holds.
    async fn forks_of(&self, parent: &str) -> Vec<String> {
        self.ok(&["sessions", "--json"])
            .await
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|s| s["parent"] == parent)
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn a_crash_while_forking_leaves_no_fork_or_a_whole_one(machine: &Machine) {
    if machine.world.is_some() {
        machine.ok(&["migrate"]).await;
    }
    let run = machine
        .ok(&[
            "run",
            "count",
            "--workspace",
            "one",
            "--create",
            "--json",
            "--pace",
            "0",
        ])
        .await;
    let result: Value = serde_json::from_str(&run).unwrap();
    let parent = result["session"].as_str().unwrap().to_string();
    let parent_diff = machine.ok(&["diff", &parent]).await;

    let mut whole = 0;
    for (fault, count, made) in [
        (steadfast_fault::points::FORK_WRITTEN, "1", 0),
        (steadfast_fault::points::FORK_WRITTEN, "2", 1),
        (steadfast_fault::points::FORK_MADE, "1", 1),
    ] {
        let at = format!("{fault}:{count}");
        let killed = machine
            .steadfast(Some(&at), &["fork", &parent, "--count", "3"])
            .await;
        assert!(!killed.status.success(), "{at}: the fork was cut short");
        whole += made;
        let forks = machine.forks_of(&parent).await;
        assert_eq!(forks.len(), whole, "{at}: {forks:?}");
    }
    // Each fork there is whole: its log verifies and reads through the parent's part,
    // and its workspace is the parent's as recorded.
    for fork in machine.forks_of(&parent).await {
        let log = machine.steadfast(None, &["log", &fork]).await;
        assert!(log.status.success(), "{}", text(&log.stderr));
        assert!(text(&log.stdout).contains(&format!("forked from {parent}")));
        assert_eq!(machine.ok(&["diff", &fork]).await, parent_diff);
    }
    // And the world goes on: the parent forks again.
    let again = machine.ok(&["fork", &parent]).await;
    assert_eq!(again.lines().count(), 1);
    assert_eq!(machine.forks_of(&parent).await.len(), whole + 1);
}

#[tokio::test]
async fn a_crash_while_forking_on_sqlite() {
    a_crash_while_forking_leaves_no_fork_or_a_whole_one(&Machine::new(None)).await;
}

#[tokio::test]
async fn a_crash_while_forking_on_postgres() {
    let db = common::TestDatabase::create("steadfast_fork_crash").await;
    a_crash_while_forking_leaves_no_fork_or_a_whole_one(&Machine::new(Some(db.url.clone()))).await;
    db.drop_now().await;
}

/// `steadfast` as one host of a fleet runs it: a home of its own, the shared
/// PostgreSQL world and S3 bucket, the model at `fake`.
fn host(
    home: &std::path::Path,
    world: &str,
    s3: &str,
    fake: &steadfast_testkit::FakeProvider,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env("STEADFAST_HOME", home)
        .env("STEADFAST_WORLD", world)
        .env("STEADFAST_BLOBS", "s3://forks/fleet")
        .env("AWS_ENDPOINT", s3)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove(steadfast_fault::FAULT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_made_on_one_host_is_driven_by_a_worker_on_another() {
    use tokio::io::AsyncBufReadExt;
    let db = common::TestDatabase::create("steadfast_fork_fleet").await;
    let moto = common::Moto::start("forks");
    let script: steadfast_testkit::Script = serde_json::from_value(serde_json::json!({"steps": [
        {"text": "one", "tool_calls": [{"name": "bash", "input": {"command": "echo one >> notes.txt"}}]},
        {"text": "turn one done"},
        {"text": "two", "tool_calls": [{"name": "bash", "input": {"command": "echo two >> notes.txt"}}]},
        {"text": "turn two done"},
    ]}))
    .unwrap();
    let fake = steadfast_testkit::FakeProvider::start(script)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("host-a"), dir.path().join("host-b"));
    let on =
        |home: &std::path::Path, args: &[&str]| host(home, &db.url, &moto.endpoint, &fake, args);
    assert!(on(&a, &["migrate"])
        .output()
        .await
        .unwrap()
        .status
        .success());

    // Host A serves the API and drives the parent's first turn.
    let mut api = on(&a, &["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
        .spawn()
        .unwrap();
    let url = tokio::io::BufReader::new(api.stdout.take().unwrap())
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let mut worker_a = on(&a, &["worker", "--workers", "1"]).spawn().unwrap();
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/v1/sessions"))
        .json(&serde_json::json!({"task": "work", "workspace": {"kind": "empty", "files": {"notes.txt": "zero\n"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let parent = created["id"].as_str().unwrap().to_string();
    common::idle_after(&url, &parent, 1).await;
    worker_a.kill().await.unwrap();
    let _ = worker_a.wait().await;

    // Forked through host A's API; driven by a worker on host B, which has never seen
    // the session: the workspace comes from the shared bucket.
    let _worker_b = on(&b, &["worker", "--workers", "1"]).spawn().unwrap();
    let made: Value = http
        .post(format!("{url}/v1/sessions/{parent}/fork"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fork = made["sessions"][0]["id"].as_str().unwrap().to_string();
    let status = http
        .post(format!("{url}/v1/sessions/{fork}/messages"))
        .header("accept", "application/json")
        .json(&serde_json::json!({"text": "more"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 202);
    let shown = common::idle_after(&url, &fork, 2).await;
    assert_eq!(shown["reply"], "turn two done", "{shown}");
    let workspaces: Vec<_> = std::fs::read_dir(b.join("workspaces"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(
        workspaces.len(),
        1,
        "host B materialized the fork's workspace"
    );
    assert_eq!(
        std::fs::read_to_string(workspaces[0].path().join("notes.txt")).unwrap(),
        "zero\none\ntwo\n"
    );
    assert_eq!(fake.calls(), 4, "nothing the fork shares was asked again");
    let _ = api.start_kill();
    db.drop_now().await;
}
