//! Vaults through the API: each owner writes credentials by name, lists their names,
//! never reads a value back; the value appears nowhere in what the server stores; no
//! owner sees another's; a server without a key, or in public mode, keeps none.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{assert_error, call, dev, server, tokens};
use reqwest::Method;
use serde_json::json;
use steadfast_server::Auth;
use steadfast_world::VaultKeys;

const SECRET: &str = "ghp_vaulted_0123456789abcdef";

/// Every byte under `dir` (the world's file, its WAL, blobs, snapshots).
fn holds(dir: &Path, needle: &[u8]) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .map(|e| e.path().display().to_string())
        .collect()
}

fn keyed(state: &mut steadfast_server::ServerState<steadfast_world::SqliteWorld>) {
    state.vault = Some(Arc::new(VaultKeys::new(&[5u8; 32], &[]).unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_write_only_per_owner_and_stored_sealed() {
    let srv = server(json!([]), tokens(), 0, keyed).await;
    let vault = |name: &str| format!("{}/v1/vaults/{name}", srv.url);
    let list = format!("{}/v1/vaults", srv.url);

    let (status, body) = call(
        Method::PUT,
        &vault("github"),
        Some("alice-secret"),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (status, listed) = call(Method::GET, &list, Some("alice-secret"), None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["credentials"][0]["name"], "github");
    assert!(!listed.to_string().contains(SECRET), "{listed}");
    let (_, theirs) = call(Method::GET, &list, Some("bob-secret"), None).await;
    assert_eq!(theirs["credentials"], json!([]), "not bob's");
    assert_error(
        &call(Method::DELETE, &vault("github"), Some("bob-secret"), None).await,
        404,
        "no_credential",
    );
    // There is no route that reads a value back.
    assert_eq!(
        call(Method::GET, &vault("github"), Some("alice-secret"), None)
            .await
            .0,
        405
    );

    // Replaced, not added; the value is nowhere on disk.
    call(
        Method::PUT,
        &vault("github"),
        Some("alice-secret"),
        Some(json!({"value": format!("{SECRET}-2")})),
    )
    .await;
    let (_, listed) = call(Method::GET, &list, Some("alice-secret"), None).await;
    assert_eq!(listed["credentials"].as_array().unwrap().len(), 1);
    let stored = holds(srv._dir.path(), SECRET.as_bytes());
    assert!(
        stored.is_empty(),
        "the value is stored in the clear: {stored:?}"
    );

    for (name, body, status, code) in [
        ("bad name!", json!({"value": "x"}), 422, "invalid_name"),
        ("ok", json!({"value": ""}), 422, "invalid_body"),
        ("ok", json!({"secret": "x"}), 422, "invalid_body"),
    ] {
        let got = call(Method::PUT, &vault(name), Some("alice-secret"), Some(body)).await;
        assert_error(&got, status, code);
    }
    assert_error(
        &call(Method::GET, &list, None, None).await,
        401,
        "unauthorized",
    );
    assert_eq!(
        call(Method::DELETE, &vault("github"), Some("alice-secret"), None)
            .await
            .0,
        204
    );
    assert_error(
        &call(Method::DELETE, &vault("github"), Some("alice-secret"), None).await,
        404,
        "no_credential",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_or_in_public_mode_no_credential_is_kept() {
    let unkeyed = server(json!([]), dev(), 0, |_| {}).await;
    assert_error(
        &call(
            Method::PUT,
            &format!("{}/v1/vaults/github", unkeyed.url),
            None,
            Some(json!({"value": SECRET})),
        )
        .await,
        404,
        "vault_unavailable",
    );
    let public = server(
        json!([]),
        Auth::new(&[], false, Some(1.0)).unwrap(),
        0,
        keyed,
    )
    .await;
    assert_error(
        &call(
            Method::PUT,
            &format!("{}/v1/vaults/github", public.url),
            None,
            Some(json!({"value": SECRET})),
        )
        .await,
        403,
        "forbidden",
    );
}

/// Storing credentials counts against the caller's creations a minute, and one owner
/// keeps at most a thousand: a new name past that is refused, naming the bound, while
/// replacing one kept goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_writes_are_bounded_per_owner() {
    let srv = server(json!([]), tokens(), 0, |state| {
        keyed(state);
        state.creations_per_minute = 2;
    })
    .await;
    let put = |name: &str, token: &'static str| {
        let url = format!("{}/v1/vaults/{name}", srv.url);
        async move {
            call(
                Method::PUT,
                &url,
                Some(token),
                Some(json!({"value": SECRET})),
            )
            .await
        }
    };
    assert_eq!(put("a", "alice-secret").await.0, 204);
    assert_eq!(put("b", "alice-secret").await.0, 204);
    assert_error(&put("c", "alice-secret").await, 429, "rate_limited");
    assert_eq!(put("c", "bob-secret").await.0, 204, "another caller");

    let srv = server(json!([]), tokens(), 0, |state| {
        keyed(state);
        state.creations_per_minute = 5000;
    })
    .await;
    let client = reqwest::Client::new();
    for n in 0..1000 {
        let status = client
            .put(format!("{}/v1/vaults/token-{n}", srv.url))
            .bearer_auth("alice-secret")
            .json(&json!({"value": SECRET}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204, "credential {n}");
    }
    let url = |name: &str| format!("{}/v1/vaults/{name}", srv.url);
    let refused = call(
        Method::PUT,
        &url("one-more"),
        Some("alice-secret"),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_error(&refused, 422, "invalid_body");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000"),
        "{}",
        refused.1
    );
    let replaced = call(
        Method::PUT,
        &url("token-7"),
        Some("alice-secret"),
        Some(json!({"value": "another"})),
    )
    .await;
    assert_eq!(replaced.0, 204, "{}", replaced.1);
}
