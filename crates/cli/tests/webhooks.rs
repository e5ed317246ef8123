//! Webhooks out, as an operator's endpoint sees them: a receiver on loopback that
//! fails the first two deliveries of each change gets it on the third, signed with
//! the operator's secret (checked here with an independent HMAC) and with the same
//! idempotency key every time, though the server was SIGKILLed and started again
//! between the attempts; after that, nothing more. The deliveries are in the world's
//! outbox and in the metrics.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use hmac::{KeyInit, Mac};
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{service, wait_for};

const SECRET: &str = "whsec-test-0123456789";

/// What the receiver got: each request's headers and body, in order.
#[derive(Default)]
struct Received {
    requests: Vec<(HeaderMap, Vec<u8>)>,
    per_key: HashMap<String, u32>,
}

/// A receiver that answers 500 to the first two deliveries of each idempotency key.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let got = Arc::new(Mutex::new(Received::default()));
    let state = got.clone();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let mut got = state.lock().unwrap();
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let n = got.per_key.entry(key).or_default();
                *n += 1;
                let status = if *n <= 2 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                };
                got.requests.push((headers, body.to_vec()));
                status
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

fn serve(home: &Path, fake: &FakeProvider, config: &Path) -> tokio::process::Command {
    let mut cmd = service(
        home,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    );
    cmd.env("STEADFAST_CONFIG", config)
        .env("STEADFAST_WEBHOOK_SECRET", SECRET);
    cmd
}

/// The outbox's rows: (kind, attempts, delivered status).
fn outbox(home: &Path) -> Vec<(String, u32, Option<u16>)> {
    let conn = rusqlite::Connection::open_with_flags(
        home.join("world.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut stmt = conn
        .prepare("SELECT kind, attempts, status FROM outbox ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap()
}

/// Checks `header` signs `body` with [`SECRET`], computing the HMAC independently.
fn verify(header: &str, body: &[u8]) {
    let (t, v1) = header
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .unwrap_or_else(|| panic!("malformed signature header {header}"));
    let t_ms: u64 = t.parse().unwrap();
    let now = steadfast_world::now_ms();
    assert!(now.abs_diff(t_ms) < 120_000, "signed at {t_ms}, now {now}");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&hex::decode(v1).unwrap())
        .expect("the signature verifies with the operator's secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_delivered_signed_on_the_third_attempt_across_a_server_kill() {
    let script: Script = serde_json::from_value(json!({"steps": [{"text": "all done"}]})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let (hook, got) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = dir.path().join("steadfast.toml");
    std::fs::write(
        &config,
        format!("[server.webhook]\nurl = \"{hook}\"\nfirst-retry-ms = 1500\n"),
    )
    .unwrap();

    let mut api = serve(&home, &fake, &config).spawn().unwrap();
    let url = common::printed_url(&mut api).await;
    let created: Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"task": "say you are done"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();

    // Two failed attempts, both recorded; then the server dies before the third.
    wait_for("two failed deliveries recorded", async || {
        got.lock().unwrap().requests.len() >= 2
            && outbox(&home)
                .iter()
                .any(|(kind, attempts, _)| kind == "turn_ended" && *attempts == 2)
    })
    .await;
    api.start_kill().unwrap();
    api.wait().await.unwrap();
    assert_eq!(
        got.lock().unwrap().requests.len(),
        2,
        "no attempt in flight"
    );

    // A new server process delivers it: nothing was lost with the old one.
    let mut api = serve(&home, &fake, &config).spawn().unwrap();
    let url = common::printed_url(&mut api).await;
    wait_for("the third delivery", async || {
        got.lock().unwrap().requests.len() >= 3
    })
    .await;
    wait_for("the delivery recorded", async || {
        outbox(&home)
            .iter()
            .any(|(kind, _, status)| kind == "turn_ended" && *status == Some(200))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let got = std::mem::take(&mut *got.lock().unwrap());
    assert_eq!(got.requests.len(), 3, "delivered once, then never again");
    let mut keys = Vec::new();
    for (n, (headers, body)) in got.requests.iter().enumerate() {
        let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_string();
        verify(&header("steadfast-signature"), body);
        let payload: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(payload["attempt"], n as u64 + 1, "{payload}");
        assert_eq!(payload["session"], id.as_str());
        assert_eq!(payload["type"], "session.idle");
        assert_eq!(header("steadfast-event"), "session.idle");
        assert_eq!(payload["event"]["type"], "turn_ended");
        assert_eq!(payload["event"]["turn"], 1);
        assert_eq!(payload["event"]["seq"], payload["seq"]);
        assert_eq!(payload["id"].as_str().unwrap(), header("idempotency-key"));
        keys.push(header("idempotency-key"));
    }
    keys.dedup();
    assert_eq!(
        keys,
        [format!("{id}.{}", {
            let payload: Value = serde_json::from_slice(&got.requests[0].1).unwrap();
            payload["seq"].as_u64().unwrap()
        })]
    );
    // A body changed in transit does not verify.
    let (headers, body) = &got.requests[2];
    let mut forged = body.clone();
    forged[10] ^= 1;
    let header = headers
        .get("steadfast-signature")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(std::panic::catch_unwind(|| verify(header, &forged)).is_err());

    let rows = outbox(&home);
    assert_eq!(rows, [("turn_ended".to_string(), 2, Some(200))]);
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("steadfast_webhook_deliveries_total{result=\"delivered\"} 1"),
        "{metrics}"
    );
}

/// An endpoint that answers with a redirect does not get the body sent on: the
/// signed, replayable delivery never reaches the host it names, and the attempt is
/// recorded as failed (to be tried again at the endpoint itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_from_the_endpoint_is_not_followed() {
    let script: Script = serde_json::from_value(json!({"steps": [{"text": "all done"}]})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    // Where the redirect points: it must see nothing.
    let (elsewhere, got_elsewhere) = receiver().await;
    let redirects = Arc::new(Mutex::new(0u32));
    let counted = redirects.clone();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move || {
            let counted = counted.clone();
            let to = elsewhere.clone();
            async move {
                *counted.lock().unwrap() += 1;
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, to)],
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = dir.path().join("steadfast.toml");
    std::fs::write(
        &config,
        format!("[server.webhook]\nurl = \"{hook}\"\nfirst-retry-ms = 60000\n"),
    )
    .unwrap();
    let mut api = serve(&home, &fake, &config).spawn().unwrap();
    let url = common::printed_url(&mut api).await;
    let (status, _) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "say you are done"})),
    )
    .await;
    assert_eq!(status, 201);
    wait_for(
        "a delivery answered with a redirect, recorded",
        async || {
            *redirects.lock().unwrap() >= 1
                && outbox(&home).iter().any(|(kind, attempts, status)| {
                    kind == "turn_ended" && *attempts >= 1 && status.is_none()
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        got_elsewhere.lock().unwrap().requests.is_empty(),
        "the redirect was not followed"
    );
}
