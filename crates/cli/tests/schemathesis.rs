//! schemathesis (from PyPI) against a live `steadfast serve` with tokens configured:
//! generated requests for every operation of the served OpenAPI document, bounded and
//! seeded, must never get a 5xx and every response must conform to the document
//! (status codes, content types, headers, bodies, server-sent events).

mod common;

use std::time::Duration;

use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

const TOKEN: &str = "schemathesis-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_get_no_server_error_and_responses_match_the_document() {
    let schemathesis = std::process::Command::new("schemathesis")
        .arg("--version")
        .output();
    assert!(
        schemathesis.is_ok_and(|o| o.status.success()),
        "schemathesis is not installed: python3 -m pip install schemathesis (.ci/run does)"
    );
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("steadfast.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ntokens = [{{ owner = \"alice\", token-hash = \"{}\" }}]\n",
            steadfast_server::hash_token(TOKEN)
        ),
    )
    .unwrap();
    let mut server = common::service(
        &dir.path().join("home"),
        &fake,
        &[
            "--config",
            config.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
        ],
    )
    // With a vault key, so the vault's routes are fuzzed past their refusal.
    .env(
        "STEADFAST_VAULT_KEY",
        "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=",
    )
    .spawn()
    .unwrap();
    let stdout = server.stdout.take().unwrap();
    let url = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("serve printed its URL")
    .unwrap()
    .unwrap();
    let run = tokio::process::Command::new("schemathesis")
        .args([
            "run",
            &format!("{url}/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {TOKEN}"),
            "--max-examples",
            "50",
            "--seed",
            "1",
            "--workers",
            "1",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance",
        ])
        .env("NO_COLOR", "1")
        // Its cache stays in the test's directory, not the checkout.
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("schemathesis finished")
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("passed"), "{report}");
    let _ = server.start_kill();
}
