//! PostgreSQL restarted in the middle of a run: workers and API processes reconnect
//! and every session completes. The server restarted is the test's own (a cluster made
//! with `initdb` in a temporary directory, on a port of its own), never the machine's.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::postgres::PrivatePostgres;
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_complete_across_a_database_restart() {
    let text = "Step by step, slowly, so the restart lands in the middle of the work.";
    let step = |n: u32| json!({"text": text, "chunk_delay_ms": 60, "tool_calls": [{"name": "bash", "input": {"command": format!("echo {n} >> progress.txt")}}]});
    let script: Script = serde_json::from_value(
        json!({"steps": [step(1), step(2), step(3), step(4), {"text": "done"}]}),
    )
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let postgres = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .unwrap()
        .expect("a private PostgreSQL server starts");
    let world = postgres.url("postgres");
    let dir = tempfile::tempdir().unwrap();
    let home: PathBuf = dir.path().join("home");
    let command = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("STEADFAST_HOME", &home)
            .env("STEADFAST_WORLD", &world)
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", fake.base_url())
            .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(steadfast_testkit::service_log::stderr(env!(
                "CARGO_TARGET_TMPDIR"
            )))
            .kill_on_drop(true);
        cmd
    };
    assert!(command(&["migrate"])
        .output()
        .await
        .unwrap()
        .status
        .success());
    let mut api = command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
        .spawn()
        .unwrap();
    let url = tokio::io::BufReader::new(api.stdout.take().unwrap())
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let _workers: Vec<_> = (0..2)
        .map(|_| command(&["worker", "--workers", "2"]).spawn().unwrap())
        .collect();
    let http = reqwest::Client::new();
    let mut sessions = Vec::new();
    for i in 0..5 {
        let created: Value = http
            .post(format!("{url}/v1/sessions"))
            .json(&json!({"task": format!("job {i}")}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sessions.push(created);
    }
    // Restart the database once the work is under way, before it is done.
    let lines = |s: &Value| {
        std::fs::read_to_string(common::workspace_in(&home, s).join("progress.txt"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    for _ in 0..200 {
        if sessions.iter().any(|s| lines(s) > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unfinished = sessions.iter().filter(|s| lines(s) < 4).count();
    assert!(
        unfinished > 0,
        "the restart lands in the middle of the work"
    );
    let before = start_time(&world).await;
    let postgres = tokio::task::spawn_blocking(move || {
        postgres.restart().expect("the private server restarts");
        postgres
    })
    .await
    .unwrap();
    assert_ne!(
        start_time(&world).await,
        before,
        "the server restarted: {}",
        postgres.log()
    );

    let mut done = false;
    for _ in 0..900 {
        let mut idle = 0;
        for s in &sessions {
            let resp = http
                .get(format!("{url}/v1/sessions/{}", s["id"].as_str().unwrap()))
                .send()
                .await;
            if let Ok(resp) = resp {
                if let Ok(shown) = resp.json::<Value>().await {
                    if shown["status"] == "idle" {
                        idle += 1;
                    }
                }
            }
        }
        if idle == sessions.len() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "every session completed after the restart");
    for s in &sessions {
        let ws = common::workspace_in(&home, s);
        assert_eq!(
            std::fs::read_to_string(ws.join("progress.txt")).unwrap(),
            "1\n2\n3\n4\n"
        );
    }
    drop(postgres);
}

/// When the server at `url` started (`pg_postmaster_start_time()`).
async fn start_time(url: &str) -> String {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .unwrap();
    row.get(0)
}
