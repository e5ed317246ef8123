//! The gateway against a real SQLite world, a real drive and the fake provider over
//! loopback HTTP: live calls are recorded, a restarted client is answered from the log
//! byte for byte without the provider, a divergence supersedes the record and restores
//! the workspace, a request whose intent the log refuses never reaches the provider
//! whole (a 409 when another driver has the session, a 503 when the log is too busy),
//! a process stopping mid-recording abandons it cleanly, and bad requests get
//! clear errors in the API's own format.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_drive::Drive;
use steadfast_gateway::{Gateway, GatewayConfig, Upstream, Upstreams};
use steadfast_journal::exchange::{Exchanges, ExchangesConfig};
use steadfast_log::{fold, Event, ModelSpec};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{Holder, Lease, LiveSession, SqliteWorld, World};

const TOKEN: &str = "sf-session-token-for-tests";

struct Setup {
    dir: tempfile::TempDir,
    fake: FakeProvider,
    world: SqliteWorld,
    drive: Drive,
    lease: Lease,
    last_snapshot: Arc<Mutex<Option<String>>>,
    /// One client for every run's gateway, as a harness has.
    http: reqwest::Client,
    /// What the next run's gateway does with a request the record does not have.
    mismatch: steadfast_journal::exchange::Mismatch,
}

impl Setup {
    async fn new(steps: Value) -> Self {
        Self::capped(steps, None).await
    }

    /// A session whose spend is capped at `cap` millionths of a dollar, if any.
    async fn capped(steps: Value, cap: Option<u64>) -> Self {
        let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
        let fake = FakeProvider::start(script).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/a.txt"), "v1").unwrap();
        let world = SqliteWorld::open(dir.path().join("world.db")).unwrap();
        let drive = Drive::open(dir.path().join("drive")).unwrap();
        let snapshot = drive.snapshot(&dir.path().join("ws")).unwrap();
        world.create_session("s1", "alice").await.unwrap();
        let lease = world
            .acquire_lease(
                "s1",
                &Holder::new("wrapped-driver"),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        world
            .append(
                &lease,
                &[{
                    let mut start = Event::bare_start(
                        "claude-code",
                        ModelSpec {
                            provider: "anthropic".into(),
                            model: "claude-sonnet-4-5".into(),
                        },
                        &dir.path().join("ws").display().to_string(),
                    );
                    if let Event::SessionStarted {
                        initial_snapshot,
                        limits,
                        ..
                    } = &mut start
                    {
                        *initial_snapshot = Some(snapshot.clone());
                        limits.max_cost_micro_usd = cap;
                    }
                    start
                }],
            )
            .await
            .unwrap();
        Setup {
            fake,
            world,
            drive,
            lease,
            last_snapshot: Arc::new(Mutex::new(Some(snapshot))),
            dir,
            http: steadfast_model::provider_http(),
            mismatch: Default::default(),
        }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// A gateway for a new run of the wrapped agent, served on loopback.
    async fn run(&self) -> (String, Gateway<SqliteWorld>, tokio::task::JoinHandle<()>) {
        let live = LiveSession::open(self.world.clone(), self.lease.clone())
            .await
            .unwrap();
        let exchanges = Exchanges::new(ExchangesConfig {
            live: Arc::new(live),
            drive: self.drive.clone(),
            workspace: self.ws(),
            last_snapshot: self.last_snapshot.clone(),
            blobs: steadfast_world::Blobs::local(&self.dir.path().join("blobs")).unwrap(),
            max_exchanges: None,
            extra_bound: None,
            prices: Default::default(),
            mismatch: self.mismatch,
        });
        let gateway = Gateway::open(GatewayConfig {
            exchanges: Arc::new(exchanges),
            token: TOKEN.into(),
            upstreams: Upstreams {
                anthropic: Some(Upstream {
                    base_url: self.fake.base_url(),
                    api_key: "sk-ant-real-key".into(),
                }),
                openai: Some(Upstream {
                    base_url: format!("{}/v1", self.fake.base_url()),
                    api_key: "sk-openai-real-key".into(),
                }),
            },
            models: vec!["claude-sonnet-4-5".into()],
            http: self.http.clone(),
            continuing: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = gateway.router();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (url, gateway, task)
    }

    /// Another process's hold on the log's write lock for `how_long`, taken when this
    /// returns; join the handle to wait for its release.
    fn hold_write_lock(&self, how_long: Duration) -> std::thread::JoinHandle<()> {
        let (locked, lock_held) = std::sync::mpsc::channel();
        let db = self.dir.path().join("world.db");
        let holder = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(db).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked.send(()).unwrap();
            std::thread::sleep(how_long);
            conn.execute_batch("ROLLBACK").unwrap();
        });
        lock_held.recv().unwrap();
        holder
    }

    /// Changes the workspace and records its snapshot as the session's last.
    fn edit(&self, content: &str) -> String {
        std::fs::write(self.ws().join("a.txt"), content).unwrap();
        let snap = self.drive.snapshot(&self.ws()).unwrap();
        *self.last_snapshot.lock().unwrap() = Some(snap.clone());
        snap
    }
}

fn messages_request(session: &str, text: &str, stream: bool) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "stream": stream,
        "metadata": {"user_id": format!("user_x_account__session_{session}")},
        "system": [{"type": "text", "text": format!("Today's date is 2026-11-3{}.", session.len() % 2),
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": text}],
    })
}

async fn post(url: &str, token: &str, body: &Value) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("x-api-key", token)
        .header("anthropic-version", "2023-06-01")
        .header("authorization", format!("Bearer {token}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn exchanges(setup: &Setup) -> Vec<steadfast_log::Exchange> {
    fold(&setup.world.read("s1", 1).await.unwrap())
        .unwrap()
        .exchanges
}

#[tokio::test]
async fn a_request_is_fitted_to_the_spend_cap_and_one_that_would_cross_it_is_never_made() {
    // claude-sonnet-4-5 costs 3 and 15 micro-USD a token. A request's worst case counts
    // each byte as a token written to the cache (3.75) plus 1,024 unseen tokens, and
    // each output token asked for: the cap leaves room for 2,000 output tokens of the
    // first request, not its 8,192.
    let mut first = messages_request("cap", "one", false);
    first["max_tokens"] = json!(8192);
    let bytes = serde_json::to_vec(&first).unwrap().len() as u64;
    let cap = ((bytes + 1024) as f64 * 3.75).ceil() as u64 + 2000 * 15 + 7;
    let setup = Setup::capped(json!([{"text": "one"}, {"text": "two"}]), Some(cap)).await;
    let (url, gateway, _task) = setup.run().await;
    let (status, body) = post(&format!("{url}/v1/messages"), TOKEN, &first).await;
    assert_eq!(status, 200, "{body}");
    let sent: Value = serde_json::from_str(&setup.fake.state().requests()[0]).unwrap();
    assert_eq!(
        sent["max_tokens"], 2000,
        "lowered to what the cap leaves room for"
    );
    assert_eq!(sent["messages"], first["messages"], "nothing else changed");

    // A long second request leaves no room for a reply: refused before the provider
    // sees it, and the session escalates with the reason.
    let second = messages_request("cap", &"x".repeat(20_000), false);
    let (status, body) = post(&format!("{url}/v1/messages"), TOKEN, &second).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("spend cap reached"), "{body}");
    assert_eq!(
        setup.fake.calls(),
        1,
        "the call that could cross the cap is not made"
    );
    let (breaker, reason) = gateway.exchanges().escalation().expect("escalated");
    assert_eq!(breaker, steadfast_log::Breaker::Cost);
    assert!(reason.contains("could cost up to"), "{reason}");
    let state = fold(&setup.world.read("s1", 1).await.unwrap()).unwrap();
    assert!(
        state.cost_micro_usd > 0 && state.cost_micro_usd <= cap,
        "{} of {cap}",
        state.cost_micro_usd
    );
    assert_eq!(exchanges(&setup).await.len(), 1);
}

#[tokio::test]
async fn a_restarted_client_is_answered_from_the_log_byte_for_byte() {
    let setup = Setup::new(json!([
        {"text": "Looking.", "tool_calls": [{"name": "bash", "input": {"command": "ls"}}]},
        {"text": "Done."}
    ]))
    .await;
    let (url, first, _task) = setup.run().await;
    let streamed = post(
        &format!("{url}/v1/messages?beta=true"),
        TOKEN,
        &messages_request("6f1c2a9e-1111-4a4a-8b8b-0123456789ab", "go", true),
    )
    .await;
    assert_eq!(streamed.0, 200, "{}", streamed.1);
    assert!(streamed.1.contains("event: message_stop"), "{}", streamed.1);
    let chat = post(
        &format!("{url}/v1/chat/completions"),
        TOKEN,
        &json!({"model": "gpt-5", "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    assert_eq!(chat.0, 200, "{}", chat.1);
    assert_eq!(setup.fake.calls(), 2);
    assert_eq!(first.exchanges().counters().live, 2);
    // Each reply is recorded whole, after it streamed through.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let recorded = exchanges(&setup).await;
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].reply.as_ref().unwrap().2, streamed.1);
    assert_eq!(recorded[1].reply.as_ref().unwrap().2, chat.1);

    // A new run of the client: another session id, another date in its prompt.
    let (url, second, _task2) = setup.run().await;
    let again = post(
        &format!("{url}/v1/messages?beta=true"),
        TOKEN,
        &messages_request("0a0b0c0d-2222-4c4c-9d9d-ba9876543210", "go", true),
    )
    .await;
    assert_eq!(again, streamed);
    let chat_again = post(
        &format!("{url}/v1/chat/completions"),
        TOKEN,
        &json!({"model": "gpt-5", "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    assert_eq!(chat_again, chat);
    assert_eq!(setup.fake.calls(), 2, "the provider was not asked again");
    assert_eq!(second.exchanges().counters().replayed, 2);

    // Past the record, requests go to the provider again.
    let next = post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("x", "and then?", false),
    )
    .await;
    assert_eq!(next.0, 200);
    assert_eq!(setup.fake.calls(), 3);
    assert_eq!(
        setup.fake.state().connections(),
        1,
        "each run's gateway calls through the harness's one connection pool"
    );
}

#[tokio::test]
async fn a_request_that_differs_from_the_record_diverges_and_restores_the_workspace() {
    let setup = Setup::new(json!([{"text": "one"}, {"text": "two"}])).await;
    let (url, _, _task) = setup.run().await;
    post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("a", "first", false),
    )
    .await;
    let at_second = setup.edit("v2"); // a tool changed the workspace between requests
    post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("a", "second", false),
    )
    .await;
    setup.edit("v3"); // and again after
    assert_eq!(setup.fake.calls(), 2);

    let (url, gateway, _task2) = setup.run().await;
    let (status, _) = post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("b", "first", false),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(setup.fake.calls(), 2, "the first request still matches");
    let (status, _) = post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("b", "something else", false),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        setup.fake.calls(),
        3,
        "the diverging request went to the provider"
    );
    assert_eq!(gateway.exchanges().counters().diverged, 1);
    assert_eq!(
        std::fs::read_to_string(setup.ws().join("a.txt")).unwrap(),
        "v2",
        "the workspace is back where it was when the superseded request was made"
    );
    let log = setup.world.read("s1", 1).await.unwrap();
    let diverged = log
        .iter()
        .find_map(|r| match &r.event {
            Event::ReplayDiverged { index, snapshot } => Some((*index, snapshot.clone())),
            _ => None,
        })
        .expect("recorded");
    assert_eq!(diverged, (1, Some(at_second)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let recorded = exchanges(&setup).await;
    assert_eq!(
        recorded.len(),
        2,
        "the superseded exchange is gone, the new one in its place"
    );
}

#[tokio::test]
async fn a_reply_cut_off_before_it_was_recorded_is_asked_again_in_its_place() {
    let setup = Setup::new(json!([{"text": "one"}])).await;
    let request = messages_request("a", "first", true);
    setup
        .world
        .append(
            &setup.lease,
            &[Event::ExchangeIntent {
                call_id: "gx_cut".into(),
                index: 0,
                api: steadfast_log::Api::AnthropicMessages,
                fingerprint: steadfast_gateway::normalize::fingerprint(
                    "anthropic.messages",
                    &request,
                    &steadfast_gateway::normalize::WorkspaceNames::new(&setup.ws(), &[]),
                ),
                stream: true,
                snapshot: None,
                request: None,
            }],
        )
        .await
        .unwrap();
    let (url, gateway, _task) = setup.run().await;
    let (status, body) = post(&format!("{url}/v1/messages"), TOKEN, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (
            gateway.exchanges().counters().live,
            gateway.exchanges().counters().diverged
        ),
        (1, 0)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let recorded = exchanges(&setup).await;
    assert_eq!(recorded.len(), 1);
    assert!(recorded[0].reply.is_some());
}

#[tokio::test]
async fn a_request_whose_intent_the_log_refuses_never_reaches_the_provider_whole() {
    let setup = Setup::new(json!([{"text": "one"}, {"text": "two"}])).await;
    let (url, gateway, _task) = setup.run().await;
    // A first call, so the gateway's connection to the provider is open and kept: the
    // next request goes out on it at once, while its intent is being appended.
    let (status, body) = post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("a", "first", false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Another driver takes the session over: this gateway's lease is stale, so the
    // store refuses its next intent.
    setup.world.release_lease(&setup.lease).await.unwrap();
    setup
        .world
        .acquire_lease(
            "s1",
            &Holder::new("another-driver"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    // And the log is slow to answer: another process holds its write lock for a
    // while, so a request that did not wait for its intent would reach the provider
    // meanwhile.
    let holder = setup.hold_write_lock(Duration::from_millis(400));
    let (status, body) = post(
        &format!("{url}/v1/messages"),
        TOKEN,
        &messages_request("a", "second", false),
    )
    .await;
    holder.join().unwrap();
    // Refused because another driver has the session: this run of the agent is over,
    // and the answer says so in the client's own error shape (not a server fault).
    assert_eq!(status, 409, "a refused intent cannot be answered: {body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error", "{body}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no longer drives the session"), "{body}");
    // What went out of the second request is abandoned, not finished late.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        setup.fake.calls(),
        1,
        "the provider must never have the whole request of an unrecorded call"
    );
    assert_eq!(gateway.exchanges().counters().live, 1);
    assert_eq!(exchanges(&setup).await.len(), 1);
}

#[tokio::test]
async fn a_reply_whose_client_went_away_mid_stream_is_still_recorded_whole() {
    let setup = Setup::new(json!([
        {"text": "A reply long enough to stream in many pieces. ".repeat(6), "chunk_delay_ms": 20}
    ]))
    .await;
    let request = messages_request("a", "go", true);
    let (url, gateway, _task) = setup.run().await;
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", TOKEN)
        .header("anthropic-version", "2023-06-01")
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    use futures_util::StreamExt;
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(body); // the client goes away with the reply half streamed
    assert!(
        exchanges(&setup).await[0].reply.is_none(),
        "not recorded before it ends"
    );
    gateway.settle(Duration::from_secs(30)).await;
    let recorded = exchanges(&setup).await;
    let reply = recorded[0].reply.as_ref().expect("recorded whole anyway");
    assert!(reply.2.contains("event: message_stop"), "{}", reply.2);

    // The client, restarted, gets the whole reply from the log.
    let (url, second, _task2) = setup.run().await;
    let (status, again) = post(&format!("{url}/v1/messages"), TOKEN, &request).await;
    assert_eq!(status, 200);
    assert_eq!(again, reply.2);
    assert_eq!(setup.fake.calls(), 1, "the provider was asked once");
    assert_eq!(second.exchanges().counters().replayed, 1);
}

/// A log too busy to take a call's intent (another process holds its write lock past
/// the store's wait) gets the call refused as unavailable, a 503 the client may retry,
/// and the call is never made; once the log is free, the same request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_log_is_too_busy_to_record_is_a_503_and_is_not_made() {
    let setup = Setup::new(json!([{"text": "one"}])).await;
    let (url, _gateway, _task) = setup.run().await;
    // Longer than the world waits for a lock (10 s).
    let holder = setup.hold_write_lock(Duration::from_secs(11));
    let request = messages_request("a", "first", false);
    let (status, body) = post(&format!("{url}/v1/messages"), TOKEN, &request).await;
    holder.join().unwrap();
    assert_eq!(status, 503, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error", "{body}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("log is unavailable"), "{body}");
    // The store's own words (SQLite's "database is locked", its file) stay in the
    // harness's log: the client is steered by the model.
    assert!(
        !message.contains("locked") && !message.contains("world.db") && !message.contains('/'),
        "{body}"
    );
    assert_eq!(setup.fake.calls(), 0, "the call was not made");
    let (status, body) = post(&format!("{url}/v1/messages"), TOKEN, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(setup.fake.calls(), 1);
}

/// A process that stops while a reply is still being recorded (its client gone, the
/// recording finishing in a task of its own) abandons the recording as a crash would:
/// the intent stays unanswered, for the next run to ask again. Before, the runtime's
/// shutdown dropped that task, whose recording handed itself to a new task, which the
/// closing runtime dropped at once, and so on until the stack overflowed.
#[test]
fn a_runtime_shut_down_mid_recording_abandons_it_cleanly() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (setup, _gateway) = runtime.block_on(async {
        let setup = Setup::new(json!([
            {"text": "A reply long enough to stream in many pieces. ".repeat(6), "chunk_delay_ms": 200}
        ]))
        .await;
        let (url, gateway, _task) = setup.run().await;
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/messages"))
            .header("x-api-key", TOKEN)
            .header("anthropic-version", "2023-06-01")
            .json(&messages_request("a", "go", true))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        use futures_util::StreamExt;
        assert!(!body.next().await.unwrap().unwrap().is_empty());
        drop(body); // the client goes away: the recording goes on in a task
        tokio::time::sleep(Duration::from_millis(100)).await;
        (setup, gateway)
    });
    drop(runtime); // the process stops with that task still reading the reply
    let after = tokio::runtime::Runtime::new().unwrap();
    let recorded = after.block_on(exchanges(&setup));
    assert_eq!(recorded.len(), 1);
    assert!(recorded[0].reply.is_none(), "abandoned, not recorded");
}

#[tokio::test]
async fn bad_requests_get_clear_errors_in_the_api_s_own_format() {
    let setup = Setup::new(json!([{"text": "one"}])).await;
    let (url, _, _task) = setup.run().await;
    let client = reqwest::Client::new();
    // No token, or another one: refused, and the provider never sees the request.
    for token in ["", "sk-ant-real-key", "wrong"] {
        let resp = client
            .post(format!("{url}/v1/messages"))
            .header("x-api-key", token)
            .json(&messages_request("a", "x", false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["type"], "authentication_error");
    }
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not JSON"));
    let resp = client
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", TOKEN)
        .body(vec![b' '; steadfast_gateway::MAX_REQUEST_BYTES + 10])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(setup.fake.calls(), 0);

    // The models listing is answered here, in either dialect.
    let anthropic: Value = client
        .get(format!("{url}/v1/models"))
        .header("x-api-key", TOKEN)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(anthropic["data"][0]["type"], "model");
    let openai: Value = client
        .get(format!("{url}/v1/models"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["data"][0]["id"], "claude-sonnet-4-5");
}

/// Runs the SDK client script against a gateway; its parsed results as JSON.
async fn sdk_clients(url: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/sdk_clients.py");
    let out = tokio::process::Command::new("python3")
        .args([script, url, TOKEN])
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the SDKs failed (pip install anthropic openai): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_official_python_sdks_parse_live_and_replayed_replies() {
    let setup = Setup::new(json!([
        {"text": "Listing the files now.", "tool_calls": [{"name": "bash", "input": {"command": "ls -la"}}]}
    ]))
    .await;
    let (url, first, _task) = setup.run().await;
    let live = sdk_clients(&url).await;
    let calls = setup.fake.calls();
    assert_eq!(calls, 6, "six model calls (count_tokens is not one)");
    assert_eq!(first.exchanges().counters().live, 7);
    // What each SDK parsed, including the tool call and its input.
    assert_eq!(live["anthropic"][1]["name"], "bash");
    assert_eq!(live["anthropic"][1]["input"]["command"], "ls -la");
    assert_eq!(live["anthropic_stream"][0], "Listing the files now.");
    assert_eq!(live["anthropic_stream"][2]["input"]["command"], "ls -la");
    assert_eq!(live["chat"][1][0][2]["command"], "ls -la");
    assert_eq!(live["chat_stream"][1][0][1], "bash");
    assert_eq!(live["responses"][0], "Listing the files now.");
    assert_eq!(live["responses_stream"][1][0][2]["command"], "ls -la");

    tokio::time::sleep(Duration::from_millis(200)).await;
    let (url, second, _task2) = setup.run().await;
    let replayed = sdk_clients(&url).await;
    assert_eq!(replayed, live, "the same results, ids included");
    assert_eq!(setup.fake.calls(), calls, "all answered from the log");
    assert_eq!(second.exchanges().counters().replayed, 7);
}
