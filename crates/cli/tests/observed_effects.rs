//! Effects observed, not guessed, through a real `steadfast serve` with bwrap sandboxes
//! and their egress proxy. The command in these tests posts to a server with Python's
//! `urllib`, which the command-text classifier takes for a mere mutation; what the
//! proxy sees decides instead:
//! - killed while the command still runs (its request already sent), the server taken
//!   down with `SIGKILL`: the next worker resolves the call as *outcome unknown*, never
//!   rolled back to be run again, and the request reached its server once;
//! - under an approval policy the request never leaves until a person approves: held
//!   at the proxy and recorded, and the same call made again waits for approval, then
//!   runs once.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{answer_approval, call, counter, event_page, status, wait_for, VaultSite};

/// A POST the classifier cannot see for what it is.
fn post(port: u16) -> String {
    format!(
        "python3 -c \"import urllib.request as u; u.urlopen(u.Request('http://localhost:{port}/deploy', data=b'go'))\""
    )
}

/// The same POST with `curl` hidden in a shell function.
fn post_in_function(port: u16) -> String {
    format!("ship() {{ curl -sf -d go http://localhost:$1/deploy; }}; ship {port}")
}

/// The same POST with Node's own `fetch`, which reads no proxy variables before Node
/// 24: without the sandbox's preload it could not reach the proxy at all.
fn post_with_node_fetch(port: u16) -> String {
    format!(
        "node -e \"fetch('http://localhost:{port}/deploy', {{method: 'POST', body: 'go'}}).then(r => process.exit(r.ok ? 0 : 1))\""
    )
}

/// A command that posts to a server on the given port.
type Command = fn(u16) -> String;

fn script(steps: Value) -> Script {
    serde_json::from_value(json!({ "steps": steps })).unwrap()
}

fn site(dir: &std::path::Path, port: u16) -> VaultSite {
    VaultSite::new(
        dir,
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"localhost:{port}\"]\n"),
    )
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cut_off_after_it_sent_a_request_is_outcome_unknown_and_never_run_again() {
    let (port, hits) = counter();
    assert_eq!(
        steadfast_sandbox::classify("bash", &json!({ "command": post(port) })),
        steadfast_log::ToolClass::Mutate,
        "the classifier alone would roll this back and have it run again"
    );
    let command = format!("{} && echo sent > sent.txt && sleep 60", post(port));
    let fake = FakeProvider::start(script(json!([
        {"text": "deploying", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "done"}
    ])))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), port);
    let (mut api, url) = site.serve(&fake, "1").await;
    let (code, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "deploy", "network": format!("allow:localhost:{port}")})),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the request to reach its server", async || {
        hits.load(Ordering::SeqCst) == 1
    })
    .await;
    // The worker dies while the command still runs, its request already made. (Told
    // "rolled back", the fake model would ask for the same call again, as a real one
    // does: the request would reach its server twice.)
    api.start_kill().unwrap();
    api.wait().await.unwrap();
    // Its machine too: a sandbox that outlived the worker alone would be adopted with
    // its command, which would then not be cut off at all (`outlives_harness.rs`).
    common::kill_sandboxes_of(&id);

    let (_api, url) = site.serve(&fake, "1").await;
    wait_for("the turn to end on the next worker", async || {
        status(&url, &id).await == "idle"
    })
    .await;
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let intent = of_type(&events, "tool_call_intent")[0];
    assert_eq!(intent["class"], "mutate", "{intent}");
    let egress = of_type(&events, "egress");
    assert_eq!(egress.len(), 1, "{events:?}");
    assert_eq!(egress[0]["call_ids"], json!([intent["call_id"]]));
    assert_eq!(egress[0]["destination"], format!("localhost:{port}"));
    assert_eq!(egress[0]["admitted"], true);
    let cut_off = of_type(&events, "tool_call_interrupted");
    assert_eq!(cut_off.len(), 1, "{events:?}");
    assert_eq!(
        cut_off[0]["resolution"]["kind"], "outcome_unknown",
        "{}",
        cut_off[0]
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the request was made once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_an_approval_policy_nothing_leaves_until_a_person_approves() {
    approval_holds("native", true, post).await;
    approval_holds("native", true, post_in_function).await;
    approval_holds("native", true, post_with_node_fetch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_under_an_approval_policy_waits_and_runs_once_approved() {
    common::installed("claude-code").await;
    approval_holds("claude-code", true, post).await;
    approval_holds("claude-code", true, post_in_function).await;
    approval_holds("claude-code", true, post_with_node_fetch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_is_told_a_refusal_and_nothing_leaves() {
    common::installed("pi").await;
    approval_holds("pi", false, post).await;
}

/// With no way out of the sandbox nothing can be an external effect: nothing is
/// asked, the command fails to connect, and nothing reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_deny_all_networking_nothing_is_asked_about() {
    common::installed("claude-code").await;
    let cases: [(&str, Command); 3] = [
        ("native", post),
        ("native", post_with_node_fetch),
        ("claude-code", post),
    ];
    for (agent, command) in cases {
        let (port, hits) = counter();
        let command = command(port);
        let fake = FakeProvider::start(script(json!([
            {"text": "deploying", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
            {"text": "done"}
        ])))
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let site = site(dir.path(), port);
        let (_api, url) = site.serve(&fake, "1").await;
        let (code, created) = call(
            reqwest::Method::POST,
            &format!("{url}/v1/sessions"),
            Some(
                json!({"task": "deploy", "agent": agent, "approve_external": true,
                        "network": "deny-all"}),
            ),
        )
        .await;
        assert_eq!(code, 201, "{agent}: {created}");
        let id = created["id"].as_str().unwrap().to_string();
        wait_for("the turn to end", async || {
            status(&url, &id).await == "idle"
        })
        .await;
        let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
        assert!(
            of_type(&events, "wait_started").is_empty(),
            "{agent}: {events:?}"
        );
        assert!(of_type(&events, "egress").is_empty(), "{agent}: {events:?}");
        let outcome = of_type(&events, "tool_call_outcome")[0];
        assert_eq!(
            outcome["is_error"], true,
            "{agent}: it could not connect: {outcome}"
        );
        assert_eq!(hits.load(Ordering::SeqCst), 0, "{agent}");
    }
}

/// A session of `agent` under `approve_external` makes a POST. One its command text
/// hides from the classifier is made twice: the first is held at the proxy (recorded,
/// the model told), the second waits for approval. One the classifier sees waits at
/// once. A person then approves (`approve`) or refuses it.
async fn approval_holds(agent: &str, approve: bool, command: Command) {
    let (port, hits) = counter();
    let command = command(port);
    let hidden = steadfast_sandbox::classify("bash", &json!({ "command": command }))
        != steadfast_log::ToolClass::External;
    let bash = json!([{"name": "bash", "input": {"command": command}}]);
    let steps = if hidden {
        json!([
            {"text": "deploying", "tool_calls": bash},
            {"text": "again", "tool_calls": bash},
            {"text": "done"}
        ])
    } else {
        json!([{"text": "deploying", "tool_calls": bash}, {"text": "done"}])
    };
    let fake = FakeProvider::start(script(steps)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path(), port);
    let (_api, url) = site.serve(&fake, "1").await;
    let (code, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(
            json!({"task": "deploy", "agent": agent, "approve_external": true,
                    "network": format!("allow:localhost:{port}")}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{agent}: {created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the call to wait for approval", async || {
        status(&url, &id).await == "waiting"
    })
    .await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "{agent}: nothing left the sandbox"
    );
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let egress = of_type(&events, "egress");
    if hidden {
        assert_eq!(egress.len(), 1, "{agent}: {events:?}");
        assert_eq!(egress[0]["admitted"], false);
        let first = of_type(&events, "tool_call_outcome")[0];
        assert!(
            first["output"]["excerpt"]
                .as_str()
                .unwrap()
                .contains("held back"),
            "{agent}: the model is told why: {first}"
        );
    } else {
        assert!(
            egress.is_empty(),
            "{agent}: asked before it ran: {events:?}"
        );
        assert!(
            of_type(&events, "tool_call_intent").is_empty(),
            "{agent}: {events:?}"
        );
    }
    let wait = of_type(&events, "wait_started");
    assert_eq!(wait.len(), 1, "{agent}: {events:?}");
    assert_eq!(wait[0]["signal"], "approval");
    assert!(
        wait[0]["reason"].as_str().unwrap().contains(&command),
        "{agent}: the wait names the command: {}",
        wait[0]
    );

    let answer = if approve {
        json!({"approved": true})
    } else {
        json!({"approved": false, "message": "not today"})
    };
    answer_approval(&url, &id, answer).await;
    wait_for("the answered call and the turn to end", async || {
        status(&url, &id).await == "idle"
    })
    .await;
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let intents = of_type(&events, "tool_call_intent");
    assert_eq!(intents.len(), 1 + hidden as usize, "{agent}: {events:?}");
    let last = intents.last().unwrap();
    assert_eq!(last["class"], "external", "{last}");
    let outcomes = of_type(&events, "tool_call_outcome");
    let answered = outcomes.last().unwrap();
    if approve {
        assert_eq!(
            hits.load(Ordering::SeqCst),
            1,
            "{agent}: sent once, once approved"
        );
        assert_eq!(answered["is_error"], false, "{agent}: {answered}");
    } else {
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "{agent}: refused, never sent"
        );
        let told = answered["output"]["excerpt"].as_str().unwrap();
        assert!(told.contains("not today"), "{agent}: told why: {told}");
    }
}

/// A policy by destination, judged at the proxy connection by connection: the
/// operator denies one host (and no session can allow it), the session allows another
/// and asks for everything else. The allowed host is reached without asking (a `curl`
/// the classifier takes for an external effect included), the denied one is refused
/// and no one is asked, the third is held back, then waits for approval naming where
/// it goes, and runs once approved.
async fn policy_by_destination(agent: &str) {
    let (allowed, allowed_hits) = counter();
    let (denied, denied_hits) = counter();
    let (asked, asked_hits) = counter();
    let curl = format!("curl -sf -d go http://localhost:{allowed}/deploy");
    let steps = json!([
        {"text": "one", "tool_calls": [{"name": "bash", "input": {"command": post(allowed)}}]},
        {"text": "two", "tool_calls": [{"name": "bash", "input": {"command": curl}}]},
        {"text": "three", "tool_calls": [{"name": "bash", "input": {"command": post(denied)}}]},
        {"text": "four", "tool_calls": [{"name": "bash", "input": {"command": post(asked)}}]},
        {"text": "five", "tool_calls": [{"name": "bash", "input": {"command": post(asked)}}]},
        {"text": "six", "tool_calls": [{"name": "write", "input": {"file_path": "notes.txt", "content": "x"}}]},
        {"text": "done"}
    ]);
    let fake = FakeProvider::start(script(steps)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = VaultSite::new(
        dir.path(),
        &format!(
            "[sandbox]\nbackend = \"bwrap\"\n\
             internal-hosts = [\"localhost:{allowed}\", \"localhost:{denied}\", \"localhost:{asked}\"]\n\
             [[approval.rules]]\nverdict = \"deny\"\nhost = \"localhost:{denied}\"\n"
        ),
    );
    // Codex speaks only OpenAI's API: the fake serves it too.
    let mut api = site
        .command(
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
        )
        .env("OPENAI_API_KEY", "test-key")
        .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url()))
        .spawn()
        .unwrap();
    let url = common::printed_url(&mut api).await;
    let network = format!("allow:localhost:{allowed},localhost:{denied},localhost:{asked}");
    let (code, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({
            "task": "deploy", "agent": agent, "network": network,
            "model": if agent == "codex" { "openai/gpt-5" } else { "anthropic/claude-sonnet-4-5" },
            "approval": {"external": "ask", "rules": [
                {"verdict": "allow", "host": format!("localhost:{allowed}")},
                {"verdict": "allow", "host": format!("localhost:{denied}")},
                {"verdict": "deny", "tool": "wr*e"}
            ]}
        })),
    )
    .await;
    assert_eq!(code, 201, "{agent}: {created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_for("the held call to wait for approval", async || {
        status(&url, &id).await == "waiting"
    })
    .await;
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    assert_eq!(
        allowed_hits.load(Ordering::SeqCst),
        2,
        "{agent}: the allowed host is reached without asking: {events:?}"
    );
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0, "{agent}");
    assert_eq!(asked_hits.load(Ordering::SeqCst), 0, "{agent}");
    let started = of_type(&events, "session_started")[0];
    assert_eq!(
        started["approval"].as_array().map(Vec::len),
        Some(2),
        "{agent}: the operator's layer and the session's: {started}"
    );
    let refused: Vec<_> = of_type(&events, "egress")
        .into_iter()
        .filter(|e| e["admitted"] == false)
        .collect();
    assert_eq!(refused.len(), 2, "{agent}: {events:?}");
    assert_eq!(refused[0]["destination"], format!("localhost:{denied}"));
    assert_eq!(refused[0]["denied"], true);
    assert_eq!(refused[1]["destination"], format!("localhost:{asked}"));
    assert_eq!(refused[1]["denied"], false);
    let told: Vec<String> = of_type(&events, "tool_call_outcome")
        .iter()
        .map(|o| {
            o["output"]["excerpt"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert!(
        told.iter()
            .any(|t| t.contains("denied: this session's approval policy")),
        "{agent}: the model is told the denial: {told:?}"
    );
    let wait = of_type(&events, "wait_started");
    assert_eq!(
        wait.len(),
        1,
        "{agent}: only the asked host waits: {events:?}"
    );
    assert!(
        wait[0]["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("about to reach localhost:{asked}")),
        "{agent}: the wait names the destination: {}",
        wait[0]
    );

    answer_approval(&url, &id, json!({"approved": true})).await;
    wait_for("the approved call and the turn to end", async || {
        status(&url, &id).await == "idle"
    })
    .await;
    assert_eq!(
        asked_hits.load(Ordering::SeqCst),
        1,
        "{agent}: sent once approved"
    );
    let events = event_page(&format!("{url}/v1/sessions/{id}/events")).await;
    let write = of_type(&events, "tool_call_intent")
        .into_iter()
        .find(|i| i["tool"] == "write")
        .unwrap_or_else(|| panic!("{agent}: {events:?}"));
    let refused = of_type(&events, "tool_call_outcome")
        .into_iter()
        .find(|o| o["call_id"] == write["call_id"])
        .unwrap();
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(
        refused["output"]["excerpt"]
            .as_str()
            .unwrap()
            .contains("does not let `write` run"),
        "{agent}: refused by its tool's rule, no one asked: {refused}"
    );
    assert_eq!(of_type(&events, "wait_started").len(), 1, "{agent}");
    let (code, file) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}/files/notes.txt"),
        None,
    )
    .await;
    assert_eq!(code, 404, "{agent}: nothing written: {file}");
    assert_eq!(
        allowed_hits.load(Ordering::SeqCst),
        2,
        "{agent}: nothing ran twice"
    );
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0, "{agent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_destination_allows_denies_and_asks_per_connection() {
    policy_by_destination("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wrapped_cli_follows_a_policy_by_destination() {
    for agent in ["claude-code", "codex", "pi", "opencode"] {
        common::installed(agent).await;
        policy_by_destination(agent).await;
    }
}

/// A bad policy is refused naming the part that is wrong, and no session is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_approval_policy_is_refused_naming_the_field() {
    let fake = FakeProvider::start(script(json!([{"text": "done"}])))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = VaultSite::new(dir.path(), "[sandbox]\nbackend = \"bwrap\"\n");
    let (_api, url) = site.serve(&fake, "1").await;
    for (policy, field) in [
        (
            json!({"rules": [{"verdict": "allow"}, {"verdict": "deny", "host": "no such host!"}]}),
            "approval.rules[1].host",
        ),
        (json!({"external": "maybe"}), "approval.external"),
        (
            json!({"rules": [{"verdict": "ask", "colour": "red"}]}),
            "approval.rules",
        ),
    ] {
        let (code, body) = call(
            reqwest::Method::POST,
            &format!("{url}/v1/sessions"),
            Some(json!({"task": "x", "approval": policy})),
        )
        .await;
        assert_eq!(code, 422, "{policy}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(field),
            "{policy}: names {field}: {body}"
        );
    }
    let (_, list) = call(reqwest::Method::GET, &format!("{url}/v1/sessions"), None).await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
}
