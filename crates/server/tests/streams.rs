//! A thousand event streams hold a bounded number of threads. Alone in its test
//! binary: it counts the process's threads, which other tests would add to.

mod common;

use std::time::Duration;

use common::{call, dev, server};
use serde_json::{json, Value};

fn names() -> std::collections::BTreeMap<String, usize> {
    let mut names = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        *names.entry(name.trim().to_string()).or_default() += 1;
    }
    names
}

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_event_streams_hold_a_bounded_number_of_threads() {
    // A turn that keeps appending (streamed text, tool calls) for several seconds, so
    // every append wakes every stream at once.
    let talk = "a reply that streams in many small pieces, each journaled as it comes. ".repeat(8);
    let step = json!({"text": talk, "chunk_delay_ms": 15, "tool_calls": [{"name": "bash", "input": {"command": "true"}}]});
    let mut steps = vec![step; 12];
    steps.push(json!({"text": "done"}));
    let srv = server(Value::Array(steps), dev(), 1, |_| {}).await;
    let (_, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", srv.url),
        None,
        Some(json!({"task": "wait"})),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    common::wait_status(&srv.url, &id, None, "running").await;
    let before = threads();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut streams = Vec::new();
    for _ in 0..1000 {
        let resp = client
            .get(format!("{}/v1/sessions/{id}/events", srv.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        streams.push(resp);
    }
    // Long enough for every stream to poll the log several times.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = threads();
    assert!(
        during < before + 64,
        "threads: {before} before, {during} with 1,000 streams: {:?}",
        names()
    );
    drop(streams);
}
