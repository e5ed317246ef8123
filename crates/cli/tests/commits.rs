//! What goes into one commit, read on PostgreSQL from the transaction id (`xmin`) of
//! each log row: a short read runs before the reply that asks for it is committed, and
//! the reply, the read's intent and outcome and the next model call's intent go in
//! one commit (one commit per step); the reply asking for a slow read commits while
//! it runs, and the outcome of a slow read, or of a call that changes the workspace,
//! is committed alone before anything else happens.

mod common;

use std::process::Stdio;

use serde_json::json;
use steadfast_testkit::{FakeProvider, Script};

use common::{stderr, TestDatabase};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_reads_outcome_commits_with_the_next_intent_and_others_alone() {
    let db = TestDatabase::create("steadfast_commits").await;
    let read = |file: &str| json!({"name": "read", "input": {"file_path": file}});
    let script: Script = serde_json::from_value(json!({"steps": [
        // First, so the sandbox runs by the reads (a read waits for no sandbox to
        // start before its reply commits).
        {"text": "writing", "tool_calls": [{"name": "write", "input": {
            "file_path": "b.txt", "content": "b\n"}}]},
        {"text": "reading", "tool_calls": [read("a.txt")]},
        {"text": "reading again", "tool_calls": [read("a.txt")]},
        // Read-only, and far slower than the staging bound on any machine.
        {"text": "a slow look", "tool_calls": [{"name": "bash", "input": {
            "command": "head -c 100000000 /dev/urandom | wc -c"}}]},
        {"text": "done"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(["run", "write b.txt, then look", "--workspace"])
        .arg(&ws)
        .args(["--model", "anthropic/claude-sonnet-4-5", "--json"])
        .env("STEADFAST_HOME", dir.path().join("home"))
        .env("STEADFAST_WORLD", &db.url)
        .env("STEADFAST_MIGRATE", "true")
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_CONFIG")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");

    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let rows: Vec<(String, String)> = client
        .query(
            "SELECT kind, xmin::text FROM steadfast_events ORDER BY session_id, seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    drop(client);
    db.drop_now().await;

    // Each tool outcome, with whether the record after it is in the same commit.
    let shared: Vec<bool> = rows
        .iter()
        .enumerate()
        .filter(|(_, (kind, _))| kind == "tool_call_outcome")
        .map(|(i, (_, xmin))| {
            let next = &rows[i + 1];
            assert_eq!(next.0, "model_call_intent", "{rows:?}");
            &next.1 == xmin
        })
        .collect();
    assert_eq!(
        shared,
        [false, true, true, false],
        "short reads share the next intent's commit; the write and the slow read do not: {rows:?}"
    );
    // Each tool outcome, with whether the reply that asked for it is in the same
    // commit: a short read runs before the reply commits, so its whole step is one
    // commit; the slow read's reply commits (with the read's intent) while it runs.
    let with_reply: Vec<bool> = rows
        .iter()
        .enumerate()
        .filter(|(_, (kind, _))| kind == "tool_call_outcome")
        .map(|(i, (_, xmin))| {
            let reply = rows[..i]
                .iter()
                .rposition(|(kind, _)| kind == "model_call_outcome")
                .unwrap();
            assert_eq!(rows[reply + 1].0, "tool_call_intent", "{rows:?}");
            &rows[reply].1 == xmin
        })
        .collect();
    assert_eq!(
        with_reply,
        [false, true, true, false],
        "a short read's step is one commit: {rows:?}"
    );
    let slow = rows
        .iter()
        .enumerate()
        .filter(|(_, (kind, _))| kind == "model_call_outcome")
        .nth(3)
        .unwrap()
        .0;
    assert_eq!(
        rows[slow].1,
        rows[slow + 1].1,
        "the slow read's intent is committed with its reply: {rows:?}"
    );
}
