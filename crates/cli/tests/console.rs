//! The web console, driven in real headless Chromium over the DevTools protocol: a
//! person logs in, watches a turn stream, reads a tool's whole output and a step's
//! diff, steers, approves a wait, interrupts a long command; another owner's browser
//! sees nothing of it; a view link shows it read-only. The page keeps up when the
//! server is SIGKILLed and started again mid-turn: nothing lost, nothing twice.
//! Screenshots of each page land in `target/tmp/screenshots/console-*.png`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use common::agents_dir;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio_tungstenite::tungstenite::Message;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef01";

/// What the first reply streams, slowly enough to be watched.
const WRITING: &str = "I will write the notes file, line by line, and then show what it holds. \
     First the lines, fifty of them; then a long count, so the output is too big for an event \
     and has to be fetched whole from where it is kept.";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_watches_inspects_and_steers_a_session_in_the_console() {
    let deploy = "curl -X POST https://deploy.example/release";
    assert_eq!(
        steadfast_sandbox::classify("bash", &json!({ "command": deploy })),
        steadfast_log::ToolClass::External,
        "the deploy must be an external effect, to wait for approval"
    );
    let fake = common::fake_playing(json!([
        {"text": WRITING, "chunk_delay_ms": 250, "tool_calls": [{"name": "bash", "input": {
            "command": "printf 'line %s\\n' $(seq 1 50) > notes.txt; seq 1 30000"}}]},
        {"text": "Checking.", "tool_calls": [{"name": "bash", "input": {"command": "sleep 6"}}]},
        {"text": "Steered: deploying.", "tool_calls": [{"name": "bash", "input": {"command": deploy}}]},
        {"text": "Now the long wait.", "tool_calls": [{"name": "bash", "input": {"command": "sleep 300"}}]},
        {"text": "Interrupted, stopping."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = serve(dir.path(), &fake, port).await;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();

    // The console refuses a cookie sent from another site's page, and a view link
    // never reaches what it was not made for (checked again in the browser below).
    let (status, _) = get_with_cookie(&http, &format!("{url}/v1/sessions"), ALICE, None).await;
    assert_eq!(status, 200, "a same-origin cookie is a credential");
    let (status, body) = get_with_cookie(
        &http,
        &format!("{url}/v1/sessions"),
        ALICE,
        Some("https://evil.example"),
    )
    .await;
    assert_eq!(status, 401, "a cross-site cookie is none: {body}");

    let created = http
        .post(format!("{url}/v1/sessions"))
        .bearer_auth(ALICE)
        .json(&json!({
            "title": "Notes and deploy",
            "network": "deny-all", "approve_external": true,
            "workspace": {"kind": "empty"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Alice logs in (a wrong token first) and finds the session in her list.
    let alice = Browser::start("alice").await;
    alice.goto(&format!("{url}/ui")).await;
    alice
        .wait(
            "the login form",
            "location.pathname === '/ui/login' && !!document.querySelector('#token')",
        )
        .await;
    alice.shot("login").await;
    alice.login("not-a-token").await;
    alice
        .wait("the refusal", "!!document.querySelector('.problem')")
        .await;
    alice.login(ALICE).await;
    alice
        .wait(
            "her session in the list",
            &format!("!!document.querySelector('#sessions tr[data-id=\"{id}\"]')"),
        )
        .await;
    assert_eq!(
        alice.eval("document.cookie").await,
        json!(""),
        "the token's cookie is HTTP-only"
    );
    let row = alice.text(&format!("#sessions tr[data-id=\"{id}\"]")).await;
    assert!(
        row.contains("Notes and deploy") && row.contains("native"),
        "{row}"
    );
    alice
        .wait(
            "the row's model and cost",
            &format!("document.querySelector('#sessions tr[data-id=\"{id}\"]').textContent.includes('claude')"),
        )
        .await;
    alice.shot("sessions").await;

    // She opens it and sends the task from the page; the turn streams into the page:
    // the reply's text grows while it is written.
    alice
        .click(&format!("#sessions tr[data-id=\"{id}\"] a"))
        .await;
    alice
        .wait(
            "the session page",
            "!!document.querySelector('#timeline') && !!document.querySelector('#message')",
        )
        .await;
    alice.fill("#message", "write the notes, then deploy").await;
    alice.click("#send").await;
    alice
        .wait(
            "her message in the timeline",
            "[...document.querySelectorAll('.ev-user_message')].some(e => e.textContent.includes('write the notes, then deploy'))",
        )
        .await;
    alice
        .wait(
            "part of the reply",
            "[...document.querySelectorAll('.model-text')].some(e => e.textContent.startsWith('I will write'))",
        )
        .await;
    let partial = alice
        .eval("document.querySelector('.model-text').textContent")
        .await;
    alice
        .wait(
            "the whole reply",
            &format!(
                "document.querySelector('.model-text').textContent === {}",
                json!(WRITING)
            ),
        )
        .await;
    assert_ne!(
        partial.as_str().unwrap(),
        WRITING,
        "the text was seen while it streamed"
    );

    // The tool's output: an excerpt, then every byte on demand; the step's diff.
    alice
        .wait(
            "the big output",
            "!!document.querySelector('.ev-tool_call_outcome button.whole')",
        )
        .await;
    alice.click(".ev-tool_call_outcome button.whole").await;
    alice
        .wait(
            "the whole output",
            "document.querySelector('.ev-tool_call_outcome pre.output').textContent.trimEnd().endsWith('\\n30000')",
        )
        .await;
    alice.click(".ev-tool_call_outcome button.step-diff").await;
    alice
        .wait(
            "the step's diff",
            "document.querySelector('#diff').textContent.includes('notes.txt (added)') && document.querySelector('#diff').textContent.includes('+line 50')",
        )
        .await;
    alice.shot("session-output-and-diff").await;

    // A steer typed while the check runs reaches the turn at its next step.
    alice
        .wait(
            "the check to run",
            "[...document.querySelectorAll('.ev-tool_call_intent pre')].some(e => e.textContent === '$ sleep 6')",
        )
        .await;
    alice.fill("#message", "also mention the changelog").await;
    alice.click("#steer").await;
    alice
        .wait(
            "the steer in the timeline",
            "[...document.querySelectorAll('.ev-steered')].some(e => e.textContent.includes('also mention the changelog'))",
        )
        .await;

    // The deploy waits for approval, showing its command; she approves it.
    alice
        .wait(
            "the approval",
            &format!("!!document.querySelector('#approve') && document.querySelector('#waiting').textContent.includes({})", json!(deploy)),
        )
        .await;
    alice.shot("approval").await;
    // What the README shows.
    alice.shot_of("approval-top", 1000.0).await;
    alice.click("#approve").await;
    alice
        .wait(
            "the approval's answer",
            "[...document.querySelectorAll('.ev-signal_received')].some(e => e.textContent.includes('approval'))",
        )
        .await;

    // The long command: interrupted from the page.
    alice
        .wait(
            "the long command",
            "[...document.querySelectorAll('.ev-tool_call_intent pre')].some(e => e.textContent === '$ sleep 300')",
        )
        .await;
    alice.click("#interrupt").await;
    alice
        .wait(
            "the interrupt",
            "!!document.querySelector('.ev-turn_interrupted') && document.querySelector('#summary .status').textContent === 'idle'",
        )
        .await;
    alice.shot("interrupted").await;

    // Between turns, a shell in the sandbox from the page: a person's command runs
    // there, and what it changed is recorded when they leave.
    alice.click("#open-shell").await;
    alice
        .wait(
            "the shell",
            "document.querySelector('#shell-state').textContent === 'read-write'",
        )
        .await;
    alice
        .fill(
            "#shell-line",
            "wc -l < notes.txt; echo from-the-console > console.txt; echo SUM-$((6*7))",
        )
        .await;
    alice
        .eval("document.querySelector('#shell form').requestSubmit()")
        .await;
    alice
        .wait(
            "the shell's answer",
            "document.querySelector('.shell-screen').textContent.includes('SUM-42') && document.querySelector('.shell-screen').textContent.includes('50')",
        )
        .await;
    alice.shot("shell").await;
    alice.click("#shell-leave").await;
    alice
        .wait(
            "the shell's record",
            "document.querySelector('#shell-state').textContent.includes('console.txt') && [...document.querySelectorAll('.ev-human_shell')].some(e => e.textContent.includes('console.txt'))",
        )
        .await;
    let events = events_as(&http, &url, &id).await;
    assert!(
        events.iter().any(|e| e["type"] == "turn_interrupted"),
        "{events:?}"
    );
    let (_, shown) = common::get_json_as(&http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
    assert_eq!(shown["status"], "idle");

    // One stream carried the whole session to the page, across its idle spells.
    assert_eq!(
        alice
            .eval("document.querySelector('#timeline').dataset.connects")
            .await,
        json!("1")
    );

    // Bob's browser: no session in his list, nothing at its page.
    let bob = Browser::start("bob").await;
    bob.goto(&format!("{url}/ui/login")).await;
    bob.login(BOB).await;
    bob.wait(
        "his empty list",
        "document.querySelector('#sessions') && document.querySelector('#sessions').textContent.includes('No sessions match.')",
    )
    .await;
    bob.goto(&format!("{url}/ui/sessions/{id}")).await;
    bob.wait(
        "no such session",
        "document.querySelector('#notice') && document.querySelector('#notice').textContent === 'No such session.'",
    )
    .await;
    assert_eq!(
        bob.eval("document.querySelectorAll('#timeline li').length")
            .await,
        json!(0)
    );
    bob.shot("another-owner").await;

    // A view link: the session read-only, in a browser with no login at all.
    alice.click("#share").await;
    alice
        .wait("the link", "!!document.querySelector('#share-url')")
        .await;
    let link = alice
        .eval("document.querySelector('#share-url').href")
        .await
        .as_str()
        .unwrap()
        .to_string();
    let secret = link.rsplit('/').next().unwrap().to_string();
    let guest = Browser::start("guest").await;
    guest.goto(&link).await;
    guest
        .wait(
            "the shared timeline",
            &format!("document.querySelector('.model-text') && document.querySelector('.model-text').textContent === {}", json!(WRITING)),
        )
        .await;
    guest
        .wait(
            "the shared summary",
            "!!document.querySelector('#summary .status')",
        )
        .await;
    for control in [
        "#message",
        "#send",
        "#steer",
        "#interrupt",
        "#close",
        "#delete",
        "#fork",
        "#rewind",
        "#share",
    ] {
        assert_eq!(
            guest
                .eval(&format!("!!document.querySelector('{control}')"))
                .await,
            json!(false),
            "a view link's page has no {control}"
        );
    }
    guest.click(".ev-tool_call_outcome button.step-diff").await;
    guest
        .wait(
            "the diff, shared",
            "document.querySelector('#diff').textContent.includes('notes.txt')",
        )
        .await;
    guest.shot("shared").await;
    // What the link's page could try with its secret: only its session's reads.
    let tried = guest
        .eval(&format!(
            "Promise.all([\
               fetch('/v1/sessions/{id}/messages', {{method: 'POST', headers: {{Authorization: 'Bearer {secret}', 'Content-Type': 'application/json'}}, body: '{{\"text\": \"hi\"}}'}}).then(r => r.status),\
               fetch('/v1/sessions', {{headers: {{Authorization: 'Bearer {secret}'}}}}).then(r => r.status),\
               fetch('/v1/sessions/{id}/events?after=0&limit=1', {{headers: {{Authorization: 'Bearer {secret}', Accept: 'application/json'}}}}).then(r => r.status),\
               fetch('/v1/sessions/{id}/audit', {{headers: {{Authorization: 'Bearer {secret}'}}}}).then(r => r.status),\
             ])"
        ))
        .await;
    assert_eq!(tried, json!([403, 403, 200, 403]), "{tried}");
    // Revoked, it opens nothing.
    let (_, links) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/links"), ALICE).await;
    assert_eq!(links["links"][0]["opens"], "view", "{links}");
    let revoked = http
        .delete(format!(
            "{url}/v1/sessions/{id}/links/{}",
            links["links"][0]["id"].as_str().unwrap()
        ))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);
    let after = http
        .get(format!("{url}/v1/sessions/{id}"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 401);
    assert_eq!(http.get(&link).send().await.unwrap().status(), 404);

    // Every page came with the console's policy.
    let page = http.get(format!("{url}/ui/login")).send().await.unwrap();
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert_eq!(page.headers()["referrer-policy"], "same-origin");

    // Logged out, the list is out of reach again.
    alice.goto(&format!("{url}/ui")).await;
    alice
        .wait("the list", "!!document.querySelector('#who form')")
        .await;
    alice
        .eval("document.querySelector('#who form').submit()")
        .await;
    alice
        .wait("the login form again", "location.pathname === '/ui/login'")
        .await;
    alice.goto(&format!("{url}/ui")).await;
    alice
        .wait(
            "a redirect to the login",
            "location.pathname === '/ui/login'",
        )
        .await;

    drop((alice, bob, guest));
    server.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_keeps_up_when_the_server_is_killed_and_started_again_mid_turn() {
    let long = "Reading the repository slowly, one piece at a time, so that the server can be \
                killed in the middle of this very reply and started again, with the page open.";
    let fake = common::fake_playing(json!([
        {"text": long, "chunk_delay_ms": 300, "tool_calls": [{"name": "bash", "input": {
            "command": "for i in 1 2 3 4 5; do echo tick $i; sleep 1; done"}}]},
        {"text": "Finished after the restart."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = serve(dir.path(), &fake, port).await;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/v1/sessions"))
        .bearer_auth(ALICE)
        .json(&json!({"network": "deny-all", "workspace": {"kind": "empty"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();

    let alice = Browser::start("alice-restart").await;
    alice.goto(&format!("{url}/ui/login")).await;
    alice.login(ALICE).await;
    alice
        .wait("the list", "!!document.querySelector('#sessions')")
        .await;
    alice.goto(&format!("{url}/ui/sessions/{id}")).await;
    alice
        .wait("the page", "!!document.querySelector('#message')")
        .await;
    alice.fill("#message", "read slowly").await;
    alice.click("#send").await;
    alice
        .wait(
            "part of the reply",
            "[...document.querySelectorAll('.model-text')].some(e => e.textContent.length > 20)",
        )
        .await;

    // SIGKILL mid-reply; the page loses its stream and keeps trying.
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    alice
        .wait(
            "the stream to drop",
            "document.querySelector('#timeline').dataset.connected === 'false'",
        )
        .await;
    alice.shot("server-down").await;
    let mut server = serve(dir.path(), &fake, port).await;

    alice
        .wait(
            "the turn to end after the restart",
            "[...document.querySelectorAll('.ev-turn_ended')].length === 1",
        )
        .await;
    alice
        .wait(
            "the summary to say idle",
            "document.querySelector('#summary .status').textContent === 'idle'",
        )
        .await;
    alice.shot("after-restart").await;

    // Every event the log holds is on the page once, in order; each model call's text
    // is its reply, whole and once.
    let events = events_as(&http, &url, &id).await;
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "restart" || e["type"] == "model_call_interrupted"),
        "the server died mid-turn: {events:?}"
    );
    let shown: Vec<u64> = serde_json::from_value(
        alice
            .eval("[...document.querySelectorAll('#timeline li[data-seq]:not(.ev-model), #timeline .meta[data-seq]')].map(e => Number(e.dataset.seq))")
            .await,
    )
    .unwrap();
    let logged: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] != "model_delta")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(shown, logged, "the page shows each event once, in order");
    for outcome in events.iter().filter(|e| e["type"] == "model_call_outcome") {
        let call = outcome["call_id"].as_str().unwrap();
        let text = alice
            .eval(&format!(
                "(document.querySelector('.model-text[data-call=\"{call}\"]') || {{}}).textContent"
            ))
            .await;
        assert_eq!(text, outcome["text"], "call {call}");
    }
    assert_eq!(
        alice
            .eval("document.querySelector('#timeline').dataset.last")
            .await,
        json!(events.last().unwrap()["seq"].to_string())
    );
    drop(alice);
    server.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrapped_agents_session_reads_as_a_native_ones_does() {
    common::installed("claude-code").await;
    let fake = common::fake_playing(json!([
        {"text": "Listing the project.", "tool_calls": [{"name": "bash", "input": {"command": "ls"}}]},
        {"text": "The project has its tests."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = serve(dir.path(), &fake, port).await;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let id = common::idle_session_as(
        &http,
        &url,
        ALICE,
        json!({"agent": "claude-code", "network": "deny-all", "workspace": {"kind": "demo"},
               "task": "what is in the project?"}),
    )
    .await;
    let alice = Browser::start("alice-wrapped").await;
    alice.goto(&format!("{url}/ui/login")).await;
    alice.login(ALICE).await;
    alice
        .wait(
            "the list",
            "!!document.querySelector('#sessions tr[data-id]')",
        )
        .await;
    alice.goto(&format!("{url}/ui/sessions/{id}")).await;
    alice
        .wait(
            "the CLI's replies and its command's output",
            "[...document.querySelectorAll('.model-text')].some(e => e.textContent === 'The project has its tests.') \
             && [...document.querySelectorAll('.ev-tool_call_intent pre')].some(e => e.textContent === '$ ls') \
             && [...document.querySelectorAll('.ev-tool_call_outcome pre.output')].some(e => e.textContent.includes('README'))",
        )
        .await;
    let summary = alice.text("#summary").await;
    assert!(summary.contains("claude-code"), "{summary}");
    alice.shot("wrapped").await;
    drop(alice);
    server.kill().await.unwrap();
}

// ---------------------------------------------------------------- the server

/// `steadfast serve` in `dir` on `port`, with Alice's and Bob's tokens; again in the
/// same `dir`, it takes up the sessions the last one left.
async fn serve(
    dir: &Path,
    fake: &steadfast_testkit::FakeProvider,
    port: u16,
) -> tokio::process::Child {
    std::fs::write(
        dir.join("steadfast.toml"),
        format!(
            "[harness]\nlease-ttl-secs = 3\n\
             [sandbox]\nbackend = \"bwrap\"\n\
             [[server.tokens]]\nowner = \"alice\"\ntoken-hash = \"{}\"\n\
             [[server.tokens]]\nowner = \"bob\"\ntoken-hash = \"{}\"\n",
            steadfast_server::hash_token(ALICE),
            steadfast_server::hash_token(BOB),
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{port}");
    let mut server = common::site_command(
        dir,
        &agents_dir(),
        fake,
        &["serve", "--listen", &listen, "--workers", "1"],
    )
    .spawn()
    .unwrap();
    common::printed_url(&mut server).await;
    server
}

/// Every event of session `id`, as Alice reads them.
async fn events_as(http: &reqwest::Client, url: &str, id: &str) -> Vec<Value> {
    let (code, page) = common::get_json_as(
        http,
        &format!("{url}/v1/sessions/{id}/events?limit=1000"),
        ALICE,
    )
    .await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["has_more"], false);
    page["events"].as_array().unwrap().clone()
}

/// A GET with the console's cookie as a browser page of `origin` would send it.
async fn get_with_cookie(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    origin: Option<&str>,
) -> (u16, String) {
    let mut request = http
        .get(url)
        .header("cookie", format!("steadfast_token={token}"));
    if let Some(origin) = origin {
        request = request
            .header("origin", origin)
            .header("sec-fetch-site", "cross-site");
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

// ---------------------------------------------------------------- the browser

/// Headless Chromium with a profile of its own, driven over the DevTools protocol.
struct Browser {
    name: String,
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    page: tokio::sync::Mutex<Page>,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

struct Page {
    socket: Socket,
    next: u64,
}

impl Browser {
    async fn start(name: &str) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("chromium")
            .env("TMPDIR", profile.path())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1280,1100",
                "--remote-debugging-port=0",
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium (the Debian package) is installed");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let devtools = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(at) = line.strip_prefix("DevTools listening on ") {
                    return at.to_string();
                }
            }
            panic!("chromium exited before it listened");
        })
        .await
        .expect("chromium listened within a minute");
        // Its stderr keeps being read, so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let port = devtools
            .trim_start_matches("ws://127.0.0.1:")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_string();
        let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
            .await
            .unwrap();
        let (socket, _) = tokio_tungstenite::client_async(page, tcp).await.unwrap();
        let browser = Browser {
            name: name.to_string(),
            _child: child,
            _profile: profile,
            page: tokio::sync::Mutex::new(Page { socket, next: 0 }),
        };
        browser.call("Page.enable", json!({})).await;
        browser.call("Runtime.enable", json!({})).await;
        browser
    }

    /// Sends a DevTools command and waits for its answer.
    async fn call(&self, method: &str, params: Value) -> Value {
        let mut page = self.page.lock().await;
        page.next += 1;
        let id = page.next;
        let command = json!({"id": id, "method": method, "params": params});
        page.socket
            .send(Message::Text(command.to_string().into()))
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let Some(Ok(Message::Text(text))) = page.socket.next().await else {
                    continue;
                };
                let message: Value = serde_json::from_str(&text).unwrap();
                if message["id"] == id {
                    return message;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{method} was answered"));
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
        self.wait("the page to load", "document.readyState === 'complete'")
            .await;
    }

    /// The value of `expression` (awaited if it is a promise).
    async fn eval(&self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Waits until `condition` holds in the page (two minutes at most: a loaded machine
    /// is slow), and says what the page showed if it never did.
    async fn wait(&self, what: &str, condition: &str) {
        let check = format!(
            "(() => {{ try {{ return !!({condition}); }} catch (_) {{ return false; }} }})()"
        );
        for _ in 0..600 {
            if self.eval(&check).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.shot(&format!("failed-{}", what.replace(' ', "-")))
            .await;
        let text = self
            .eval("document.body ? document.body.innerText : ''")
            .await;
        panic!("{}: never saw {what}; the page showed:\n{text}", self.name);
    }

    async fn click(&self, selector: &str) {
        let clicked = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({0}); if (!e) return false; e.click(); return true; }})()",
                json!(selector)
            ))
            .await;
        assert_eq!(
            clicked,
            json!(true),
            "{}: nothing to click at {selector}",
            self.name
        );
    }

    async fn fill(&self, selector: &str, text: &str) {
        let filled = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({0}); if (!e) return false; e.value = {1}; return true; }})()",
                json!(selector),
                json!(text)
            ))
            .await;
        assert_eq!(
            filled,
            json!(true),
            "{}: nothing to fill at {selector}",
            self.name
        );
    }

    async fn text(&self, selector: &str) -> String {
        self.eval(&format!(
            "document.querySelector({}).textContent",
            json!(selector)
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Logs in with `token` from the login page it is on.
    async fn login(&self, token: &str) {
        self.wait("the login form", "!!document.querySelector('#token')")
            .await;
        self.fill("#token", token).await;
        self.eval("document.querySelector('form').submit()").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.wait("the next page", "document.readyState === 'complete'")
            .await;
    }

    /// Saves a screenshot of the whole page as `console-<browser>-<name>.png` with the
    /// tests' artefacts.
    async fn shot(&self, name: &str) {
        self.shot_of(name, 6000.0).await
    }

    /// Saves a screenshot of the top `height` pixels of the page.
    async fn shot_of(&self, name: &str, height: f64) {
        let shots = screenshots();
        // The page, not only what the window shows.
        let metrics = self.call("Page.getLayoutMetrics", json!({})).await;
        let size = &metrics["cssContentSize"];
        let clip = json!({
            "x": 0, "y": 0, "scale": 1,
            "width": size["width"].as_f64().unwrap_or(1280.0),
            "height": size["height"].as_f64().unwrap_or(1100.0).min(height),
        });
        let taken = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true, "clip": clip}),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(taken["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(shots.join(format!("console-{}-{name}.png", self.name)), png).unwrap();
    }
}

fn screenshots() -> PathBuf {
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    shots
}
