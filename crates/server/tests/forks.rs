//! Forking through the API: the forks are the caller's, begin at the position asked
//! with the parent's workspace there, go on by themselves, and outlive the parent.

mod common;

use common::{assert_error, call, dev, server, tokens, wait_status};
use reqwest::Method;
use serde_json::json;

fn bash(command: &str) -> serde_json::Value {
    json!({"text": "running", "tool_calls": [{"name": "bash", "input": {"command": command}}]})
}

#[tokio::test]
async fn forks_through_the_api_outlive_their_parent() {
    let s = server(
        json!([
            bash("echo one >> notes.txt"),
            {"text": "turn one done"},
            bash("echo two >> notes.txt"),
            {"text": "turn two done"},
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = s
        .create(json!({"task": "work", "title": "parent", "workspace": {"kind": "empty", "files": {"notes.txt": "zero\n"}}}))
        .await;
    let parent = created["id"].as_str().unwrap().to_string();
    let shown = wait_status(&s.url, &parent, None, "idle").await;
    let end_of_turn_one = shown["last_seq"].as_u64().unwrap();
    let fork_url = format!("{}/v1/sessions/{parent}/fork", s.url);

    // Refused, naming the field, and nothing made.
    for (body, field) in [
        (json!({"at": 0}), "at"),
        (json!({"at": end_of_turn_one + 1}), "at"),
        (json!({"count": 0}), "count"),
        (json!({"count": 33}), "count"),
        (json!({"model": "no-provider"}), "model"),
    ] {
        let got = call(Method::POST, &fork_url, None, Some(body.clone())).await;
        assert_eq!(got.0, 422, "{body}: {got:?}");
        assert!(
            got.1["error"]["message"].as_str().unwrap().contains(field),
            "{body}: {got:?}"
        );
    }
    assert_eq!(s.show(&parent).await["children"], json!([]));

    let (status, made) = call(
        Method::POST,
        &fork_url,
        None,
        Some(json!({"count": 2, "title": "a fork"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let forks: Vec<String> = made["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(forks.len(), 2);
    for fork in &made["sessions"].as_array().unwrap()[..] {
        assert_eq!(fork["parent"], parent.as_str());
        assert_eq!(fork["forked_at"], end_of_turn_one);
        assert_eq!(fork["status"], "idle");
        assert_eq!(fork["title"], "a fork");
    }
    assert_eq!(s.show(&parent).await["children"], json!(forks));
    let child = s.show(&forks[0]).await;
    assert_eq!(
        (child["parent"].as_str(), child["forked_at"].as_u64()),
        (Some(parent.as_str()), Some(end_of_turn_one))
    );
    assert_eq!(
        child["reply"], "turn one done",
        "the history is the parent's"
    );

    // The parent goes away; the first fork takes a message and works from the
    // parent's files as they were at the fork.
    let (status, _) = call(
        Method::DELETE,
        &format!("{}/v1/sessions/{parent}", s.url),
        None,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, queued) = call(
        Method::POST,
        &format!("{}/v1/sessions/{}/messages", s.url, forks[0]),
        None,
        Some(json!({"text": "more"})),
    )
    .await;
    assert!(status == 200 || status == 202, "{queued}");
    let done = wait_status(&s.url, &forks[0], None, "idle").await;
    assert_eq!(done["reply"], "turn two done", "{done}");
    let (status, file) = call(
        Method::GET,
        &format!("{}/v1/sessions/{}/files/notes.txt", s.url, forks[0]),
        None,
        None,
    )
    .await;
    assert_eq!((status, file), (200, json!("zero\none\ntwo\n")));
    // Its log reads whole, the shared part included, and verifies.
    let events: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/sessions/{}/events?limit=1000",
            s.url, forks[0]
        ))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds.first(), Some(&"session_started"), "{kinds:?}");
    assert!(kinds.contains(&"forked"), "{kinds:?}");
    let (status, integrity) = call(
        Method::GET,
        &format!("{}/v1/sessions/{}/integrity", s.url, forks[0]),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{integrity}");
}

#[tokio::test]
async fn only_the_owner_forks() {
    let s = server(json!([{"text": "done"}]), tokens(), 1, |_| {}).await;
    let (status, created) = call(
        Method::POST,
        &format!("{}/v1/sessions", s.url),
        Some("alice-secret"),
        Some(json!({"task": "work"})),
    )
    .await;
    assert_eq!(status, 201);
    let id = created["id"].as_str().unwrap();
    wait_status(&s.url, id, Some("alice-secret"), "idle").await;
    let url = format!("{}/v1/sessions/{id}/fork", s.url);
    assert_error(
        &call(Method::POST, &url, Some("bob-secret"), Some(json!({}))).await,
        404,
        "session_not_found",
    );
    assert_error(
        &call(Method::POST, &url, None, Some(json!({}))).await,
        401,
        "unauthorized",
    );
    let (status, made) = call(Method::POST, &url, Some("alice-secret"), Some(json!({}))).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["sessions"][0]["owner"], "alice");
}

#[tokio::test]
async fn a_rewind_through_the_api_goes_back_and_keeps_what_followed() {
    let s = server(
        json!([
            bash("echo one > one.txt"),
            {"text": "turn one done"},
            bash("echo two > two.txt"),
            {"text": "turn two done"},
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let id = s.create(json!({"task": "one"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let end_of_one = wait_status(&s.url, &id, None, "idle").await["last_seq"]
        .as_u64()
        .unwrap();
    let (status, _) = call(
        Method::POST,
        &format!("{}/v1/sessions/{id}/messages", s.url),
        None,
        Some(json!({"text": "two"})),
    )
    .await;
    assert!(status == 200 || status == 202);
    let mut shown = wait_status(&s.url, &id, None, "idle").await;
    for _ in 0..200 {
        if shown["turn"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        shown = wait_status(&s.url, &id, None, "idle").await;
    }
    let last = shown["last_seq"].as_u64().unwrap();
    let url = format!("{}/v1/sessions/{id}/rewind", s.url);

    for (body, status) in [
        (json!({"to": 0}), 422),
        (json!({"to": last}), 422),
        (json!({"to": end_of_one + 2}), 422),
        (json!({}), 422),
    ] {
        let got = call(Method::POST, &url, None, Some(body.clone())).await;
        assert_eq!(got.0, status, "{body}: {got:?}");
        assert!(
            got.1["error"]["message"].as_str().unwrap().contains("to"),
            "{body}: {got:?}"
        );
    }

    let (status, rewound) = call(Method::POST, &url, None, Some(json!({"to": end_of_one}))).await;
    assert_eq!(status, 200, "{rewound}");
    assert_eq!(
        (rewound["to"].as_u64(), rewound["status"].as_str()),
        (Some(end_of_one), Some("idle"))
    );
    let branch = rewound["branch"].as_str().unwrap();
    let shown = s.show(&id).await;
    assert_eq!(shown["reply"], "turn one done", "{shown}");
    assert_eq!(shown["last_seq"], last + 1);
    let file = |session: &str, path: &str| {
        let url = format!("{}/v1/sessions/{session}/files/{path}", s.url);
        async move { call(Method::GET, &url, None, None).await.0 }
    };
    assert_eq!(file(&id, "one.txt").await, 200);
    assert_eq!(
        file(&id, "two.txt").await,
        404,
        "the workspace is as it was at the turn's end"
    );
    assert_eq!(
        file(branch, "two.txt").await,
        200,
        "what followed is kept in the branch"
    );
    assert_eq!(s.show(branch).await["reply"], "turn two done");
    // The stream goes on with the rewind, positions moving forward.
    let events: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/sessions/{id}/events?after={end_of_one}",
            s.url
        ))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0]["type"].as_str(), events[0]["seq"].as_u64()),
        (Some("rewound"), Some(last + 1))
    );
}

#[tokio::test]
async fn a_fork_takes_bounds_of_its_own_within_the_ceilings() {
    let s = server(json!([{"text": "done"}]), dev(), 1, |state| {
        state.ceilings.max_turns = Some(10);
    })
    .await;
    let id = s
        .create(json!({"task": "work", "budget": {"max_tokens": 5000}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_status(&s.url, &id, None, "idle").await;
    let url = format!("{}/v1/sessions/{id}/fork", s.url);
    let over = call(
        Method::POST,
        &url,
        None,
        Some(json!({"budget": {"max_turns": 11}})),
    )
    .await;
    assert_error(&over, 403, "over_ceiling");
    assert!(
        over.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget.max_turns"),
        "{over:?}"
    );
    let zero = call(
        Method::POST,
        &url,
        None,
        Some(json!({"budget": {"max_turns": 0}})),
    )
    .await;
    assert_eq!(zero.0, 422, "{zero:?}");
    assert_eq!(s.show(&id).await["children"], json!([]), "nothing made");

    let (status, made) = call(
        Method::POST,
        &url,
        None,
        Some(json!({"budget": {"max_turns": 3}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let fork = s.show(made["sessions"][0]["id"].as_str().unwrap()).await;
    assert_eq!(fork["limits"]["max_turns"], 3, "{fork}");
    assert_eq!(
        fork["limits"]["max_tokens"], 5000,
        "the parent's other bounds stay: {fork}"
    );
}

/// `POST /v1/sessions/{id}/agent` moves a wrapped session to another CLI version,
/// recorded in its events; bad input is a 422 naming `agent`, a native session is
/// refused, and another owner's session is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_sessions_agent_is_changed_through_the_api() {
    // A harness with an Anthropic upstream (never called), so Claude Code sessions can
    // be made.
    let s = server(json!([]), tokens(), 0, |state| {
        let home = state.workspaces.parent().unwrap().to_path_buf();
        let mut options = steadfast_harness::HarnessOptions::fake_provider("http://127.0.0.1:9");
        options.agents.upstreams.anthropic = Some(steadfast_gateway::Upstream {
            base_url: "http://127.0.0.1:9".into(),
            api_key: "unused".into(),
        });
        state.harness =
            std::sync::Arc::new(steadfast_harness::Harness::open_local(&home, options).unwrap());
    })
    .await;
    // Stand-ins for the CLI at two versions, where this server looks for them.
    let agents = s._dir.path().join("home/agents");
    for version in ["2.1.197", "2.1.332"] {
        let adapter = steadfast_wrap::Adapter::named("claude-code")
            .unwrap()
            .at_version(Some(version))
            .unwrap();
        let manifest = adapter
            .prefix(&agents)
            .join("node_modules")
            .join(adapter.package)
            .join("package.json");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::write(&manifest, json!({"version": version}).to_string()).unwrap();
        let bin = adapter.executable(&agents);
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(bin, "#!/bin/sh\n").unwrap();
    }
    let sessions = format!("{}/v1/sessions", s.url);
    let (status, created) = call(
        Method::POST,
        &sessions,
        Some("alice-secret"),
        Some(json!({"agent": "claude-code", "model": "anthropic/claude-sonnet-4-5"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let agent = format!("{sessions}/{id}/agent");
    let (status, changed) = call(
        Method::POST,
        &agent,
        Some("alice-secret"),
        Some(json!({"agent": "claude-code@2.1.332"})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["cli"], "@anthropic-ai/claude-code@2.1.332");
    let (_, events) = call(
        Method::GET,
        &format!("{sessions}/{id}/events"),
        Some("alice-secret"),
        None,
    )
    .await;
    assert!(events.to_string().contains("agent_changed"), "{events}");
    for bad in [
        json!({"agent": "claude-code@not a version"}),
        json!({"agent": "claude-code@9.9.9"}),
        json!({"agent": "codex"}),
    ] {
        let got = call(Method::POST, &agent, Some("alice-secret"), Some(bad)).await;
        assert_error(&got, 422, "invalid_body");
        assert!(got.1.to_string().contains("agent"), "{}", got.1);
    }
    assert_error(
        &call(
            Method::POST,
            &agent,
            Some("bob-secret"),
            Some(json!({"agent": "claude-code"})),
        )
        .await,
        404,
        "session_not_found",
    );
    let (_, native) = call(
        Method::POST,
        &sessions,
        Some("alice-secret"),
        Some(json!({})),
    )
    .await;
    let got = call(
        Method::POST,
        &format!("{sessions}/{}/agent", native["id"].as_str().unwrap()),
        Some("alice-secret"),
        Some(json!({"agent": "claude-code"})),
    )
    .await;
    assert_error(&got, 422, "invalid");
    assert!(got.1.to_string().contains("native loop"), "{}", got.1);
}
