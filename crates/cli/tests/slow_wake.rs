//! A wake that takes longer than the lease never runs two drivers at once. A worker on
//! a new host takes a session over and must first hydrate its workspace from an S3
//! bucket that answers slowly — far longer than the lease's time to live. The lease is
//! renewed from the moment it is taken, so the host's other worker (or any other)
//! cannot take the session meanwhile: the turn is driven under one epoch and
//! its model call is made once.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{kind, TestDatabase};

/// How long the slow bucket holds back each piece of each answer.
const STALL: Duration = Duration::from_millis(1000);

/// A TCP relay to `to` that holds back every piece of the server's answers by `stall`.
async fn slow_relay(to: u16, stall: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                continue;
            };
            let (mut c_read, mut c_write) = client.into_split();
            let (mut s_read, mut s_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut c_read, &mut s_write).await;
            });
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match s_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    tokio::time::sleep(stall).await;
                    if c_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_longer_than_the_lease_never_runs_two_drivers_at_once() {
    let db = TestDatabase::create(&format!("steadfast_slow_wake_{}", std::process::id())).await;
    let moto = common::Moto::start("slow");
    let moto_port: u16 = moto.endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let slow = format!("http://127.0.0.1:{}", slow_relay(moto_port, STALL).await);
    let fake = common::fake_playing(json!([
        {"text": "Writing.", "tool_calls": [{"name": "bash", "input": {
            "command": "for i in $(seq 40); do echo \"file $i\" > f$i.txt; done"}}]},
        {"text": "Written."},
        {"text": "Again."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        "[harness]\nlease-ttl-secs = 3\n",
    )
    .unwrap();
    // A machine of its own for each name (its home, its host identity); the world
    // and the bucket are all they share.
    let host = |name: &str, s3: &str, args: &[&str]| {
        let mut cmd = common::service(&dir.path().join(name), &fake, args);
        cmd.env("STEADFAST_HOST_ID", name)
            .env("STEADFAST_WORLD", &db.url)
            .env("STEADFAST_MIGRATE", "true")
            .env("STEADFAST_BLOBS", "s3://slow/steadfast")
            .env("AWS_ENDPOINT", s3)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("STEADFAST_CONFIG", dir.path().join("steadfast.toml"));
        cmd
    };
    let mut api = host(
        "api",
        &moto.endpoint,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    let mut first = host("first", &moto.endpoint, &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    let (status, created) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"workspace": {"kind": "empty"}, "task": "write the files"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    common::idle_after(&url, &id, 1).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();

    // A new host, with two worker processes, reaching the bucket only through the
    // slow relay.
    let _second = host("second", &slow, &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    let _third = host("second", &slow, &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    let queued = steadfast_world::now_ms();
    common::queue_message(&url, &id, "again").await;
    let shown = tokio::time::timeout(Duration::from_secs(240), common::idle_after(&url, &id, 2))
        .await
        .expect("the second turn ended");
    assert_eq!(shown["reply"], "Again.", "{shown}");

    let out = host("api", &moto.endpoint, &["log", &id, "--json"])
        .output()
        .await
        .unwrap();
    let log: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let turn_two = log
        .iter()
        .rposition(|r| kind(r) == "user_message")
        .expect("the second turn's message");
    // The test's premise: the wake (taking the message, after hydrating the
    // workspace) took longer than the lease (3 s).
    let taken = log[turn_two]["at_ms"].as_u64().unwrap();
    eprintln!("the wake took {} ms", taken.saturating_sub(queued));
    assert!(
        taken.saturating_sub(queued) > 3_000,
        "the wake took {} ms, not longer than the lease: the bucket was not slow enough",
        taken.saturating_sub(queued)
    );
    let epochs: std::collections::BTreeSet<u64> = log[turn_two + 1..]
        .iter()
        .map(|r| r["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(
        epochs.len(),
        1,
        "one driver drove the turn: {kinds:?} {epochs:?}"
    );
    // And it was the first to take the session after the last turn: no other holder
    // took the lease while it woke (one whose taking was later fenced off leaves no
    // record of its own, only the epoch it took).
    let before = log[turn_two - 1]["epoch"].as_u64().unwrap();
    assert_eq!(
        epochs.first().copied(),
        Some(before + 1),
        "the lease was taken once between the turns: {kinds:?}"
    );
    assert_eq!(fake.calls(), 3, "each model call was made once: {kinds:?}");
    assert_eq!(fake.state().distinct_requests(), 3, "{kinds:?}");
    drop(api);
    db.drop_now().await;
}
