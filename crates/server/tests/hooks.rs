//! Inbound hooks over real HTTP: a GitHub-signed delivery answers a session's wait, a
//! token URL starts a turn, and forged, replayed, stale, revoked and other owners'
//! attempts change nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_error, call, server, wait_status};
use hmac::{KeyInit, Mac};
use reqwest::Method;
use serde_json::{json, Value};
use steadfast_server::Auth;
use steadfast_world::Scope;

fn auth() -> Auth {
    common::auth_of(&[
        ("alice", "alice-secret", None),
        ("bob", "bob-secret", None),
        ("ops", "ops-secret", Some(Scope::ALL.to_vec())),
    ])
}

fn github_signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Posts `body` to a hook URL with `headers`; the status and JSON answer.
async fn deliver(url: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn create_session(url: &str) -> String {
    let (status, created) = call(
        Method::POST,
        &format!("{url}/v1/sessions"),
        Some("alice-secret"),
        Some(json!({"task": "hello"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_string()
}

async fn events(url: &str, id: &str) -> Vec<Value> {
    let resp = reqwest::Client::new()
        .get(format!("{url}/v1/sessions/{id}/events?limit=1000"))
        .bearer_auth("alice-secret")
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let page: Value = resp.json().await.unwrap();
    page["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_signed_delivery_answers_a_wait_once() {
    let srv = server(
        json!([
            {"text": "hi"},
            {"tool_calls": [{"name": "request_approval", "input": {"reason": "merge when CI passes"}}]},
            {"text": "approved, done"}
        ]),
        auth(),
        1,
        |state| {
            state.vault = Some(Arc::new(
                steadfast_world::VaultKeys::new(&[9u8; 32], &[]).unwrap(),
            ))
        },
    )
    .await;
    let id = create_session(&srv.url).await;
    wait_status(&srv.url, &id, Some("alice-secret"), "idle").await;
    let hooks = format!("{}/v1/sessions/{id}/hooks", srv.url);

    // Another owner can neither make nor see the session's hooks.
    let body = json!({"name": "approval", "check": "github"});
    let bobs = call(Method::POST, &hooks, Some("bob-secret"), Some(body.clone())).await;
    assert_error(&bobs, 404, "session_not_found");
    // A name only the owner may send is refused.
    let resume = call(
        Method::POST,
        &hooks,
        Some("alice-secret"),
        Some(json!({"name": "resume", "check": "github"})),
    )
    .await;
    assert_error(&resume, 422, "invalid_body");
    for name in ["..", "a/b", ""] {
        let bad = call(
            Method::POST,
            &hooks,
            Some("alice-secret"),
            Some(json!({"name": name, "check": "token"})),
        )
        .await;
        assert_error(&bad, 422, "invalid_body");
    }
    let (status, made) = call(
        Method::POST,
        &hooks,
        Some("alice-secret"),
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (made["check"].as_str(), made["then"].as_str()),
        (Some("github"), Some("signal"))
    );
    let secret = made["secret"].as_str().unwrap().to_string();
    let url = made["url"].as_str().unwrap().to_string();
    assert_eq!(url, format!("{}/v1/hooks/{id}/approval", srv.url));
    let again = call(Method::POST, &hooks, Some("alice-secret"), Some(body)).await;
    assert_error(&again, 409, "hook_exists");
    let (_, listed) = call(Method::GET, &hooks, Some("alice-secret"), None).await;
    assert_eq!(listed["hooks"].as_array().unwrap().len(), 1, "{listed}");
    assert!(
        !listed.to_string().contains(&secret),
        "no secret listed: {listed}"
    );
    let (status, _) = call(Method::GET, &hooks, Some("bob-secret"), None).await;
    assert_eq!(status, 404);

    // The next turn waits for approval.
    let queued = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .bearer_auth("alice-secret")
        .header("accept", "application/json")
        .json(&json!({"text": "merge it"}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202);
    let waiting = wait_status(&srv.url, &id, Some("alice-secret"), "waiting").await;
    let since = waiting["waiting_since"].as_u64().unwrap();

    let payload = br#"{"approved": true, "check_run": {"conclusion": "success"}}"#;
    let signed = |delivery: &str, event: &str, key: &str, body: &[u8]| {
        vec![
            ("x-hub-signature-256", github_signature(key, body)),
            ("x-github-delivery", delivery.to_string()),
            ("x-github-event", event.to_string()),
        ]
    };
    // Forged, unsigned or unnamed deliveries are refused and change nothing.
    let forged = deliver(
        &url,
        &signed("d-1", "check_run", "guessed-secret", payload),
        payload,
    )
    .await;
    assert_error(&forged, 401, "bad_signature");
    let tampered = deliver(
        &url,
        &signed("d-1", "check_run", &secret, payload),
        br#"{"approved": true}"#,
    )
    .await;
    assert_error(&tampered, 401, "bad_signature");
    let mut unnamed = signed("d-1", "check_run", &secret, payload);
    unnamed.retain(|(k, _)| *k != "x-github-delivery");
    let unnamed = deliver(&url, &unnamed, payload).await;
    assert_error(&unnamed, 400, "missing_header");
    assert!(
        unnamed.1.to_string().contains("X-GitHub-Delivery"),
        "{unnamed:?}"
    );
    let bearer_only = call(
        Method::POST,
        &url,
        Some("alice-secret"),
        Some(json!({"approved": true})),
    )
    .await;
    assert_error(&bearer_only, 400, "missing_header");
    // GitHub's ping is answered and delivers nothing.
    let ping = deliver(&url, &signed("d-0", "ping", &secret, b"{}"), b"{}").await;
    assert_eq!(ping.0, 200, "{ping:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let still = wait_status(&srv.url, &id, Some("alice-secret"), "waiting").await;
    assert_eq!(still["waiting_since"], since);

    let taken = deliver(&url, &signed("d-1", "check_run", &secret, payload), payload).await;
    assert_eq!(taken.0, 202, "{taken:?}");
    assert_eq!(taken.1["answers"], since, "{taken:?}");
    assert_eq!(taken.1["delivery"], "d-1");
    let done = wait_status(&srv.url, &id, Some("alice-secret"), "idle").await;
    assert_eq!(done["reply"], "approved, done");
    // The same delivery again is a replay, refused even though it is well signed.
    let replay = deliver(&url, &signed("d-1", "check_run", &secret, payload), payload).await;
    assert_error(&replay, 409, "replayed");
    // A new delivery while nothing waits is refused, and may be sent again later.
    let early = deliver(&url, &signed("d-2", "check_run", &secret, payload), payload).await;
    assert_error(&early, 409, "not_waiting");

    // The log has what the hook delivered, where the wait was answered.
    let log = events(&srv.url, &id).await;
    let received: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "signal_received")
        .collect();
    assert_eq!(received.len(), 1, "{log:?}");
    assert_eq!(received[0]["signal"], "approval");
    assert_eq!(received[0]["payload"]["check_run"]["conclusion"], "success");

    // The audit log names the hook's making and its delivery; metrics count by result.
    let (status, audit) = call(
        Method::GET,
        &format!("{}/v1/audit", srv.url),
        Some("ops-secret"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{audit}");
    let actions: Vec<(&str, &str)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert!(actions.contains(&("hook.created", "alice")), "{audit}");
    assert!(
        actions.contains(&("hook.delivered", "hook:approval")),
        "{audit}"
    );
    // The owner reads the session's own entries; another owner reads nothing.
    let audit_url = format!("{}/v1/sessions/{id}/audit", srv.url);
    let (status, own) = call(Method::GET, &audit_url, Some("alice-secret"), None).await;
    assert_eq!(status, 200, "{own}");
    let own: Vec<&str> = own["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(own, ["session.created", "hook.created", "hook.delivered"]);
    let (status, _) = call(Method::GET, &audit_url, Some("bob-secret"), None).await;
    assert_eq!(status, 404);
    let metrics = steadfast_metrics::metrics().encode();
    for result in [
        "delivered",
        "bad_signature",
        "replayed",
        "ping",
        "not_waiting",
    ] {
        assert!(
            metrics.contains(&format!(
                "steadfast_hook_deliveries_total{{check=\"github\",result=\"{result}\"}}"
            )),
            "{result} counted: {metrics}"
        );
    }

    // Revoked: the URL is gone at once.
    let bobs = call(
        Method::DELETE,
        &format!("{hooks}/approval"),
        Some("bob-secret"),
        None,
    )
    .await;
    assert_eq!(bobs.0, 404);
    let (status, _) = call(
        Method::DELETE,
        &format!("{hooks}/approval"),
        Some("alice-secret"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let revoked = deliver(&url, &signed("d-3", "check_run", &secret, payload), payload).await;
    assert_error(&revoked, 404, "hook_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_url_starts_a_turn_with_the_delivery() {
    let srv = server(
        json!([{"text": "hi"}, {"text": "looking at the disk"}, {"text": "on it"}]),
        auth(),
        1,
        // Two messages a minute: replays must not spend them.
        |state| state.messages_per_minute = 2,
    )
    .await;
    let id = create_session(&srv.url).await;
    wait_status(&srv.url, &id, Some("alice-secret"), "idle").await;
    let hooks = format!("{}/v1/sessions/{id}/hooks", srv.url);
    // Signing checks seal their key with the vault's: this server has none.
    let signed = call(
        Method::POST,
        &hooks,
        Some("alice-secret"),
        Some(json!({"name": "page", "check": "slack"})),
    )
    .await;
    assert_error(&signed, 422, "vault_unavailable");
    let bad = call(
        Method::POST,
        &hooks,
        Some("alice-secret"),
        Some(json!({"name": "page", "check": "carrier-pigeon"})),
    )
    .await;
    assert_eq!(bad.0, 422, "{bad:?}");
    assert!(bad.1.to_string().contains("check"), "{bad:?}");
    let (status, made) = call(
        Method::POST,
        &hooks,
        Some("alice-secret"),
        Some(json!({"name": "page", "then": "message"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let url = made["url"].as_str().unwrap().to_string();
    let token = made["secret"].as_str().unwrap();
    assert!(url.ends_with(&format!("?token={token}")), "{made}");
    let bare = url.split('?').next().unwrap();

    let incident = br#"{"incident": "disk full on db-7", "severity": "high"}"#;
    let key = |k: &str| vec![("idempotency-key", k.to_string())];
    assert_error(
        &deliver(bare, &key("p-1"), incident).await,
        401,
        "missing_token",
    );
    assert_error(
        &deliver(&format!("{bare}?token=hk_wrong"), &key("p-1"), incident).await,
        401,
        "bad_signature",
    );
    let taken = deliver(&url, &key("p-1"), incident).await;
    assert_eq!(taken.0, 202, "{taken:?}");
    for _ in 0..5 {
        assert_error(&deliver(&url, &key("p-1"), incident).await, 409, "replayed");
    }
    let done = wait_status(&srv.url, &id, Some("alice-secret"), "idle").await;
    assert_eq!(done["reply"], "looking at the disk", "{done}");
    let log = events(&srv.url, &id).await;
    let said: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "user_message")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        said.iter()
            .any(|t| t.contains("`page` hook") && t.contains("disk full on db-7")),
        "{said:?}"
    );
    // The model was asked with it.
    assert!(
        srv.fake
            .state()
            .requests()
            .iter()
            .any(|r| r.contains("disk full on db-7")),
        "the model saw the delivery"
    );
    // The replays spent none of the session's two messages a minute.
    let second = deliver(&url, &key("p-2"), br#"{"incident": "resolved"}"#).await;
    assert_eq!(second.0, 202, "{second:?}");
    // A body over the limit is refused from its headers.
    let big = vec![b' '; 2 * 1024 * 1024];
    assert_error(
        &deliver(&url, &key("p-3"), &big).await,
        413,
        "body_too_large",
    );
}
