//! A deployment's limits hold whichever API host a caller reaches: two `steadfast
//! serve` processes (each with its own home, as on two machines) on one PostgreSQL
//! world draw on the same buckets, so a caller alternating between them gets the rate
//! the operator set, not twice it.

mod common;

use serde_json::{json, Value};

use common::TestDatabase;

/// An API host (no workers) on the world at `world`, its configuration in `dir`.
async fn api_host(
    dir: &std::path::Path,
    world: &str,
    fake: &steadfast_testkit::FakeProvider,
) -> (tokio::process::Child, String) {
    let mut api = common::service(
        &dir.join("home"),
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .env("STEADFAST_CONFIG", dir.join("steadfast.toml"))
    .env("STEADFAST_WORLD", world)
    .env("STEADFAST_MIGRATE", "true")
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut api).await;
    (api, url)
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_limits_hold_across_api_hosts() {
    let db = TestDatabase::create("steadfast_rate_limits").await;
    let fake = common::fake_playing(json!([{"text": "hi"}])).await;
    let root = tempfile::tempdir().unwrap();
    let mut hosts = Vec::new();
    for name in ["a", "b"] {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("steadfast.toml"),
            "[server]\ncreations-per-minute = 3\nmessages-per-minute = 4\n",
        )
        .unwrap();
        hosts.push(api_host(&dir, &db.url, &fake).await);
    }
    let url = |i: usize| hosts[i % 2].1.clone();

    // Three creations a minute, made through both hosts in turn; the fourth is refused
    // by either.
    let mut made = Vec::new();
    for i in 0..3 {
        let (status, body) = post(&format!("{}/v1/sessions", url(i)), json!({})).await;
        assert_eq!(status, 201, "creation {i}: {body}");
        made.push(body["id"].as_str().unwrap().to_string());
    }
    for i in 0..2 {
        let (status, body) = post(&format!("{}/v1/sessions", url(i)), json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (429, Some("rate_limited")),
            "host {i}: {body}"
        );
    }

    // Four messages a minute to a session, whichever host takes them.
    let messages = |i: usize| format!("{}/v1/sessions/{}/messages", url(i), made[0]);
    for i in 0..4 {
        let (status, body) = post(&messages(i), json!({"text": format!("m{i}")})).await;
        assert_eq!(status, 202, "message {i}: {body}");
    }
    for i in 0..2 {
        let (status, body) = post(&messages(i), json!({"text": "more"})).await;
        assert_eq!(status, 429, "host {i}: {body}");
    }
    // Another session has its own.
    let other = format!("{}/v1/sessions/{}/messages", url(1), made[1]);
    let (status, body) = post(&other, json!({"text": "hello"})).await;
    assert_eq!(status, 202, "{body}");
    drop(hosts);
    db.drop_now().await;
}
