//! What a browser page gets: the seed-003 `EventSource` snippet (`onmessage`) sees
//! every event of a session exactly once across a dropped connection, and CORS lets
//! only the configured origins in.

mod common;

use std::path::PathBuf;

use common::{call, server, tokens};
use serde_json::{json, Value};

/// The pinned npm `eventsource` package, the WHATWG `EventSource` for Node.
const EVENTSOURCE: &str = "eventsource@5.1.5";

/// A directory whose `node_modules` holds [`EVENTSOURCE`], installed once per machine.
async fn eventsource_package() -> PathBuf {
    let dir = std::env::var_os("STEADFAST_TEST_NPM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/steadfast-test-npm"))
        .join(EVENTSOURCE.replace('@', "-"));
    if !dir.join("node_modules/eventsource/package.json").exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let out = tokio::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(EVENTSOURCE)
            .output()
            .await
            .expect("npm runs");
        assert!(
            out.status.success(),
            "npm install {EVENTSOURCE}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

fn slow_steps() -> Value {
    let text = "Working through it one careful step at a time, saying what I do as I go.";
    json!([
        {"text": text, "chunk_delay_ms": 10, "tool_calls": [{"name": "write", "input": {"file_path": "a.txt", "content": "one\n"}}]},
        {"text": text, "chunk_delay_ms": 10, "tool_calls": [{"name": "bash", "input": {"command": "sleep 0.3; cat a.txt"}}]},
        {"text": "All done.", "chunk_delay_ms": 10}
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_event_source_sees_every_event_once_across_a_reconnect() {
    let package = eventsource_package().await;
    let srv = server(slow_steps(), tokens(), 1, |_| {}).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", srv.url),
        Some("alice-secret"),
        Some(json!({"task": "go"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();

    // The page's script, beside the package it imports.
    let page = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        package.join("node_modules"),
        page.path().join("node_modules"),
    )
    .unwrap();
    let script = page.path().join("read_stream.mjs");
    std::fs::write(&script, include_str!("browser/read_stream.mjs")).unwrap();
    let out = tokio::process::Command::new("node")
        .arg(&script)
        .arg(format!("{}/v1/sessions/{id}/events", srv.url))
        .arg("alice-secret")
        .arg("1500")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        seen["ended"], true,
        "the named `end` closed the stream: {seen}"
    );
    let reconnects = seen["reconnects"].as_array().unwrap();
    assert!(
        !reconnects.is_empty() && reconnects[0].as_str().is_some_and(|s| !s.is_empty()),
        "the client reconnected by itself with Last-Event-ID: {seen}"
    );

    let (_, shown) = call(
        reqwest::Method::GET,
        &format!("{}/v1/sessions/{id}", srv.url),
        Some("alice-secret"),
        None,
    )
    .await;
    let last_seq = shown["last_seq"].as_u64().unwrap();
    let events = seen["events"].as_array().unwrap();
    let ids: Vec<u64> = events
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=last_seq).collect::<Vec<_>>(),
        "onmessage saw every log position exactly once, in order"
    );
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for kind in [
        "session_started",
        "user_message",
        "model_delta",
        "tool_call_outcome",
        "turn_ended",
    ] {
        assert!(kinds.contains(&kind), "a `{kind}` frame: {kinds:?}");
    }

    // The same events as JSON pages, for clients that poll.
    let events_url = format!("{}/v1/sessions/{id}/events", srv.url);
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = reqwest::Client::new()
            .get(format!("{events_url}?after={after}&limit=5"))
            .bearer_auth("alice-secret")
            .header("Accept", "application/json")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let batch = page["events"].as_array().unwrap().clone();
        assert!(batch.len() <= 5, "{page}");
        paged.extend(batch);
        after = page["next_after"].as_u64().unwrap();
        if page["has_more"] == false {
            break;
        }
    }
    let paged_kinds: Vec<&str> = paged.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        paged_kinds, kinds,
        "the pages hold what the stream sent, in order"
    );
    assert_eq!(after, last_seq);
    // They carry the public event schema: flat, with no storage internals.
    for event in &paged {
        let fields = event.as_object().unwrap();
        for internal in [
            "event",
            "epoch",
            "fingerprint",
            "snapshot",
            "snapshot_before",
            "snapshot_after",
            "inbox_id",
            "workspace",
            "system",
            "body",
            "cost_micro_usd",
        ] {
            assert!(!fields.contains_key(internal), "`{internal}` in {event}");
        }
        assert!(
            fields["seq"].is_u64() && fields["at_ms"].is_u64(),
            "{event}"
        );
    }
    let outcome = paged
        .iter()
        .find(|e| e["type"] == "tool_call_outcome")
        .unwrap();
    assert!(outcome["output"]["excerpt"].is_string(), "{outcome}");
    let started = paged
        .iter()
        .find(|e| e["type"] == "tool_call_intent")
        .unwrap();
    assert!(
        started["class"].is_string() && started["tool"].is_string(),
        "{started}"
    );
    let refused = reqwest::Client::new()
        .get(format!("{events_url}?limit=5000"))
        .bearer_auth("alice-secret")
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    // What the turn changed, as a page would show it.
    let diff_url = format!("{}/v1/sessions/{id}/diff", srv.url);
    let (status, diff) = call(reqwest::Method::GET, &diff_url, Some("alice-secret"), None).await;
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["files"][0]["path"], "a.txt", "{diff}");
    assert_eq!(diff["files"][0]["change"], "added");
    let patch = diff["files"][0]["patch"].as_str().unwrap();
    assert!(
        patch.contains("+++ b/a.txt") && patch.contains("+one"),
        "{patch}"
    );
    let (status, refused) = call(
        reqwest::Method::GET,
        &format!("{diff_url}?from=5&to=2"),
        Some("alice-secret"),
        None,
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    let (status, _) = call(reqwest::Method::GET, &diff_url, Some("bob-secret"), None).await;
    assert_eq!(status, 404, "another owner sees nothing");

    // The workspace's files at any position, from the snapshots.
    let files = format!("{}/v1/sessions/{id}/files", srv.url);
    let (status, listing) = call(reqwest::Method::GET, &files, Some("alice-secret"), None).await;
    assert_eq!(status, 200, "{listing}");
    let a = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "a.txt")
        .unwrap_or_else(|| panic!("a.txt listed: {listing}"));
    assert_eq!(
        (a["kind"].as_str(), a["size"].as_u64()),
        (Some("file"), Some(4))
    );
    let fetch = |url: String, token: &'static str| async move {
        let resp = reqwest::Client::new()
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.bytes().await.unwrap())
    };
    let (status, bytes) = fetch(format!("{files}/a.txt"), "alice-secret").await;
    assert_eq!((status, &bytes[..]), (200, &b"one\n"[..]));
    let (status, body) = fetch(format!("{files}/a.txt?at=1"), "alice-secret").await;
    assert_eq!(status, 404, "no a.txt as the session began: {body:?}");
    assert!(String::from_utf8_lossy(&body).contains("no_file"));
    let (status, _) = fetch(format!("{files}/..%2F..%2Fetc%2Fpasswd"), "alice-secret").await;
    assert_eq!(status, 404, "only paths of the snapshot exist");
    let (status, _) = fetch(format!("{files}/a.txt?at=99999"), "alice-secret").await;
    assert_eq!(status, 422);
    let (status, _) = fetch(format!("{files}/a.txt"), "bob-secret").await;
    assert_eq!(status, 404, "another owner reads nothing");
}

#[tokio::test]
async fn cors_admits_only_the_configured_origins() {
    let allowed = "https://app.example.com";
    let srv = server(json!([]), tokens(), 0, |state| {
        state.cors_origins = vec![allowed.to_string()];
    })
    .await;
    let http = reqwest::Client::new();
    let preflight = |origin: &'static str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/sessions/x/events", srv.url),
        )
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "GET")
        .header(
            "Access-Control-Request-Headers",
            "authorization, last-event-id",
        )
        .send()
    };
    let ok = preflight(allowed).await.unwrap();
    assert!(ok.status().is_success(), "{}", ok.status());
    let headers = ok.headers();
    assert_eq!(headers["access-control-allow-origin"], allowed);
    let asked = headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        asked.contains("authorization") && asked.contains("last-event-id"),
        "{asked}"
    );

    let other = preflight("https://evil.example").await.unwrap();
    assert!(
        other.headers().get("access-control-allow-origin").is_none(),
        "another origin is not admitted"
    );

    // A refusal still names the origin, so the page can read the error.
    let refused = http
        .get(format!("{}/v1/sessions", srv.url))
        .header("Origin", allowed)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["access-control-allow-origin"], allowed);
}

#[tokio::test]
async fn without_cors_a_preflight_is_a_json_405() {
    let srv = server(json!([]), tokens(), 0, |_| {}).await;
    let resp = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, format!("{}/v1/sessions", srv.url))
        .header("Origin", "https://app.example.com")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
}
