//! A bound stops a `steadfast run` in `escalated` (exit code 2), `steadfast log` shows
//! why with the diff, and `steadfast signal ... resume` with a raised bound lets
//! `steadfast resume` finish the task.

use std::process::Output;

use steadfast_testkit::{demo, FakeProvider};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

async fn steadfast(dir: &std::path::Path, fake: &FakeProvider, args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("STEADFAST_HOME", dir.join("home"))
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_MODEL")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_token_limit_escalates_shows_in_the_log_and_a_raised_limit_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    demo::write_project(&ws).unwrap();
    let fake = FakeProvider::start(demo::script()).await.unwrap();
    let ws_arg = ws.display().to_string();
    let model = "anthropic/claude-sonnet-4-5";
    let run = steadfast(
        dir.path(),
        &fake,
        &[
            "run",
            demo::TASK,
            "--workspace",
            &ws_arg,
            "--model",
            model,
            // Passed after the edit of stats.py (the fourth reply), not before: every
            // request carries the tools' specs, so a tool more moves this.
            "--max-tokens",
            "4000",
            "--json",
        ],
    )
    .await;
    assert_eq!(
        run.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(result["status"], "escalated");
    assert_eq!(result["escalated_by"], "tokens");
    let session = result["session"].as_str().unwrap().to_string();
    let calls = fake.calls();
    assert!(calls >= 2, "stopped after the limit was passed, not before");

    let log = steadfast(dir.path(), &fake, &["log", &session]).await;
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        text.contains("escalated by the tokens breaker: token limit reached"),
        "{text}"
    );
    assert!(
        text.contains("modified stats.py"),
        "the diff since the start: {text}"
    );

    // Resuming without the signal does nothing; with a raised limit it finishes.
    let again = steadfast(dir.path(), &fake, &["resume", &session]).await;
    assert_eq!(again.status.code(), Some(2));
    assert_eq!(fake.calls(), calls);
    let signal = steadfast(
        dir.path(),
        &fake,
        &["signal", &session, "resume", r#"{"max_tokens": 1000000}"#],
    )
    .await;
    assert!(
        signal.status.success(),
        "{}",
        String::from_utf8_lossy(&signal.stderr)
    );
    let resumed = steadfast(dir.path(), &fake, &["resume", &session, "--json"]).await;
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    assert!(std::fs::read_to_string(ws.join("CHANGELOG.md"))
        .unwrap()
        .contains("off-by-one"));
}
