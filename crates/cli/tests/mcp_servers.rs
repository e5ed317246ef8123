//! The user's own MCP servers, through a real `steadfast serve` with bwrap sandboxes: a
//! session names an MCP server (rmcp, bearer-token auth, on loopback) and a vault
//! credential; the harness connects with the token and offers the server's tools as
//! `tracker__<tool>`. A worker SIGKILLed (aborted) right after each tool's effect is
//! replaced, and each cut-off call is resolved by its class as its annotations say: the
//! read-only and the idempotent tool run again, the destructive one is never run twice
//! (outcome unknown). The token reaches neither the sandbox nor anything stored. The
//! same tools are offered to a wrapped CLI (Claude Code) through the journaled MCP
//! server.

use std::path::PathBuf;

use serde_json::{json, Value};
use steadfast_testkit::mcp_server::McpTracker;
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{answer_approval, call, event_page, holding, put_credential, wait_for, VaultSite};

const TOKEN: &str = "mcp-token-2b7f04c1";
const TOOLS: [&str; 3] = ["lookup_issue", "set_label", "close_issue"];

fn script() -> Script {
    let probe = "env > env.txt; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' > environ.txt; \
         a=mcp-token; b=2b7f04c1; \
         grep -rsl \"$a-$b\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr > found.txt; true";
    serde_json::from_value(json!({"steps": [
        {"text": "reading the issue", "tool_calls": [{"name": "tracker__lookup_issue", "input": {"id": 7}}]},
        {"text": "labelling it", "tool_calls": [{"name": "tracker__set_label", "input": {"id": 7, "label": "bug"}}]},
        {"text": "closing it", "tool_calls": [{"name": "tracker__close_issue", "input": {"id": 7}}]},
        {"text": "checking", "tool_calls": [{"name": "bash", "input": {"command": probe}}]},
        {"text": "issue 7 is handled"}
    ]}))
    .unwrap()
}

/// A site whose operator opened the tracker's address (on this host, so internal) to
/// what sessions name.
fn opened_to(dir: &std::path::Path, tracker: &McpTracker) -> VaultSite {
    let url = tracker.url();
    let address = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    VaultSite::new(
        dir,
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"{address}\"]\n"),
    )
}

fn counts(tracker: &McpTracker) -> [u32; 3] {
    TOOLS.map(|t| tracker.calls(t))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_are_offered_journaled_and_resolved_by_their_class() {
    rounds("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_gets_the_same_tools_through_the_journal() {
    common::installed("claude-code").await;
    rounds("claude-code").await;
}

/// Sessions of `agent`, each with its k-th MCP call cut off by a worker's crash.
async fn rounds(agent: &str) {
    let tracker = McpTracker::start(TOKEN).await.unwrap();
    let fake = FakeProvider::start(script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = opened_to(dir.path(), &tracker);
    let home = site.home.clone();
    let (_api, url) = site.serve(&fake, "0").await;
    put_credential(&url, "tracker", TOKEN).await;
    let sessions = format!("{url}/v1/sessions");
    let server = json!({"name": "tracker", "url": tracker.url(), "credential": "tracker"});

    // Refused before anything is made, naming the field.
    for (servers, says) in [
        (
            json!([{"name": "a b", "url": tracker.url()}]),
            "mcp_servers",
        ),
        (
            json!([{"name": "t", "url": "file:///etc/passwd"}]),
            "mcp_servers",
        ),
        (
            json!([{"name": "t", "url": tracker.url(), "credential": "missing"}]),
            "mcp_servers.credential",
        ),
        (
            json!([{"name": "t", "url": tracker.url(), "colour": "red"}]),
            "colour",
        ),
    ] {
        let (status, body) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({"mcp_servers": servers})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }

    // The k-th MCP call is cut off after its effect; how it resolves is its class's.
    let expected = [
        ("rerun", [2, 1, 1]),
        ("rerun", [1, 2, 1]),
        ("outcome_unknown", [1, 1, 1]),
    ];
    for (k, (resolution, ran)) in expected.iter().enumerate() {
        let before = counts(&tracker);
        let (status, created) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({"task": "handle issue 7", "agent": agent, "mcp_servers": [server]})),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let workspace = common::workspace_in(&home, &created);
        let mut doomed = site.command(&fake, &["worker"]);
        doomed.env(
            "STEADFAST_FAULT",
            format!("{}:{}", steadfast_fault::points::TOOL_EFFECT, k + 1),
        );
        let status = tokio::time::timeout(std::time::Duration::from_secs(120), doomed.status())
            .await
            .expect("the worker reached the fault")
            .unwrap();
        assert!(!status.success());
        let mut worker = site.command(&fake, &["worker"]).spawn().unwrap();
        wait_for("the turn to end", async || {
            reqwest::get(format!("{sessions}/{id}"))
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()["status"]
                == "idle"
        })
        .await;
        worker.kill().await.unwrap();

        let after = counts(&tracker);
        let delta: Vec<u32> = (0..3).map(|i| after[i] - before[i]).collect();
        assert_eq!(
            delta,
            ran.to_vec(),
            "{agent}: cut off at MCP call {}",
            k + 1
        );
        let log = event_page(&format!("{sessions}/{id}/events")).await;
        let resolved: Vec<&Value> = log
            .iter()
            .filter(|e| e["type"] == "tool_call_interrupted")
            .collect();
        assert_eq!(resolved.len(), 1, "{resolved:?}");
        assert_eq!(resolved[0]["resolution"]["kind"], *resolution, "{agent}");
        let classes: Vec<&Value> = log
            .iter()
            .filter(|e| e["type"] == "tool_call_intent")
            .filter(|e| e["tool"].as_str().unwrap().starts_with("tracker__"))
            .map(|e| &e["class"])
            .collect();
        assert!(classes.contains(&&json!("read")), "{classes:?}");
        assert!(classes.contains(&&json!("idempotent")), "{classes:?}");
        assert!(classes.contains(&&json!("external")), "{classes:?}");
        let outcomes = serde_json::to_string(&log).unwrap();
        assert!(outcomes.contains("issue 7: the parser drops trailing commas"));

        for seen in ["env.txt", "environ.txt"] {
            let text = std::fs::read_to_string(workspace.join(seen)).unwrap();
            assert!(!text.is_empty() && !text.contains(TOKEN), "{seen}");
        }
        let found = std::fs::read_to_string(workspace.join("found.txt")).unwrap();
        assert!(found.trim().is_empty(), "readable files hold it: {found}");
    }
    assert_eq!(tracker.refused(), 0, "every request carried the token");
    assert_eq!(holding(&home, TOKEN), Vec::<PathBuf>::new());
}

/// An approval policy names MCP servers and tools: the read-only tool runs, the tool a
/// rule denies never reaches its server (no one is asked), and the server's external
/// tool waits for a person, naming it, then runs once.
async fn policy(agent: &str) {
    let tracker = McpTracker::start(TOKEN).await.unwrap();
    let fake = FakeProvider::start(script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = opened_to(dir.path(), &tracker);
    let (_api, url) = site.serve(&fake, "1").await;
    put_credential(&url, "tracker", TOKEN).await;
    let server = json!({"name": "tracker", "url": tracker.url(), "credential": "tracker"});
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(
            json!({"task": "handle issue 7", "agent": agent, "mcp_servers": [server],
            "approval": {"rules": [
                {"verdict": "ask", "mcp_server": "tracker", "class": "external"},
                {"verdict": "deny", "tool": "tracker__set_*"}
            ]}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let shown = async || {
        reqwest::get(format!("{url}/v1/sessions/{id}"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    wait_for("the external tool to wait", async || {
        shown().await["status"] == "waiting"
    })
    .await;
    assert_eq!(
        counts(&tracker),
        [1, 0, 0],
        "{agent}: looked up, not labelled, not closed"
    );
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let wait: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "wait_started")
        .collect();
    assert_eq!(wait.len(), 1, "{agent}: {events:?}");
    assert!(
        wait[0]["reason"]
            .as_str()
            .unwrap()
            .contains("tracker__close_issue"),
        "{agent}: {}",
        wait[0]
    );
    let denied = events
        .iter()
        .find(|e| e["type"] == "tool_call_outcome" && e["is_error"] == true)
        .unwrap_or_else(|| panic!("{agent}: {events:?}"));
    assert!(
        denied["output"]["excerpt"]
            .as_str()
            .unwrap()
            .contains("does not let `tracker__set_label` run"),
        "{agent}: {denied}"
    );
    answer_approval(&url, &id, json!({"approved": true})).await;
    wait_for("the turn to end", async || {
        shown().await["status"] == "idle"
    })
    .await;
    assert_eq!(
        counts(&tracker),
        [1, 0, 1],
        "{agent}: closed once, approved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_policy_names_mcp_servers_and_tools() {
    policy("native").await;
    common::installed("claude-code").await;
    policy("claude-code").await;
}

/// An MCP server at an internal address the operator did not open is never connected
/// to: a session names the URL, and the harness would otherwise reach into its own
/// network for it. Its tools are not offered, and the turn goes on without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_at_an_internal_address_nobody_opened_is_not_reached() {
    let tracker = McpTracker::start(TOKEN).await.unwrap();
    let fake = FakeProvider::start(script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = VaultSite::new(dir.path(), "[sandbox]\nbackend = \"bwrap\"\n");
    let (_api, url) = site.serve(&fake, "1").await;
    // The tracker's port on loopback, spelled as one number.
    let sneaky = tracker.url().replace("127.0.0.1", "2130706433");
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "handle issue 7", "mcp_servers": [
            {"name": "tracker", "url": sneaky},
        ]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    common::idle_after(&url, &id, 1).await;
    assert_eq!(counts(&tracker), [0, 0, 0], "no tool of it ran");
    assert_eq!(tracker.refused(), 0, "not even a request without its token");
    let events = event_page(&format!("{url}/v1/sessions/{id}/events?limit=1000")).await;
    let answered: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_call_outcome")
        .collect();
    assert!(
        answered.iter().take(3).all(|e| e["is_error"] == true),
        "the model was told its calls of the tracker failed: {answered:?}"
    );
}
