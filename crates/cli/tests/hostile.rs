//! A hostile tenant, through the CLI and the model's tools: the world's files are out
//! of every sandbox's reach, special files never block a session, production never
//! runs commands unisolated, and lost data is reported, never papered over.

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

async fn steadfast(home: &Path, cwd: &Path, fake: &FakeProvider, args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("STEADFAST_HOME", home)
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_MODEL")
        .env_remove("STEADFAST_SANDBOX")
        .output()
        .await
        .unwrap()
}

fn script(steps: Value) -> Script {
    serde_json::from_value(json!({ "steps": steps })).unwrap()
}

fn bash(command: &str) -> Value {
    json!({"tool_calls": [{"name": "bash", "input": {"command": command}}]})
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn a_workspace_that_holds_the_home_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".steadfast");
    let fake = FakeProvider::start(script(json!([
        bash("sqlite3 .steadfast/world.db \"update sessions set owner = 'mallory'\""),
        {"text": "done"}
    ])))
    .await
    .unwrap();
    // Once to make the home (a session elsewhere), then with the directory holding it.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let first = steadfast(&home, dir.path(), &fake, &["sessions", "--json"]).await;
    assert!(first.status.success(), "{}", text(&first));
    let ws = dir.path().display().to_string();
    let run = steadfast(
        &home,
        dir.path(),
        &fake,
        &[
            "run",
            "clean up",
            "--workspace",
            &ws,
            "--model",
            "anthropic/claude-sonnet-4-5",
        ],
    )
    .await;
    assert!(!run.status.success(), "{}", text(&run));
    assert!(
        text(&run).contains("holds Steadfast's home"),
        "{}",
        text(&run)
    );
    assert_eq!(fake.calls(), 0, "no model call, no command");
    let listed = steadfast(&home, dir.path(), &fake, &["sessions", "--json"]).await;
    assert!(listed.status.success(), "{}", text(&listed));
    assert_eq!(
        listed.stdout.len(),
        0,
        "no session was made: {}",
        text(&listed)
    );
}

#[tokio::test]
async fn production_refuses_to_start_without_an_isolating_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |sandbox: Option<&'static str>, path: &'static str| {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["serve", "--production", "--listen", "127.0.0.1:0"])
            .current_dir(dir.path())
            .env("STEADFAST_HOME", dir.path().join("home"))
            .env("PATH", path)
            .env_remove("STEADFAST_SANDBOX")
            .kill_on_drop(true);
        if let Some(backend) = sandbox {
            cmd.env("STEADFAST_SANDBOX", backend);
        }
        async move {
            tokio::time::timeout(std::time::Duration::from_secs(20), cmd.output())
                .await
                .expect("it stops at once instead of serving")
                .unwrap()
        }
    };
    let host_path = std::env::var("PATH").unwrap();
    let host_path: &'static str = Box::leak(host_path.into_boxed_str());
    // Asked for `local` by name, and `auto` on a host without bubblewrap.
    for (sandbox, path) in [(Some("local"), host_path), (None, "/nonexistent")] {
        let out = serve(sandbox, path).await;
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("refuses to start without an isolating sandbox"),
            "{}",
            text(&out)
        );
    }
}

#[tokio::test]
async fn a_lost_output_blob_is_reported_with_its_position_by_log_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeProvider::start(script(json!([
        bash("yes x | head -c 200000"),
        {"text": "done"}
    ])))
    .await
    .unwrap();
    let ws_arg = ws.display().to_string();
    let run = steadfast(
        &home,
        dir.path(),
        &fake,
        &[
            "run",
            "print a lot",
            "--workspace",
            &ws_arg,
            "--model",
            "anthropic/claude-sonnet-4-5",
            "--json",
        ],
    )
    .await;
    assert!(run.status.success(), "{}", text(&run));
    let result: Value = serde_json::from_slice(&run.stdout).unwrap();
    let id = result["session"].as_str().unwrap().to_string();
    let log = steadfast(&home, dir.path(), &fake, &["log", &id, "--json"]).await;
    assert!(log.status.success(), "intact: {}", text(&log));
    let (seq, hash) = String::from_utf8_lossy(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|r| {
            let out = &r["event"]["tool_call_outcome"]["output"];
            (out["kind"] == "blob").then(|| {
                (
                    r["seq"].as_u64().unwrap(),
                    out["hash"].as_str().unwrap().to_string(),
                )
            })
        })
        .expect("the big output went to a blob");

    std::fs::remove_file(home.join("blobs").join(&hash)).unwrap();
    let log = steadfast(&home, dir.path(), &fake, &["log", &id]).await;
    assert!(!log.status.success());
    let said = format!("DATA LOST in session {id} at #{seq}: the output blob {hash} is missing");
    assert!(text(&log).contains(&said), "{}", text(&log));
    let resume = steadfast(&home, dir.path(), &fake, &["resume", &id]).await;
    assert!(text(&resume).contains(&said), "{}", text(&resume));

    // A corrupt blob is named as such.
    std::fs::write(home.join("blobs").join(&hash), "tampered").unwrap();
    let log = steadfast(&home, dir.path(), &fake, &["log", &id]).await;
    assert!(
        text(&log).contains(&format!("at #{seq}: the output blob {hash} is corrupt")),
        "{}",
        text(&log)
    );
}
