//! Services: a dev server the agent starts with the `service` tool keeps answering
//! after its call, after the worker driving the session is SIGKILLed (the next worker
//! adopts the sandbox, services and all), and in the next turn, whose new sandbox
//! starts it again — which the log records and the model is told. The API lists it.

mod common;

use std::time::Duration;

use common::{agents_dir, call, installed, kind, wait_for};
use serde_json::json;

const PROBE: &str = "curl -s localhost:8000/ | grep -o 'Directory listing' | head -n 1";

async fn a_service_survives_the_harness_and_comes_back_with_the_sandbox(agent: &str, sleep: &str) {
    let label = agent;
    let fake = common::fake_playing(json!([
        {"text": "A server.", "tool_calls": [{"name": "service", "input": {
            "action": "start", "name": "web", "command": "python3 -m http.server 8000", "port": 8000}}]},
        {"text": "Waiting.", "tool_calls": [{"name": "bash", "input": {"command": format!("{PROBE}; sleep {sleep}; echo slept")}}]},
        {"text": "Still there?", "tool_calls": [{"name": "bash", "input": {"command": PROBE}}]},
        {"text": "Served."},
        {"text": "Again?", "tool_calls": [{"name": "bash", "input": {"command": PROBE}}]},
        {"text": "Served again."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        "[sandbox]\nbackend = \"bwrap\"\n[harness]\nlease-ttl-secs = 6\n",
    )
    .unwrap();
    let (_api, mut worker, url) = common::site_api(dir.path(), &agents_dir(), &fake).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({
            "agent": agent, "model": "anthropic/claude-sonnet-4-5",
            "workspace": {"kind": "empty"}, "task": "serve",
        })),
    )
    .await;
    assert_eq!(status, 201, "{label}: {created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the second command to run", async || {
        common::running(&format!("sleep {sleep}"))
    })
    .await;
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    let (_next, shown) = common::next_worker_ends_turn(dir.path(), &fake, &url, &id).await;
    assert_eq!(shown["reply"], "Served.", "{label}: {shown}");

    let (status, missing) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/ses_nothing/services"),
        None,
    )
    .await;
    assert_eq!(status, 404, "{label}: {missing}");
    assert!(
        missing["error"]["message"].is_string(),
        "{label}: {missing}"
    );
    let (status, listed) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}/services"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{label}: {listed}");
    assert_eq!(listed["services"][0]["name"], "web", "{label}: {listed}");
    assert_eq!(listed["services"][0]["port"], 8000, "{label}: {listed}");
    assert_eq!(listed["services"][0]["restarts"], 0, "{label}: {listed}");

    // The next turn gets a new sandbox: the service is started again in it.
    common::queue_message(&url, &id, "again").await;
    let shown = tokio::time::timeout(Duration::from_secs(120), common::idle_after(&url, &id, 2))
        .await
        .unwrap_or_else(|_| panic!("{label}: the second turn ended"));
    assert_eq!(shown["reply"], "Served again.", "{label}: {shown}");

    let log = common::site_log(dir.path(), &fake, &id).await;
    let kinds: Vec<String> = log.iter().map(kind).collect();
    let of = |kind_: &str| common::events_of(&log, kind_);
    assert!(
        of("tool_call_interrupted").is_empty(),
        "{label}: nothing was cut off: {kinds:?}"
    );
    let probes: Vec<String> = of("tool_call_outcome")
        .into_iter()
        .map(|o| o["output"].to_string())
        .filter(|o| o.contains("Directory listing"))
        .collect();
    // The probe before the crash, the one after it (the adopted sandbox's server),
    // and the next turn's (the server started again).
    assert_eq!(
        probes.len(),
        3,
        "{label}: the server answered each time: {kinds:?}"
    );
    assert!(
        probes[2].contains("its services were started again"),
        "{label}: the model is told: {}",
        probes[2]
    );
    let restarted = of("services_restarted");
    assert_eq!(restarted.len(), 1, "{label}: {kinds:?}");
    assert_eq!(restarted[0]["services"][0][0], "web", "{label}");
    assert_eq!(restarted[0]["services"][0][1], "started", "{label}");
    let (_, listed) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}/services"),
        None,
    )
    .await;
    assert_eq!(listed["services"][0]["restarts"], 1, "{label}: {listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_survives_the_harness_and_comes_back_with_a_new_sandbox() {
    installed("claude-code").await;
    for (agent, sleep) in [("native", "4.91"), ("claude-code", "4.92")] {
        a_service_survives_the_harness_and_comes_back_with_the_sandbox(agent, sleep).await;
    }
}
