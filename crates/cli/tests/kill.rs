//! Real signals against the `steadfast` binary: SIGKILL and Ctrl-C mid-command, and a
//! corrupt log record.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
}

impl Case {
    async fn new(steps: Value) -> Self {
        let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        let fake = FakeProvider::start(script).await.unwrap();
        Case { dir, fake }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("STEADFAST_HOME", self.dir.path().join("home"))
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", self.fake.base_url())
            .env_remove("OPENAI_API_KEY")
            .env_remove("STEADFAST_FAULT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    fn spawn_run(&self) -> tokio::process::Child {
        self.spawn_run_on("auto")
    }

    /// `run` on sandbox backend `sandbox`.
    fn spawn_run_on(&self, sandbox: &str) -> tokio::process::Child {
        let ws = self.ws().display().to_string();
        self.command(&[
            "run",
            "go",
            "--workspace",
            &ws,
            "--model",
            "anthropic/claude-sonnet-4-5",
        ])
        .env("STEADFAST_SANDBOX", sandbox)
        .spawn()
        .unwrap()
    }

    async fn session(&self) -> String {
        let out = self
            .command(&["sessions", "--json"])
            .output()
            .await
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .to_string();
        serde_json::from_str::<Value>(&line).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

async fn wait_for(path: &Path, text: &str) {
    for _ in 0..200 {
        if std::fs::read_to_string(path).is_ok_and(|s| s.contains(text)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} never contained {text}", path.display());
}

fn slow_step() -> Value {
    json!({"text": "Running the slow job.", "tool_calls": [{"name": "bash", "input": {"command": "echo start >> job.log; sleep 2; echo late >> job.log"}}]})
}

/// SIGKILL of `run` mid-command: the command runs on in its sandbox, which outlives
/// the process that started it, and `resume` adopts the sandbox, waits for the command
/// and records it: it ran once, whole, and nothing is rolled back.
#[tokio::test]
async fn sigkill_mid_command_leaves_the_command_to_finish_for_resume() {
    let case = Case::new(json!([slow_step(), {"text": "done"}])).await;
    let mut child = case.spawn_run_on("bwrap");
    wait_for(&case.ws().join("job.log"), "start").await;
    child.kill().await.unwrap(); // SIGKILL: the harness gets no chance to clean up

    let id = case.session().await;
    let out = case
        .command(&["resume", &id, "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(case.ws().join("job.log")).unwrap(),
        "start\nlate\n"
    );
    let log = String::from_utf8_lossy(&case.command(&["log", &id]).output().await.unwrap().stdout)
        .into_owned();
    assert!(!log.contains("rolled back"), "{log}");
    assert_eq!(
        case.fake.calls(),
        2,
        "step, final: the command was never asked again"
    );
}

#[tokio::test]
async fn a_killed_drivers_orphan_writes_nothing_into_the_rolled_back_workspace() {
    // The local sandbox has no namespace to die with its driver: a background writer
    // the command started outlives a SIGKILL until the next sandbox reaps it.
    let marks = tempfile::tempdir().unwrap();
    let spawned = marks.path().join("spawned");
    let command = format!(
        "test -e {0} && exit 0; touch {0}; \
         (while true; do echo x >> junk.log; done) & sleep 30",
        spawned.display()
    );
    let case = Case::new(json!([
        {"text": "Starting a writer.", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "done"},
    ]))
    .await;
    let mut child = case.spawn_run_on("local");
    wait_for(&case.ws().join("junk.log"), "x").await;
    child.kill().await.unwrap();

    let id = case.session().await;
    let mut resume = case.command(&["resume", &id]);
    resume.env("STEADFAST_SANDBOX", "local");
    let out = resume.output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The writer was reaped before the rollback, not after it: nothing it wrote is
    // in the workspace, and nothing more arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !case.ws().join("junk.log").exists(),
        "the orphan wrote into the workspace after it was rolled back"
    );
}

#[tokio::test]
async fn ctrl_c_stops_the_command_and_resume_finishes() {
    let case = Case::new(json!([slow_step(), {"text": "done"}])).await;
    let child = case.spawn_run();
    wait_for(&case.ws().join("job.log"), "start").await;
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(130));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("steadfast resume ses_"), "{stderr}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        std::fs::read_to_string(case.ws().join("job.log")).unwrap(),
        "start\n",
        "the command was stopped"
    );

    let id = case.session().await;
    let out = case.command(&["resume", &id]).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(case.ws().join("job.log")).unwrap(),
        "start\nlate\n"
    );
}

#[tokio::test]
async fn a_corrupt_record_stops_log_and_resume_with_its_position() {
    let case = Case::new(json!([{"text": "hi", "tool_calls": [{"name": "bash", "input": {"command": "echo hi"}}]}, {"text": "done"}])).await;
    let out = case.spawn_run().wait_with_output().await.unwrap();
    assert!(out.status.success());
    let id = case.session().await;
    let db = rusqlite::Connection::open(case.dir.path().join("home/world.db")).unwrap();
    let mut body: Vec<u8> = db
        .query_row("SELECT body FROM events WHERE seq = 4", [], |r| r.get(0))
        .unwrap();
    body[5] ^= 0x20;
    db.execute("UPDATE events SET body = ?1 WHERE seq = 4", [&body])
        .unwrap();

    for args in [vec!["log", id.as_str()], vec!["resume", id.as_str()]] {
        let out = case.command(&args).output().await.unwrap();
        assert!(!out.status.success(), "{args:?} accepted a corrupt log");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("corrupt log record in session {id} at position 4")),
            "{args:?}: {stderr}"
        );
    }
}
