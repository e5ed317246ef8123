//! PostgreSQL restarted in the middle of a run: workers and API processes reconnect
//! and every session completes. (Its own test binary: it restarts the machine's
//! server, which no other test may be using at the time.)

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

fn admin() -> String {
    std::env::var("STEADFAST_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn admin_client() -> Option<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(&admin(), tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(client)
}

fn restart_postgres() {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("a Debian PostgreSQL cluster")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .max()
        .unwrap();
    let status = std::process::Command::new("pg_ctlcluster")
        .args([
            "--skip-systemctl-redirect",
            &version,
            "main",
            "restart",
            "--",
            "-m",
            "fast",
        ])
        .status()
        .expect("pg_ctlcluster runs");
    assert!(status.success(), "PostgreSQL restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_complete_across_a_database_restart() {
    let text = "Step by step, slowly, so the restart lands in the middle of the work.";
    let step = |n: u32| json!({"text": text, "chunk_delay_ms": 60, "tool_calls": [{"name": "bash", "input": {"command": format!("echo {n} >> progress.txt")}}]});
    let script: Script = serde_json::from_value(
        json!({"steps": [step(1), step(2), step(3), step(4), {"text": "done"}]}),
    )
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let client = admin_client().await.expect("PostgreSQL must be running");
    let db = format!("steadfast_restart_{}", std::process::id());
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    drop(client);
    let base = admin();
    let world = format!("{}/{db}", &base[..base.rfind('/').unwrap()]);
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
            .stderr(Stdio::null())
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
    restart_postgres();

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
    if let Some(client) = admin_client().await {
        let _ = client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .await;
    }
}
