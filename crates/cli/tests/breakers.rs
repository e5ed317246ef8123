//! A bound stops a `steadfast run` in `escalated` (exit code 2), `steadfast log` shows
//! why with the diff, and `steadfast signal ... resume` with a raised bound lets
//! `steadfast resume` finish the task.

mod common;

use std::process::Output;

use serde_json::Value;
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

/// `steadfast run` of the demo task by a wrapped `agent` on `model`, with a spend cap.
async fn wrapped_run(
    agent: &str,
    model: &str,
    cap_usd: f64,
) -> (Output, FakeProvider, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    demo::write_project(&ws).unwrap();
    let fake = FakeProvider::start(demo::script()).await.unwrap();
    let out = tokio::process::Command::new(BIN)
        .args([
            "run",
            demo::TASK,
            "--agent",
            agent,
            "--model",
            model,
            "--json",
        ])
        .args(["--workspace", &ws.display().to_string()])
        .args(["--max-cost-usd", &cap_usd.to_string()])
        .current_dir(dir.path())
        .env("STEADFAST_HOME", dir.path().join("home"))
        .env("STEADFAST_AGENTS_DIR", common::agents_dir())
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("OPENAI_API_KEY", "test-key")
        .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url()))
        .env_remove("STEADFAST_MODEL")
        .env_remove("STEADFAST_FAULT")
        .output()
        .await
        .unwrap();
    (out, fake, dir)
}

/// The requests of the agent's own loop (those offering tools), as sent to the provider.
fn loop_requests(fake: &FakeProvider) -> Vec<Value> {
    fake.state()
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r).ok())
        .filter(|r| r.get("tools").is_some())
        .collect()
}

#[tokio::test]
async fn a_wrapped_cli_s_calls_are_fitted_to_the_spend_cap_and_never_cross_it() {
    // Each CLI at its price: the field it limits its reply with, if any.
    for (agent, model, (input, output), field) in [
        (
            "claude-code",
            "anthropic/claude-sonnet-4-5",
            (3.0, 15.0),
            "max_tokens",
        ),
        ("codex", "openai/gpt-5", (1.25, 10.0), "max_output_tokens"),
    ] {
        common::installed(agent).await;
        // A run with room to spare shows what the CLI's first request weighs.
        let (out, fake, _dir) = wrapped_run(agent, model, 100.0).await;
        assert!(out.status.success(), "{agent}: {}", common::stderr(&out));
        let first = loop_requests(&fake).remove(0);
        let bytes = first.to_string().len() as f64;
        // A cap with room for that request's worst case (each byte a token written to
        // the cache, 1,024 unseen tokens) and 3,000 output tokens.
        let cap = ((bytes + 1024.0) * input * 1.25 + 3000.0 * output) / 1e6;
        let (out, fake, _dir) = wrapped_run(agent, model, cap).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{agent}: {}",
            common::stderr(&out)
        );
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["escalated_by"], "cost", "{agent}: {result}");
        let sent = loop_requests(&fake);
        let limit = sent[0][field]
            .as_u64()
            .unwrap_or_else(|| panic!("{agent}: {}", sent[0]));
        assert!(
            (2000..4000).contains(&limit),
            "{agent}: the first call lowered to what the cap leaves room for: {limit}"
        );
        let spent = result["cost_usd"].as_f64().unwrap();
        assert!(
            spent > 0.0 && spent <= cap,
            "{agent}: spent {spent} of {cap}"
        );
    }
}
