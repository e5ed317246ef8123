//! Tools a session's client runs: the model calls one, the session waits holding no
//! worker, the worker is SIGKILLed, the client posts the result later through the API
//! and a new worker finishes the turn with it. The call was emitted once, answered
//! once, and the model saw the client's result.

use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{call, last_kind_and_holder, service, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_is_answered_after_the_worker_dies_and_asked_once() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "let me look it up", "tool_calls": [{"name": "lookup_ticket", "input": {"id": 4521}}]},
        {"text": "ticket 4521 is open and alice has it"},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut api = service(
        &home,
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    let sessions = format!("{url}/v1/sessions");
    let tool = json!({
        "name": "lookup_ticket",
        "description": "Look a ticket up in the team's tracker",
        "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    });

    // Refused before anything is made: a built-in's name, a schema that is not an object.
    for bad in [
        json!({"tools": [{"name": "bash", "input_schema": {"type": "object"}}]}),
        json!({"tools": [{"name": "t", "input_schema": {"type": "string"}}]}),
    ] {
        let (status, body) = call(reqwest::Method::POST, &sessions, Some(bad)).await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("tools"),
            "{body}"
        );
    }

    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(json!({"task": "what about ticket 4521?", "tools": [tool]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let session = format!("{sessions}/{id}");
    let mut worker = service(&home, &fake, &["worker"]).spawn().unwrap();

    let mut shown = Value::Null;
    wait_for("the session to wait for the client", async || {
        shown = call(reqwest::Method::GET, &session, None).await.1;
        shown["status"] == "waiting"
    })
    .await;
    let waiting = &shown["waiting_call"];
    assert_eq!(waiting["tool"], "lookup_ticket", "{shown}");
    assert_eq!(waiting["input"], json!({"id": 4521}));
    let call_id = waiting["call_id"].as_str().unwrap().to_string();
    assert_eq!(
        shown["waiting_for"].as_str(),
        Some(format!("tool_result.{call_id}").as_str())
    );
    // Waiting holds no worker: the lease is free, and the worker dies.
    wait_for("the lease to be let go", async || {
        last_kind_and_holder(&home).1 == 0
    })
    .await;
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();

    // Only the awaited call is answered, once.
    let results = format!("{session}/tool_results");
    let (status, body) = call(
        reqwest::Method::POST,
        &results,
        Some(json!({"call_id": "toolu_other", "content": "no"})),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("not_waiting"))
    );
    let answer = json!({"call_id": call_id, "content": "ticket 4521: open, assigned to alice"});
    let (status, body) = call(reqwest::Method::POST, &results, Some(answer.clone())).await;
    assert_eq!(status, 202, "{body}");
    let (status, _) = call(
        reqwest::Method::POST,
        &format!("{session}/signals/tool_result.{call_id}"),
        Some(json!({"content": "sneaky"})),
    )
    .await;
    assert_eq!(status, 422, "not through the generic signal route");

    // A new worker finishes the turn with the client's result.
    let _worker = service(&home, &fake, &["worker"]).spawn().unwrap();
    wait_for("the turn to finish", async || {
        call(reqwest::Method::GET, &session, None).await.1["status"] == "idle"
    })
    .await;
    let (status, _) = call(reqwest::Method::POST, &results, Some(answer)).await;
    assert_eq!(status, 409, "a call is answered once");

    assert_eq!(fake.calls(), 2, "no model call asked twice");
    let second: Value = serde_json::from_str(&fake.state().requests()[1]).unwrap();
    let result = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result")
        .expect("the model got the tool's result");
    assert_eq!(result["tool_use_id"], call_id.as_str());
    assert!(
        result
            .to_string()
            .contains("ticket 4521: open, assigned to alice"),
        "{result}"
    );
    assert!(second["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "lookup_ticket"));

    // The call is in the log once, as is its wait and its answer.
    let page: Value = reqwest::Client::new()
        .get(format!("{session}/events?limit=1000"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = page["events"].as_array().unwrap();
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(count("tool_call_intent"), 1);
    assert_eq!(count("wait_started"), 1);
    assert_eq!(count("signal_received"), 1);
    let intent = events
        .iter()
        .find(|e| e["type"] == "tool_call_intent")
        .unwrap();
    assert_eq!(
        (&intent["call_id"], &intent["class"]),
        (&json!(call_id), &json!("external"))
    );
    assert_eq!(events.last().unwrap()["type"], "turn_ended");
    tokio::time::sleep(Duration::from_millis(10)).await;
}
