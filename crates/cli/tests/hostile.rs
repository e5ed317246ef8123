//! A hostile tenant, through the CLI and the model's tools: the world's files are out
//! of every sandbox's reach, special files never block a session, production never
//! runs commands unisolated, and lost data is reported, never papered over.

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

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

/// Production, a public server and a server with tokens run other people's commands:
/// where no isolating sandbox works (a `bwrap` that fails, none at all, or `local`
/// asked for by name) each refuses to start, rather than run them as plain processes
/// of this machine. A developer's own server (no tokens) starts, and says it does not
/// isolate.
#[tokio::test]
async fn a_server_others_use_refuses_to_start_without_an_isolating_sandbox() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A `bwrap` that cannot make namespaces here, first on PATH.
    let broken = dir.path().join("broken-bin");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("bwrap"),
        "#!/bin/sh\necho 'no namespaces' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(broken.join("bwrap"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[server]\ntokens = [{ owner = \"alice\", token-hash = \"0000000000000000000000000000000000000000000000000000000000000000\" }]\n",
    )
    .unwrap();
    let host_path = std::env::var("PATH").unwrap();
    let broken_path = format!("{}:{host_path}", broken.display());
    let serve = |extra: &[&str], sandbox: Option<&str>, path: &str, config: Option<&Path>| {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .current_dir(dir.path())
            .env("STEADFAST_HOME", dir.path().join("home"))
            .env("PATH", path)
            .env_remove("STEADFAST_SANDBOX")
            .env_remove("STEADFAST_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(backend) = sandbox {
            cmd.env("STEADFAST_SANDBOX", backend);
        }
        if let Some(config) = config {
            cmd.env("STEADFAST_CONFIG", config);
        }
        cmd
    };
    let public: &[&str] = &["--public", "--session-spend-cap-usd", "0.01"];
    /// What the case is, `serve`'s extra arguments, `STEADFAST_SANDBOX`, `PATH`, and
    /// the configuration file.
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        Option<&'a str>,
        &'a str,
        Option<&'a Path>,
    );
    let cases: Vec<Case> = vec![
        (
            "production, local by name",
            &["--production"],
            Some("local"),
            &host_path,
            None,
        ),
        (
            "production, no bwrap",
            &["--production"],
            None,
            "/nonexistent",
            None,
        ),
        (
            "public, a bwrap that fails",
            public,
            None,
            &broken_path,
            None,
        ),
        (
            "public, local by name",
            public,
            Some("local"),
            &host_path,
            None,
        ),
        (
            "tokens, a bwrap that fails",
            &[],
            None,
            &broken_path,
            Some(&tokens),
        ),
    ];
    for (case, extra, sandbox, path, config) in cases {
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            serve(extra, sandbox, path, config).output(),
        )
        .await
        .expect("it stops at once instead of serving")
        .unwrap();
        assert!(!out.status.success(), "{case}: {}", text(&out));
        assert!(
            text(&out).contains("refuses to start without an isolating sandbox"),
            "{case}: {}",
            text(&out)
        );
    }
    // A developer's own server starts, and says what it runs commands in.
    let mut dev = serve(&[], None, &broken_path, None).spawn().unwrap();
    let url = common::printed_url(&mut dev).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    dev.kill().await.unwrap();
}

#[tokio::test]
async fn a_lost_output_blob_is_reported_with_its_position_by_log_and_resume() {
    lost_blob_reported(false).await;
    // `resume` wakes from the latest checkpoint (its cost does not grow with the
    // history), and still says what was lost before it.
    lost_blob_reported(true).await;
}

async fn lost_blob_reported(checkpointed: bool) {
    let dir = tempfile::tempdir().unwrap();
    if checkpointed {
        std::fs::write(
            dir.path().join("steadfast.toml"),
            "[harness]\ncheckpoint-every = 1\n",
        )
        .unwrap();
    }
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
    let checkpoint = String::from_utf8_lossy(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["event"].get("checkpoint").is_some())
        .filter_map(|r| r["seq"].as_u64())
        .max();
    assert_eq!(
        checkpoint.is_some_and(|at| at > seq),
        checkpointed,
        "a checkpoint after the lost blob's record: {checkpoint:?}"
    );

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
