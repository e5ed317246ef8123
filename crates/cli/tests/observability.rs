//! What operators see of real `steadfast serve` and `steadfast worker` processes.
//! Metrics, scraped after scripted runs: the series count what the fake provider and
//! the log say happened, a takeover after a SIGKILL is counted by the worker that took
//! over, and outside development the metrics are only on the operator's own listener.
//! Logs: JSON lines, an access log, and the session's id on every line of its work.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

const MODEL: &str = "claude-sonnet-4-5";

use common::{service as command, wait_for};

/// A loopback address nothing listens on (the port is free when this returns).
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Starts `steadfast serve` with `extra` arguments; returns it with its base URL.
async fn serve(
    home: &Path,
    fake: &FakeProvider,
    extra: &[&str],
) -> (tokio::process::Child, String) {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = command(home, fake, &args).spawn().unwrap();
    let url = common::printed_url(&mut child).await;
    (child, url)
}

/// The scraped exposition, once the endpoint answers.
async fn scrape(url: &str) -> String {
    for _ in 0..200 {
        if let Ok(resp) = reqwest::get(url).await {
            assert_eq!(resp.status(), 200, "{url}");
            let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
            assert!(
                content_type.starts_with("application/openmetrics-text"),
                "{content_type}"
            );
            return resp.text().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never answered");
}

/// The value of one series (its name and labels exactly as exposed); 0 if absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

async fn session(url: &str, id: &str) -> Value {
    reqwest::get(format!("{url}/v1/sessions/{id}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn create(url: &str, task: &str) -> String {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"task": task}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let created: Value = resp.json().await.unwrap();
    created["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_is_counted_as_the_provider_and_the_log_saw_it() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Writing the notes.", "tool_calls": [
            {"name": "write", "input": {"file_path": "notes.txt", "content": "one\n"}},
            {"name": "read", "input": {"file_path": "notes.txt"}},
        ]},
        {"text": "Checking them.", "tool_calls": [{"name": "read", "input": {"file_path": "missing.txt"}}]},
        {"text": "Done."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (_server, url) = serve(&home, &fake, &["--workers", "1"]).await;
    let id = create(&url, "take notes").await;
    let mut summary = Value::Null;
    wait_for("the turn to end", async || {
        summary = session(&url, &id).await;
        summary["status"] == "idle"
    })
    .await;

    let text = scrape(&format!("{url}/metrics")).await;
    let calls = |outcome: &str| {
        value(
            &text,
            &format!("steadfast_model_calls_total{{provider=\"anthropic\",model=\"{MODEL}\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(calls("ok"), fake.calls() as f64, "{text}");
    assert_eq!(calls("ok"), 3.0);
    assert_eq!(calls("failed"), 0.0);
    let tokens = |kind: &str| {
        value(
            &text,
            &format!("steadfast_model_tokens_total{{provider=\"anthropic\",model=\"{MODEL}\",kind=\"{kind}\"}}"),
        )
    };
    assert_eq!(
        tokens("input"),
        summary["usage"]["input_tokens"].as_f64().unwrap()
    );
    assert_eq!(
        tokens("output"),
        summary["usage"]["output_tokens"].as_f64().unwrap()
    );
    let cost = value(
        &text,
        &format!("steadfast_model_cost_usd_total{{provider=\"anthropic\",model=\"{MODEL}\"}}"),
    );
    assert!(
        (cost - summary["cost_usd"].as_f64().unwrap()).abs() < 1e-9,
        "{cost}"
    );
    assert!(cost > 0.0);
    assert_eq!(
        value(
            &text,
            "steadfast_model_call_duration_seconds_count{provider=\"anthropic\"}"
        ),
        3.0
    );

    // Tool calls by class and result: the write changed the workspace, the reads
    // did not, and reading a missing file was a tool error.
    let tools = |class: &str, result: &str| {
        value(
            &text,
            &format!("steadfast_tool_calls_total{{class=\"{class}\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(tools("mutate", "ok"), 1.0, "{text}");
    assert_eq!(tools("read", "ok"), 1.0);
    assert_eq!(tools("read", "error"), 1.0);
    assert_eq!(
        value(
            &text,
            "steadfast_tool_call_duration_seconds_count{class=\"read\"}"
        ),
        2.0
    );

    assert_eq!(value(&text, "steadfast_turns_started_total"), 1.0);
    assert_eq!(
        value(&text, "steadfast_turns_ended_total{outcome=\"completed\"}"),
        1.0
    );
    assert_eq!(value(&text, "steadfast_turn_duration_seconds_count"), 1.0);
    assert_eq!(value(&text, "steadfast_step_duration_seconds_count"), 3.0);
    assert_eq!(value(&text, "steadfast_sessions{status=\"idle\"}"), 1.0);
    assert_eq!(value(&text, "steadfast_queue_depth"), 0.0);
    assert_eq!(value(&text, "steadfast_lease_takeovers_total"), 0.0);
    assert!(value(&text, "steadfast_queue_claim_duration_seconds_count") >= 1.0);

    // Every append was timed: as many as the log has appends (at most one per record).
    let appends = value(
        &text,
        "steadfast_journal_append_duration_seconds_count{store=\"sqlite\"}",
    );
    let records = summary["last_seq"].as_f64().unwrap();
    assert!(
        appends >= 6.0 && appends <= records,
        "{appends} appends, {records} records"
    );
    let provisioned: f64 = text
        .lines()
        .filter(|l| l.starts_with("steadfast_sandbox_provision_duration_seconds_count{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(provisioned >= 1.0, "{text}");

    // API requests by route pattern, never by the path with its ids.
    assert_eq!(
        value(
            &text,
            "steadfast_http_requests_total{method=\"POST\",route=\"/v1/sessions\",status=\"201\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(value(&text, "steadfast_http_requests_total{method=\"GET\",route=\"/v1/sessions/{id}\",status=\"200\"}") >= 1.0);
    assert!(!text.contains(&id), "session ids are never labels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_that_takes_over_a_killed_worker_s_turn_counts_it() {
    let long = "A reply that streams for a while, one careful piece at a time.";
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": long.repeat(4), "chunk_delay_ms": 30},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (_api, url) = serve(&home, &fake, &["--workers", "0"]).await;
    let addrs = [free_addr(), free_addr()];
    let mut workers: Vec<_> = addrs
        .iter()
        .map(|a| {
            command(&home, &fake, &["worker", "--metrics-listen", a])
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<i32> = workers.iter().map(|w| w.id().unwrap() as i32).collect();
    for addr in &addrs {
        scrape(&format!("http://{addr}/metrics")).await;
    }
    let id = create(&url, "explain slowly").await;
    let mut victim = 0;
    wait_for("the reply to be streaming", async || {
        let last;
        (last, victim) = common::last_kind_and_holder(&home);
        last == "model_delta" && pids.contains(&victim)
    })
    .await;
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    wait_for("the turn to end", async || {
        session(&url, &id).await["status"] == "idle"
    })
    .await;

    let survivor = &addrs[if pids[0] == victim { 1 } else { 0 }];
    let text = scrape(&format!("http://{survivor}/metrics")).await;
    assert_eq!(
        value(&text, "steadfast_lease_takeovers_total"),
        1.0,
        "{text}"
    );
    assert_eq!(value(&text, "steadfast_recovery_seconds_count"), 1.0);
    let recovery = value(&text, "steadfast_recovery_seconds_sum");
    assert!((0.0..30.0).contains(&recovery), "{recovery}");
    // The survivor answered the re-issued call and ended the turn it did not start.
    assert_eq!(
        value(
            &text,
            &format!("steadfast_model_calls_total{{provider=\"anthropic\",model=\"{MODEL}\",outcome=\"ok\"}}")
        ),
        1.0
    );
    assert_eq!(fake.calls(), 2);
    assert_eq!(
        value(&text, "steadfast_turns_ended_total{outcome=\"completed\"}"),
        1.0
    );
    assert_eq!(value(&text, "steadfast_turns_started_total"), 0.0);
    // The census is the world's, whichever process is asked.
    assert_eq!(value(&text, "steadfast_sessions{status=\"idle\"}"), 1.0);
    for w in &mut workers {
        let _ = w.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_development_metrics_are_only_on_the_operator_s_listener() {
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let metrics = free_addr();
    let (_server, url) = serve(
        &home,
        &fake,
        &[
            "--workers",
            "0",
            "--production",
            "--metrics-listen",
            &metrics,
        ],
    )
    .await;
    let resp = reqwest::get(format!("{url}/metrics")).await.unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--metrics-listen"),
        "{body}"
    );
    let text = scrape(&format!("http://{metrics}/metrics")).await;
    assert_eq!(value(&text, "steadfast_queue_depth"), 0.0);
    assert!(
        text.contains("# TYPE steadfast_turns_started counter"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_s_json_log_has_an_access_log_and_names_the_session_on_every_line_of_its_work() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Writing.", "tool_calls": [{"name": "write", "input": {"file_path": "a.txt", "content": "a"}}]},
        {"text": "Done."},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut cmd = command(
        &home,
        &fake,
        &[
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
        ],
    );
    cmd.env_remove("RUST_LOG").stderr(Stdio::piped());
    let mut server = cmd.spawn().unwrap();
    let stdout = server.stdout.take().unwrap();
    let stderr = server.stderr.take().unwrap();
    let lines = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push(line);
        }
        all
    });
    let url = tokio::io::BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let id = create(&url, "write a").await;
    wait_for("the turn to end", async || {
        session(&url, &id).await["status"] == "idle"
    })
    .await;
    kill(Pid::from_raw(server.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let _ = server.wait().await;
    let lines = lines.await.unwrap();

    let json: Vec<Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(json.len() >= 4, "{lines:#?}");
    let access: Vec<&Value> = json
        .iter()
        .filter(|l| l["target"] == "steadfast::access")
        .collect();
    let created = access
        .iter()
        .find(|l| l["fields"]["method"] == "POST" && l["fields"]["route"] == "/v1/sessions")
        .unwrap_or_else(|| panic!("no access line for the create: {lines:#?}"));
    assert_eq!(created["fields"]["status"], 201);
    assert!(created["fields"]["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(access
        .iter()
        .any(|l| l["fields"]["path"] == format!("/v1/sessions/{id}")));

    // The worker's lines about the session's work name it, through their span.
    let work: Vec<&Value> = json
        .iter()
        .filter(|l| {
            l["target"]
                .as_str()
                .unwrap()
                .starts_with("steadfast_harness")
        })
        .collect();
    assert!(!work.is_empty(), "{lines:#?}");
    for line in work {
        assert_eq!(line["span"]["session"], id.as_str(), "{line}");
    }
}

/// An OTLP/HTTP receiver (JSON encoding) on loopback: every span exported to it.
async fn otlp_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request: Value = serde_json::from_slice(&body).unwrap();
                let mut kept = kept.lock().unwrap();
                for resource in request["resourceSpans"].as_array().into_iter().flatten() {
                    let instance = attribute(&resource["resource"], "service.instance.id");
                    for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                        for span in scope["spans"].as_array().into_iter().flatten() {
                            let mut span = span.clone();
                            span["instance"] = instance.clone();
                            kept.push(span);
                        }
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

/// An attribute's value in OTLP's JSON (a string; integers are sent as strings too).
fn attribute(item: &Value, key: &str) -> Value {
    item["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == key)
        .map(|a| {
            let v = &a["value"];
            v.get("stringValue")
                .or_else(|| v.get("intValue"))
                .cloned()
                .unwrap_or(Value::Null)
        })
        .unwrap_or(Value::Null)
}

/// An attribute's OTLP value type (`stringValue`, `intValue`, ...) and value.
fn typed(item: &Value, key: &str) -> (String, Value) {
    item["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"].as_object())
        .and_then(|v| v.iter().next())
        .map(|(kind, value)| (kind.clone(), value.clone()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_one_trace_across_a_worker_kill_with_genai_model_spans() {
    let long = "A reply that streams for a while, one careful piece at a time.";
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Writing.", "tool_calls": [{"name": "write", "input": {"file_path": "a.txt", "content": "a"}}]},
        {"text": long.repeat(4), "chunk_delay_ms": 30},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let (otlp, spans) = otlp_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (_api, url) = serve(&home, &fake, &["--workers", "0"]).await;
    let mut workers: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = command(&home, &fake, &["worker"]);
            cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
                .env("OTEL_BSP_SCHEDULE_DELAY", "50");
            cmd.spawn().unwrap()
        })
        .collect();
    let pids: Vec<i32> = workers.iter().map(|w| w.id().unwrap() as i32).collect();
    let id = create(&url, "write a, then explain").await;
    let mut victim = 0;
    wait_for("the second reply to be streaming", async || {
        let last;
        (last, victim) = common::last_kind_and_holder(&home);
        let streamed = spans.lock().unwrap().iter().any(|s| {
            s["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("execute_tool")
        });
        last == "model_delta" && pids.contains(&victim) && streamed
    })
    .await;
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    wait_for("the turn to end", async || {
        session(&url, &id).await["status"] == "idle"
    })
    .await;
    // The survivor stops on SIGTERM, sending what it has batched.
    for w in &mut workers {
        if let Some(pid) = w.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        let _ = w.wait().await;
    }

    let spans = spans.lock().unwrap().clone();
    let ours: Vec<&Value> = spans
        .iter()
        .filter(|s| attribute(s, "steadfast.session") == id.as_str())
        .collect();
    // Provisioning a sandbox (on the blocking pool) is part of the turn's trace, not a
    // trace of its own.
    let provisions: Vec<&Value> = spans.iter().filter(|s| s["name"] == "provision").collect();
    assert!(
        !provisions.is_empty(),
        "a sandbox was provisioned: {spans:#?}"
    );
    for p in &provisions {
        assert!(
            p["parentSpanId"].as_str().is_some_and(|id| !id.is_empty())
                && ours.iter().any(|s| s["traceId"] == p["traceId"]),
            "{p:#}"
        );
    }
    let traces: std::collections::BTreeSet<&str> = ours
        .iter()
        .map(|s| s["traceId"].as_str().unwrap())
        .collect();
    assert_eq!(traces.len(), 1, "one trace for the turn: {ours:#?}");
    let instances: std::collections::BTreeSet<String> =
        ours.iter().map(|s| s["instance"].to_string()).collect();
    assert_eq!(instances.len(), 2, "spans from both workers: {ours:#?}");
    let models: Vec<&&Value> = ours
        .iter()
        .filter(|s| s["name"] == format!("chat {MODEL}"))
        .collect();
    assert!(models.len() >= 2, "{ours:#?}");
    for span in &models {
        assert_eq!(attribute(span, "gen_ai.system"), "anthropic");
        assert_eq!(attribute(span, "gen_ai.request.model"), MODEL);
        assert_eq!(attribute(span, "gen_ai.operation.name"), "chat");
        assert_eq!(span["kind"], 3, "a client span: {span}");
    }
    // Counts are integers, as the GenAI conventions type them (not strings).
    assert!(
        models.iter().any(|s| {
            [
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "steadfast.turn",
            ]
            .iter()
            .all(|key| typed(s, key).0 == "intValue")
        }),
        "{models:#?}"
    );
    assert!(
        ours.iter().any(|s| s["name"] == "execute_tool write"),
        "{ours:#?}"
    );
    let turn = ours
        .iter()
        .find(|s| s["name"] == "turn 1")
        .unwrap_or_else(|| panic!("the turn's span: {ours:#?}"));
    assert_eq!(attribute(turn, "steadfast.turn.outcome"), "completed");
    // The turn span is the trace's root, and every other span of the turn hangs from it
    // (no span names a parent the trace lacks).
    assert!(
        turn["parentSpanId"].as_str().unwrap_or_default().is_empty(),
        "{turn}"
    );
    // Snapshots are spans of the tool calls that take them.
    let tools: Vec<&Value> = ours
        .iter()
        .filter(|s| s["name"] == "execute_tool write")
        .map(|s| &s["spanId"])
        .collect();
    let in_trace: Vec<&Value> = spans
        .iter()
        .filter(|s| s["traceId"] == ours[0]["traceId"])
        .collect();
    assert!(
        in_trace
            .iter()
            .any(|s| s["name"] == "snapshot workspace" && tools.contains(&&s["parentSpanId"])),
        "{in_trace:#?}"
    );
    let ids: Vec<&Value> = ours.iter().map(|s| &s["spanId"]).collect();
    for span in ours.iter().filter(|s| s["name"] != "turn 1") {
        assert!(
            ids.contains(&&span["parentSpanId"]),
            "a dangling parent: {span}"
        );
        let name = span["name"].as_str().unwrap();
        if name.starts_with("chat") || name.starts_with("execute_tool") {
            assert_eq!(span["parentSpanId"], turn["spanId"], "{span}");
        }
    }
    // The turn span runs from the turn's start, which the other worker saw.
    let start: u64 = turn["startTimeUnixNano"].as_str().map_or_else(
        || turn["startTimeUnixNano"].as_u64().unwrap(),
        |s| s.parse().unwrap(),
    );
    let first_child = ours
        .iter()
        .filter_map(|s| {
            s["startTimeUnixNano"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .or_else(|| s["startTimeUnixNano"].as_u64())
        })
        .min()
        .unwrap();
    assert!(start <= first_child, "{start} > {first_child}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_that_does_not_parse_is_a_clear_startup_error() {
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(
        &dir.path().join("home"),
        &fake,
        &["worker", "--metrics-listen", "nowhere:xx"],
    );
    cmd.stderr(Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listening for metrics on nowhere:xx"),
        "{stderr}"
    );
}

/// Idle workers wait to be told about work instead of polling the queue: four idle
/// worker slots make a handful of claims in four seconds (about eighty when each
/// looked five times a second), and still take a session another process makes at
/// once: on PostgreSQL through its notifications, on SQLite through its data
/// version, which moves on another process's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_wait_to_be_told_rather_than_poll_the_queue() {
    let script: Script = serde_json::from_value(json!({"steps": [{"text": "Hello."}]})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let db = common::TestDatabase::create("idle_workers").await;
    for world in [None, Some(db.url.clone())] {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let with_world = |mut cmd: tokio::process::Command| {
            if let Some(url) = &world {
                cmd.env("STEADFAST_WORLD", url)
                    .env("STEADFAST_MIGRATE", "true");
            }
            cmd
        };
        let addr = free_addr();
        let _worker = with_world(command(
            &home,
            &fake,
            &["worker", "--workers", "4", "--metrics-listen", &addr],
        ))
        .spawn()
        .unwrap();
        let metrics = format!("http://{addr}/metrics");
        let claims = async || {
            value(
                &scrape(&metrics).await,
                "steadfast_queue_claim_duration_seconds_count",
            )
        };
        claims().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = claims().await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let looked = claims().await - before;
        assert!(
            looked <= 24.0,
            "{looked} claims in 4 s by 4 idle workers ({world:?})"
        );

        let mut api = with_world(command(
            &home,
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
        ))
        .spawn()
        .unwrap();
        let url = common::printed_url(&mut api).await;
        let id = create(&url, "say hello").await;
        wait_for("the idle worker to take the session", async || {
            session(&url, &id).await["status"] == "idle"
        })
        .await;
    }
    db.drop_now().await;
}
