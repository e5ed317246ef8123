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
